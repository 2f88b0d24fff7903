-- Taking and giving back limit slots, parking jobs on a full limit and waking them.
--- @include "limits"
--- @include "ready"

-- Wake parked jobs of one limit key while it has free slots: each woken job gets a
-- reserved slot and goes to the consumer end of ready (or the front of its priority).
-- Stale entries (a job cancelled, requeued or otherwise no longer parked) are skipped.
-- Returns how many were woken.
local function wake_parked(lim_prefix, key, n, now, job_prefix, ready_key, notify_key, limwait_key, prio_key)
  local k = lim_prefix .. key
  local wk = k .. ':w'
  local parked = redis.pcall('LLEN', wk)
  if type(parked) ~= 'number' or parked == 0 then
    -- Nobody waits (the common case of a release): nothing to wake, and the key leaves
    -- the sweep's index. A damaged waiter list is renamed aside.
    if type(parked) ~= 'number' then heal_limit(k) end
    if limwait_key then redis.call('ZREM', limwait_key, key) end
    return 0
  end
  purge_holders(k, now)
  local woke = 0
  for _ = 1, 64 do
    if redis.call('ZCARD', k) >= n then break end
    local w = redis.pcall('LPOP', wk)
    if type(w) ~= 'string' then break end
    local sk = job_prefix .. w .. ':s'
    local st = redis.pcall('HMGET', sk, 'status', 'priority')
    if type(st) == 'table' and st[1] == 'deferred' then
      redis.call('ZADD', k, now + RESERVE_MS, '=' .. w)
      redis.call('HSET', sk, 'status', 'queued', 'ready_ms', now, 'woken', '1')
      to_ready(ready_key, prio_key, w, st[2], now, true)
      woke = woke + 1
    end
  end
  if woke > 0 then wake(notify_key) end
  if limwait_key and redis.call('EXISTS', wk) == 0 then redis.call('ZREM', limwait_key, key) end
  return woke
end

-- A woken job that will not take the slots reserved for it (a duplicate, expired or
-- cancelled before its claim) hands each to the next parked job of its key now.
local function give_up_reserved(lim_prefix, limits, id, now, job_prefix, ready_key, notify_key, limwait_key,
    prio_key)
  for _, l in ipairs(limits) do
    if redis.call('ZREM', lim_prefix .. l.key, '=' .. id) == 1 then
      wake_parked(lim_prefix, l.key, l.n, now, job_prefix, ready_key, notify_key, limwait_key, prio_key)
    end
  end
end

-- Give back every slot a claim token holds and wake the next parked job of each key.
local function release_limits(lim_prefix, raw, token, now, job_prefix, ready_key, notify_key, limwait_key,
    prio_key)
  for _, l in ipairs(parse_limits(raw)) do
    on_holders('ZREM', lim_prefix .. l.key, token)
    wake_parked(lim_prefix, l.key, l.n, now, job_prefix, ready_key, notify_key, limwait_key, prio_key)
  end
end

-- Take a slot of every limit for this claim, or none: returns nil when all were taken,
-- else the limit that is full (the job is parked on it). Only a woken job can hold a
-- reserved slot ("=<id>", see wake_parked) to take over; another never looks for one.
local function acquire_limits(lim_prefix, limits, id, token, now, lease, woken)
  for _, l in ipairs(limits) do
    local k = lim_prefix .. l.key
    -- Lapsed holders (their worker died before a reclaim released them) are purged only
    -- when the key looks full: purging only lowers the count, so it never turns a free
    -- slot into a full one (and it costs a command a start).
    local count = on_holders('ZCARD', k)
    local mine = woken and redis.call('ZSCORE', k, '=' .. id) and 1 or 0
    if count - mine >= l.n then
      purge_holders(k, now)
      mine = woken and redis.call('ZSCORE', k, '=' .. id) and 1 or 0
      if redis.call('ZCARD', k) - mine >= l.n then return l end
    end
  end
  for _, l in ipairs(limits) do
    local k = lim_prefix .. l.key
    if woken then redis.call('ZREM', k, '=' .. id) end
    redis.call('ZADD', k, now + lease, token)
  end
  return nil
end

-- Park a job on a full limit: it leaves every structure but the key's waiter list. A job
-- that was woken before and lost its reserved slot goes back to the head of the line.
local function park(lim_prefix, l, id, jk, deferrals, woken, now, limwait_key)
  heal_limit(lim_prefix .. l.key)
  local wk = lim_prefix .. l.key .. ':w'
  redis.call('HSET', jk .. ':s', 'status', 'deferred', 'deferrals', deferrals + 1)
  redis.call('HDEL', jk .. ':s', 'woken')
  if woken then
    redis.call('LPUSH', wk, id)
    -- Counted, so a page of the deferred list (counting its place from the head) knows how
    -- far these pushed the ids its cursor keeps (seek_list.lua); kept a day past the last.
    -- (pcall: a key of another type there, a limit's own name, must not fail the park)
    if type(redis.pcall('INCR', wk .. ':heads')) == 'number' then
      redis.call('PEXPIRE', wk .. ':heads', 86400000)
    end
  else
    redis.call('RPUSH', wk, id)
  end
  redis.call('ZADD', limwait_key, 'NX', now + 1000, l.key)
end
