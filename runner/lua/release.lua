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
local ids = {}
for i = 0, n - 1 do
  local id, token = ARGV[3 + i * 2], ARGV[4 + i * 2]
  local jk = KEYS[4] .. id
  local f = fenced(jk, token, 'resource_key', 'attempt')
  if not f then
    out[#out + 1] = -1
  else
    -- claim vouched that attempt is an integer before it handed the job out.
    redis.call('HSET', jk, 'status', 'queued', 'ready_ms', now, 'attempt', (tonumber(f[4]) or 1) - 1,
      'token', '')
    -- RPUSH: the consumer end of ready, so a released job runs next.
    redis.call('RPUSH', KEYS[2], id)
    release_lock(KEYS[5], f[3], token, KEYS[6], KEYS[2], KEYS[3], KEYS[4])
    ids[#ids + 1] = id
    out[#out + 1] = 1
  end
end
if #ids > 0 then
  call_many('ZREM', KEYS[1], ids, 1)
  wake(KEYS[3])
end
return out
