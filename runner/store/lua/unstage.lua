-- unstage: take a committed stage's first placed entries off it, and move the entries for
-- queues the relaying process does not know to the outbox, in one step, only while the
-- stage still starts with the entry read. Every worker's scheduler relays committed
-- stages (worker/relay.py), and two that read the same head both placed it (once each by
-- id) and both trimmed it, the second dropping the next entries, unplaced (every loss a
-- multiple of the batch). Entries are unique (each names its follow-up's id), so the
-- first one says whether the head is still the one read.
--
-- KEYS[1] stage        LIST  the committed stage (outbox entries)
-- KEYS[2] outbox       LIST  the partition's outbox
-- ARGV[1] the first entry read
-- ARGV[2] how many were placed
-- ARGV[3..] the entries to wait on the outbox
--
-- Returns 1 trimmed, 0 another relay was first (nothing changed).
if redis.call('LINDEX', K.stage, 0) ~= ARGV[1] then return 0 end
if #ARGV > 2 then redis.call('RPUSH', K.outbox, unpack(ARGV, 3)) end
redis.call('LTRIM', K.stage, tonumber(ARGV[2]), -1)
return 1
