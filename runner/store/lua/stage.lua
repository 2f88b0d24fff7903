-- stage: write one chunk of a run's follow-ups to its stage, a list of their own that
-- nothing reads until the run's ack commits it (ack.lua; scripts.py writes a run's
-- follow-ups past STAGE_OVER so, STAGE_CHUNK a call). The chunk is appended and the
-- stage's expiry set in one step: a worker killed mid-way leaves a stage that expires by
-- itself (set last, a kill between the writes left it for ever). The first chunk empties
-- the stage first: the same ack sent again writes it again whole.
--
-- KEYS[1] stage        LIST  outbox entries (scripts.job_entry), oldest first
-- ARGV[1] the stage's time to live, ms (relative: the server sets it)
-- ARGV[2] '1' the first chunk (the stage emptied first), else '0'
-- ARGV[3..] the entries (at most STAGE_CHUNK)
--
-- Returns 1.
if ARGV[2] == '1' then redis.call('UNLINK', K.stage) end
redis.call('RPUSH', K.stage, unpack(ARGV, 3))
redis.call('PEXPIRE', K.stage, ARGV[1])
return 1
