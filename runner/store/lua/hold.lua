-- hold: a claimed job waits for its executor to be ready before its handler starts (a
-- child process still starting: an interpreter and the functions' imports, seconds). Its
-- claim is marked 'p' and 'h': no attempt counts until start.lua marks it started, and a
-- lease that lapses meanwhile (its worker died in the wait) gives the job back spending
-- nothing, however often (reclaim.lua), since its worker marks the start before the
-- handler gets the job. A cancel meanwhile finds it claimed ahead (cancel.lua answers 3),
-- and its worker's hand-back ends it cancelled. Fenced.
--
-- KEYS[1] claims       HASH  id -> "<token> <attempt> <started_ms> <flags>"
-- ARGV[1] id
-- ARGV[2] token
--
-- Returns 1 held, -1 refused (lease lost).
--- @include "claims"
local c = fence(redis.call('HGET', K.claims, ARGV[1]), ARGV[2])
if not c then return -1 end
c.prefetched, c.held = true, true
redis.call('HSET', K.claims, ARGV[1], claim_entry(c.token, c.attempt_s, c.started, flags_of(c)))
return 1
