-- cancel: end a job that has not run, or ask a running one to stop.
--
-- A queued, scheduled, retrying or deferred job becomes "cancelled" at once: a terminal
-- status in its state hash, kept (record and state) for the retention given, like a dead
-- job but outside the dead-letter set. Its id may still sit in ready (deeper than
-- unready below looks) or on a limit's waiter list: claim and the limit wake-up skip
-- any job whose status is not queued or deferred, so it never runs. A job claimed ahead (prefetched, not started) cannot be
-- ended here without a race: its worker may be starting it this instant. Its claim gets
-- the 'c' flag and its id and token are published on the queue's cancels channel; the
-- worker holding it drops it if its handler has not started (it hands the claim back,
-- and the next claim ends the job cancelled: see claim.lua) or tells the handler, as for
-- a running job, if it just did. A worker that misses the notice hears it from its next
-- renewal or start mark. A running job gets the 'c' flag in its
-- claim entry (fenced by that claim's token: a later claim starts without it) and
-- cancel_requested in its state, so the renewal tells its worker and a reclaim after a
-- crash cancels it instead of running it again.
--
-- KEYS[1] job          STRING  the record (state: K.job .. ':s')
-- KEYS[2] claims       HASH    id -> claim
-- KEYS[3] leases       ZSET
-- KEYS[4] scheduled    ZSET
-- KEYS[5] done_meta    HASH
-- KEYS[6] done_prefix  (string)
-- KEYS[7] idem_prefix  (string)
-- KEYS[8] census       HASH
-- KEYS[9] ended        channel  (see waited in includes/ended.lua)
-- KEYS[10] cancelled   ZSET    cancelled ids -> time of the cancel ms (the job list's index)
-- KEYS[11] cancels     channel "<id> <token>" of prefetched claims cancelled
-- KEYS[12] group_prefix (string; a group's member cancelled here counts down: group_settle in includes/groups.lua)
-- KEYS[13] job_prefix  (string; a complete group's then-job is written here)
-- KEYS[14] ready       LIST
-- KEYS[15] notify      LIST
-- KEYS[16] stats       HASH
-- KEYS[17] outbox      LIST
-- KEYS[18] prio        ZSET  ids of priority 1-9 (a cancelled one leaves it; a complete
--                            group's then-job of priority goes there)
-- KEYS[19] lim_prefix   (string; a job woken from a limit's waiters gives its reserved
--                        slot to the next waiter: see wake_parked in includes/parking.lua)
-- KEYS[20] limwait     ZSET
-- KEYS[21] sleeping    ZSET  sleeping ids -> wake ms (suspend.lua; one the release before
--                            suspended is in scheduled too): a cancelled one leaves both
-- KEYS[22] waiting     ZSET  the same for the waiting ones
-- KEYS[23] delayed     ZSET  the ids of scheduled that are scheduled or retrying -> due (ms): the
--                            scheduled list's own index (see keys.py)
-- KEYS[24] dead        ZSET  (a job whose state key is damaged is dead when it is in it)
-- ARGV[1] now, ms ('' for the server's clock)
-- ARGV[2] job id
-- ARGV[3] retention, ms
-- ARGV[4] history entry (a JSON object without at_ms: who asked, see Client.cancel; '' none),
--         stamped with this call's time and added to the job's history unless it had ended
--
-- ARGV[5] batch size ('' one job: ARGV[2]); see "A batch of deferred jobs" below
-- ARGV[6] with a batch: only jobs of this type ('' any)
-- ARGV[7] with a batch: the id the previous batch left in place last ('' from the head)
-- ARGV[8] with a batch: the limit whose waiters K.job holds ('' a held list)
-- ARGV[9] with a batch: the most bytes of records it reads ('' no bound; at least one job)
--
-- Returns {code, status}: 1 cancelled, 2 stop requested (running), 3 claimed ahead: its
-- worker drops it (the caller reads the job to learn which way it went), -1 no such job,
-- -2 ended already (status done, dead or cancelled); and a third value, 'state', when the
-- job's state key held another Redis type (another writer's damage). Its status is then
-- what the queue's sets say: dead or cancelled in theirs (-2, the key left as it is), else
-- the key is set aside as <key>:corrupt before anything is written, and the job is
-- cancelled as one with no state yet (a claimed one asked to stop). A raise midway left
-- the claim flagged and the state unwritten.
--
-- A batch of deferred jobs (`runner cancel --all --status deferred`): K.job is then a
-- deferred list (a paused function's held list, or a limit's waiters) and this call
-- takes up to ARGV[5] of its deferred jobs out of it and ends them cancelled, first to
-- be woken first. Read and cancelled in one step, a job cannot be woken (and run) between
-- being found and being cancelled. Bounded: at most 4 x ARGV[5] entries read, from just
-- after ARGV[7] (found with LPOS within the first 100,000; from the head if it left).
-- An entry left in place (another type, or no longer deferred: the wake-up drops it) is
-- passed over. Bounded by bytes too: each record is read whole (about 7 ms of Redis a
-- MiB), so the batch stops before the record that would take those it read (cancelled
-- or passed over for their type) past ARGV[9] (a STRLEN first), and says there is more.
-- Returns {1 more to read (0: the list is read to its end), the id to go on after (''
-- from the head), id cancelled, ...}.
--- @include "clock"
--- @include "history"
--- @include "limits"
--- @include "parking"
--- @include "stats"
--- @include "claims"
--- @include "record_keys"
--- @include "done"
--- @include "groups"
--- @include "ended"
local now, ttl = clock(ARGV[1]), tonumber(ARGV[3])

-- Who asked, in the job's history (its state hash: a running job's claim has the 's'
-- flag set below; a cancelled one gets its state in finish).
local function note(sk)
  local set = {}
  with_history(set, redis.call('HGET', sk, 'history'), stamped(ARGV[4], now))
  if #set > 0 then redis.call('HSET', sk, unpack(set)) end
end

-- A queued job's id leaves ready too when it sits within 1,000 entries of either end
-- (bounded: each LPOS reads at most 1,000 entries, and the LREM stops where it found
-- it), so the ready count and the oldest wait stop counting it at once (with no worker
-- to pass over it, as on a paused queue, they did for ever). One deeper stays, skipped by
-- the claim as before. The id it leaves in its place, its neighbor toward the consumer
-- end ('' at that end), goes in the job's state as list_next: a job list whose cursor
-- kept this id resumes there (seek_list.lua), where a cancel of every id a cursor keeps
-- had looked like workers claiming past them.
local function unready(id, sk)
  if not K.ready then return end
  local at = redis.call('LPOS', K.ready, id, 'MAXLEN', 1000)
  local from = 1
  if not at then
    at = redis.call('LPOS', K.ready, id, 'RANK', -1, 'MAXLEN', 1000)
    from = -1
  end
  if not at then return end
  local len = redis.call('LLEN', K.ready)
  local nxt = ''
  if at + 1 < len then  -- (LINDEX from the nearer end: at most 1,000 entries)
    nxt = redis.call('LINDEX', K.ready, from == 1 and at + 1 or at + 1 - len)
  end
  redis.call('HSET', sk, 'list_next', nxt)
  redis.call('LREM', K.ready, from, id)
end

local function finish(jk, id, rec)
  local sk = jk .. ':s'
  redis.call('ZREM', K.scheduled, id)
  if K.sleeping then
    redis.pcall('ZREM', K.sleeping, id)
    redis.pcall('ZREM', K.waiting, id)
  end
  if K.delayed then redis.pcall('ZREM', K.delayed, id) end
  if K.lim_prefix and rec.limits ~= '' and redis.call('HGET', sk, 'woken') == '1' then
    give_up_reserved(K.lim_prefix, parse_limits(rec.limits), id, now, K.job_prefix, K.ready, K.notify, K.limwait, K.prio)
  end
  -- Out of the priority set at once (cheap; an id left in ready is skipped by the claim).
  if K.prio then redis.call('ZREM', K.prio, id) end
  end_cancelled(jk, id, rec, now, ttl, K.idem_prefix, K.census, K.cancelled, K.ended)
  tally('cancelled|' .. rec.type)  -- an outcome of its own, never counted dead
  if K.group_prefix then
    group_cancelled({group = K.group_prefix, notify = K.notify, census = K.census, outbox = K.outbox,
      Q = {ready = K.ready, scheduled = K.scheduled, delayed = K.delayed, stats = K.stats, job = K.job_prefix, idem = K.idem_prefix, claims = K.claims,
        prio = K.prio,
        done_meta = K.done_meta, done = K.done_prefix}}, now, id, rec)
  end
  return {1, 'cancelled'}
end


if ARGV[5] ~= nil and ARGV[5] ~= '' then
  local list, n, only, after = K.job, tonumber(ARGV[5]), ARGV[6], ARGV[7]
  local most, read, full = tonumber(ARGV[9] or ''), 0, false
  local start = 0
  if after ~= '' then
    local at = redis.call('LPOS', list, after, 'MAXLEN', 100000)
    if at then start = at + 1 end
  end
  local entries = redis.call('LRANGE', list, start, start + 4 * n - 1)
  local out, last, count = {}, '', 0
  -- The id just before each one taken out (toward the head, where a deferred list's pages
  -- go), kept in its state as list_next for a job list's cursor (see unready above).
  local before = start > 0 and after or ''
  for _, id in ipairs(entries) do
    if count >= n then break end
    local jk = K.job_prefix .. id
    local st = redis.pcall('HMGET', jk .. ':s', 'status')
    local deferred = type(st) == 'table' and st[1] == 'deferred'
    if deferred and most then
      local size = redis.pcall('STRLEN', jk)
      size = type(size) == 'number' and size or 0
      if read > 0 and read + size > most then
        full = true
        break
      end
      read = read + size
    end
    local rec = deferred and rec_load(jk) or nil
    if rec and (only == '' or rec.type == only) then
      redis.call('HSET', jk .. ':s', 'list_next', before)
      redis.call('LREM', list, 1, id)
      note(jk .. ':s')
      finish(jk, id, rec)
      count = count + 1
      out[#out + 1] = id
    else
      last = id
      before = id
    end
  end
  if ARGV[8] ~= '' and redis.call('EXISTS', list) == 0 then redis.call('ZREM', K.limwait, ARGV[8]) end
  if K.stats then flush(K.stats) end  -- once for the batch: one HINCRBY per type
  local more = (full or count >= n or #entries == 4 * n) and 1 or 0
  local reply = {more, last ~= '' and last or after}
  for _, id in ipairs(out) do reply[#reply + 1] = id end
  return reply
end

do
  local id = ARGV[2]
  local jk = K.job
  local sk = jk .. ':s'
  local rec = rec_load(jk)
  if not rec then
    if done_has(K.done_meta, K.done_prefix, id) then return {-2, 'done'} end
    return {-1, ''}
  end
  local status = redis.pcall('HGET', sk, 'status')
  local damaged = type(status) == 'table'
  if damaged then
    if K.dead and redis.call('ZSCORE', K.dead, id) then return {-2, 'dead', 'state'} end
    if redis.call('ZSCORE', K.cancelled, id) then return {-2, 'cancelled', 'state'} end
    redis.call('RENAME', sk, sk .. ':corrupt')
    status = false
  end
  local function said(out)
    if damaged then out[3] = 'state' end
    return out
  end
  local c = parse_claim(redis.call('HGET', K.claims, id))
  if c then
    if not c.cancel then
      c.cancel = true
      c.state = true  -- it has one from here on (cancel_requested)
      redis.call('HSET', K.claims, id, claim_entry(c.token, c.attempt, c.started, flags_of(c)))
    end
    redis.call('HSET', sk, 'cancel_requested', '1')
    note(sk)
    if c.prefetched then
      redis.pcall('PUBLISH', K.cancels, id .. ' ' .. c.token)  -- (refused channels: the worker sees it at start)
      return said({3, 'queued'})
    end
    return said({2, 'processing'})
  end
  -- (a damaged state's job in neither set: queued, or scheduled when that set holds it)
  if damaged and redis.call('ZSCORE', K.scheduled, id) then status = 'scheduled' end
  status = status or 'queued'
  if status == 'done' or status == 'dead' or status == 'cancelled' then return {-2, status} end
  note(sk)
  if status == 'queued' then unready(id, sk) end
  local out = finish(jk, id, rec)
  if K.stats then flush(K.stats) end
  return said(out)
end
