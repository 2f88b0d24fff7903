-- step: record one finished step of a durable function in its job's step log, fenced by
-- the claim token (a stale worker's step is refused, so a reclaimed run's log is never
-- written by two runs). The log lives in the job's state hash, so it is deleted, kept and
-- expired with the job (its retention) by every script that already does so:
--   steps        the number of entries; step:<i> (i from 0) each entry (JSON)
--   step_bytes   the bytes of all entries
--
-- KEYS[1] job          STRING  the record (its state hash is K.job .. ':s')
-- KEYS[2] claims       HASH    id -> claim
-- KEYS[3] stats        HASH
-- ARGV[1] now, ms ('' for the server's clock)
-- ARGV[2] token
-- ARGV[3] job id
-- ARGV[4] position (0-based) the entry takes: the log's length as the run read it
-- ARGV[5] entry (a JSON object without its finished_ms, which the server's clock adds;
--         or a compact array, which gets it as its last element: records.py)
-- ARGV[6] the most entries of a log (1,000)
-- ARGV[7] the most bytes of a log (4 MiB)
-- ARGV[8] the stats field counting this step in K.stats ('' none)
-- ARGV[9] the entry's summary for job lists ('' none: a short entry, read whole): a JSON
--         object without the value, to which this call adds finished_ms and size (the
--         entry's bytes), kept as stephead:<i> (lookup.lua reads it instead of the entry)
-- ARGV[10] the run's latest progress not written yet (JSON for the state's progress field,
--         as joblog.lua writes it with log lines; '' or absent: none, most calls): written
--         under the fence, whatever else the call answers, so a reader who sees the step
--         sees the progress reported before it
--
-- Returns {code, n}: 1 recorded; -1 refused (lease lost: nothing changed); -2 another
-- entry holds that position (n: the log's length); -3 the log is full (n entries); -4
-- the entry would take the log past its bytes (n: its bytes now).
--- @include "clock"
--- @include "claims"
--- @include "history"
--- @include "stats"
local now = clock(ARGV[1])
if not fence(redis.call('HGET', K.claims, ARGV[3]), ARGV[2]) then return {-1, 0} end
local sk = K.job .. ':s'
-- (pcall: a state key of another type, damage, loses the progress; the step then fails below)
if ARGV[10] and ARGV[10] ~= '' then redis.pcall('HSET', sk, 'progress', ARGV[10]) end
local f = redis.call('HMGET', sk, 'steps', 'step_bytes')
local n, bytes = tonumber(f[1]) or 0, tonumber(f[2]) or 0
if n ~= tonumber(ARGV[4]) then return {-2, n} end
if n + 1 > tonumber(ARGV[6]) then return {-3, n} end
local entry = stamped_as(ARGV[5], 'finished_ms', now)
if bytes + #entry > tonumber(ARGV[7]) then return {-4, bytes} end
redis.call('HSET', sk, 'step:' .. n, entry, 'steps', n + 1, 'step_bytes', bytes + #entry)
if ARGV[9] and ARGV[9] ~= '' then
  redis.call('HSET', sk, 'stephead:' .. n, stamped_as(stamped_as(ARGV[9], 'finished_ms', now), 'size', #entry))
end
-- pcall: a stats hash damaged to another type loses the count, never the step.
if K.stats and ARGV[8] and ARGV[8] ~= '' then stat_add(K.stats, ARGV[8], 1) end
return {1, n + 1}
