-- suspend: a claimed durable function's run ends at a sleep (ctx.sleep, ctx.sleep_until)
-- or a wait (ctx.wait_for_signal), fenced by its claim token: the entry joins the job's
-- step log (see step.lua),
-- the claim and lease go, its limit slots (RESOURCE_KEY, CONCURRENCY) are released, and
-- the job waits until it is due (promote.lua wakes it: status 'queued'), all in this one
-- step: a sleeping job in the sleeping set alone, whose score is its wake time (the set is
-- its list's index and its due index at once), a waiting one in scheduled and in the
-- waiting set. No attempt is spent (the state's attempt is left as it was, as a
-- deferral's), and 'suspended' marks a job that has started once: its MAX_AGE no longer
-- applies (claim.lua).
--
-- A sleeping job's state is kept small (a sleeping job's memory is most of what 100,000 of
-- them cost): its status, its log, and one 'sleep' field for the rest (includes/asleep.lua).
--
-- KEYS[1] leases       ZSET
-- KEYS[2] scheduled    ZSET  id -> due ms
-- KEYS[3] stats        HASH
-- KEYS[4] job_prefix   (string)
-- KEYS[5] lim_prefix   (string)
-- KEYS[6] ready        LIST  (a job woken by a freed slot goes here)
-- KEYS[7] notify       LIST
-- KEYS[8] claims       HASH  id -> claim
-- KEYS[9] limwait      ZSET  limit keys with parked jobs
-- KEYS[10] prio        ZSET
-- KEYS[11] idem_prefix (string)
-- KEYS[12] done_meta   HASH
-- KEYS[13] done_prefix (string)
-- KEYS[14] census      HASH
-- KEYS[15] outbox      LIST  (the child job of ctx.invoke)
-- KEYS[16] sleeping    ZSET  id -> due ms: the sleeping jobs, the scheduled set's of their
--                            kind (promote reads both) and the sleeping list's own index
-- KEYS[17] waiting     ZSET  the waiting ids of scheduled (a signal, an event, a child) -> due
--                            ms: the waiting list's own index
-- KEYS[18] delayed     ZSET  the same for scheduled and retrying ones (a delayed child job)
-- KEYS[19] log_prefix  (string) the job's log, LIST (joblog.lua)
-- KEYS[20] stream_prefix (string) the job's stream, LIST (joblog.lua)
-- ARGV[1] now, ms ('' for the server's clock)
-- ARGV[2] job id
-- ARGV[3] token
-- ARGV[4] position (0-based) of the sleep's entry in the step log
-- ARGV[5] entry (JSON object without started_ms and until_ms, which this call adds; a
--         sleep's compact array gets them as its last two elements, records.py); ''
--         when the log already holds it (a sleep resumed before its end sleeps again)
-- ARGV[6] delay, ms from now (ctx.sleep), or '' for ARGV[7]
-- ARGV[7] due, absolute epoch ms (ctx.sleep_until; also the recorded end of a sleep
--         resumed early)
-- ARGV[8] the most entries of a log
-- ARGV[9] the most bytes of a log
-- ARGV[10] stats fields (space-separated "name[=n]", see bump in _lib.lua)
-- ARGV[11] kind: 'sleep' (status 'sleeping') or 'signal' (status 'waiting', until the
--          signal ARGV[12] comes (signal.lua wakes it) or the timeout (due: promote));
--          'event' (ctx.wait_for_event) waits as 'signal' does, for the signal an event's
--          delivery sends ('event.<position>', client/waking.py)
-- ARGV[12] the signal's name (kind 'signal' or 'invoke')
-- ARGV[13] ms from now to the wait's end as its entry records it ('' the due time): a
--          child call's wait ends at its timeout, while the job is due earlier, to look
--          for the child's end should its signal have been lost
-- ARGV[14] m: 1 with a child job to write (kind 'invoke', ctx.invoke), 0 none; then in
--          ARGV[15..29] its 15 fields as ack.lua takes a follow-up (1, its queue or '' this
--          one, the 12 fields of enqueue.lua, its priority; '' each when none), written in
--          this same step (write_followups)
-- ARGV[30] 1: hold the job's limit slots while it is suspended (HOLD_LOCKS_WHILE_SUSPENDED):
--          each becomes a reservation ('=<id>', as a woken job's, see wake_parked in
--          _lib.lua) until 10 s past the wait's end, which its next claim takes over;
--          '' or 0: released now, the next parked job woken (the default)
-- ARGV[31] the retention of the job's log, ms ('' or 0: its expiry is left as it is)
-- ARGV[32] the handler's start, ms ('' the claim's; set for a run whose start mark was
--          not sent, as in retry.lua): the first run's start when this run is the first
--
-- Kind 'invoke' waits as 'signal' does: the child's end is its signal (the worker that
-- settles the child sends it; a parent due before that looks for the child itself).
--
-- The state keeps the attempt the run spent and when that attempt's first run began
-- ('run_attempt', 'run_started_ms'; a resumed run of the same attempt keeps the first
-- start), so a suspended job shows the attempt it ran and its start, not 0 and none;
-- the state's own 'attempt' stays the attempts spent before it (the next claim counts
-- from it, and a resume spends none). ack.lua ends the outcome with that first start.
--
-- A signal that came between the run's last look (wait.lua) and this call is kept in the
-- state ('sig:<name>'): the job then goes to ready at once, and its next run takes it.
--
-- Returns {code, due ms}: 1 suspended; -1 refused (lease lost: nothing changed); -2 the
-- log does not stand where the run read it (nothing changed); -3/-4 the log is full
-- (entries/bytes: nothing changed, the run fails with StepTooLarge).
--- @include "clock"
--- @include "claims"
--- @include "history"
--- @include "ready"
--- @include "record_keys"
--- @include "limits"
--- @include "parking"
--- @include "followups"
--- @include "stats"
--- @include "asleep"
local now = clock(ARGV[1])
local id, token, pos = ARGV[2], ARGV[3], tonumber(ARGV[4])
local c = fence(redis.call('HGET', K.claims, id), token)
if not c then return {-1} end
local damaged = damaged_set({{'scheduled', K.scheduled}, {'sleeping', K.sleeping}})
if damaged then return damaged end
local jk = K.job_prefix .. id
local sk = jk .. ':s'
local f = redis.call('HMGET', sk, 'steps', 'step_bytes', 'sleep')
local n, bytes = tonumber(f[1]) or 0, tonumber(f[2]) or 0
if not f[1] and f[3] then n, bytes = asleep_parts(f[3]) end  -- (not reached: a sleeping job has no claim)
n, bytes = n or 0, bytes or 0
local due = tonumber(ARGV[6]) and now + tonumber(ARGV[6]) or tonumber(ARGV[7])
local waits = ARGV[11] == 'signal' or ARGV[11] == 'invoke' or ARGV[11] == 'event'
local ran = redis.call('HMGET', sk, 'run_attempt', 'run_started_ms')
local first = (ran[1] == tostring(c.attempt) and ran[2]) or (ARGV[32] ~= '' and ARGV[32]) or c.started
local set = {'status', 'sleeping'}
if waits then
  set = {'status', 'waiting', 'ready_ms', due, 'suspended', '1', 'run_attempt', c.attempt, 'run_started_ms', first,
    'waiting_for', ARGV[12]}
