-- renew: extend the leases (and limit slots) of jobs this worker still owns.
--
-- KEYS[1] leases       ZSET  id -> lease deadline ms
-- KEYS[2] job_prefix   (string)
-- KEYS[3] lim_prefix   (string)
-- KEYS[4] claims       HASH  id -> claim
-- ARGV[1] now, ms ('' for the server's clock)
-- ARGV[2] lease, ms
-- ARGV[3] n; then per job: id, token, progress (JSON written to the state's progress
--   field, fenced; '' none: ctx.progress is batched onto the renewal)
--
-- Returns one code per job:
--   1  renewed
--  -1  refused: the job is no longer processing under this token (lease lost)
--  -2  renewed, but a limit slot it held went to another job meanwhile (its slot's lease
--      lapsed and the limit is full): the handler no longer has the exclusion it had
--   3  renewed, and a cancel asked this run to stop (cancel.lua): the worker sets
--      ctx.cancelled (a lost slot is then told on a later renewal)
--- @include "clock"
--- @include "limits"
--- @include "claims"
--- @include "record_keys"
local now, lease, n = clock(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {}
local held = batch_claims(K.claims, 4, 3, n)
for i = 0, n - 1 do
  local id, token, progress = ARGV[4 + i * 3], ARGV[5 + i * 3], ARGV[6 + i * 3]
  local c = fence(held[i + 1], token)
  if not c or not redis.call('ZSCORE', K.leases, id) then
    out[#out + 1] = -1
  else
    redis.call('ZADD', K.leases, 'XX', now + lease, id)
    -- (pcall: a state key of another type, damage, loses its progress, never the renewal
    -- of this call's other jobs, whose leases could then lapse under their live runs)
    if progress ~= '' then redis.pcall('HSET', K.job_prefix .. id .. ':s', 'progress', progress) end
    local code = 1
    local rec = c.res and rec_load(K.job_prefix .. id) or nil
    for _, l in ipairs(parse_limits(rec and rec.limits or nil)) do
      local k = K.lim_prefix .. l.key
      heal_limit(k)
      -- A slot still in the key, even lapsed, was counted by every admission since (claims
      -- purge lapsed holders only when a key looks full): extend it as on time, so the key
      -- keeps counting the job that runs on.
      if redis.call('ZSCORE', k, token) then
        redis.call('ZADD', k, 'XX', now + lease, token)
      else
        purge_holders(k, now)
        if redis.call('ZCARD', k) < l.n then
          redis.call('ZADD', k, now + lease, token)
        else
          code = -2
        end
      end
    end
    if c.cancel then code = 3 end
    out[#out + 1] = code
  end
end
return out
