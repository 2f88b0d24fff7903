-- checkpoint: save a running job's checkpoint, fenced by its claim token.
--
-- KEYS[1] job          HASH
-- ARGV[1] token
-- ARGV[2] checkpoint (JSON)
--
-- Returns 1 saved, -1 refused (lease lost).
if not owns(KEYS[1], ARGV[1]) then return -1 end
redis.call('HSET', KEYS[1], 'checkpoint', ARGV[2])
return 1
