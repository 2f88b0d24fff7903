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
  else
    redis.call('LPUSH', ready_key, id)
  end
end
