-- count: add a worker's summed figures to one hash (store/stats.py add_counts). A stats
-- hash's go through stat_add, the one rule of its field names that every script's figures
-- follow (includes/stats.lua): a function's successes and timings land where its other
-- figures do, and the hash stays bounded. A throughput minute's are added as they are.
--
-- KEYS[1] figures      HASH  a queue's stats hash, or a throughput minute's
-- ARGV[1] '1' for a stats hash, '' for a throughput minute
-- ARGV[2] ms to keep the hash after this add ('' for ever)
-- ARGV[3..] field, count, field, count, ... (at most 1,000 pairs a call: add_counts)
--
-- Returns the fields added. (pcall: a hash damaged to another type loses its counts.)
--- @include "stats"
local n = 0
for i = 3, #ARGV - 1, 2 do
  local by = tonumber(ARGV[i + 1])
  if by then
    if ARGV[1] == '1' then
      stat_add(K.figures, ARGV[i], by)
    else
      redis.pcall('HINCRBY', K.figures, ARGV[i], by)
    end
    n = n + 1
  end
end
if ARGV[2] ~= '' then redis.pcall('PEXPIRE', K.figures, ARGV[2]) end
return n
