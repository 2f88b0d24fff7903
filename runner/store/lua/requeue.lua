-- requeue: move one dead job back to ready with a fresh attempt budget, optionally
-- with a new (already validated) payload and version.
--
-- KEYS[1] dead         ZSET
-- KEYS[2] ready        LIST
-- KEYS[3] notify       LIST
-- KEYS[4] job          HASH  the record
-- ARGV[1] now_ms
-- ARGV[2] job id
-- ARGV[3] payload (JSON, '' to keep)
-- ARGV[4] version ('' to keep)
-- ARGV[5] history entry (JSON, '' for none): who requeued it, appended to the history
--
-- Returns 1 requeued, -1 not in the dead-letter set.
local now, id = tonumber(ARGV[1]), ARGV[2]
if redis.call('ZREM', KEYS[1], id) == 0 then return -1 end
if redis.call('TYPE', KEYS[4])['ok'] ~= 'hash' then return -1 end
redis.call('HSET', KEYS[4], 'status', 'queued', 'attempt', 0, 'ready_ms', now,
  'enqueued_ms', now, 'deferrals', 0)
redis.call('HDEL', KEYS[4], 'reason', 'finished_ms', 'token')
if ARGV[3] ~= '' then redis.call('HSET', KEYS[4], 'payload', ARGV[3]) end
if ARGV[4] ~= '' then redis.call('HSET', KEYS[4], 'version', ARGV[4]) end
if ARGV[5] and ARGV[5] ~= '' then
  local set = {}
  with_history(set, redis.call('HGET', KEYS[4], 'history'), ARGV[5])
  redis.call('HSET', KEYS[4], unpack(set))
end
redis.call('PERSIST', KEYS[4])
redis.call('LPUSH', KEYS[2], id)
wake(KEYS[3])
return 1
