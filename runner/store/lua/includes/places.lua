-- An audit entry's place number (as audit.lua writes it: a top-level member, after '{' or
-- ','; inside a string such a mark is escaped), or nil: an earlier release's entry, or
-- another writer's number. Only ASCII digits without a leading zero, at most 16 of them,
-- within 1..2^50 (audit.PLACE_BOUND; past 2^53 Lua's doubles give n + 1 == n, and every
-- later entry would share one number): audit.py's _PLACE reads the same, so the script
-- and the web process never disagree on an entry's place.
local function place_of(entry)
  local d = string.match(entry or '', '[{,]"n":([1-9]%d*)[,}]')
  if d == nil or #d > 16 then return nil end
  local n = tonumber(d)
  if n > 1125899906842624 then return nil end
  return n
end
