-- retry: a claimed job failed transiently; schedule its next attempt (fenced).
--
-- KEYS[1] leases       ZSET
-- KEYS[2] scheduled    ZSET  id -> due ms
-- KEYS[3] stats        HASH
-- KEYS[4] job prefix   (string)
-- KEYS[5] lock prefix  (string)
-- KEYS[6] ready        LIST  (to wake a job waiting on a released resource)
-- KEYS[7] notify       LIST
-- ARGV[1] now_ms
-- ARGV[2] n; then per job 6 fields:
--   id, token, due_ms, error (JSON), history entry (JSON), stats fields (space-separated)
--
-- Returns one code per job: 1 scheduled, -1 refused (lease lost: nothing changed).
local now, n = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = {}
for i = 0, n - 1 do
  local b = 3 + i * 6
  local id, token, due, err, entry, fields = ARGV[b], ARGV[b + 1], tonumber(ARGV[b + 2]), ARGV[b + 3], ARGV[b + 4], ARGV[b + 5]
  local jk = KEYS[4] .. id
  if not owns(jk, token) then
    out[#out + 1] = -1
  else
    local rkey = redis.call('HGET', jk, 'resource_key')
    redis.call('HSET', jk, 'status', 'retrying', 'error', err, 'ready_ms', due, 'finished_ms', now)
    redis.call('HDEL', jk, 'token')
    append_history(jk, entry)
    redis.call('ZREM', KEYS[1], id)
    redis.call('ZADD', KEYS[2], due, id)
    release_lock(KEYS[5], rkey, token, KEYS[2], KEYS[6], KEYS[7], KEYS[4])
    bump(fields)
    out[#out + 1] = 1
  end
end
flush(KEYS[3])
return out
