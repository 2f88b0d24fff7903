-- tick: decide one tick of one schedule and, when it fires, enqueue its job, in one
-- atomic step. scripts.py sends this file with enqueue.lua appended: a tick that fires
-- falls through to the enqueue script, which writes the job (one job, no idempotency
-- key) exactly as any other enqueue does. So the keys and arguments are the enqueue
-- script's own first, then this guard's, counted from the end (the enqueue script reads
-- its arguments by its job count and never sees these):
--
-- KEYS[1..m]    as enqueue.lua, for one job
-- KEYS[#KEYS-3] state        HASH  the schedule's state (see keys.py): def, def_at, tick,
--                                  fired, job (the last, ticked or manual), tick_job (the last
--                                  tick's), late_ms, n_fired, n_missed, n_overlap, n_manual
-- KEYS[#KEYS-2] job prefix   (string; the last job's record is prefix .. id)
-- KEYS[#KEYS-1] claims       HASH  (the last job is processing while it has a claim)
-- KEYS[#KEYS]   done meta    HASH  (unused: a done job has no record left)
-- ARGV[1..n]    as enqueue.lua, for one job
-- ARGV[#ARGV-7] mode: 'fire', 'skip' (record the tick as handled, enqueue nothing) or
--               'manual' (runner schedules trigger: enqueue now, the tick order untouched)
-- ARGV[#ARGV-6] tick, ms (the tick's own time, not when it is handled)
-- ARGV[#ARGV-5] the definition's digest
-- ARGV[#ARGV-4] born, ms: when the caller's definition was loaded (server time)
-- ARGV[#ARGV-3] overlap: 'skip' (no fire while the last job is unfinished: queued, scheduled,
--                  retrying, deferred or processing) or 'allow'
-- ARGV[#ARGV-2] missed ticks this step passes over (counted)
-- ARGV[#ARGV-1] how late the step is taken, ms
-- ARGV[#ARGV]   the new job's id
--
-- Returns {code, id, status}:
--   1  fired: the enqueue script's answer (the new job's id and status)
--   2  skipped as missed: the tick is recorded as handled
--   3  skipped for overlap: the last job's id and its unfinished status
--  -2  refused: this tick or a later one was already handled; the state's tick
--  -3  refused: the state holds another definition (a newer deploy took over, or this
--      schedule was removed); the winning digest ('' removed)
local g_state, g_jobs, g_claims, g_done = KEYS[#KEYS - 3], KEYS[#KEYS - 2], KEYS[#KEYS - 1], KEYS[#KEYS]
local ga = #ARGV - 7
local g_mode, g_tick, g_digest, g_born = ARGV[ga], tonumber(ARGV[ga + 1]), ARGV[ga + 2], ARGV[ga + 3]
local g_overlap, g_missed, g_late, g_id = ARGV[ga + 4], tonumber(ARGV[ga + 5]), tonumber(ARGV[ga + 6]), ARGV[ga + 7]
local g = redis.call('HMGET', g_state, 'def', 'tick', 'job', 'tick_job')
if g_mode ~= 'manual' then
  if not g[1] then
    -- No state (a new schedule whose adoption has not run, or lost data): this
    -- definition is the only one known.
    redis.call('HSET', g_state, 'def', g_digest, 'def_at', g_born)
  elseif g[1] ~= g_digest then
    return {-3, g[1], 'superseded'}
  end
  if g[2] and g_tick <= tonumber(g[2]) then
    return {-2, g[2], 'handled'}
  end
end
if g_missed > 0 then redis.call('HINCRBY', g_state, 'n_missed', g_missed) end
if g_mode == 'skip' then
  redis.call('HSET', g_state, 'tick', g_tick)
  return {2, '', 'skipped'}
end
if g_mode == 'fire' and g_overlap == 'skip' then
  -- The last job, and the last tick's when a manual run came after it (the manual one may
  -- end first while the tick's runs on). A job with no record is done (or gone); else
  -- its claim, else its state, says.
  for _, last in ipairs({g[3] or false, g[4] ~= g[3] and g[4] or false}) do
    if last then
      local st
      if redis.call('HEXISTS', g_claims, last) == 1 then
        st = 'processing'
      elseif redis.call('EXISTS', g_jobs .. last) == 1 then
        st = redis.pcall('HGET', g_jobs .. last .. ':s', 'status')
        if type(st) ~= 'string' then st = 'queued' end
      else
        st = 'done'
      end
      if st == 'queued' or st == 'scheduled' or st == 'retrying' or st == 'deferred' or st == 'processing' then
        redis.call('HSET', g_state, 'tick', g_tick)
        redis.call('HINCRBY', g_state, 'n_overlap', 1)
        return {3, last, st}
      end
    end
  end
end
if g_mode == 'manual' then
  redis.call('HSET', g_state, 'job', g_id)
  redis.call('HINCRBY', g_state, 'n_manual', 1)
else
  redis.call('HSET', g_state, 'tick', g_tick, 'fired', g_tick, 'job', g_id, 'tick_job', g_id, 'late_ms', g_late)
  redis.call('HINCRBY', g_state, 'n_fired', 1)
  redis.call('HINCRBY', g_state, 'late_sum_ms', g_late)
end
-- The tick fires: the enqueue script follows.
