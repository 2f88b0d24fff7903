-- steps: read a durable function's step log in one round trip (a run's first durable
-- call), and count a replay when there is one.
--
-- KEYS[1] job          STRING  the record (its state hash, which holds the log, is K.job .. ':s')
-- KEYS[2] stats        HASH
-- ARGV[1] the stats field counting a replay ('' none)
-- ARGV[2] the most entries a log holds (steps.MAX_STEPS; step.lua refuses one more)
--
-- Returns the entries (JSON each), oldest first; {} for a job without a log. A count
-- past ARGV[2] is damage (another writer's record): read as that many entries, so the
-- call's work stays bounded (steps=1000000 built a million field names) and the missing
-- ones come back '', which the reader marks damaged.
--- @include "stats"
--- @include "asleep"

local sk = K.job .. ':s'
local got = redis.pcall('HMGET', sk, 'steps', 'sleep')
if type(got) ~= 'table' or got.err then got = {} end
-- (a sleeping job's count is in its 'sleep' field: includes/asleep.lua)
local n = tonumber(got[1]) or asleep_parts(got[2]) or 0
if n <= 0 then return {} end
n = math.min(math.floor(n), tonumber(ARGV[2]) or 0)
local names = {}
for i = 0, n - 1 do names[#names + 1] = 'step:' .. i end
local out = {}
for s = 1, #names, 1000 do
  local part = redis.call('HMGET', sk, unpack(names, s, math.min(s + 999, #names)))
  for j = 1, #part do out[#out + 1] = part[j] or '' end
end
-- (stat_add: a stats hash damaged to another type loses the count, never the read.)
if ARGV[1] ~= '' then stat_add(K.stats, ARGV[1], 1) end
return out
