-- hold: a claimed job waits for its executor to be ready before its handler starts (a
-- child process still starting: an interpreter and the functions' imports, seconds). Its
-- claim is marked 'p' and 'h': no attempt counts until start.lua marks it started, and a
-- lease that lapses meanwhile (its worker died in the wait) gives the job back spending
-- nothing, however often (reclaim.lua), since no handler has it yet. (A child's job
-- claimed ahead is held so by claim.lua itself, from its claim.) A cancel meanwhile finds
-- it claimed ahead (cancel.lua answers 3), and its worker's hand-back ends it cancelled.
-- Fenced.
--
-- With ARGV[3] 'off', the wait is over (its child is ready and gets the job next: its
-- worker ends the hold before it sends the job, never after): the claim loses its 'h'
-- and stays claimed ahead ('p') until its handler starts (start.lua), so a lapse from
-- now on gives it back spending nothing once only (reclaim.lua): a handler that kills
-- its worker at once cannot loop for ever.
--
-- KEYS[1] claims       HASH  id -> "<token> <attempt> <started_ms> <flags>"
-- ARGV[1] id
-- ARGV[2] token
-- ARGV[3] 'off' to end the hold ('' to hold)
--
-- Returns 1 held (or its hold ended), 2 its hold ended but a cancel asked it to stop,
-- -1 refused (lease lost).
--- @include "claims"
local c = fence(redis.call('HGET', K.claims, ARGV[1]), ARGV[2])
if not c then return -1 end
local off = ARGV[3] == 'off'
c.prefetched, c.held = true, not off
redis.call('HSET', K.claims, ARGV[1], claim_entry(c.token, c.attempt_s, c.started, flags_of(c)))
if off and c.cancel then return 2 end
return 1
