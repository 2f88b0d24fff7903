-- release: hand claimed jobs back without spending an attempt (fenced), in one of two
-- ways:
--   now    to the front of ready at once: the job never started, or its handler is known
--          to have stopped (its child process was killed at shutdown); a claim that a
--          cancel took while it waited to start (flag 'c', see cancel.lua) ends the job
--          cancelled instead
--   later  the handler may still be running (a thread at shutdown): the claim is marked
--          'x' and keeps its lease, so nobody can start the job while that process
--          lives; once the lease lapses, reclaim puts it back without spending the attempt
--
-- KEYS[1] leases       ZSET
-- KEYS[2] ready        LIST
-- KEYS[3] notify       LIST
-- KEYS[4] job_prefix   (string)
-- KEYS[5] lim_prefix   (string)
-- KEYS[6] claims       HASH  id -> claim
-- KEYS[7] limwait      ZSET  limit keys with parked jobs
-- KEYS[8] idem_prefix  (string)
-- KEYS[9] census       HASH
-- KEYS[10] cancelled   ZSET  cancelled ids -> time ms
-- KEYS[11] ended       channel
-- KEYS[12] group_prefix (string; a cancelled job of a group counts down: group_settle in includes/groups.lua)
-- KEYS[13] scheduled   ZSET  (its group's then-job, when delayed)
-- KEYS[14] stats       HASH
-- KEYS[15] done_meta   HASH
-- KEYS[16] done_prefix (string)
-- KEYS[17] outbox      LIST  (its group's then-job, when that runs on another queue)
-- KEYS[18] prio        ZSET  (a job of priority 1-9 goes back there: to_ready in includes/ready.lua)
-- KEYS[19] delayed     ZSET  the ids of scheduled that are scheduled or retrying -> due (ms): the
--                            scheduled list's own index (see keys.py)
-- ARGV[1] now, ms ('' for the server's clock)
-- ARGV[2] n; then per job: id, token, mode (now | later), history entry ('' none)
-- ARGV[last] the done retention, ms (a cancelled job's)
--
-- Returns one code per job: 1 released, -1 refused (lease lost: nothing changed).
--- @include "clock"
--- @include "history"
--- @include "calls"
--- @include "ready"
--- @include "parking"
--- @include "stats"
--- @include "claims"
--- @include "record_keys"
--- @include "groups"
--- @include "ended"
local now, n = clock(ARGV[1]), tonumber(ARGV[2])
local done_ttl = tonumber(ARGV[3 + n * 4]) or 86400000
local out = {}
local ids, marked, back = {}, {}, {}
local seen = {}
local held = batch_claims(K.claims, 3, 4, n)
for i = 0, n - 1 do
  local b = 3 + i * 4
  local id, token, mode, entry = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3]
  local jk = K.job_prefix .. id
  -- The same claim twice in one batch settles once (seen), refused the second time.
  local c = not seen[id] and fence(held[i + 1], token)
  if not c then
    out[#out + 1] = -1
  elseif mode == 'later' then
    seen[id] = true
    marked[#marked + 1] = id
    c.exiting = true
    marked[#marked + 1] = claim_entry(c.token, c.attempt, c.started, flags_of(c))
    out[#out + 1] = 1
  elseif c.cancel and c.prefetched then
    seen[id] = true
    local rec = rec_load(jk)
    if rec then
      end_cancelled(jk, id, rec, now, done_ttl, K.idem_prefix, K.census, K.cancelled, K.ended)
      tally('cancelled|' .. rec.type)
      if K.group_prefix then
        group_cancelled({group = K.group_prefix, notify = K.notify, census = K.census, outbox = K.outbox,
          Q = {ready = K.ready, scheduled = K.scheduled, delayed = K.delayed, stats = K.stats, job = K.job_prefix, idem = K.idem_prefix, prio = K.prio,
            claims = K.claims, done_meta = K.done_meta, done = K.done_prefix}}, now, id, rec)
      end
    end
    ids[#ids + 1] = id
    out[#out + 1] = 1
  else
    seen[id] = true
    -- The claim's attempt was never written to the state, so nothing is spent; the job
    -- is still queued.
    -- Only a job that has a state hash (or a history entry to write) gets one.
    if c.state or entry ~= '' then
      local set = {'ready_ms', now}
      if entry ~= '' then
        local old = redis.pcall('HGET', jk .. ':s', 'history')
        with_history(set, type(old) == 'string' and old or nil, entry)
      end
      redis.pcall('HSET', jk .. ':s', unpack(set))
    end
    -- The consumer end of ready (or the front of its priority), so a released job runs
    -- next: pushed after the loop, last first (back).
    local prio = redis.pcall('HGET', jk .. ':s', 'priority')
    back[#back + 1] = {id, type(prio) == 'string' and prio or nil, c.res and token or nil}
    ids[#ids + 1] = id
    out[#out + 1] = 1
  end
end
-- Each push goes in front of the one before it, so the jobs are pushed last first: the
-- first handed back (the first claimed, the first to arrive) runs first, in arrival order.
for i = #back, 1, -1 do to_ready(K.ready, K.prio, back[i][1], back[i][2], now, true) end
-- After the pushes, so a job parked on a freed limit runs before the released job takes
-- the slot again (as in reclaim.lua).
for _, b in ipairs(back) do
  if b[3] then
    local rec = rec_load(K.job_prefix .. b[1])
    if rec then release_limits(K.lim_prefix, rec.limits, b[3], now, K.job_prefix, K.ready, K.notify, K.limwait, K.prio) end
  end
end
call_many('HSET', K.claims, marked, 2)
if #ids > 0 then
  unclaim(K.claims, K.leases, ids)
  wake(K.notify)
end
if K.stats then flush(K.stats) end
return out
