-- weigh: the exact bytes of a stats hash narrow enough to be read whole, in the same round
-- trip as its reader's other counts (store/stats.py stats_hashes; it reads, never writes).
-- MEMORY USAGE at its default sampling reads a hash's first 5 entries in table order: 5,000
-- ordinary figures beside 1,000 fields named by 100 KB types (115 MB) were estimated at
-- 0.35 MB and read whole. SAMPLES 0 walks every entry, so only a hash of at most ARGV[1]
-- fields is walked (about 1 ms at 20,000); a wider one is read by name on its field count.
--
-- KEYS[1] stats        HASH    the stats hash of a partition
-- ARGV[1] the most fields a hash may hold to be weighed (STATS_WHOLE)
--
-- Returns its bytes, or 0 when it was not weighed: no hash, more than ARGV[1] fields, or a
-- server that refuses MEMORY USAGE (then its field count alone decides).
local n = redis.pcall('HLEN', K.stats)
if type(n) ~= 'number' or n == 0 or n > tonumber(ARGV[1]) then return 0 end
local bytes = redis.pcall('MEMORY', 'USAGE', K.stats, 'SAMPLES', '0')
if type(bytes) ~= 'number' then return 0 end
return bytes
