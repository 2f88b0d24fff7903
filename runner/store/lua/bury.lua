-- bury: move claimed jobs to the dead-letter set with a reason (fenced). A dead job's
-- idempotency key is freed (a key remembers a completed request; a failed one may be
-- sent again), and its limit slots are released.
--
-- KEYS[1] leases       ZSET
-- KEYS[2] dead         ZSET  id -> time of death ms
-- KEYS[3] stats        HASH
-- KEYS[4] job_prefix   (string)
-- KEYS[5] lim_prefix   (string)
-- KEYS[6] idem_prefix  (string)
-- KEYS[7] ready        LIST  (a job woken by a freed slot goes here)
-- KEYS[8] notify       LIST
-- KEYS[9] claims       HASH  id -> claim
-- KEYS[10] limwait     ZSET  limit keys with parked jobs
-- KEYS[11] scheduled   ZSET  (an ON_FAILURE destination's job, when delayed)
-- KEYS[12] census      HASH  (a cancelled job leaves it)
-- KEYS[13] done_meta   HASH
-- KEYS[14] done_prefix (string)
-- KEYS[15] outbox      LIST  (a destination in another queue: see ack.lua)
-- KEYS[16] ended       channel  ids of waited jobs that ended (see waited in includes/ended.lua)
-- KEYS[17] cancelled   ZSET  cancelled ids -> time ms
-- KEYS[18] group_prefix (string; see group_settle in includes/groups.lua)
-- KEYS[19] prio        ZSET  (a job of priority 1-9 goes back there: to_ready in includes/ready.lua)
-- KEYS[20] delayed     ZSET  the ids of scheduled that are scheduled or retrying -> due (ms): the
--                            scheduled list's own index (see keys.py)
-- ARGV[1] now, ms ('' for the server's clock)
-- ARGV[2] dead retention, ms
-- ARGV[3] n; then per job 8 fields:
--   id, token, reason, error (JSON, '' none), history entry (JSON, '' none),
--   attempt refund (1: the attempt is given back, e.g. the payload never reached
--   a handler; 0: it counts), stats fields (space-separated), the handler's start, ms
--   ('' the claim's; set for a run whose start mark was not sent, as in retry.lua)
-- then m, ON_FAILURE jobs, 15 fields each as ack.lua's follow-ups: written only for a job
--   buried here, in this step, once by id (their ids go in its state as 'children'); a
--   job requeued n times gets n + 1 appended to its follow-up's id (<id>.f2, ...)
-- then g, the group members among the jobs, 6 fields each as in ack.lua (status dead or
--   cancelled): each counted down in this step, once
--
-- Each job costs one HMGET, one HSET of its state and two PEXPIREs (record and state); the batch's fences, claims,
-- leases and dead-letter entries go in one variadic HMGET, HDEL, ZREM and ZADD, before
-- any limit slot is released.
--
-- A burial with reason "cancelled" (the handler stopped on a cancel request) ends the job
-- cancelled instead: the same state, status cancelled, outside the dead-letter set, and it
-- leaves the census (it never runs again).
--
-- Returns one code per job: 1 dead (or cancelled), -1 refused (lease lost: nothing changed).
--- @include "clock"
--- @include "history"
--- @include "calls"
--- @include "parking"
--- @include "stats"
--- @include "claims"
--- @include "idem"
--- @include "records"
--- @include "record_keys"
--- @include "followups"
--- @include "groups"
--- @include "ended"
local now, dead_ttl, n = clock(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local damaged = damaged_set((tonumber(ARGV[4 + n * 8]) or 0) > 0 and {{'dead', K.dead}, {'scheduled', K.scheduled}}
  or {{'dead', K.dead}})
if damaged then return damaged end
local out = {}
local ids, dead_ids, slots = {}, {}, {}
local seen = {}
local ended = {}  -- waited jobs buried in this batch
-- A requeued job's death is a death of its own: its ON_FAILURE job is <id>.f<n> (n the
-- requeues plus one; relay.py's lost_destinations names it alike), not the first
-- death's <id>.f, which would be known already and never written (place -> n).
local again = {}
local held = batch_claims(K.claims, 4, 8, n)
for i = 0, n - 1 do
  local b = 4 + i * 8
  local id, token, reason, err = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3]
  local entry, refund, fields = ARGV[b + 4], tonumber(ARGV[b + 5]), ARGV[b + 6]
  local jk = K.job_prefix .. id
  local sk = jk .. ':s'
  -- The same claim twice in one batch settles once (seen), refused the second time.
  local c = not seen[id] and fence(held[i + 1], token)
  local f = c and redis.pcall('HMGET', sk, 'history', 'requeued')
  if not c or f.err then
    out[#out + 1] = -1
  else
    seen[id] = true
    local cancelled = reason == 'cancelled'
    local set = {'status', cancelled and 'cancelled' or 'dead', 'reason', reason, 'finished_ms', now,
      'attempt', c.attempt - refund, 'started_ms', ARGV[b + 7] ~= '' and ARGV[b + 7] or c.started}
    if err ~= '' then
      set[#set + 1] = 'error'
      set[#set + 1] = err
    end
    with_history(set, f[1], entry)
    redis.call('HSET', sk, unpack(set))
    rec_expire(jk, dead_ttl)
    local rec = (c.idem or c.res) and rec_load(jk) or nil
    if rec then free_idem(K.idem_prefix, rec.type, rec.idem_key, id, dead_ttl) end
    ids[#ids + 1] = id
    if cancelled then
      redis.call('HDEL', sk, 'cancel_requested')
      redis.pcall('ZADD', K.cancelled, now, id)  -- (a listing only: damaged, it costs no job)
      local r = rec or rec_load(jk)
      if r then census(K.census, r.type .. '|' .. r.version, -1) end
    else
      dead_ids[#dead_ids + 1] = now
      dead_ids[#dead_ids + 1] = id
    end
    if rec and c.res then slots[#slots + 1] = {rec.limits, token} end
    if c.waited then ended[#ended + 1] = id end
    local requeued = whole_count(f[2])
    if requeued >= 1 then again[i + 1] = string.format('%d', requeued + 1) end
    bump(fields)
    out[#out + 1] = 1
  end
end
unclaim(K.claims, K.leases, ids)
call_many('ZADD', K.dead, dead_ids, 2)
for _, s in ipairs(slots) do
  release_limits(K.lim_prefix, s[1], s[2], now, K.job_prefix, K.ready, K.notify, K.limwait, K.prio)
end
local fb = 4 + n * 8
local m = tonumber(ARGV[fb]) or 0
local Q = {ready = K.ready, scheduled = K.scheduled, delayed = K.delayed, stats = K.stats, job = K.job_prefix, idem = K.idem_prefix, prio = K.prio,
  claims = K.claims, done_meta = K.done_meta, done = K.done_prefix}
if m > 0 then
  write_followups(Q, now, out, fb, m, K.outbox, K.notify, K.census, again)
  -- A dead job keeps its state: its children (the ON_FAILURE job) go there, for readers.
  local kids = {}
  for i = 0, m - 1 do
    local b = fb + 1 + i * 15
    local place = tonumber(ARGV[b])
    if (out[place] or -1) > 0 then
      local pid = ARGV[4 + (place - 1) * 8]
      kids[pid] = (kids[pid] and kids[pid] .. ',' or '') .. ARGV[b + 2] .. (again[place] or '')
    end
  end
  for pid, ids in pairs(kids) do redis.call('HSET', K.job_prefix .. pid .. ':s', 'children', ids) end
end
local gb = fb + 1 + m * 15
if (tonumber(ARGV[gb]) or 0) > 0 then
  group_members({group = K.group_prefix, Q = Q, notify = K.notify, census = K.census, outbox = K.outbox}, now, out, gb)
end
flush(K.stats)
announce(K.ended, ended)
return out
