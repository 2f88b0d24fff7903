-- adopt: a worker's schedule definitions of one queue take over where they are newer,
-- and the schedules it no longer defines are retired where it is newer. "Newer" is the
-- time the definition was loaded (born): the most recently started worker wins, so a
-- deploy (or a rollback) takes over from the workers still running the code before it.
-- A digest is "<timing>:<whole>" (catalog/schedules.py). A definition that takes over
-- with the same timing (cron and time zone; a new payload, schema version or policy)
-- keeps the schedule's timeline: the ticks due while the deploy restarted the workers are
-- missed ticks, handled by its MISSED policy. Another timing starts a new timeline at
-- born: the old one's ticks are not the new schedule's to catch up.
--
-- A takeover (stale_before > 0) is a worker whose definition lost taking the schedule
-- back because the winner's workers are gone (a canary withdrawn): it wins only where the
-- winning definition's holders last said they live (seen) before stale_before, and never
-- where they never said so (a worker of a version that does not say it).
--
-- KEYS[1] index          HASH  schedule id -> digest of its winning definition
-- KEYS[2] state prefix   (string; a schedule's state is prefix .. id, see tick.lua)
-- KEYS[3] seen           HASH  schedule id -> when its winning definition's holder last
--                              said it lives, ms (set here when a definition wins)
-- ARGV[1] born, ms (server time; for a takeover, now)
-- ARGV[2] how long a retired schedule's state is kept, ms (its tombstone)
-- ARGV[3] n, the schedules this worker defines on this queue; then 2 fields each:
--   id, digest
-- ARGV[4 + 2n] m, the schedules to retire (in the index, not defined by this worker);
--   then m ids
-- ARGV[5 + 2n + m] stale_before, ms ('' or 0: an adoption, not a takeover)
--
-- Returns, per defined schedule, three values: won (1: this definition holds the
-- schedule; 0: a newer one does), floor ms (ticks at or before it are handled: the last
-- handled tick, or when the timeline began, whichever is later), and the
-- winning digest; then per schedule to retire, 1 retired or 0 kept (a newer definition
-- holds it).
local born, ttl, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local r = 4 + 2 * n
local m = tonumber(ARGV[r])
local stale_before = tonumber(ARGV[r + m + 1] or '') or 0
local out = {}
for i = 0, n - 1 do
  local id, digest = ARGV[4 + 2 * i], ARGV[5 + 2 * i]
  local sk = KEYS[2] .. id
  local st = redis.call('HMGET', sk, 'def', 'def_at', 'tick', 'line_at')
  local def, def_at = st[1], tonumber(st[2] or '0')
  local line_at = tonumber(st[4] or '') or def_at  -- state written before line_at: def_at
  local won = 1
  if def ~= digest then
    local holder_lives = false
    if stale_before > 0 and def then
      local seen = tonumber(redis.call('HGET', KEYS[3], id) or '')
      -- A retired schedule ('') is nobody's to take back: its remover does not say it lives.
      holder_lives = def == '' or not seen or seen >= stale_before
    end
    if (def and def_at >= born) or holder_lives then
      won = 0
    else
      local timing = string.match(digest, '^(%x+):')
      if not (timing and def and string.match(def, '^(%x+):') == timing) then line_at = born end
      def, def_at = digest, born
      redis.call('HSET', sk, 'def', digest, 'def_at', born, 'line_at', line_at)
      redis.call('PERSIST', sk)  -- a tombstone brought back by a newer definition
      redis.call('HSET', KEYS[1], id, digest)
      redis.call('HSET', KEYS[3], id, born)
    end
  else
    if redis.call('HEXISTS', KEYS[1], id) == 0 then redis.call('HSET', KEYS[1], id, digest) end
    redis.call('HSET', KEYS[3], id, born)  -- another holder of the winning definition lives
  end
  local floor = math.max(tonumber(st[3] or '0'), line_at)
  out[#out + 1] = won
  out[#out + 1] = floor
  out[#out + 1] = def
end
for j = 1, m do
  local id = ARGV[r + j]
  local sk = KEYS[2] .. id
  local def_at = tonumber(redis.call('HGET', sk, 'def_at') or '0')
  if def_at < born then
    redis.call('HSET', sk, 'def', '', 'def_at', born, 'line_at', born)
    redis.call('PEXPIRE', sk, ttl)
    redis.call('HDEL', KEYS[1], id)
    redis.call('HDEL', KEYS[3], id)
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
