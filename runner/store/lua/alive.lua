-- alive: a ticker says it lives for the schedules it holds, and learns which it no
-- longer holds. For each (id, digest): where the schedule's state holds this digest, its
-- seen time is set to now (adopt.lua's takeover reads it); where it holds another, the
-- id and the winning digest ('' removed) are returned, so the ticker stands by at once
-- instead of at its next tick. A ticker that lost never stamps the winner's seen time.
--
-- KEYS[1] schedule_prefix (string; a schedule's state is prefix .. id, see tick.lua)
-- KEYS[2] schedules_seen HASH  schedule id -> when a holder of its winning definition
--                              last said it lives, ms
-- ARGV[1] now, ms (server time)
-- ARGV[2] n; then per schedule 2 fields: id, digest
--
-- Returns a flat list: id, winning digest, for each schedule this digest no longer holds
-- (one with no state yet counts as held: its first tick writes it).
local now, n = ARGV[1], tonumber(ARGV[2])
local out = {}
local stamp = {}
for i = 0, n - 1 do
  local id, digest = ARGV[3 + 2 * i], ARGV[4 + 2 * i]
  local def = redis.call('HGET', K.schedule_prefix .. id, 'def')
  if not def or def == digest then
    stamp[#stamp + 1] = id
    stamp[#stamp + 1] = now
  else
    out[#out + 1] = id
    out[#out + 1] = def
  end
end
if #stamp > 0 then redis.call('HSET', K.schedules_seen, unpack(stamp)) end
return out
