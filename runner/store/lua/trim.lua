-- trim: forget dead-letter entries past the dead retention (their records go too), and
-- delete done jobs past theirs: the record, the outcome and the index entry together.
-- Both are bounded per call, whatever the backlog.
--
-- KEYS[1] dead         ZSET  id -> time of death ms
-- KEYS[2] finished     ZSET  id -> finish time ms
-- KEYS[3] done         HASH  id -> outcome
-- KEYS[4] job prefix   (string)
-- ARGV[1] now, ms ('' for the server's clock)
-- ARGV[2] dead retention, ms
-- ARGV[3] done retention, ms
-- ARGV[4] the most entries of each kind to remove in this call (<= 4000)
--
-- Returns {dead entries removed, done jobs deleted}.
local now = clock(ARGV[1])
local limit = tonumber(ARGV[4])
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]), 'LIMIT', 0, limit)
local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[3]), 'LIMIT', 0, limit)
for _, group in ipairs({dead, ids}) do
  if #group > 0 then
    local jobs = {}
    for j, id in ipairs(group) do jobs[j] = KEYS[4] .. id end
    redis.call('DEL', unpack(jobs))  -- the caller keeps the limit within unpack's
  end
end
call_many('ZREM', KEYS[1], dead, 1)
call_many('HDEL', KEYS[3], ids, 1)
call_many('ZREM', KEYS[2], ids, 1)
return {#dead, #ids}
