-- adopt: a worker's schedule definitions of one queue take over where they are newer,
-- and the schedules it no longer defines are retired where it is newer. "Newer" is the
-- time the definition was loaded (born): the most recently started worker wins, so a
-- deploy (or a rollback) takes over from the workers still running the code before it.
--
-- KEYS[1] index          HASH  schedule id -> digest of its winning definition
-- KEYS[2] state prefix   (string; a schedule's state is prefix .. id, see tick.lua)
-- ARGV[1] born, ms (server time)
-- ARGV[2] how long a retired schedule's state is kept, ms (its tombstone)
-- ARGV[3] n, the schedules this worker defines on this queue; then 2 fields each:
--   id, digest
-- ARGV[4 + 2n] m, the schedules to retire (in the index, not defined by this worker);
--   then m ids
--
-- Returns, per defined schedule, three values: won (1: this definition holds the
-- schedule; 0: a newer one does), floor ms (ticks at or before it are handled: the last
-- handled tick, or when the winning definition took over, whichever is later), and the
-- winning digest; then per schedule to retire, 1 retired or 0 kept (a newer definition
-- holds it).
local born, ttl, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {}
for i = 0, n - 1 do
  local id, digest = ARGV[4 + 2 * i], ARGV[5 + 2 * i]
  local sk = KEYS[2] .. id
  local st = redis.call('HMGET', sk, 'def', 'def_at', 'tick')
  local def, def_at = st[1], tonumber(st[2] or '0')
  local won = 1
  if def ~= digest then
    if def and def_at >= born then
      won = 0
    else
      def, def_at = digest, born
      redis.call('HSET', sk, 'def', digest, 'def_at', born)
      redis.call('PERSIST', sk)  -- a tombstone brought back by a newer definition
      redis.call('HSET', KEYS[1], id, digest)
    end
  elseif redis.call('HEXISTS', KEYS[1], id) == 0 then
    redis.call('HSET', KEYS[1], id, digest)
  end
  local floor = math.max(tonumber(st[3] or '0'), def_at)
  out[#out + 1] = won
  out[#out + 1] = floor
  out[#out + 1] = def
end
local r = 4 + 2 * n
local m = tonumber(ARGV[r])
for j = 1, m do
  local id = ARGV[r + j]
  local sk = KEYS[2] .. id
  local def_at = tonumber(redis.call('HGET', sk, 'def_at') or '0')
  if def_at < born then
    redis.call('HSET', sk, 'def', '', 'def_at', born)
    redis.call('PEXPIRE', sk, ttl)
    redis.call('HDEL', KEYS[1], id)
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
