-- trim: forget dead-letter entries whose record has passed its retention.
--
-- KEYS[1] dead         ZSET  id -> time of death ms
-- ARGV[1] cutoff_ms (now - dead retention)
--
-- Returns the number of entries removed.
return redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
