-- resume: lift the pause of a queue or of one function of it, and put that function's
-- held jobs back at the consumer end of ready in the order they were held (oldest taken
-- first), at most ARGV[3] of them per call: the caller calls again while some remain.
-- A held id whose job is no longer held (deleted meanwhile) is dropped.
--
-- KEYS[1] paused       HASH  "queue" | "fn:<type>" -> paused since ms
-- KEYS[2] ready        LIST
-- KEYS[3] notify       LIST
-- KEYS[4] job_prefix   (string)
-- KEYS[5] held         LIST  the function's held ids, oldest first ('' for the queue)
-- KEYS[6] prio         ZSET  (a job of priority 1-9 goes back there: to_ready in includes/ready.lua)
-- ARGV[1] field        "queue" | "fn:<type>"
-- ARGV[2] first call   1 lifts the pause, 0 only moves more held ids
-- ARGV[3] the most ids moved in this call
--
-- Returns {ids moved, ids still held, 1 if this call lifted a pause else 0}.
--- @include "ready"
local lifted = 0
if ARGV[2] == '1' then lifted = redis.call('HDEL', K.paused, ARGV[1]) end
local moved, tail = 0, 0
if K.held ~= '' then
  -- Take the newest first to the consumer end, so the oldest ends up taken first. A job
  -- of priority goes to the front of its priority, scored by its place in the held list
  -- (1 the oldest), so the order holds across calls too.
  local place = redis.call('LLEN', K.held)
  for _ = 1, tonumber(ARGV[3]) do
    local id = redis.call('RPOP', K.held)
    if not id then break end
    local sk = K.job_prefix .. id .. ':s'
    local st = redis.pcall('HMGET', sk, 'status', 'priority')
    if type(st) == 'table' and st[1] == 'deferred' then
      redis.call('HSET', sk, 'status', 'queued')
      if tonumber(st[2]) and K.prio then
        redis.call('ZADD', K.prio, -tonumber(st[2]) * 1e13 + place, id)
      else
        redis.call('RPUSH', K.ready, id)
        tail = tail + 1
      end
      moved = moved + 1
    end
    place = place - 1
  end
end
if tail > 0 then pushed_to_tail(K.ready, tail) end
wake(K.notify)
return {moved, K.held ~= '' and redis.call('LLEN', K.held) or 0, lifted}
