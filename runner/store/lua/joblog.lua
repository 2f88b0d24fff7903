-- joblog: append lines to one job's log, keep only the newest within its bounds, and
-- keep the log as long as the job's outcome is kept.
--
-- KEYS[1] log          LIST  the job's log lines (JSON objects), oldest first
-- ARGV[1] the most lines kept
-- ARGV[2] the most bytes kept (the sum of the lines' lengths)
-- ARGV[3] how long the log is kept from now, ms (the retention of the job's state)
-- ARGV[4..] the lines to append, oldest first (none: only the expiry is set)
--
-- Returns the number of lines kept. Bounded per call: the list never holds more than
-- ARGV[1] lines, and the worker sends at most that many.
local most = tonumber(ARGV[1])
local n
if #ARGV > 3 then
  -- In chunks: a stream keeps up to 10,000 chunks, past Lua's unpack limit (about 8,000).
  for s = 4, #ARGV, 4000 do
    n = redis.call('RPUSH', K.log, unpack(ARGV, s, math.min(s + 3999, #ARGV)))
  end
else
  n = redis.call('LLEN', K.log)
  if n == 0 then return 0 end
end
if n > most then
  redis.call('LTRIM', K.log, -most, -1)
  n = most
end
local budget = tonumber(ARGV[2])
local lines = redis.call('LRANGE', K.log, 0, -1)
local total = 0
for _, line in ipairs(lines) do total = total + #line end
local drop = 0
while total > budget and drop < #lines - 1 do
  drop = drop + 1
  total = total - #lines[drop]
end
if drop > 0 then
  redis.call('LTRIM', K.log, drop, -1)
  n = n - drop
end
redis.call('PEXPIRE', K.log, ARGV[3])
return n
