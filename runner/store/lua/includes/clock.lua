-- The time of a call.
-- Shared helpers, prepended to every script by scripts.py (Lua scripts cannot import).
-- None of them builds a key from anything but a prefix passed in KEYS.

-- The time of this call, in ms: the server's (TIME), so deadlines written by a worker on
-- one host are judged by a scheduler on another against the same clock. A test may pass
-- its own clock as a positive number; production passes '' (Redis 7 replicates a
-- script's effects, so reading TIME before writing is safe).
local function clock(arg)
  local t = tonumber(arg)
  if t and t > 0 then return t end
  local s = redis.call('TIME')
  return tonumber(s[1]) * 1000 + math.floor(tonumber(s[2]) / 1000)
end
