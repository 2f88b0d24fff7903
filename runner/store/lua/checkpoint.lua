-- checkpoint: save a running job's checkpoint, fenced by its claim token.
--
-- KEYS[1] job          STRING  the record (its state hash is K.job .. ':s')
-- KEYS[2] claims       HASH  id -> claim
-- ARGV[1] token
-- ARGV[2] checkpoint (JSON)
-- ARGV[3] job id
--
-- Returns 1 saved, -1 refused (lease lost).
--- @include "claims"
if not fence(redis.call('HGET', K.claims, ARGV[3]), ARGV[1]) then return -1 end
redis.call('HSET', K.job .. ':s', 'checkpoint', ARGV[2])
return 1
