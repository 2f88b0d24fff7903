-- bury: move claimed jobs to the dead-letter set with a reason (fenced).
--
-- KEYS[1] leases       ZSET
-- KEYS[2] dead         ZSET  id -> time of death ms
-- KEYS[3] stats        HASH
-- KEYS[4] job prefix   (string)
-- KEYS[5] lock prefix  (string)
-- KEYS[6] scheduled    ZSET  (to wake a job waiting on a released resource)
-- KEYS[7] ready        LIST
-- KEYS[8] notify       LIST
-- ARGV[1] now_ms
-- ARGV[2] dead retention, ms
-- ARGV[3] n; then per job 7 fields:
--   id, token, reason, error (JSON, '' none), history entry (JSON, '' none),
--   attempt refund (1: the attempt is given back, e.g. the payload never reached
--   a handler; 0: it counts), stats fields (space-separated)
--
-- Returns one code per job: 1 dead, -1 refused (lease lost: nothing changed).
local now, dead_ttl, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {}
for i = 0, n - 1 do
  local b = 4 + i * 7
  local id, token, reason, err = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3]
  local entry, refund, fields = ARGV[b + 4], tonumber(ARGV[b + 5]), ARGV[b + 6]
  local jk = KEYS[4] .. id
  if not owns(jk, token) then
    out[#out + 1] = -1
  else
    local rkey = redis.call('HGET', jk, 'resource_key')
    redis.call('HSET', jk, 'status', 'dead', 'reason', reason, 'finished_ms', now)
    if err ~= '' then redis.call('HSET', jk, 'error', err) end
    if refund > 0 then redis.call('HINCRBY', jk, 'attempt', -refund) end
    redis.call('HDEL', jk, 'token')
    append_history(jk, entry)
    redis.call('ZREM', KEYS[1], id)
    redis.call('ZADD', KEYS[2], now, id)
    release_lock(KEYS[5], rkey, token, KEYS[6], KEYS[7], KEYS[8], KEYS[4])
    redis.call('PEXPIRE', jk, dead_ttl)
    bump(fields)
    out[#out + 1] = 1
  end
end
flush(KEYS[3])
return out
