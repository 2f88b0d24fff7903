-- unroster: delete a stale worker's roster entry, only while it still holds the value the
-- pruning read (store/roster.py): a worker that beat again between the read and the
-- delete (a host back from a pause) keeps its entry, instead of vanishing from the
-- roster until its next beat.
--
-- KEYS[1] roster       HASH  worker id -> its entry (JSON)
-- ARGV[1] the worker's id
-- ARGV[2] its entry as read
--
-- Returns 1 deleted, 0 beaten since (kept).
if redis.call('HGET', K.roster, ARGV[1]) == ARGV[2] then return redis.call('HDEL', K.roster, ARGV[1]) end
return 0
