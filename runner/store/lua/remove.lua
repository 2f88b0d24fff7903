-- remove: delete one dead job and its record; its idempotency key, should it still name
-- the job, goes too.
--
-- KEYS[1] dead         ZSET
-- KEYS[2] job          HASH
-- KEYS[3] idem prefix  (string)
-- ARGV[1] job id
--
-- Returns 1 deleted, -1 not in the dead-letter set.
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return -1 end
local f = redis.pcall('HMGET', KEYS[2], 'type', 'idem_key')
if not f.err then free_idem(KEYS[3], f[1], f[2], ARGV[1]) end
redis.call('DEL', KEYS[2])
return 1
