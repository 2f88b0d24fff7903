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
-- ARGV[1] 'off' to end the hold ('' to hold)
-- ARGV[2] n, the jobs; then per job 2 fields: id, token
--
-- A batch's members (BATCH functions) are handed to their call together: one call holds
-- or ends the hold of them all, one HMGET and one HSET, instead of a call per member.
--
-- Returns one code per job, in order: 1 held (or its hold ended), 2 its hold ended but a
-- cancel asked it to stop, -1 refused (lease lost: that job is left as it was).
--- @include "calls"
--- @include "claims"
local off = ARGV[1] == 'off'
local n = tonumber(ARGV[2])
local got = batch_claims(K.claims, 3, 2, n)
local out, set = {}, {}
for i = 1, n do
  local id = ARGV[1 + 2 * i]
  local c = fence(got[i], ARGV[2 + 2 * i])
  if not c then
    out[i] = -1
  else
    c.prefetched, c.held = true, not off
    set[#set + 1] = id
    set[#set + 1] = claim_entry(c.token, c.attempt_s, c.started, flags_of(c))
    out[i] = (off and c.cancel) and 2 or 1
  end
end
call_many('HSET', K.claims, set, 2)
return out
