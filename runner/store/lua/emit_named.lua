-- emit_named: an event's record names the jobs that stand for the ones it sent away. A
-- job sent to another partition (or queue) through the outbox may, when placed, join a
-- DEBOUNCE burst's job or meet the job that holds its idempotency key: the job sent is
-- then never written, and a record naming it would name an unknown job. The emitter,
-- once it placed them (outbox.place tells it which), rewrites each one's entry in the
-- record it wrote (emit.lua), in the recent events and under the emit's idempotency key.
-- The entries are replaced as text: the record's data is never re-encoded (cjson would
-- round numbers).
--
-- KEYS[1] emitted      LIST  this partition's recent events, newest first (JSON records)
-- KEYS[2] emit_prefix  (string; an emit's idempotency key is prefix .. name .. ':' .. key,
--                      a HASH: hash, record)
-- ARGV[1] the event's id
-- ARGV[2] its name
-- ARGV[3] its idempotency key ('' none)
-- ARGV[4] the most records `emitted` keeps (looked through 100 at a time, from the newest;
--         the event was pushed a moment ago, so it is near the head)
-- ARGV[5] n; then n pairs: a job's entry as the record holds it (JSON), its replacement
--
-- Returns 1 when the record was found and rewritten, 0 when it was not (trimmed away, or
-- expired: nothing else holds it).
local n = tonumber(ARGV[5])
local function renamed(record)
  local out = record
  for i = 0, n - 1 do
    local old, new = ARGV[6 + 2 * i], ARGV[7 + 2 * i]
    local at = string.find(out, old, 1, true)
    if at then out = string.sub(out, 1, at - 1) .. new .. string.sub(out, at + #old) end
  end
  return out
end
local head = '{"id":' .. cjson.encode(ARGV[1]) .. ','
local most = tonumber(ARGV[4])
local found = 0
local from = 0
while found == 0 and from < most do
  -- (pcall: a list of another Redis type, damaged since the emit, holds no record; the
  -- next emit sets it aside, emit.lua)
  local page = redis.pcall('LRANGE', K.emitted, from, math.min(from + 99, most - 1))
  if page.err or #page == 0 then break end
  for i, record in ipairs(page) do
    if string.sub(record, 1, #head) == head then
      redis.call('LSET', K.emitted, from + i - 1, renamed(record))
      found = 1
      break
    end
  end
  from = from + 100
end
if ARGV[3] ~= '' then
  local hold_key = K.emit_prefix .. ARGV[2] .. ':' .. ARGV[3]
  local record = redis.call('HGET', hold_key, 'record')
  if record and string.sub(record, 1, #head) == head then
    redis.call('HSET', hold_key, 'record', renamed(record))
  end
end
return found
