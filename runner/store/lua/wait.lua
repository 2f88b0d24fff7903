-- wait: a durable function's ctx.wait_for_signal reads its signal, fenced by the claim
-- token. The wait's entry in the step log (see step.lua) is at ARGV[3]: absent (a wait
-- reached for the first time) or status "waiting" (written by suspend.lua when the run
-- ended there). A signal kept for the job ('sig:<name>', signal.lua) is taken and the
-- entry says "ok" with its body; else past the wait's end the entry says "timeout"; else
-- nothing changes and the run suspends (again) until a signal or the timeout.
--
-- KEYS[1] job          STRING  the record (state: K.job .. ':s')
-- KEYS[2] claims       HASH    id -> claim
-- ARGV[1] now, ms ('' for the server's clock)
-- ARGV[2] job id
-- ARGV[3] token
-- ARGV[4] position of the wait's entry
-- ARGV[5] signal name
-- ARGV[6] the entry's head: a JSON object's fields (name, kind, signal) without the
--         closing brace, to which this call adds status, finished_ms and value
-- ARGV[7] the wait's end, epoch ms (its recorded until_ms), '' for a first wait
-- ARGV[8] the most entries of a log
-- ARGV[9] the most bytes of a log
-- ARGV[10] the longest entry a job list reads whole (records.STEP_INLINE; '' none): a
--          longer one gets its summary beside it, stephead:<position> (see step.lua)
-- ARGV[11] the summary's head ('' ARGV[6]): ARGV[6] without what makes it long (an
--          event wait's match, up to 4 KiB), so a summary stays within a few hundred bytes
--
-- Returns {code, body}: 1 a signal taken (its body), 2 timed out, 0 nothing yet (suspend),
-- -1 refused (lease lost), -2 the log does not stand where the run read it, -3/-4 full.
--- @include "clock"
--- @include "claims"
local now, id, pos = clock(ARGV[1]), ARGV[2], tonumber(ARGV[4])
if not fence(redis.call('HGET', K.claims, id), ARGV[3]) then return {-1, ''} end
local sk = K.job .. ':s'
local f = redis.call('HMGET', sk, 'steps', 'step_bytes', 'sig:' .. ARGV[5], 'step:' .. pos)
local n, bytes, body, old = tonumber(f[1]) or 0, tonumber(f[2]) or 0, f[3], f[4]
local first = ARGV[7] == ''
if (first and n ~= pos) or (not first and (pos >= n or not old)) then return {-2, ''} end
local entry
if body then
  entry = ARGV[6] .. ',"status":"ok","finished_ms":' .. now .. ',"value":' .. body .. '}'
elseif not first and now >= tonumber(ARGV[7]) then
  entry = ARGV[6] .. ',"status":"timeout","finished_ms":' .. now .. '}'
else
  return {0, ''}
end
local size = bytes + #entry - (old and #old or 0)
if first and n + 1 > tonumber(ARGV[8]) then return {-3, ''} end
if size > tonumber(ARGV[9]) then return {-4, ''} end
redis.call('HSET', sk, 'step:' .. pos, entry, 'steps', first and n + 1 or n, 'step_bytes', size)
local inline = tonumber(ARGV[10] or '')
if inline and #entry > inline then
  local shead = (ARGV[11] and ARGV[11] ~= '') and ARGV[11] or ARGV[6]
  redis.call('HSET', sk, 'stephead:' .. pos, shead .. ',"status":"' .. (body and 'ok' or 'timeout') ..
             '","finished_ms":' .. now .. ',"size":' .. #entry .. '}')
elseif inline then
  redis.call('HDEL', sk, 'stephead:' .. pos)  -- (none should be there: a summary never outlives its entry)
end
if body then
  redis.call('HDEL', sk, 'sig:' .. ARGV[5])
  -- What signal.lua counts kept (never below 0: a signal kept before it counted).
  local kept = redis.call('HMGET', sk, 'sigs', 'sig_bytes')
  redis.call('HSET', sk, 'sigs', math.max(0, (tonumber(kept[1]) or 0) - 1),
             'sig_bytes', math.max(0, (tonumber(kept[2]) or 0) - #body))
  return {1, body}
end
return {2, ''}
