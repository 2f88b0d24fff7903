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
-- winning definition's holders said they live after it won (seen >= def_at, which a
-- worker of a version that never says so, e.g. a rollback, leaves false) and have been
-- quiet since before stale_before. It keeps the timeline (the gap's ticks are missed
-- ticks, run under MISSED) and writes the taker's own born as def_at, so a newer
-- definition whose workers still run (or start again) wins over it by born as ever.
-- A state written before digests had a timing part holds the <whole> part alone: the
-- same definition, taken as such.
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
-- ARGV[5 + 2n + m] stale_before, ms ('' or 0: an adoption, not a takeover; -1: a
--   standby's rejoin, which wins only a schedule held by an older definition, never one
--   removed or gone, and starts a new timing at now)
-- ARGV[6 + 2n + m] now, ms (server time; '' for born): a winner's first seen time
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
local now = tonumber(ARGV[r + m + 2] or '') or born
local out = {}
for i = 0, n - 1 do
  local id, digest = ARGV[4 + 2 * i], ARGV[5 + 2 * i]
  local sk = KEYS[2] .. id
  local st = redis.call('HMGET', sk, 'def', 'def_at', 'tick', 'line_at')
  local def, def_at = st[1], tonumber(st[2] or '0')
  if stale_before == 0 and def_at < born and def and def ~= '' and not string.find(def, ':', 1, true)
      and string.match(digest, ':(%x+)$') == def then
    def = digest  -- written before the timing part (and older than this worker): the same definition
    redis.call('HSET', sk, 'def', digest)
    redis.call('HSET', KEYS[1], id, digest)
  end
  local line_at = tonumber(st[4] or '') or def_at  -- state written before line_at: def_at
  local won = 1
  if def ~= digest then
    local take
    if stale_before > 0 then
      local seen = tonumber(redis.call('HGET', KEYS[3], id) or '')
      -- A removed schedule ('') is nobody's to take back: its remover does not say it lives.
      take = def and def ~= '' and seen and seen >= def_at and seen < stale_before
    else
      take = not (def and def_at >= born)
      if stale_before < 0 and not (def and def ~= '') then take = false end
      local timing = string.match(digest, '^(%x+):')
      if take and not (timing and def and string.match(def, '^(%x+):') == timing) then
        line_at = stale_before < 0 and now or born
      end
    end
    if not take then
      won = 0
    else
      def, def_at = digest, born
      redis.call('HSET', sk, 'def', digest, 'def_at', born, 'line_at', line_at)
      redis.call('PERSIST', sk)  -- a tombstone brought back by a newer definition
      redis.call('HSET', KEYS[1], id, digest)
      redis.call('HSET', KEYS[3], id, now)
    end
  elseif redis.call('HEXISTS', KEYS[1], id) == 0 then
    redis.call('HSET', KEYS[1], id, digest)
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
