-- emit: one event's jobs for every subscribed function, its record and its idempotency
-- key, in one atomic step on the event's home partition (see runner/client/emitting.py).
-- The jobs for this partition are written here as enqueue.lua writes them; the jobs for
-- other queues (or other partitions) go to this partition's outbox in the same step and
-- are placed from there by their ids, once whoever places them (the emitter at once, else
-- the relay: runner/outbox.py). So a producer killed at any point leaves every job of the
-- event or none.
--
-- KEYS[1] ready        LIST
-- KEYS[2] scheduled    ZSET  id -> due ms
-- KEYS[3] notify       LIST
-- KEYS[4] stats        HASH  (events_emitted, events_jobs: this event and the jobs it started)
-- KEYS[5] job_prefix   (string; the job key is prefix .. id)
-- KEYS[6] idem_prefix  (string; a job's idempotency key is prefix .. type .. ':' .. key)
-- KEYS[7] claims       HASH
-- KEYS[8] census       HASH
-- KEYS[9] prio         ZSET
-- KEYS[10] lim_prefix  (string; see enqueue.lua)
-- KEYS[11] delayed     ZSET  the scheduled list's index (see enqueue.lua)
-- KEYS[12] outbox      LIST  the jobs on their way to another partition (JSON entries)
-- KEYS[13] emitted     LIST  this partition's recent events, newest first (JSON records); one
--                      of another Redis type (another program's write, or damage) is
--                      renamed aside to <key>:corrupt (counted as "corrupt|events") and the
--                      list starts afresh, so the event is recorded (store/damage.py)
-- KEYS[14] emit_prefix (string; an emit's idempotency key is prefix .. name .. ':' .. key,
--                      a HASH: hash (of the event's data), record)
-- KEYS[15] wakes       LIST  events whose waiters (ctx.wait_for_event) are still to be told
--                      (JSON: id, name, ts, data); the emitter tells them and takes the
--                      entry off, else the relay does (client/waking.py)
-- KEYS[16] shapes      HASH  the name's waiters' field lists (store/listeners.py), read
--                      when ARGV[14 + 13 n + m] is 1 (one server holds every key); on
--                      Redis Cluster another slot's, so a key of this one stands in
-- ARGV[1] now, ms ('' for the server's clock; tests pass their own)
-- ARGV[2] n, the jobs written here; then 13 fields per job, as enqueue.lua
-- ARGV[3 + 13 n] how long a limit key's marker lives, ms
-- ARGV[4 + 13 n] the event's id
-- ARGV[5 + 13 n] its name
-- ARGV[6 + 13 n] its data as the record shows it: '"data":' and the JSON, or a preview
--                 (see emitting.py, shown_data)
-- ARGV[7 + 13 n] the emit's idempotency key ('' none)
-- ARGV[8 + 13 n] the data's hash (for the idempotency key)
-- ARGV[9 + 13 n] how long the idempotency key is kept, ms
-- ARGV[10 + 13 n] the most records `emitted` keeps (the list expires with the key's time)
-- ARGV[11 + 13 n] the jobs sent away: a JSON array of {id, type, queue}
-- ARGV[12 + 13 n] this partition's queue (named in the record of each job written here)
-- ARGV[13 + 13 n] m, the outbox entries; then m entries (JSON: queue, 12 fields, priority)
-- ARGV[14 + 13 n + m] 1: KEYS[16] is the name's registry; 0: it is not (Redis Cluster)
-- ARGV[15 + 13 n + m] the data itself (JSON), whole, as the name's waiters get it
--
-- Returns {code, record}:
--   1  emitted: the record (JSON), then code, id, status per job written here (as enqueue.lua),
--      then the entry put on `wakes` ('' none: the registry, read here, has no waiters; a
--      waiter put on after this step began after the event, and does not get it)
--   0  duplicate: the record of the emit that holds the key, nothing written
--  -1  conflict: the record of the emit that holds the key with other data, nothing written
--- @include "clock"
--- @include "batch"
local now = clock(ARGV[1])
local n = tonumber(ARGV[2])
local e = 3 + n * 13
local id, name, data, ikey = ARGV[e + 1], ARGV[e + 2], ARGV[e + 3], ARGV[e + 4]
local hold_key = ''
if ikey ~= '' then
  hold_key = K.emit_prefix .. name .. ':' .. ikey
  local held = redis.call('HMGET', hold_key, 'hash', 'record')
  if held[2] then
    if held[1] == ARGV[e + 5] then return {0, held[2]} end
    return {-1, held[2]}
  end
end
local out = {1, ''}
local here = {}
local started = 0  -- jobs this event started: new ones written here, and those sent away
batch_put(now, out, function(j, code, jid, status)
  if code == 1 then started = started + 1 end
  if code >= 0 then
    local entry = {id = jid, type = j.type, queue = ARGV[e + 9], status = status}
    -- A DEBOUNCE function's job: the id is its burst's one job (see jobs.lua).
    if j.meta ~= '' and string.find(j.meta, '"debounce":', 1, true) then entry.debounced = true end
    here[#here + 1] = cjson.encode(entry)
  end
end)
local m = tonumber(ARGV[e + 10])
for i = 1, m do
  redis.call('RPUSH', K.outbox, ARGV[e + 10 + i])
end
-- The home partition's counts of events and of the jobs they started (pcall: a stats hash
-- damaged to another type loses these counts, never the event).
redis.pcall('HINCRBY', K.stats, 'events_emitted', 1)
if started + m > 0 then redis.pcall('HINCRBY', K.stats, 'events_jobs', started + m) end
-- The record: data as the producer sent it (never re-encoded: cjson would round numbers)
-- or its preview when big, the jobs written here and those sent away.
local away = ARGV[e + 8]
local jobs = '[' .. table.concat(here, ',')
if away ~= '[]' then
  jobs = jobs .. (#here > 0 and ',' or '') .. string.sub(away, 2, -2)
end
jobs = jobs .. ']'
local record = '{"id":' .. cjson.encode(id) .. ',"name":' .. cjson.encode(name) .. ',"at_ms":' ..
  string.format('%d', now) .. ',' .. data .. ',"jobs":' .. jobs .. '}'
-- (pcall, set aside and pushed again: the jobs above are written, and a failure here would
-- leave them written with no record of their event and the emit answered an error)
local pushed = redis.pcall('LPUSH', K.emitted, record)
if type(pushed) == 'table' and pushed.err then
  redis.call('RENAME', K.emitted, K.emitted .. ':corrupt')
  redis.pcall('HINCRBY', K.stats, 'corrupt|events', 1)
  redis.call('LPUSH', K.emitted, record)
end
redis.call('LTRIM', K.emitted, 0, tonumber(ARGV[e + 7]) - 1)
redis.call('PEXPIRE', K.emitted, tonumber(ARGV[e + 6]))
if hold_key ~= '' then
  redis.call('HSET', hold_key, 'hash', ARGV[e + 5], 'record', record)
  redis.call('PEXPIRE', hold_key, tonumber(ARGV[e + 6]))
end
out[2] = record
-- The event as a waiter gets it, kept until every waiter of before now was told: in this
-- same step, so an accepted emit reaches them whatever dies after.
local pending = '{"id":' .. cjson.encode(id) .. ',"name":' .. cjson.encode(name) .. ',"ts":' ..
  string.format('%d', now) .. ',"data":' .. ARGV[e + 12 + m] .. '}'
if ARGV[e + 11 + m] ~= '1' or redis.call('EXISTS', K.shapes) == 1 then
  redis.call('RPUSH', K.wakes, pending)
  out[#out + 1] = pending
else
  out[#out + 1] = ''
end
return out
