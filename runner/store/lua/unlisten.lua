-- unlisten: take waiters off an event name's registry (store/listeners.py): those an
-- event was delivered to, or whose job no longer waits (it timed out, was cancelled,
-- ended or replayed elsewhere), and count how many that event resumed. Each waiter leaves
-- once: its field list's count goes down only for a member that was there.
--
-- KEYS[1] shapes        HASH  a match's field names (JSON list) -> waiters with it
-- KEYS[2] bucket_prefix (string; a match's waiters are the ZSET prefix .. digest)
-- KEYS[3] woke_prefix   (string; prefix .. event id counts the waiters it resumed)
-- ARGV[1] the event's id ('' none)
-- ARGV[2] how long its count is kept, ms
-- ARGV[3] waiters it resumed now
-- ARGV[4] m, the waiters to take off; then m triples: digest, field names, member
--
-- Returns the waiters taken off (those that were there).
local removed = 0
local m = tonumber(ARGV[4])
for i = 0, m - 1 do
  local b = 5 + i * 3
  if redis.call('ZREM', K.bucket_prefix .. ARGV[b], ARGV[b + 2]) == 1 then
    removed = removed + 1
    if redis.call('HINCRBY', K.shapes, ARGV[b + 1], -1) <= 0 then
      redis.call('HDEL', K.shapes, ARGV[b + 1])
    end
  end
end
local resumed = tonumber(ARGV[3]) or 0
if ARGV[1] ~= '' and resumed > 0 then
  local key = K.woke_prefix .. ARGV[1]
  redis.call('INCRBY', key, resumed)
  redis.call('PEXPIRE', key, tonumber(ARGV[2]))
end
return removed
