-- seek: one page of a sorted set, read from where the last page ended, in the order the
-- page reads it (it reads, never writes). Finding the place and reading the page are one
-- call, so a member added or removed meanwhile (a claim landing at the head of the
-- processing list) cannot shift the page off its place. A place is a rank (the first
-- page) or a position (score, member) that is unique even where many members share a
-- score (the leases of one claim share a deadline): members of one score sort by their
-- bytes, so the page starts after the anchor's place whether the anchor itself is still
-- there, left, or moved. Bounded: two counts, a binary search over the members of the
-- anchor's score (log2 of their number, one rank read each), then one range of at most
-- ARGV[3] members.
--
-- KEYS[1] index        ZSET
-- ARGV[1] '1' newest first (highest score first, ZREVRANGE's order), else lowest first
-- ARGV[2] the rank to start at when there is no anchor
-- ARGV[3] how many members to read (at most 1000)
-- ARGV[4] the anchor's score (optional: with ARGV[5])
-- ARGV[5] the anchor's member
--
-- Returns {rank (in the order read, 0-based) of the first member read, member, score, ...}.
local key, desc = K.index, ARGV[1] == '1'
local count = math.min(tonumber(ARGV[3]), 1000)
local score, anchor = ARGV[4], ARGV[5]
local range = desc and 'ZREVRANGE' or 'ZRANGE'

-- a <= b by bytes, as a sorted set orders the members of one score (Lua's own
-- comparison follows the server's locale).
local function bytes_le(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a <= #b
end

local start = tonumber(ARGV[2])
if anchor ~= nil then
  local before
  if desc then
    before = redis.call('ZCOUNT', key, '(' .. score, '+inf')
  else
    before = redis.call('ZCOUNT', key, '-inf', '(' .. score)
  end
  local ties = redis.call('ZCOUNT', key, score, score)
  -- The first of the ties that comes after the anchor in the order read.
  local lo, hi = 0, ties
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    local m = redis.call(range, key, before + mid, before + mid)[1]
    local done
    if m == nil then
      done = false
    elseif desc then
      done = bytes_le(anchor, m)  -- at or before the anchor: read already
    else
      done = bytes_le(m, anchor)
    end
    if done then lo = mid + 1 else hi = mid end
  end
  start = before + lo
end
local out = {start}
if count > 0 then
  local page = redis.call(range, key, start, start + count - 1, 'WITHSCORES')
  for i = 1, #page do out[#out + 1] = page[i] end
end
return out
