-- run_now: an operator's "run now" of a job that waits for a time (delayed, retrying, or
-- a durable function's sleep): out of scheduled and into ready at once, keeping its id
-- and spending no attempt (the attempt is counted at the claim, as for any job). One
-- atomic step fenced by what it moves from: the id must still be in scheduled (a sleeping
-- one in sleeping, or in scheduled as the release before put it) with one of those statuses and without a claim, so a promote or a claim that came first (or a
-- cancel, a signal's wake) leaves nothing for this call to move, and it says what the
-- job is instead.
--
-- A sleeping job's sleep is cut short: its step log's last entry (the sleep) gets this
-- call's time as its until_ms, so the replay returns from ctx.sleep instead of sleeping
-- again until the recorded end (worker/journal.py). A job waiting for a signal is not
-- moved: its wait ends with the signal, or at its timeout (POST /jobs/{id}/signals/...).
--
-- KEYS[1] job          STRING  the job's record (its state is the hash at .. ':s')
-- KEYS[2] claims       HASH    id -> claim (a claimed job is running, or about to)
-- KEYS[3] scheduled    ZSET    id -> due ms
-- KEYS[4] ready        LIST
-- KEYS[5] notify       LIST
-- KEYS[6] prio         ZSET    (a job of priority 1-9 goes there: to_ready in includes/ready.lua)
-- KEYS[7] sleeping     ZSET    sleeping ids -> wake ms (see suspend.lua)
-- KEYS[8] delayed      ZSET  the ids of scheduled that are scheduled or retrying -> due (ms): the
--                            scheduled list's own index (see keys.py)
-- ARGV[1] now, ms ('' for the server's clock)
-- ARGV[2] job id
-- ARGV[3] history entry (a JSON object without at_ms: who asked; '' none), stamped here
--
-- Returns {code, status}: 1 moved to ready (the status it had); -1 no such record (gone,
-- or done: the caller looks); -2 refused, the job's status given (processing, queued,
-- waiting, dead, ...): nothing changed.
--- @include "clock"
--- @include "history"
--- @include "ready"
--- @include "asleep"
local now, id = clock(ARGV[1]), ARGV[2]
local sk = K.job .. ':s'
if redis.call('EXISTS', K.job) == 0 then return {-1, ''} end
if redis.call('HEXISTS', K.claims, id) == 1 then return {-2, 'processing'} end
-- pcall: a state key of another type is a damaged job, refused as it reads.
local f = redis.pcall('HMGET', sk, 'status', 'priority', 'history', 'steps', 'step_bytes', 'attempt', 'run_attempt',
  'sleep')
if type(f) ~= 'table' or f.err then return {-2, 'damaged'} end
local st = f[1] or 'queued'
local function waits_there()
  if redis.call('ZSCORE', K.scheduled, id) then return true end
  local z = st == 'sleeping' and redis.pcall('ZSCORE', K.sleeping, id)
  return type(z) == 'string'
end
if not (st == 'scheduled' or st == 'retrying' or st == 'sleeping') or not waits_there() then
  return {-2, st}
end
local set = {'status', 'queued'}
if st ~= 'sleeping' then
  set = {'status', 'queued', 'ready_ms', now}
else
  -- (the fields its sleep left out, as promote.lua writes them back: includes/asleep.lua)
  asleep_woken(set, now, f[6], f[7], f[8])
  if f[8] then
    redis.call('HDEL', sk, 'sleep')
    f[4], f[5] = asleep_parts(f[8])
  end
  local n = tonumber(f[4]) or 0
  local last = n > 0 and redis.call('HGET', sk, 'step:' .. (n - 1)) or nil
  local cut
  if last and string.sub(last, 1, 5) == '["z",' then  -- a compact sleep: its end is its last element
    cut = string.gsub(last, ',%-?%d+%]$', ',' .. now .. ']')
  elseif last and string.find(last, '"kind":"sleep"', 1, true) then
    cut = string.gsub(last, '"until_ms":%-?%d+}$', '"until_ms":' .. now .. '}')
  end
  if cut then
    for _, v in ipairs({'step:' .. (n - 1), cut, 'step_bytes', (tonumber(f[5]) or 0) + #cut - #last}) do
      set[#set + 1] = v
    end
  end
end
with_history(set, f[3], stamped(ARGV[3], now))
redis.call('ZREM', K.scheduled, id)
if st == 'sleeping' then redis.pcall('ZREM', K.sleeping, id) else redis.pcall('ZREM', K.delayed, id) end
redis.call('HSET', sk, unpack(set))
to_ready(K.ready, K.prio, id, f[2], now, false)
wake(K.notify)
return {1, st}
