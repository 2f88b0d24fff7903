-- seek_trail: one page of an audit trail (a LIST, newest at the head), read from where
-- the last page ended (it reads, never writes). Finding the place and reading the page
-- are one call, so an action landing between the two cannot shift the page.
--
-- A place is an anchor, the place number `n` of a numbered entry at or above the last one
-- shown (audit.lua: the numbers fall strictly from head to tail and an entry keeps its
-- own), and how many entries after the anchor were shown. Entries are only ever pushed
-- at the head, rewritten in place, or trimmed off the tail, so the entries between the
-- anchor and the place never change while the place is on the trail: the page starts
-- that many entries past the anchor, whatever landed at the head, was folded or
-- rewritten, or was trimmed off the tail since.
--
-- Entries without a number (an earlier release's; or another writer's number outside
-- 1..2^50) are ordered by the first numbered entry below them among the next 64 (0 if
-- none: the earlier release's entries at the tail), so a binary search finds the anchor
-- among entries of both releases. Only more than 64 unnumbered entries together above a
-- numbered one (an earlier release's long run of actions during a rolling deploy) can
-- mislead it. Without an anchor (ARGV[1] 0: a trail with no numbered entry when the last
-- page was read), a place is a count of the entries left past it, which a trim moves.
-- Bounded: log2 of the list's length probes of at most 64 entries, one range of at most
-- ARGV[3] entries, and one look at the newest 64.
--
-- KEYS[1] audit        LIST  JSON entries, newest first
-- ARGV[1] the anchor's place number ('' for the first page; 0: none, see ARGV[2])
-- ARGV[2] with an anchor: the entries after it already shown; without: how many entries
--         were left past the last one shown
-- ARGV[3] how many entries to read (at most 1000)
--
-- Returns {length of the list, index of the first entry read, the newest numbered entry's
-- number (0: none among the newest 64), its index, entry, ...}.
--- @include "places"
local key = K.audit
local count = math.min(tonumber(ARGV[3]) or 0, 1000)
local len = redis.call('LLEN', key)
local W = 64

-- The number entry i is ordered by: its own, or the first one below it within W.
local function order_of(i)
  local n = place_of(redis.call('LINDEX', key, i))
  if n then return n end
  for _, e in ipairs(redis.call('LRANGE', key, i + 1, i + W - 1)) do
    n = place_of(e)
    if n then return n end
  end
  return 0
end

local start = 0
local after = tonumber(ARGV[1])
local shown = math.max(tonumber(ARGV[2]) or 0, 0)
if after ~= nil and after > 0 then
  -- The first index ordered below the anchor: the one just after it.
  local lo, hi = 0, len
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if order_of(mid) < after then hi = mid else lo = mid + 1 end
  end
  start = lo + shown
elseif after ~= nil then
  start = math.max(len - shown, 0)
end
local head, at = 0, -1
for i, e in ipairs(redis.call('LRANGE', key, 0, W - 1)) do
  local n = place_of(e)
  if n then head, at = n, i - 1 break end
end
local out = {len, start, head, at}
if count > 0 and start < len then
  for _, e in ipairs(redis.call('LRANGE', key, start, start + count - 1)) do out[#out + 1] = e end
end
return out