end
if ARGV[5] ~= '' then
  if n ~= pos then return {-2} end
  if n + 1 > tonumber(ARGV[8]) then return {-3} end
  local ends = tonumber(ARGV[13]) and now + tonumber(ARGV[13]) or due
  local entry = stamped_as(stamped_as(ARGV[5], 'started_ms', now), 'until_ms', ends)
  if bytes + #entry > tonumber(ARGV[9]) then return {-4} end
  for _, v in ipairs({'step:' .. n, entry}) do set[#set + 1] = v end
  n, bytes = n + 1, bytes + #entry
elseif n <= pos then
  return {-2}
end
if waits then
  for _, v in ipairs({'steps', n, 'step_bytes', bytes}) do set[#set + 1] = v end
else
  for _, v in ipairs({'sleep', n .. ' ' .. bytes .. ' ' .. first}) do set[#set + 1] = v end
  -- (before the HSET: a listpack that shrank keeps the size it grew to)
  redis.call('HDEL', sk, 'steps', 'step_bytes', 'run_started_ms', 'ready_ms', 'suspended', 'run_attempt')
end
local early = waits and redis.call('HEXISTS', sk, 'sig:' .. ARGV[12]) == 1
if early then
  set[2] = 'queued'
  set[4] = now
end
redis.call('HSET', sk, unpack(set))
unclaim(K.claims, K.leases, {id})
if early then
  to_ready(K.ready, K.prio, id, redis.call('HGET', sk, 'priority'), now, false)
  wake(K.notify)
elseif waits then
  redis.call('ZADD', K.scheduled, due, id)
  redis.pcall('ZADD', K.waiting, due, id)
else
  redis.call('ZADD', K.sleeping, due, id)
end
if c.res then
  local rec = rec_load(jk)
  if rec and ARGV[30] == '1' then
    local ends = tonumber(ARGV[13]) and now + tonumber(ARGV[13]) or due
    for _, l in ipairs(parse_limits(rec.limits)) do
      on_holders('ZREM', K.lim_prefix .. l.key, token)
      redis.call('ZADD', K.lim_prefix .. l.key, ends + RESERVE_MS, '=' .. id)
    end
    redis.call('HSET', sk, 'woken', '1')
  elseif rec then
    release_limits(K.lim_prefix, rec.limits, token, now, K.job_prefix, K.ready, K.notify, K.limwait, K.prio)
  end
end
-- The log and stream were kept the retention from their last write: a sleep or a wait
-- longer than that would lose them while the job lives. They are kept until the wait
-- ends, plus the retention (never shortened).
local keep = tonumber(ARGV[31]) or 0
if keep > 0 then
  local ends = tonumber(ARGV[13]) and now + tonumber(ARGV[13]) or due
  local ttl = math.max(ends, due, now) - now + keep
  for _, key in ipairs({K.log_prefix .. id, K.stream_prefix .. id}) do
    local left = redis.call('PTTL', key)
    if left >= 0 and left < ttl then redis.call('PEXPIRE', key, ttl) end
  end
end
if (tonumber(ARGV[14]) or 0) > 0 then
  local Q = {ready = K.ready, scheduled = K.scheduled, delayed = K.delayed, stats = K.stats, job = K.job_prefix, idem = K.idem_prefix, prio = K.prio,
    claims = K.claims, done_meta = K.done_meta, done = K.done_prefix}
  write_followups(Q, now, {1}, 14, 1, K.outbox, K.notify, K.census)
end
bump(ARGV[10])
flush(K.stats)
return {1}
