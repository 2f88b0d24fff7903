-- promote: move due jobs (delayed, retrying, handed back) from scheduled to ready, and
-- sweep the limit keys with parked jobs: a key whose holders lapsed without a release
-- (their worker died before any reclaim) wakes its parked jobs here, so none is stranded.
--
-- KEYS[1] scheduled    ZSET  id -> due ms
-- KEYS[2] ready        LIST
-- KEYS[3] notify       LIST
-- KEYS[4] job_prefix   (string)
-- KEYS[5] lim_prefix   (string)
-- KEYS[6] limwait      ZSET  limit keys with parked jobs -> next sweep ms
-- KEYS[7] prio         ZSET  (a job of priority 1-9 goes back there: to_ready in includes/ready.lua)
-- KEYS[8] sleeping     ZSET  the sleeping ids of scheduled (the sleeping list's index): a
--                            woken one leaves it with scheduled
-- KEYS[9] waiting      ZSET  the same for the waiting ones (a wait's timeout, a parent's look)
-- KEYS[10] delayed     ZSET  the ids of scheduled that are scheduled or retrying -> due (ms): the
--                            scheduled list's own index (see keys.py)
-- ARGV[1] now, ms ('' for the server's clock)
-- ARGV[2] the most jobs to move in this call (and a twentieth as many keys to sweep)
--
-- Returns {moved, ms until the next due job (or the next sweep), -1 when none}.
--- @include "clock"
--- @include "ready"
--- @include "limits"
--- @include "parking"
--- @include "record_keys"
local now, limit = clock(ARGV[1]), tonumber(ARGV[2])
local ids = redis.call('ZRANGEBYSCORE', K.scheduled, '-inf', now, 'LIMIT', 0, limit)
local moved = 0
for _, id in ipairs(ids) do
  redis.call('ZREM', K.scheduled, id)
  local jk = K.job_prefix .. id
  -- pcall: a state key of another type is claim's to bury, with the reason.
  local f = redis.pcall('HMGET', jk .. ':s', 'status', 'priority')
  local st, prio = nil, nil
  if type(f) == 'table' and not f.err then st, prio = f[1], f[2] else st = f end
  -- (sleeping, waiting: a durable function's sleep or wait ended, see suspend.lua)
  if st == 'scheduled' or st == 'retrying' or st == 'sleeping' or st == 'waiting' then
    redis.call('HSET', jk .. ':s', 'status', 'queued')
  end
  -- Off its list index with it (any other state's id leaves delayed: a stray there is
  -- never listed, and this is its last chance to go).
  if st == 'sleeping' then
    redis.pcall('ZREM', K.sleeping, id)
  elseif st == 'waiting' then
    redis.pcall('ZREM', K.waiting, id)
  else
    redis.pcall('ZREM', K.delayed, id)
  end
  -- Any other state is handed to claim, which buries a malformed record with a reason
  -- and drops a stray id; promote never decides that on its own. A job with neither
  -- record nor state is gone (deleted): nothing to move.
  if st or redis.call('EXISTS', jk) == 1 then
    to_ready(K.ready, K.prio, id, prio, now, false)
    moved = moved + 1
  end
end
if moved > 0 then wake(K.notify) end
-- The sweep: each due key wakes what its free slots allow; the limit is read off the
-- first parked job's record.
for _, key in ipairs(redis.call('ZRANGEBYSCORE', K.limwait, '-inf', now, 'LIMIT', 0, math.max(1, math.floor(limit / 20)))) do
  heal_limit(K.lim_prefix .. key)
  local first = redis.call('LINDEX', K.lim_prefix .. key .. ':w', 0)
  local n = nil
  if first then
    local rec = rec_load(K.job_prefix .. first)
    for _, l in ipairs(parse_limits(rec and rec.limits or nil)) do
      if l.key == key then n = l.n end
    end
  end
  if n then
    wake_parked(K.lim_prefix, key, n, now, K.job_prefix, K.ready, K.notify, K.limwait, K.prio)
    if redis.call('EXISTS', K.lim_prefix .. key .. ':w') == 1 then redis.call('ZADD', K.limwait, now + 1000, key) end
  elseif first then
    redis.call('LPOP', K.lim_prefix .. key .. ':w')  -- a stale entry: the next sweep looks again
    redis.call('ZADD', K.limwait, now, key)
  else
    redis.call('ZREM', K.limwait, key)
  end
end
local due = -1
local nxt = redis.call('ZRANGE', K.scheduled, 0, 0, 'WITHSCORES')
if nxt[2] then due = math.max(0, tonumber(nxt[2]) - now) end
local sweep = redis.call('ZRANGE', K.limwait, 0, 0, 'WITHSCORES')
if sweep[2] then
  local s = math.max(0, tonumber(sweep[2]) - now)
  if due < 0 or s < due then due = s end
end
return {moved, due}
