-- renew: extend the leases (and resource locks) of jobs this worker still owns.
--
-- KEYS[1] leases       ZSET  id -> lease deadline ms
-- KEYS[2] job prefix   (string)
-- KEYS[3] lock prefix  (string)
-- KEYS[4] claims       HASH  id -> claim
-- ARGV[1] now_ms
-- ARGV[2] lease, ms
-- ARGV[3] n; then per job: id, token
--
-- Returns one code per job:
--   1  renewed
--  -1  refused: the job is no longer processing under this token (lease lost)
--  -2  renewed, but the resource lock is held by another token (it lapsed meanwhile)
local now, lease, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {}
local held = batch_claims(KEYS[4], 4, 2, n)
for i = 0, n - 1 do
  local id, token = ARGV[4 + i * 2], ARGV[5 + i * 2]
  local jk = KEYS[2] .. id
  local c = fence(held[i + 1], token)
  if not c or not redis.call('ZSCORE', KEYS[1], id) then
    out[#out + 1] = -1
  else
    redis.call('ZADD', KEYS[1], 'XX', now + lease, id)
    local code = 1
    local rkey = c.res and redis.pcall('HGET', jk, 'resource_key')
    if type(rkey) == 'string' and rkey ~= '' then
      local lk = KEYS[3] .. rkey
      local holder = redis.call('GET', lk)
      if holder == token then
        redis.call('PEXPIRE', lk, lease)
      elseif not holder then
        redis.call('SET', lk, token, 'PX', lease)
      else
        code = -2
      end
    end
    out[#out + 1] = code
  end
end
return out
