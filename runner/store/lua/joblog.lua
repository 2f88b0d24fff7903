-- joblog: append lines to one job's log, keep only the newest within its bounds, and
-- keep the log as long as the job's outcome is kept.
--
-- A log's lines (ARGV[5] given) are numbered: each gets "n", its place among every line
-- written to the log (the last line's n + 1, past the lines lost before they were
-- sent), so a follower resumes after the line it saw last however many were trimmed
-- meanwhile, and whatever lines repeat. A log that lost lines (trimmed here, or dropped
-- by the worker before they were sent) keeps one marker line at its head that counts
-- them all: only this script knows how many of the lines sent before a trim takes, so
-- it keeps the count, in the marker itself.
-- A stream's chunks are numbered by the worker (attempt, number): they are kept as they
-- come, with the run of a requeued job marked ("r", below).
--
-- A run writes under its claim's token, fenced as ack and renew are: a run whose lease
-- was lost (its worker stalled past it, the job reclaimed and run again, maybe ended)
-- writes nothing, so a job's log and stream hold only the runs that owned it.
--
-- Its cost is what it appends, not what the log keeps: the log's count of lines and bytes
-- is kept beside it (K.log .. ':size', "<lines> <bytes> <sha1 of the newest line>"), so a
-- write trims the oldest lines by the bounds reading only the lines it drops (it read the
-- newest ARGV[1] lines whole on every write: 5-6 ms of Redis a write for a stream at its
-- 10,000 chunks). A count that does not hold for the list as it is (the newest line is
-- not the one counted, or the length differs: a writer of an earlier release, a list
-- deleted or expired without it, a retry or a sleep that kept the log longer than its
-- count) is counted again, once, from the newest ARGV[1] lines as before (the lines past
-- them go by the count alone), so the work of a call stays bounded by the bounds and by
-- what it appends whatever another writer left in the list.
--
-- A log or stream key of another Redis type (another program's write, or damage) would
-- fail every write, and the run's lines would be lost: it is renamed aside to
-- <key>:corrupt (kept as long as the log would be, counted as "corrupt|log" or
-- "corrupt|stream") and the log starts afresh (store/damage.py).
--
-- KEYS[1] log          LIST  the job's log lines (JSON objects), oldest first; its count is
--                            the STRING K.log .. ':size' (lines, bytes, the newest's sha1),
--                            expiring with it
-- KEYS[2] claims       HASH  id -> claim
-- KEYS[3] job          STRING  the job's record (its state hash is K.job .. ':s')
-- KEYS[4] stats        HASH  (corrupt|log, corrupt|stream: a key set aside)
-- ARGV[1] the most lines kept
-- ARGV[2] the most bytes kept (the sum of the lines' lengths)
-- ARGV[3] how long the log is kept from now, ms (the retention of the job's state)
-- ARGV[4] lines lost before they were sent, ahead of these (a count; '' for a stream)
-- ARGV[5] the marker line (a JSON object, the count as #LOST#; '' for a stream)
-- ARGV[6] the job's id ('' writes unfenced: a tool's, not a run's)
-- ARGV[7] the run's claim token
-- ARGV[8] the run's latest progress (JSON written to the state's progress field, fenced,
--   ahead of the lines: a follower who sees a line sees the progress reported before
--   it; '' none, most calls)
-- ARGV[9..] the lines to append, oldest first (none: only the expiry is set)
--
-- Returns the number of lines kept, or -1: refused, the job is not claimed under this
-- token (nothing written). Bounded per call: the list never holds more than ARGV[1]
-- lines (and a marker), and the worker sends at most that many.
--- @include "claims"
local FIRST = 9
if ARGV[6] ~= '' and not fence(redis.call('HGET', K.claims, ARGV[6]), ARGV[7]) then return -1 end
-- (pcall: a state key of another type, damage, loses the progress, never the lines)
if ARGV[8] ~= '' then redis.pcall('HSET', K.job .. ':s', 'progress', ARGV[8]) end
local most, budget, keep = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local marked = ARGV[5] ~= ''
local SIZE = K.log .. ':size'
local HEAD = '"level": "WARNING", "src": "runner", "msg": "%[([%d,]+) earlier line'

-- The newest entry kept (false: none). A key of another Redis type is set aside first.
local function newest()
  local last = redis.pcall('LINDEX', K.log, -1)
  if type(last) ~= 'table' or not last.err then return last end
  redis.call('RENAME', K.log, K.log .. ':corrupt')
  redis.call('PEXPIRE', K.log .. ':corrupt', keep)
  redis.pcall('HINCRBY', K.stats, marked and 'corrupt|log' or 'corrupt|stream', 1)
  return false
end

-- The list's count as kept beside it, {lines, bytes}, when it stands for the list whose
-- newest entry is ``last``; nil when it must be counted again.
local function counted(last)
  if not last then return {0, 0} end
  local got = redis.pcall('GET', SIZE)
  if type(got) ~= 'string' then return nil end
  local lines, bytes, sha = string.match(got, '^(%d+) (%d+) (%x+)$')
  if not sha or sha ~= redis.sha1hex(last) then return nil end
  return {tonumber(lines), tonumber(bytes)}
end

-- The newest ``most`` lines, and their bytes, read once when the count did not hold (as
-- every write read them before the count was kept: the lines past them go by the count
-- alone, so another writer's list of any length costs no more).
local function window()
  local kept, total = redis.call('LRANGE', K.log, -most, -1), 0
  for _, line in ipairs(kept) do total = total + #line end
  return kept, total
end

-- A line's number, or nil (a chunk, or a line written before lines were numbered).
local function number_of(line)
  return line and tonumber(string.match(line, '^{"n": (%-?%d+), '))
end

local function numbered(line, n)
  if string.sub(line, 1, 2) ~= '{"' then return line end
  return '{"n": ' .. n .. ', ' .. string.sub(line, 2)
end

local function commas(x)
  local s = string.format('%d', x)
  local out = string.reverse((string.gsub(string.reverse(s), '(%d%d%d)', '%1,')))
  if string.sub(out, 1, 1) == ',' then out = string.sub(out, 2) end
  return out
end

-- The marker standing at the head says what was lost so far: it goes (its line and bytes
-- off the count), and comes back with the new count should anything have been lost.
-- -> the lines lost, the marker's bytes taken off (0: none was there)
local function lift_marker()
  local head = redis.call('LINDEX', K.log, 0)
  local said = head and (string.match(head, '^{"n": %-?%d+, "ts": %d+, ' .. HEAD)
    or string.match(head, '^{"ts": %d+, ' .. HEAD))
  if not said then return 0, 0 end
  redis.call('LPOP', K.log)
  return tonumber((string.gsub(said, ',', ''))) or 0, #head
end

-- A log's lines, each numbered from the newest kept line's number on. The lines lost
-- before they were sent came ahead of these: they count too, so n is the line's place
-- among every line the handler wrote.
local function log_lines(last, held)
  local seq = number_of(last)
  seq = (seq and seq + 1 or held) + (tonumber(ARGV[4]) or 0)
  local lines = {}
  for i = FIRST, #ARGV do
    lines[#lines + 1] = numbered(ARGV[i], seq)
    seq = seq + 1
  end
  return lines
end

-- A stream's chunks. A chunk's place is (attempt, number), set by the worker; a requeued
-- job starts again at attempt 1, so chunks that would not follow the last one kept belong
-- to a new run after a requeue: they and that run's later chunks carry "r", one more than
-- the last one's, first in their place, so places grow over the job's whole life.
local function chunks(last)
  local r = 0
  if last then
    local lr, la, li = string.match(last, '^{"r": (%d+), "a": (%-?%d+), "i": (%-?%d+)')
    if not lr then
      la, li = string.match(last, '^{"a": (%-?%d+), "i": (%-?%d+)')
      lr = la and 0
    end
    local a, i = string.match(ARGV[FIRST], '^{"a": (%-?%d+), "i": (%-?%d+)')
    if lr and a then
      r = tonumber(lr)
      la, li, a, i = tonumber(la), tonumber(li), tonumber(a), tonumber(i)
      if a < la or (a == la and i <= li) then r = r + 1 end
    end
  end
  local lines = {}
  for i = FIRST, #ARGV do
    local chunk = ARGV[i]
    if r > 0 and string.sub(chunk, 1, 6) == '{"a": ' then chunk = '{"r": ' .. r .. ', ' .. string.sub(chunk, 2) end
    lines[#lines + 1] = chunk
  end
  return lines
end

-- Appends ``lines`` -> the list's length after, and their bytes.
local function append(lines)
  local n, bytes = 0, 0
  -- In chunks: a stream keeps up to 10,000 chunks, past Lua's unpack limit (about 8,000).
  for s = 1, #lines, 4000 do
    n = redis.call('RPUSH', K.log, unpack(lines, s, math.min(s + 3999, #lines)))
  end
  for _, line in ipairs(lines) do bytes = bytes + #line end
  return n, bytes
end

-- How many of the oldest of ``n`` lines (``total`` bytes) go: past ``cap`` by count, then
-- past ``room`` by bytes, never the newest. Only the lines that go are read (and at most
-- as many again past them, in growing pages), each once in the log's life: the work is
-- what the writes appended, whatever the log keeps. -> how many, the bytes left.
local function oldest(n, total, cap, room)
  local drop = math.max(0, n - cap)
  if drop > 0 then
    for _, line in ipairs(redis.call('LRANGE', K.log, 0, drop - 1)) do total = total - #line end
  end
  local page = 1
  while total > room and drop < n - 1 do
    for _, line in ipairs(redis.call('LRANGE', K.log, drop, math.min(drop + page, n - 1) - 1)) do
      if total <= room or drop >= n - 1 then break end
      total = total - #line
      drop = drop + 1
    end
    page = math.min(page * 4, 1024)
  end
  return drop, total
end

-- The same for a log whose count did not hold, from its newest lines as read (``kept``, of
-- ``n``; ``total``, their bytes): the ones before them go whatever their bytes.
local function oldest_read(n, kept, total, cap, room)
  local drop = math.max(0, #kept - cap)
  for i = 1, drop do total = total - #kept[i] end
  while total > room and drop < #kept - 1 do
    drop = drop + 1
    total = total - #kept[drop]
  end
  return n - #kept + drop, total
end

local last = newest()
local count = counted(last)
local lost, unmarked = 0, 0
if marked then
  lost, unmarked = lift_marker()
  lost = lost + (tonumber(ARGV[4]) or 0)
  if unmarked > 0 then
    if count then count = {count[1] - 1, count[2] - unmarked} end
    -- (the marker was the list's one line: no line is the newest now)
    if (count and count[1] or redis.call('LLEN', K.log)) == 0 then last = false end
  end
end
local n, total, kept
if #ARGV >= FIRST then
  local held = count and count[1] or redis.call('LLEN', K.log)
  local lines = marked and log_lines(last, held) or chunks(last)
  local added
  n, added = append(lines)
  last = lines[#lines]
  total = count and n == count[1] + #lines and count[2] + added
else
  n = redis.call('LLEN', K.log)
  if n == 0 then return 0 end
  total = count and n == count[1] and count[2]
end
if not total then kept, total = window() end
-- The marker takes a line and its bytes of the bounds (room for its longest count and
-- number: 48 bytes past its template), so the trim that makes it needed makes room for
-- it too. (``total``: the whole list's bytes, or the newest ``most`` lines' when read;
-- past ``most`` lines the marker is needed either way.)
local mark = marked and (lost > 0 or n > most or total > budget)
local cap, room = most, budget
if mark then
  cap = math.max(1, most - 1)
  room = budget - (#ARGV[5] + 48)
end
local cut
if kept then cut, total = oldest_read(n, kept, total, cap, room) else cut, total = oldest(n, total, cap, room) end
if cut > 0 then
  redis.call('LTRIM', K.log, cut, -1)
  n = n - cut
  lost = lost + cut
end
if mark then
  local first = number_of(redis.call('LINDEX', K.log, 0))
  local line = string.gsub(ARGV[5], '#LOST#', commas(lost))
  line = first and numbered(line, first - 1) or line
  redis.call('LPUSH', K.log, line)
  n = n + 1
  total = total + #line
end
local size = n .. ' ' .. total .. ' ' .. redis.sha1hex(last or redis.call('LINDEX', K.log, -1))
if keep > 0 then redis.call('SET', SIZE, size, 'PX', keep) else redis.call('DEL', SIZE) end
redis.call('PEXPIRE', K.log, keep)
return n
