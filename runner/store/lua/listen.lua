-- listen: a durable function's ctx.wait_for_event puts its waiter on the registry of the
-- event's name (store/listeners.py), before its run suspends (suspend.lua, another slot):
-- so an emit that comes after the wait began finds it, and a run that dies between the
-- two leaves a waiter whose job replays to the same wait and keeps it. A waiter already
-- there (a replay of the same wait) keeps the time it began.
--
-- KEYS[1] shapes       HASH  a match's field names (JSON list) -> waiters with it
-- KEYS[2] bucket       ZSET  this match's waiters -> when each began (ms)
-- ARGV[1] now, ms ('' for the server's clock)
-- ARGV[2] the match's field names (JSON list, sorted)
-- ARGV[3] the member: JSON [queue, tag, job id, position]
-- ARGV[4] the most distinct field lists one event name's waiters may use
--
-- Returns {code, since ms}: 1 put on, 0 there already (its time), -1 refused (the name's
-- waiters use ARGV[4] field lists already; nothing changed).
--- @include "clock"
local now = clock(ARGV[1])
local since = redis.call('ZSCORE', K.bucket, ARGV[3])
if since then return {0, tonumber(since)} end
if redis.call('HEXISTS', K.shapes, ARGV[2]) == 0 and redis.call('HLEN', K.shapes) >= tonumber(ARGV[4]) then
  return {-1, 0}
end
redis.call('ZADD', K.bucket, now, ARGV[3])
redis.call('HINCRBY', K.shapes, ARGV[2], 1)
return {1, now}
