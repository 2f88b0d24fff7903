-- remove: delete one dead job and its record; its idempotency key, should it still name
-- the job, goes too.
--
-- KEYS[1] dead         ZSET
-- KEYS[2] job          STRING  the record (its state hash is KEYS[2] .. ':s')
-- KEYS[3] idem prefix  (string)
-- KEYS[4] census       HASH  jobs not done per "<type>|<version>"
-- ARGV[1] job id
--
-- Returns 1 deleted, -1 not in the dead-letter set.
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return -1 end
local rec = rec_load(KEYS[2])
if rec then
  free_idem(KEYS[3], rec.type, rec.idem_key, ARGV[1])
  census(KEYS[4], rec.type .. '|' .. rec.version, -1)
end
redis.call('DEL', KEYS[2], KEYS[2] .. ':s')
return 1
