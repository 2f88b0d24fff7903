-- release: hand claimed jobs back to the front of ready without spending an attempt
-- (graceful shutdown, or jobs claimed but never started). Fenced.
--
-- KEYS[1] leases       ZSET
-- KEYS[2] ready        LIST
-- KEYS[3] notify       LIST
-- KEYS[4] job prefix   (string)
-- KEYS[5] lock prefix  (string)
-- KEYS[6] scheduled    ZSET  (to wake a job waiting on a released resource)
-- ARGV[1] now_ms
-- ARGV[2] n; then per job: id, token
--
-- Returns one code per job: 1 released, -1 refused (lease lost: nothing changed).
local now, n = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = {}
local any = false
for i = 0, n - 1 do
  local id, token = ARGV[3 + i * 2], ARGV[4 + i * 2]
  local jk = KEYS[4] .. id
  if not owns(jk, token) then
    out[#out + 1] = -1
  else
    local rkey = redis.call('HGET', jk, 'resource_key')
    redis.call('HSET', jk, 'status', 'queued', 'ready_ms', now)
    redis.call('HINCRBY', jk, 'attempt', -1)
    redis.call('HDEL', jk, 'token')
    redis.call('ZREM', KEYS[1], id)
    -- RPUSH: the consumer end of ready, so a released job runs next.
    redis.call('RPUSH', KEYS[2], id)
    release_lock(KEYS[5], rkey, token, KEYS[6], KEYS[2], KEYS[3], KEYS[4])
    any = true
    out[#out + 1] = 1
  end
end
if any then wake(KEYS[3]) end
return out
