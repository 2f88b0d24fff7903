-- promote: move due jobs (delayed, retrying, handed back, waiting ones at their timeout)
-- from scheduled, and sleeping ones from sleeping (a sleeping job is in that set alone: see
-- suspend.lua), to ready, and sweep the limit keys with parked jobs: a key whose holders
-- lapsed without a release (their worker died before any reclaim) wakes its parked jobs
-- here, so none is stranded. A sleeping job suspended by the release before is in both
-- sets: it wakes from scheduled and leaves sleeping with it.
--
-- KEYS[1] scheduled    ZSET  id -> due ms
-- KEYS[2] ready        LIST
-- KEYS[3] notify       LIST
-- KEYS[4] job_prefix   (string)
-- KEYS[5] lim_prefix   (string)
-- KEYS[6] limwait      ZSET  limit keys with parked jobs -> next sweep ms
-- KEYS[7] prio         ZSET  (a job of priority 1-9 goes back there: to_ready in includes/ready.lua)
-- KEYS[8] sleeping     ZSET  sleeping ids -> wake ms: read after scheduled, within the same
--                            bound; an id there whose job no longer sleeps is dropped
-- KEYS[9] waiting      ZSET  the waiting ids of scheduled (a wait's timeout, a parent's look)
-- KEYS[10] delayed     ZSET  the ids of scheduled that are scheduled or retrying -> due (ms): the
--                            scheduled list's own index (see keys.py)
-- KEYS[11] dead        ZSET  id -> time of death ms (a sleeper whose state is gone or lost its status)
-- KEYS[12] stats       HASH  (its 'dead|?')
-- ARGV[1] now, ms ('' for the server's clock)
-- ARGV[2] the most ids to take from scheduled and sleeping together in this call (and a
--         twentieth as many keys to sweep)
-- ARGV[3] dead retention, ms ('' or 0: its keys get no expiry; see rec_expire)
--
-- A sleeping job is in no other structure, so an id of the sleeping set is dropped only
-- when its job is elsewhere (a known status other than sleeping) or gone (neither record
-- nor state). A state of another type, or an unknown status, goes to claim, which buries
-- it with the reason; a state gone or without its status, the record still there, is
-- buried here (claim would run it as a fresh queued job, its steps run again).
--
-- Returns {moved, ms until the next due job (or the next sweep), -1 when none}.
--- @include "clock"
--- @include "ready"
--- @include "limits"
--- @include "parking"
--- @include "record_keys"
--- @include "asleep"
--- @include "stats"
local now, limit = clock(ARGV[1]), tonumber(ARGV[2])
local dead_ttl = tonumber(ARGV[3] or '') or 0
local moved = 0
local KNOWN = {queued = true, scheduled = true, processing = true, retrying = true, deferred = true,
  waiting = true, done = true, dead = true, cancelled = true}
-- One due id of scheduled (from_sleeping false) or of sleeping (true) to ready.
local function promote_one(id, due, from_sleeping)
  local jk = K.job_prefix .. id
  -- pcall: a state key of another type is claim's to bury, with the reason.
  local f = redis.pcall('HMGET', jk .. ':s', 'status', 'priority', 'attempt', 'run_attempt', 'sleep')
  local st, prio = nil, nil
  if type(f) == 'table' and not f.err then st, prio = f[1], f[2] else st, f = f, {} end
  if from_sleeping then
    redis.call('ZREM', K.sleeping, id)
    if KNOWN[st] then return end  -- a stale id: its job was woken, cancelled, ended elsewhere
    if not st then
      -- Gone (deleted, or its dead keys expired): nothing to move. Else damaged: buried
      -- with the reason, as claim buries a record it cannot run.
      local has_rec, has_state = redis.call('EXISTS', jk) == 1, redis.call('EXISTS', jk .. ':s') == 1
      if not (has_rec or has_state) then return end
      local why = has_state and 'its state has no status' or 'its state is missing'
      redis.call('HSET', jk .. ':s', 'status', 'dead', 'finished_ms', now,
        'reason', 'malformed record: ' .. why .. ' (a sleeping job; its step log may be lost)')
      redis.call('ZADD', K.dead, now, id)
      rec_expire(jk, dead_ttl)
      stat_add(K.stats, 'dead|?', 1)
      return
    end
    redis.call('ZREM', K.scheduled, id)
  else
    redis.call('ZREM', K.scheduled, id)
    -- Off its list index with it (any other state's id leaves delayed: a stray there is
    -- never listed, and this is its last chance to go).
    if st == 'sleeping' then
      redis.pcall('ZREM', K.sleeping, id)
    elseif st == 'waiting' then
      redis.pcall('ZREM', K.waiting, id)
    else
      redis.pcall('ZREM', K.delayed, id)
    end
  end
  -- (sleeping, waiting: a durable function's sleep or wait ended, see suspend.lua)
  if st == 'sleeping' then
    -- A woken sleeper gets back the fields its sleep left out (includes/asleep.lua).
    redis.call('HSET', jk .. ':s', unpack(asleep_woken({'status', 'queued'}, due, f[3], f[4], f[5])))
    if f[5] then redis.call('HDEL', jk .. ':s', 'sleep') end
  elseif st == 'scheduled' or st == 'retrying' or st == 'waiting' then
    redis.call('HSET', jk .. ':s', 'status', 'queued')
  end
  -- Any other state is handed to claim, which buries a malformed record with a reason
  -- and drops a stray id; promote never decides that on its own. A job with neither
  -- record nor state is gone (deleted): nothing to move.
  if st or redis.call('EXISTS', jk) == 1 then
    to_ready(K.ready, K.prio, id, prio, now, false)
    moved = moved + 1
  end
end
-- Each due set's head is read first: most calls find nothing due, and then that read is
-- all the call sends for the set (its score is also the next-due time in the answer).
-- A set a call moved jobs from is read again for the answer.
local function is_due(first) return first[2] ~= nil and tonumber(first[2]) <= now end
local nxt = redis.call('ZRANGE', K.scheduled, 0, 0, 'WITHSCORES')
local taken = 0
if is_due(nxt) then
  local ids = redis.call('ZRANGEBYSCORE', K.scheduled, '-inf', now, 'WITHSCORES', 'LIMIT', 0, limit)
  for i = 1, #ids, 2 do promote_one(ids[i], ids[i + 1], false) end
  taken, nxt = #ids / 2, nil
end
-- pcall: a sleeping key of another type wakes nothing here; the reclaim puts it aside.
-- Read after scheduled's moves (a sleeper of the release before leaves both sets).
local wakes = redis.pcall('ZRANGE', K.sleeping, 0, 0, 'WITHSCORES')
if wakes.err then wakes = {} end
if taken < limit and is_due(wakes) then
  local asleep = redis.call('ZRANGEBYSCORE', K.sleeping, '-inf', now, 'WITHSCORES', 'LIMIT', 0, limit - taken)
  for i = 1, #asleep, 2 do promote_one(asleep[i], asleep[i + 1], true) end
  wakes, nxt = nil, nil  -- (such a sleeper of the release before left scheduled too)
end
if moved > 0 then wake(K.notify) end
-- The sweep: each due key wakes what its free slots allow; the limit is read off the
-- first parked job's record.
local sweep = redis.call('ZRANGE', K.limwait, 0, 0, 'WITHSCORES')
local swept = is_due(sweep) and
  redis.call('ZRANGEBYSCORE', K.limwait, '-inf', now, 'LIMIT', 0, math.max(1, math.floor(limit / 20))) or {}
if #swept > 0 then sweep = nil end
for _, key in ipairs(swept) do
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
nxt = nxt or redis.call('ZRANGE', K.scheduled, 0, 0, 'WITHSCORES')
if not wakes then
  wakes = redis.pcall('ZRANGE', K.sleeping, 0, 0, 'WITHSCORES')
  if wakes.err then wakes = {} end
end
sweep = sweep or redis.call('ZRANGE', K.limwait, 0, 0, 'WITHSCORES')
for _, first in ipairs({nxt, wakes, sweep}) do
  if first[2] then
    local s = math.max(0, tonumber(first[2]) - now)
    if due < 0 or s < due then due = s end
  end
end
return {moved, due}
