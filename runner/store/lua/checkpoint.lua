-- checkpoint: save a running job's checkpoint, fenced by its claim token.
--
-- KEYS[1] job          STRING  the record (its state hash is KEYS[1] .. ':s')
-- KEYS[2] claims       HASH  id -> claim
-- ARGV[1] token
-- ARGV[2] checkpoint (JSON)
-- ARGV[3] job id
--
-- Returns 1 saved, -1 refused (lease lost).
if not fence(redis.call('HGET', KEYS[2], ARGV[3]), ARGV[1]) then return -1 end
redis.call('HSET', KEYS[1] .. ':s', 'checkpoint', ARGV[2])
return 1
