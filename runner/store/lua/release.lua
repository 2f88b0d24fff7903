-- release: hand claimed jobs back to the front of ready without spending an attempt
-- (graceful shutdown, or jobs claimed but never started). Fenced.
--
-- KEYS[1] leases       ZSET
-- KEYS[2] ready        LIST
-- KEYS[3] notify       LIST
-- KEYS[4] job prefix   (string)
-- KEYS[5] lock prefix  (string)
-- KEYS[6] scheduled    ZSET  (to wake a job waiting on a released resource)
-- KEYS[7] claims       HASH  id -> claim
-- ARGV[1] now_ms
-- ARGV[2] n; then per job: id, token
--
-- Returns one code per job: 1 released, -1 refused (lease lost: nothing changed).
local now, n = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = {}
local ids = {}
local held = batch_claims(KEYS[7], 3, 2, n)
for i = 0, n - 1 do
  local id, token = ARGV[3 + i * 2], ARGV[4 + i * 2]
  local jk = KEYS[4] .. id
  local c = fence(held[i + 1], token)
  if not c then
    out[#out + 1] = -1
  else
    held[i + 1] = false
    -- The claim's attempt was never written to the record, so nothing is spent; the
    -- record is still queued.
    redis.pcall('HSET', jk, 'ready_ms', now)
    -- RPUSH: the consumer end of ready, so a released job runs next.
    redis.call('RPUSH', KEYS[2], id)
    if c.res then
      local rkey = redis.pcall('HGET', jk, 'resource_key')
      if type(rkey) == 'string' then
        release_lock(KEYS[5], rkey, token, KEYS[6], KEYS[2], KEYS[3], KEYS[4])
      end
    end
    ids[#ids + 1] = id
    out[#out + 1] = 1
  end
end
if #ids > 0 then
  unclaim(KEYS[7], KEYS[1], ids)
  wake(KEYS[3])
end
return out
