-- prune: take ids off one of the list indexes that mirror the scheduled set (delayed,
-- sleeping, waiting) when their job no longer has a status that index lists. Such an id is
-- stale: a worker of an earlier release woke, signalled or cancelled its job without
-- knowing the index, and nothing else would ever take it off (its job may never come back
-- to that status). The job lists call this with the ids a page read there and skipped;
-- the check and the removal are one step, so a job that came back to the index's status
-- in between keeps its place. Bounded: one HGET and at most one ZREM per id given (a
-- page's worth, at most 1000).
--
-- KEYS[1] index        ZSET  the list index (id -> due ms)
-- KEYS[2] job_prefix   (string; a job's state hash is prefix .. id .. ':s')
-- ARGV[1] s, how many statuses follow
-- ARGV[2 .. 1 + s] the statuses the index lists
-- ARGV[2 + s ..] the ids to check (at most 1000)
--
-- Returns the number of ids taken off.
local s = tonumber(ARGV[1])
local listed = {}
for i = 2, 1 + s do listed[ARGV[i]] = true end
local removed = 0
for i = 2 + s, math.min(#ARGV, 1001 + s) do
  local id = ARGV[i]
  -- pcall: a state key of another type is not a status the index lists either.
  local st = redis.pcall('HGET', K.job_prefix .. id .. ':s', 'status')
  if type(st) ~= 'string' or not listed[st] then
    -- pcall: a server refusing writes (a replica, MISCONF) leaves the id for a later page;
    -- a list is a read, and never fails for its tidying.
    local n = redis.pcall('ZREM', K.index, id)
    if type(n) == 'number' then removed = removed + n end
  end
end
return removed
