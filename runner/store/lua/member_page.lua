-- member_page: one page of a group's members in member order, each with the outcome the
-- group counted for it (it reads, never writes). group.lua lists the members as it writes
-- them, and group_settle (includes/groups.lua) marks each as the group counts it, so a
-- page is read from the group's own keys, never by reading the members' records.
--
-- KEYS[1] group_prefix (string; the group's member list is prefix .. id .. ':m', a LIST of
--         their ids in member order, and its marks prefix .. id .. ':f', a STRING of a
--         byte per member: d done, x dead, c cancelled; \0 or past its end: not finished)
-- ARGV[1] group id
-- ARGV[2] the first member of the page (1-based)
-- ARGV[3] the most members on the page (groups.MEMBERS_PAGE_MAX at most)
-- ARGV[4] the outcomes listed: '' every member; else some of d, x, c, and p (not finished)
--
-- Returns {next, listed, member, id, mark, member, id, mark, ...}: next is the member the
-- next page starts at (0: none is left to list), listed the members the list holds (0: a
-- group written before its members were listed, or none of that id); a mark is '' for a
-- member not finished yet.
--
-- Bounded whatever the group's size: a page of every member is one LRANGE and one GETRANGE
-- of the page; a page of some outcomes is one search through the marks (a byte a member,
-- 100,000 at most, in C: string.find) and an LINDEX per member listed.
local mk, fk = K.group_prefix .. ARGV[1] .. ':m', K.group_prefix .. ARGV[1] .. ':f'
if redis.call('TYPE', mk)['ok'] ~= 'list' then return {0, 0} end
local total = redis.call('LLEN', mk)
local start, limit, want = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local out = {0, total}

-- (pcall: marks of another type, damage, read as none: every member not finished)
local function marks_from(first, last)
  local m = redis.pcall('GETRANGE', fk, first - 1, last - 1)
  return type(m) == 'string' and m or ''
end

local function put(i, id, m)
  if m == '\0' then m = '' end
  out[#out + 1] = i
  out[#out + 1] = id or ''
  out[#out + 1] = m
end

if want == '' then
  local last = math.min(total, start + limit - 1)
  if start > last then return out end
  local marks = marks_from(start, last)
  for j, id in ipairs(redis.call('LRANGE', mk, start - 1, last - 1)) do
    put(start + j - 1, id, string.sub(marks, j, j))
  end
  if last < total then out[1] = last + 1 end
  return out
end

local marks = marks_from(1, total)
local n = #marks
local pending = string.find(want, 'p', 1, true) ~= nil
local pattern = '[' .. string.gsub(want, '[^dxc]', '') .. (pending and '%z' or '') .. ']'

-- The first member from i on whose outcome is wanted, or nil.
local function next_wanted(i)
  if i <= n then
    local at = string.find(marks, pattern, i)
    if at then return at end
    i = n + 1
  end
  if pending and i <= total then return i end  -- past the marks: not finished
  return nil
end

local found, i = {}, start
while #found <= limit do  -- one past the page: it says where the next one starts
  local at = next_wanted(i)
  if not at or at > total then break end
  found[#found + 1] = at
  i = at + 1
end
for j = 1, math.min(#found, limit) do
  local at = found[j]
  put(at, redis.call('LINDEX', mk, at - 1), string.sub(marks, at, at))
end
if #found > limit then out[1] = found[limit + 1] end
return out
