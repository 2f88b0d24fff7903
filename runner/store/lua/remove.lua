-- remove: delete one dead job and its record.
--
-- KEYS[1] dead         ZSET
-- KEYS[2] job          HASH
-- ARGV[1] job id
--
-- Returns 1 deleted, -1 not in the dead-letter set.
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return -1 end
redis.call('DEL', KEYS[2])
return 1
