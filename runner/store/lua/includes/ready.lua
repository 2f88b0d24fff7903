-- Putting a job back in ready and waking idle workers.

-- Wake idle workers, keeping the wake-up list short: one push, whose reply is the
-- length, and a trim to half the bound only once the bound is passed (no worker takes
-- the tokens), so a wake costs one command, where a length read before each push cost
-- two at light load. pcall: a wake-up list damaged to another type must not fail a
-- transition whose writes are already made (workers still poll on their own; the
-- scheduler renames the key aside).
local WAKE_MAX = 64
local function wake(notify_key)
  local len = redis.pcall('LPUSH', notify_key, '1')
  if type(len) == 'number' and len > WAKE_MAX then
    redis.call('LTRIM', notify_key, 0, WAKE_MAX / 2 - 1)
  end
end

-- Jobs put at the consumer end (the tail) of ready from outside a claim: counted in
-- <ready>:tails, so a page of the queued list knows how far past its cursor's place
-- (counted from the tail) they pushed the ids it keeps (seek_list.lua). A claim that pops
-- ids and puts some back in its own call moves no other id away from the tail: not
-- counted.
local function pushed_to_tail(ready_key, n)
  redis.pcall('INCRBY', ready_key .. ':tails', n)  -- (pcall: a count is no reason to fail a settle)
end

-- A job back to waiting for a worker (due after a delay or a backoff, released, its lease
-- lapsed, woken by a limit, resumed, requeued): one of priority 1-9 (its state's
-- 'priority', written at enqueue) goes to the priority set, so it keeps its place ahead
-- of plain jobs wherever it comes back from; else to ready. ``next``: it is the next of
-- its kind to run (the consumer end of ready; the front of its priority), else the last.
local function to_ready(ready_key, prio_key, id, prio, now, next)
  local p = tonumber(prio)
  if p and p > 0 and prio_key then
    redis.call('ZADD', prio_key, -p * 1e13 + (next and 0 or now), id)
  elseif next then
    redis.call('RPUSH', ready_key, id)
    pushed_to_tail(ready_key, 1)
  else
    redis.call('LPUSH', ready_key, id)
  end
end
