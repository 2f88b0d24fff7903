-- audit: put one operator action on the audit trail, stamped with the server's time, and
-- keep the trail bounded by count and by age: the newest `most` entries at most, and
-- none older than `max_age` (the oldest, at the tail, leave first; at most 1000 per
-- call, so one call's work stays bounded whatever the trail held before).
--
-- KEYS[1] audit        LIST  JSON entries, newest first
-- ARGV[1] now, ms ('' for the server's clock)
-- ARGV[2] the entry: a JSON object without at_ms (added here)
-- ARGV[3] most entries kept
-- ARGV[4] max age, ms
-- ARGV[5] a bulk action's id ('' none): its entry, written when the action starts, is
--         replaced in place as the action goes (its count so far, then how it ended),
--         keeping its time; looked for among the newest 1000 entries, pushed anew if
--         it is not there (1000 other actions since)
--
-- Returns the entries the trail holds after the call.
--- @include "clock"
--- @include "history"
local now = clock(ARGV[1])
local most, max_age = tonumber(ARGV[3]), tonumber(ARGV[4])
local bulk = ARGV[5] or ''
local placed = false
if bulk ~= '' then
  local mark = '"bulk":' .. cjson.encode(bulk)
  for i, old in ipairs(redis.call('LRANGE', K.audit, 0, 999)) do
    if string.find(old, mark, 1, true) then
      local ok, entry = pcall(cjson.decode, old)
      local at = ok and type(entry) == 'table' and tonumber(entry.at_ms) or now
      redis.call('LSET', K.audit, i - 1, stamped(ARGV[2], string.format('%d', at)))
      placed = true
      break
    end
  end
end
if not placed then redis.call('LPUSH', K.audit, stamped(ARGV[2], now)) end
redis.call('LTRIM', K.audit, 0, most - 1)
for _ = 1, 1000 do
  local oldest = redis.call('LINDEX', K.audit, -1)
  if not oldest then break end
  local ok, entry = pcall(cjson.decode, oldest)
  -- An entry that is not JSON, or has no time, is as old as can be.
  local at = ok and type(entry) == 'table' and tonumber(entry.at_ms) or 0
  if at >= now - max_age then break end
  redis.call('RPOP', K.audit)
end
return redis.call('LLEN', K.audit)
