-- cancel: end a job that has not run, or ask a running one to stop.
--
-- A queued, scheduled, retrying or deferred job becomes "cancelled" at once: a terminal
-- status in its state hash, kept (record and state) for the retention given, like a dead
-- job but outside the dead-letter set. Its id may still sit in ready or on a limit's
-- waiter list: claim and the limit wake-up skip any job whose status is not queued or
-- deferred, so it never runs. A job claimed ahead (prefetched, not started) loses its
-- claim here, so its worker's start is refused. A running job gets the 'c' flag in its
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
-- ARGV[1] now, ms ('' for the server's clock)
-- ARGV[2] job id
-- ARGV[3] retention, ms
--
-- Returns {code, status}: 1 cancelled, 2 stop requested (running), -1 no such job,
-- -2 ended already (status done, dead or cancelled).
local now, id, ttl = clock(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local jk = KEYS[1]
local sk = jk .. ':s'

local function finish(rec)
  redis.call('HSET', sk, 'status', 'cancelled', 'reason', 'cancelled', 'finished_ms', now)
  redis.call('HDEL', sk, 'cancel_requested')
  redis.call('ZREM', KEYS[4], id)
  redis.call('ZADD', KEYS[10], now, id)
  rec_expire(jk, ttl)
  free_idem(KEYS[7], rec.type, rec.idem_key, id)
  census(KEYS[8], rec.type .. '|' .. rec.version, -1)
  if waited(rec.meta) then announce(KEYS[9], {id}) end
  return {1, 'cancelled'}
end

local rec = rec_load(jk)
if not rec then
  if done_has(KEYS[5], KEYS[6], id) then return {-2, 'done'} end
  return {-1, ''}
end
local c = parse_claim(redis.call('HGET', KEYS[2], id))
if c then
  if c.prefetched then
    redis.call('HDEL', KEYS[2], id)
    redis.call('ZREM', KEYS[3], id)
    return finish(rec)
  end
  if not c.cancel then
    c.cancel = true
    redis.call('HSET', KEYS[2], id, claim_entry(c.token, c.attempt, c.started, c))
  end
  redis.call('HSET', sk, 'cancel_requested', '1')
  return {2, 'processing'}
end
local status = redis.pcall('HGET', sk, 'status')
if type(status) == 'table' then return {-1, ''} end
status = status or 'queued'
if status == 'done' or status == 'dead' or status == 'cancelled' then return {-2, status} end
return finish(rec)
