-- prune: take ids off one of the list indexes that mirror the scheduled set (delayed,
-- sleeping, waiting) when their job no longer has a status that index lists. Such an id is
-- stale: a worker of an earlier release woke, signalled or cancelled its job without
-- knowing the index, and nothing else would ever take it off (its job may never come back
-- to that status). The job lists call this with the ids a page read there and skipped;
-- the check and the removal are one step, so a job that came back to the index's status
-- in between keeps its place. Bounded: one HGET, at most one EXISTS and one ZREM per id
-- given (a page's worth, at most 1000).
--
-- Only an id whose job is elsewhere (a known status the index does not list) or gone
-- (neither record nor state) is stale. A state damaged to another type, an unknown status,
-- or a state gone or without its status while the record stays is damage: the id keeps its
-- place (for the sleeping set a sleeper's only one), and promote hands the job on to be
-- buried with the reason when it is due.
--
-- KEYS[1] index        ZSET  the list index (id -> due ms)
-- KEYS[2] job_prefix   (string; a job's state hash is prefix .. id .. ':s')
-- ARGV[1] s, how many statuses follow
-- ARGV[2 .. 1 + s] the statuses the index lists
-- ARGV[2 + s ..] the ids to check (at most 1000)
--
-- Returns the number of ids taken off.
local KNOWN = {queued = true, scheduled = true, processing = true, retrying = true, deferred = true,
  sleeping = true, waiting = true, done = true, dead = true, cancelled = true}
local s = tonumber(ARGV[1])
local listed = {}
for i = 2, 1 + s do listed[ARGV[i]] = true end
local removed = 0
for i = 2 + s, math.min(#ARGV, 1001 + s) do
  local id = ARGV[i]
  -- pcall: a state key of another type is damage, kept (above).
  local jk = K.job_prefix .. id
  local st = redis.pcall('HGET', jk .. ':s', 'status')
  local stale
  if type(st) == 'string' then
    stale = KNOWN[st] and not listed[st]
  else
    stale = not st and redis.call('EXISTS', jk, jk .. ':s') == 0
  end
  if stale then
    -- pcall: a server refusing writes (a replica, MISCONF) leaves the id for a later page;
    -- a list is a read, and never fails for its tidying.
    local n = redis.pcall('ZREM', K.index, id)
    if type(n) == 'number' then removed = removed + n end
  end
end
return removed
