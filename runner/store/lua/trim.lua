-- trim: forget dead-letter entries whose record has passed its retention, and delete
-- done jobs past theirs: the record, the outcome and the index entry go together.
--
-- KEYS[1] dead         ZSET  id -> time of death ms
-- KEYS[2] finished     ZSET  id -> finish time ms
-- KEYS[3] done         HASH  id -> outcome
-- KEYS[4] job prefix   (string)
-- ARGV[1] dead cutoff, ms (now - dead retention)
-- ARGV[2] done cutoff, ms (now - done retention)
-- ARGV[3] the most done jobs to delete in this call
--
-- Returns {dead entries removed, done jobs deleted}.
local dead = redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
if #ids > 0 then
  local jobs = {}
  for j, id in ipairs(ids) do jobs[j] = KEYS[4] .. id end
  redis.call('DEL', unpack(jobs))  -- the caller keeps the limit within unpack's
end
call_many('HDEL', KEYS[3], ids, 1)
call_many('ZREM', KEYS[2], ids, 1)
return {dead, #ids}
