-- Variadic commands in bounded chunks.

-- Run one variadic command (ZADD, ZREM, ...) over a flat list of arguments, in chunks
-- (a multiple of `step`, so member/score pairs stay together) to keep within Lua's
-- unpack limit. Nothing is sent for an empty list.
local function call_many(cmd, key, args, step)
  local chunk = 4000 - 4000 % step
  for s = 1, #args, chunk do
    redis.call(cmd, key, unpack(args, s, math.min(s + chunk - 1, #args)))
  end
end
