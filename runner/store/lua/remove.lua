-- remove: delete one dead job and its record, its own log and stream; its idempotency key,
-- should it still name the job, goes too.
--
-- KEYS[1] dead         ZSET
-- KEYS[2] job          STRING  the record (its state hash is K.job .. ':s')
-- KEYS[3] idem_prefix  (string)
-- KEYS[4] census       HASH  jobs not done per "<type>|<version>"
-- KEYS[5] log_prefix   (string)  the job's log is this and its id (a LIST; its count, the
--                                 STRING that and ':size', joblog.lua)
-- KEYS[6] stream_prefix (string) the job's stream is this and its id (a LIST; its count alike)
-- ARGV[1] job id
--
-- Returns 1 deleted, -1 not in the dead-letter set.
--- @include "idem"
--- @include "records"
--- @include "record_keys"
if redis.call('ZREM', K.dead, ARGV[1]) == 0 then return -1 end
local rec = rec_head(K.job)  -- (its payload is not needed: a big record is not read whole)
if rec then
  free_idem(K.idem_prefix, rec.type, rec.idem_key, ARGV[1])
  census(K.census, rec.type .. '|' .. rec.version, -1)
end
local log, stream = K.log_prefix .. ARGV[1], K.stream_prefix .. ARGV[1]
redis.call('DEL', K.job, K.job .. ':s', log, log .. ':size', stream, stream .. ':size')
return 1
