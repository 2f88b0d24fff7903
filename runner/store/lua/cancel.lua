-- cancel: end a job that has not run, or ask a running one to stop.
--
-- A queued, scheduled, retrying or deferred job becomes "cancelled" at once: a terminal
-- status in its state hash, kept (record and state) for the retention given, like a dead
-- job but outside the dead-letter set. Its id may still sit in ready or on a limit's
-- waiter list: claim and the limit wake-up skip any job whose status is not queued or
-- deferred, so it never runs. A job claimed ahead (prefetched, not started) cannot be
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
-- KEYS[1] job          STRING  the record (state: KEYS[1] .. ':s')
-- KEYS[2] claims       HASH    id -> claim
-- KEYS[3] leases       ZSET
-- KEYS[4] scheduled    ZSET
-- KEYS[5] done meta    HASH
-- KEYS[6] done prefix  (string)
-- KEYS[7] idem prefix  (string)
-- KEYS[8] census       HASH
-- KEYS[9] ended        channel  (see waited in _lib.lua)
-- KEYS[10] cancelled   ZSET    cancelled ids -> time of the cancel ms (the job list's index)
-- KEYS[11] cancels     channel "<id> <token>" of prefetched claims cancelled
-- KEYS[12] group prefix (string; a group's member cancelled here counts down: group_settle in _lib.lua)
-- KEYS[13] job prefix  (string; a complete group's then-job is written here)
-- KEYS[14] ready       LIST
-- KEYS[15] notify      LIST
-- KEYS[16] stats       HASH
-- KEYS[17] outbox      LIST
-- KEYS[18] prio        ZSET  ids of priority 1-9 (a cancelled one leaves it; a complete
--                            group's then-job of priority goes there)
-- KEYS[19] limit prefix (string; a job woken from a limit's waiters gives its reserved
--                        slot to the next waiter: see wake_parked in _lib.lua)
-- KEYS[20] limwait     ZSET
-- ARGV[1] now, ms ('' for the server's clock)
-- ARGV[2] job id
-- ARGV[3] retention, ms
-- ARGV[4] history entry (a JSON object without at_ms: who asked, see Client.cancel; '' none),
--         stamped with this call's time and added to the job's history unless it had ended
--
-- Returns {code, status}: 1 cancelled, 2 stop requested (running), 3 claimed ahead: its
-- worker drops it (the caller reads the job to learn which way it went), -1 no such job,
-- -2 ended already (status done, dead or cancelled).
local now, id, ttl = clock(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local jk = KEYS[1]
local sk = jk .. ':s'

-- Who asked, in the job's history (its state hash: a running job's claim has the 's'
-- flag set below; a cancelled one gets its state in finish).
local function note()
  local set = {}
  with_history(set, redis.call('HGET', sk, 'history'), stamped(ARGV[4], now))
  if #set > 0 then redis.call('HSET', sk, unpack(set)) end
end

local function finish(rec)
  redis.call('ZREM', KEYS[4], id)
  if KEYS[19] and rec.limits ~= '' and redis.call('HGET', sk, 'woken') == '1' then
    give_up_reserved(KEYS[19], parse_limits(rec.limits), id, now, KEYS[13], KEYS[14], KEYS[15], KEYS[20], KEYS[18])
  end
  -- Out of the priority set at once (cheap; an id left in ready is skipped by the claim).
  if KEYS[18] then redis.call('ZREM', KEYS[18], id) end
  end_cancelled(jk, id, rec, now, ttl, KEYS[7], KEYS[8], KEYS[10], KEYS[9])
  if KEYS[12] then
    group_cancelled({group = KEYS[12], notify = KEYS[15], census = KEYS[8], outbox = KEYS[17],
      Q = {ready = KEYS[14], scheduled = KEYS[4], stats = KEYS[16], job = KEYS[13], idem = KEYS[7], claims = KEYS[2],
        prio = KEYS[18],
        done_meta = KEYS[5], done = KEYS[6]}}, now, id, rec)
    flush(KEYS[16])
  end
  return {1, 'cancelled'}
end

local rec = rec_load(jk)
if not rec then
  if done_has(KEYS[5], KEYS[6], id) then return {-2, 'done'} end
  return {-1, ''}
end
local c = parse_claim(redis.call('HGET', KEYS[2], id))
if c then
  if not c.cancel then
    c.cancel = true
    c.state = true  -- it has one from here on (cancel_requested)
    redis.call('HSET', KEYS[2], id, claim_entry(c.token, c.attempt, c.started, flags_of(c)))
  end
  redis.call('HSET', sk, 'cancel_requested', '1')
  note()
  if c.prefetched then
    redis.call('PUBLISH', KEYS[11], id .. ' ' .. c.token)
    return {3, 'queued'}
  end
  return {2, 'processing'}
end
local status = redis.pcall('HGET', sk, 'status')
if type(status) == 'table' then return {-1, ''} end
status = status or 'queued'
if status == 'done' or status == 'dead' or status == 'cancelled' then return {-2, status} end
note()
return finish(rec)
