-- index_delayed: put the jobs of one stretch of the scheduled set in their list's index at
-- their due time: scheduled and retrying ones in delayed, waiting ones in waiting, and
-- sleeping ones in sleeping, which they then leave scheduled for (a sleeping job is in the
-- sleeping set alone: suspend.lua; this moves the ones an earlier release suspended). A job delayed, retrying, rate-limited or suspended by a release before
-- the indexes existed is in the scheduled set only; the
-- scheduler walks the set once at a worker's start, a stretch a call, so the scheduled
-- list shows such jobs too. Idempotent (a ZADD of the score the set holds), and a job that
-- moves between two calls moves through the scripts that keep the index. Bounded: at most
-- ARGV[2] ids (1000 at most), one HGET and at most one ZADD and one ZREM each.
--
-- KEYS[1] scheduled    ZSET  id -> due ms
-- KEYS[2] job_prefix   (string; a job's state hash is prefix .. id .. ':s')
-- KEYS[3] delayed      ZSET  the ids of scheduled that are scheduled or retrying -> due (ms)
-- KEYS[4] sleeping     ZSET  sleeping ids -> due (ms)
-- KEYS[5] waiting      ZSET  the ids of scheduled that wait -> due (ms)
-- ARGV[1] the rank to start at, latest due first (promote takes jobs off the other end,
--         so the ranks still to walk do not move under it)
-- ARGV[2] how many ids to look at
--
-- Returns {the rank to go on from (the sleepers moved out of this stretch leave it sooner),
-- -1 once the set is walked (or is not a set); ids indexed or moved by this call}.
local start, count = tonumber(ARGV[1]), math.min(tonumber(ARGV[2]), 1000)
-- pcall: a scheduled key of another type is the reclaim's to report; there is no set to walk.
local got = redis.pcall('ZREVRANGE', K.scheduled, start, start + count - 1, 'WITHSCORES')
if got.err then return {-1, 0} end
local added, moved = 0, 0
for i = 1, #got, 2 do
  local id = got[i]
  -- pcall: a state key of another type is claim's to bury; it is listed nowhere.
  local st = redis.pcall('HGET', K.job_prefix .. id .. ':s', 'status')
  local index = (st == 'scheduled' or st == 'retrying') and K.delayed or st == 'sleeping' and K.sleeping
    or st == 'waiting' and K.waiting or nil
  if index then
    local n = redis.pcall('ZADD', index, got[i + 1], id)
    if type(n) ~= 'number' then return {-1, added} end  -- a damaged index: the reclaim puts it aside
    added = added + n
    if index == K.sleeping then
      redis.call('ZREM', K.scheduled, id)
      moved = moved + 1
      if n == 0 then added = added + 1 end
    end
  end
end
if #got < count * 2 then return {-1, added} end
return {start + count - moved, added}
