-- adopt: a worker's schedule definitions of one queue take over where they are newer,
-- and the schedules it no longer defines are retired where no living worker holds them.
-- "Newer" is when a definition was first seen: the first time any worker registered that
-- digest for that schedule (the state's field "first:<digest>", server time, written
-- once and kept while the schedule's state lives). So a deploy takes over from the
-- workers still running the code before it, and a worker of the older release restarted
-- during the deploy (or `runner dev` from an older checkout) does not: its definition was
-- first seen before. A rollback to a definition seen before wins only once the holders
-- of the newer one have gone quiet (a takeover, below), as it looks the same.
-- A digest is "<timing>:<whole>" (catalog/schedules.py). A definition that takes over
-- with the same timing (cron and time zone; a new payload, schema version or policy)
-- keeps the schedule's timeline: the ticks due while the deploy restarted the workers are
-- missed ticks, handled by its MISSED policy. Another timing starts a new timeline at
-- born: the old one's ticks are not the new schedule's to catch up.
--
-- A takeover (stale_before > 0) is a worker whose definition lost taking the schedule
-- back because the winner's workers are gone (a canary withdrawn, a rollback): it wins
-- only where the winning definition's holders said they live after it won (seen >=
-- def_at) and have been quiet since before stale_before. It keeps the timeline (the
-- gap's ticks are missed ticks, run under MISSED) and writes its own first seen as
-- def_at, so a newer definition whose workers still run (or start again) wins over it.
--
-- KEYS[1] schedules      HASH  schedule id -> digest of its winning definition
-- KEYS[2] schedule_prefix (string; a schedule's state is prefix .. id, see tick.lua)
-- KEYS[3] schedules_seen HASH  schedule id -> when its winning definition's holder last
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
-- ARGV[7 + 2n + m] f: the first f ids to retire are removals by a reload of this very
--   worker ('' or absent: 0)
--
-- Retiring: a retirer is no proof of a newer release, as a restarted worker of the
-- previous release lacks the schedules a newer release added; nothing in Redis tells an
-- older release that lacks a schedule from a newer one that removed it. So a schedule
-- whose holders live is retired only by a reload of a worker that defined it (the first
-- f ids); otherwise only once its holders have been quiet since before stale_before
-- (> 0): no living worker defines it. A schedule whose holders never said they live is
-- retired by born, as ever. A retired schedule's state records when (def_at): a worker
-- that defines it and adopts after that (started, or heard again after a silence that
-- made it look gone) brings it back, as it lives; once no such worker is seen, the
-- workers that do not define it retire it again (standby.py).
--
-- Returns, per defined schedule, three values: won (1: this definition holds the
-- schedule; 0: a newer one does), floor ms (ticks at or before it are handled: the last
-- handled tick, or when the timeline began, whichever is later), and the
-- winning digest; then per schedule to retire, 1 retired, 0 kept (its holders live, or a
-- newer definition holds it) or -1 retired already.
local born, ttl, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local r = 4 + 2 * n
local m = tonumber(ARGV[r])
local stale_before = tonumber(ARGV[r + m + 1] or '') or 0
local now = tonumber(ARGV[r + m + 2] or '') or born
local forced = tonumber(ARGV[r + m + 3] or '') or 0
local out = {}
for i = 0, n - 1 do
  local id, digest = ARGV[4 + 2 * i], ARGV[5 + 2 * i]
  local sk = K.schedule_prefix .. id
  local st = redis.call('HMGET', sk, 'def', 'def_at', 'tick', 'line_at', 'first:' .. digest)
  local def, def_at = st[1], tonumber(st[2] or '0')
  -- First seen now, unless recorded; a state written before first seen times were kept
  -- dates the definition it holds by when that won. Recorded below where a state lives
  -- (never creating one for a definition that did not win it).
  local first = tonumber(st[5] or '') or ((def == digest and def_at > 0) and def_at or born)
  if not st[5] and def then redis.call('HSET', sk, 'first:' .. digest, first) end
  local line_at = tonumber(st[4] or '') or def_at  -- state written before line_at: def_at
  local won = 1
  if def ~= digest then
    local take
    if stale_before > 0 then
      local seen = tonumber(redis.call('HGET', K.schedules_seen, id) or '')
      -- A removed schedule ('') is nobody's to take back: its remover does not say it lives.
      take = def and def ~= '' and seen and seen >= def_at and seen < stale_before
    else
      if def == '' then
        take = def_at < born  -- a worker that defines it, started (or heard again) after its retirement
      else
        take = not (def and def_at >= first)
      end
      if stale_before < 0 and not (def and def ~= '') then take = false end
      local timing = string.match(digest, '^(%x+):')
      if take and not (timing and def and string.match(def, '^(%x+):') == timing) then
        line_at = stale_before < 0 and now or born
      end
    end
    if not take then
      won = 0
    else
      def, def_at = digest, first
      redis.call('HSET', sk, 'def', digest, 'def_at', first, 'line_at', line_at, 'first:' .. digest, first)
      redis.call('PERSIST', sk)  -- a tombstone brought back by a newer definition
      redis.call('HSET', K.schedules, id, digest)
      redis.call('HSET', K.schedules_seen, id, now)
    end
  elseif redis.call('HEXISTS', K.schedules, id) == 0 then
    redis.call('HSET', K.schedules, id, digest)
  end
  local floor = math.max(tonumber(st[3] or '0'), line_at)
  out[#out + 1] = won
  out[#out + 1] = floor
  out[#out + 1] = def
end
for j = 1, m do
  local id = ARGV[r + j]
  local sk = K.schedule_prefix .. id
  local st = redis.call('HMGET', sk, 'def_at', 'def')
  local def_at = tonumber(st[1] or '0')
  local seen = tonumber(redis.call('HGET', K.schedules_seen, id) or '')
  local unheld = j <= forced or (seen == nil and stale_before <= 0)
      or (seen ~= nil and stale_before > 0 and seen < stale_before)
  if st[2] == '' or (not st[2] and redis.call('HEXISTS', K.schedules, id) == 0) then
    out[#out + 1] = -1
  elseif def_at < born and unheld then
    redis.call('HSET', sk, 'def', '', 'def_at', now, 'line_at', now)
    redis.call('PEXPIRE', sk, ttl)
    redis.call('HDEL', K.schedules, id)
    redis.call('HDEL', K.schedules_seen, id)
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
