-- tick: decide one tick of one schedule and, when it fires, enqueue its job, in one
-- atomic step. scripts.py sends this file with enqueue.lua appended: a tick that fires
-- falls through to the enqueue script, which writes the job (one job, no idempotency
-- key) exactly as any other enqueue does. So the keys and arguments are the enqueue
-- script's own first, then this guard's, counted from the end (the enqueue script reads
-- its arguments by its job count and never sees these):
--
-- On a partitioned queue a job whose keys (RESOURCE_KEY, CONCURRENCY, RATE_LIMIT) route
-- it to another partition than the one holding the schedule's state (the queue's home
-- partition) must meet the other jobs of those keys there, in another slot on Redis
-- Cluster, which this script cannot write. Such a tick's job goes to this partition's
-- outbox in the same step as the tick's bookkeeping, and is placed from there by its id,
-- once whoever places it (the ticker at once, else the relay: runner/outbox.py). The
-- state keeps the entry (job_away, tick_job_away), so a reader can tell a last job still
-- in the outbox (LPOS) from one placed.
--
-- KEYS[1..11]  as enqueue.lua, for one job (K.job_prefix: the last job's record is
--               prefix .. id; K.claims: the last job is processing while it has a claim)
-- KEYS[12] outbox      LIST  the jobs on their way to another partition (JSON entries)
-- KEYS[13] schedule    HASH  the schedule's state (see keys.py): def, def_at, tick,
--                            fired, job (the last, ticked or manual), tick_job (the last
--                            tick's), job_away and tick_job_away (their outbox entries
--                            when they were sent to another partition), late_ms,
--                            n_fired, n_missed, n_overlap, n_manual
-- ARGV[1..n]    as enqueue.lua, for one job
-- ARGV[#ARGV-9] mode: 'fire', 'skip' (record the tick as handled, enqueue nothing) or
--               'manual' (runner schedules trigger: enqueue now, the tick order untouched)
-- ARGV[#ARGV-8] tick, ms (the tick's own time, not when it is handled)
-- ARGV[#ARGV-7] the definition's digest
-- ARGV[#ARGV-6] born, ms: when the caller's definition was loaded (server time)
-- ARGV[#ARGV-5] overlap: 'skip' (no fire while the last job is unfinished: queued, scheduled,
--                  retrying, deferred or processing) or 'allow'
-- ARGV[#ARGV-4] missed ticks this step passes over (counted)
-- ARGV[#ARGV-3] how late the step is taken, ms
-- ARGV[#ARGV-2] the new job's id
-- ARGV[#ARGV-1] away: '' (the job is written here, by the enqueue script) or its outbox entry
--               (JSON: its queue, its 12 enqueue fields, its priority) when its keys route it
--               to another partition
-- ARGV[#ARGV]   seen: '' (a queue of one partition: a last job with no record here is done),
--               else what the caller read of the last jobs (state's job and tick_job) just
--               before, one "<id> <where>" pair a line: 'here' (in this partition, or in
--               none: done), 'relaying' (its entry was in the outbox: unfinished), or its
--               status in another partition. What was read can only have moved on to
--               finished since (a stale reading skips a tick a moment early, at worst).
--
-- Returns {code, id, status}:
--   1  fired: the enqueue script's answer (the new job's id and status), or the id and
--      'queued' for a job sent through the outbox
--   2  skipped as missed: the tick is recorded as handled
--   3  skipped for overlap: the last job's id and its unfinished status
--  -2  refused: this tick or a later one was already handled; the state's tick
--  -3  refused: the state holds another definition (a newer deploy took over, or this
--      schedule was removed); the winning digest ('' removed)
--  -4  refused, nothing written: a last job may live in another partition and the caller
--      did not read it (the state moved on since it read): read again and retry
local g_outbox, g_state, g_jobs, g_claims = K.outbox, K.schedule, K.job_prefix, K.claims
local ga = #ARGV - 9
local g_mode, g_tick, g_digest, g_born = ARGV[ga], tonumber(ARGV[ga + 1]), ARGV[ga + 2], ARGV[ga + 3]
local g_overlap, g_missed, g_late, g_id = ARGV[ga + 4], tonumber(ARGV[ga + 5]), tonumber(ARGV[ga + 6]), ARGV[ga + 7]
local g_away, g_seen = ARGV[ga + 8], ARGV[ga + 9]

-- A last job's status for OVERLAP, wherever it lives; nil when the caller must look again.
local function g_status(last)
  if g_seen ~= '' then
    local where = string.match('\n' .. g_seen .. '\n', '\n' .. last:gsub('%p', '%%%0') .. ' (%S+)\n')
    if not where then return nil end  -- not read: the state moved on since
    if where == 'relaying' then return 'queued' end
    if where ~= 'here' then return where end
  end
  -- A job with no record here is done (or gone); else its claim, else its state, says.
  if redis.call('HEXISTS', g_claims, last) == 1 then return 'processing' end
  if redis.call('EXISTS', g_jobs .. last) == 1 then
    local st = redis.pcall('HGET', g_jobs .. last .. ':s', 'status')
    return type(st) == 'string' and st or 'queued'
  end
  return 'done'
end
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
  -- end first while the tick's runs on).
  for _, last in ipairs({g[3] or false, g[4] ~= g[3] and g[4] or false}) do
    if last then
      local st = g_status(last)
      if not st then return {-4, last, 'look'} end
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
local sent = g_mode == 'manual' and {'job_away'} or {'job_away', 'tick_job_away'}
if g_away == '' then
  redis.call('HDEL', g_state, unpack(sent))
else
  redis.call('RPUSH', g_outbox, g_away)
  for _, f in ipairs(sent) do redis.call('HSET', g_state, f, g_away) end
  return {1, g_id, 'queued'}
end
-- The tick fires here: the enqueue script follows.
