-- seek_list: one page of a deferred LIST (a held list, a limit's waiters; or a ready
-- list, see ARGV[5]), newest first
-- (read from the tail toward the head), resuming from the ids the last page ended on
-- (it reads, never writes). Jobs are parked at the tail and leave from the head (a
-- wake) or from anywhere (a cancel), so a place counted from either end moves while a
-- client pages; an id does not. The page starts just before the last id shown, found by
-- LPOS from the head; if that one left, at the first id not yet shown; if that one was
-- taken out by a cancel too, at the id the cancel left in its place (its state's
-- list_next, see cancel.lua: the neighbor the pages go toward), followed through cancels
-- of those in turn; if an id of that chain left otherwise, the list is read (a limit
-- wakes from the head: the jobs before it left first). Finding the place and reading the
-- page are one call. Bounded: LPOS looks at most MAXLEN ids: where the ids were, plus
-- how many ids were pushed since at the end the place counts from (woken jobs that went
-- back to the head of a limit's waiters, <list>:heads; jobs put at the consumer end of
-- ready, <list>:tails: a resume puts thousands there at once), plus SLACK, and never more
-- than the list holds; the chain at most CHAIN ids (one HGET each; past them the reply is
-- an empty page whose next place is the chain's last id, so the next call goes on from
-- there), then one range of at most ARGV[1] + 1 ids.
--
-- KEYS[1] list          LIST  oldest at the head
-- KEYS[2] job_prefix    (string; a job's state is prefix .. id .. ':s', its list_next read)
-- ARGV[1] how many ids to read (at most 1000)
-- ARGV[2] where (index from the head) the first id not yet shown was; '' the first page
-- ARGV[3] the first id not yet shown
-- ARGV[4] the last id shown
-- ARGV[5] '1': a ready LIST instead, newest at the head (LPUSH in, claimed from the tail,
--         cancelled from anywhere), read from the head toward the tail; ARGV[2] then
--         counts from the tail, the end nothing is added to but a job sent to the front
--         of the line. The page starts just after the last id shown, found by LPOS from
--         the tail; if that one left, at the first id not yet shown or where a cancel
--         left it (the chain above); if that chain ends in an id a worker took (from the
--         tail: the jobs past it left first), just after the nearest of the ids shown
--         before the last (ARGV[7], ...) that is still there: nothing comes between ids
--         in the list, so what follows it was not shown (a place counted from the tail
--         moves as a worker claims from there: the page showed again jobs of the page
--         before). If all of them left, the list is read.
--         ARGV[5] '2': a done generation's log instead, newest at the head: ids come in
--         at the head only and leave only with the whole log (done.lua), so a place
--         counted from the tail never moves however many jobs finish meanwhile. ARGV[2]
--         is how many ids are left to read (the next one is that many from the tail),
--         '' for the first page of the log, which starts ARGV[3] ids from the head (0,
--         or a place a cursor of an earlier release counted from the head). Two reads.
-- ARGV[6] the count of ids pushed at the end the place counts from (the list's :tails or
--         :heads) when the place was read; '' unknown (then SLACK alone)
-- ARGV[7...] (a ready LIST) the ids shown before the last, from the one just before it back
--
-- Returns {index of the next id not yet shown or -1, that id or '', the count ARGV[6]
-- names as it stands for that place, id, ...} (newest first).
local SLACK = 1000
local CHAIN = 1000
local key = K.list

-- Where the first id not yet shown is now, following the chain of ids cancels left in
-- its place (rank: 1 from the head, -1 from the tail): its index; nil if the chain ends
-- in an id that left otherwise; or false and the chain's last id when CHAIN ran out.
local function find_next(id, rank, reach)
  for _ = 1, CHAIN do
    local nxt = redis.pcall('HGET', K.job_prefix .. id .. ':s', 'list_next')
    if type(nxt) ~= 'string' then
      if reach <= 0 then return nil end  -- (MAXLEN 0 would mean the whole list)
      return redis.call('LPOS', key, id, 'RANK', rank, 'MAXLEN', reach)
    end
    if nxt == '' then return nil end  -- it was the last: nothing past it
    id = nxt
  end
  return false, id
end
local count = math.min(tonumber(ARGV[1]), 1000)
local len = redis.call('LLEN', key)
-- How many ids were pushed past the place since it was read: a place's reach grows by
-- them. A count that went back (its key expired: a limit's, a day after its last push)
-- says nothing: the reach is the whole list.
local pushed = redis.pcall('GET', key .. (ARGV[5] == '1' and ':tails' or ':heads'))
pushed = type(pushed) == 'string' and tonumber(pushed) or 0  -- (pcall: another type reads as none)
local grown = 0
if tonumber(ARGV[6]) then
  grown = pushed - tonumber(ARGV[6])
  if grown < 0 then grown = len end
end
if ARGV[5] == '2' then
  local left = len - (tonumber(ARGV[3]) or 0)
  if ARGV[2] ~= '' then left = math.min(tonumber(ARGV[2]), len) end
  if left <= 0 or count <= 0 then return {-1, ''} end
  local got = redis.call('LRANGE', key, -left, math.min(-left + count - 1, -1))
  local out = {left - #got, '', 0}
  if left - #got <= 0 then out[1] = -1 end
  for i = 1, #got do out[#out + 1] = got[i] end
  return out
end
if ARGV[5] == '1' then
  local start = 0
  if ARGV[2] ~= '' then
    local was = tonumber(ARGV[2])
    local reach = math.min(was + #ARGV + SLACK + grown, len)
    start = len
    if reach > 0 then
      local after = redis.call('LPOS', key, ARGV[4], 'RANK', -1, 'MAXLEN', reach)
      if after then
        start = after + 1
      else
        local at, chained = find_next(ARGV[3], -1, reach)
        if at then
          start = at
        elseif chained then
          return {was, chained, ARGV[6] ~= '' and ARGV[6] or pushed}
        else
          for i = 7, #ARGV do
            local shown = redis.call('LPOS', key, ARGV[i], 'RANK', -1, 'MAXLEN', reach)
            if shown then
              start = shown + 1
              break
            end
          end
        end
      end
    end
  end
  if start >= len or count <= 0 then return {-1, '', pushed} end
  local got = redis.call('LRANGE', key, start, start + count)
  local out = {-1, '', pushed}
  if #got > count then out = {len - 1 - (start + count), got[count + 1], pushed} end
  for i = 1, math.min(#got, count) do out[#out + 1] = got[i] end
  return out
end
local start = len - 1
if ARGV[2] ~= '' then
  local reach = math.min(tonumber(ARGV[2]) + 2 + SLACK + grown, len)
  start = -1
  local after = reach > 0 and redis.call('LPOS', key, ARGV[4], 'RANK', 1, 'MAXLEN', reach)
  if after then
    start = after - 1
  else
    local at, chained = find_next(ARGV[3], 1, reach)
    if at then
      start = at
    elseif chained then
      return {ARGV[2], chained, ARGV[6] ~= '' and ARGV[6] or pushed}
    end
  end
end
if start < 0 or count <= 0 then return {-1, '', pushed} end
local lo = math.max(0, start - count)
local got = redis.call('LRANGE', key, lo, start)
local out = {-1, '', pushed}
if #got > count then out = {lo, got[1], pushed} end
for i = #got, math.max(#got - count + 1, 1), -1 do out[#out + 1] = got[i] end
return out
