-- seek_trail: one page of an audit trail (a LIST, newest at the head), read from where
-- the last page ended (it reads, never writes). Finding the place and reading the page
-- are one call, so an action landing between the two cannot shift the page.
--
-- A place is the place number `n` of the last entry shown (audit.lua: the numbers fall
-- strictly from head to tail and an entry keeps its own), so the page starts at the
-- first entry numbered below it, whatever landed at the head, was folded or rewritten,
-- or was trimmed off the tail since. Entries of an earlier release have no number and
-- sit at the tail: read as numbered 0, and a place among them is a count of the entries
-- left past it, which the head's pushes do not move. Bounded: a binary search over the
-- list (log2 of its length, one LINDEX each), then one range of at most ARGV[3] entries.
--
-- KEYS[1] audit        LIST  JSON entries, newest first
-- ARGV[1] the place number of the last entry shown ('' for the first page; 0: one of
--         an earlier release, found by ARGV[2])
-- ARGV[2] with ARGV[1] 0: how many entries were left past the last one shown
-- ARGV[3] how many entries to read (at most 1000)
--
-- Returns {length of the list, index of the first entry read, entry, ...}.
local key = K.audit
local count = math.min(tonumber(ARGV[3]) or 0, 1000)
local len = redis.call('LLEN', key)

local function place_of(entry)
  return tonumber(string.match(entry or '', '[{,]"n":(%d+)')) or 0
end

local start = 0
local after = tonumber(ARGV[1])
if after ~= nil and after > 0 then
  -- The first index whose number is below `after` (the numbers fall down the list).
  local lo, hi = 0, len
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if place_of(redis.call('LINDEX', key, mid)) < after then hi = mid else lo = mid + 1 end
  end
  start = lo
elseif after ~= nil then
  start = math.max(len - (tonumber(ARGV[2]) or 0), 0)
end
local out = {len, start}
if count > 0 and start < len then
  for _, e in ipairs(redis.call('LRANGE', key, start, start + count - 1)) do out[#out + 1] = e end
end
return out
