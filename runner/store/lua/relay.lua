-- relay: place follow-ups that another queue's ack put in its outbox (see ack.lua) into
-- this queue, each once by its id: a relay that died after placing them and before
-- taking them off the outbox places nothing the second time.
--
-- A DEBOUNCE function's job absorbed into a burst leaves no job under its own id, so its
-- id is kept known on its own (a marker under the idempotency prefix, '~absorbed:<id>',
-- naming the burst's job) as long as a placed job's id is known after its end: a second
-- placement (its emitter died before taking it off, or two relays read it) would merge
-- its payload again over a newer one and count it twice.
--
-- KEYS[1] ready        LIST
-- KEYS[2] scheduled    ZSET  id -> due ms
-- KEYS[3] notify       LIST
-- KEYS[4] stats        HASH
-- KEYS[5] job_prefix   (string)
-- KEYS[6] idem_prefix  (string)
-- KEYS[7] claims       HASH
-- KEYS[8] census       HASH
-- KEYS[9] done_meta    HASH
-- KEYS[10] done_prefix (string)
-- KEYS[11] prio        ZSET  ready ids of priority 1-9 (see enqueue.lua)
-- KEYS[12] lim_prefix  (string; a job under limits marks its first key where it is placed,
--                      as enqueue.lua does, so producers on another count of partitions
--                      find the key here while it may live here: see routing.py)
-- KEYS[13] delayed     ZSET  the ids of scheduled that are scheduled or retrying -> due (ms): the
--                            scheduled list's own index (see keys.py)
-- ARGV[1] now, ms ('' for the server's clock)
-- ARGV[2] n; then the 12 fields of enqueue.lua and the priority per job
-- ARGV[3 + 13 n] how long a limit key's marker lives, ms (0: none)
-- ARGV[4 + 13 n] how long an absorbed job's id stays known, ms (the done retention and a
--                margin)
--
-- Returns one code per job: 1 placed (counted as relayed|<type>), 0 already known (or its
-- idempotency key's job stands), -1 its idempotency key holds another payload (not placed),
-- 2 absorbed into a DEBOUNCE burst's job (see jobs.lua; 0 when it was absorbed before);
-- then, per job another job stands for (the burst's job it joined, or the job that holds
-- its idempotency key), its index
-- (0-based), that job's id and its status: whoever named the job sent can name the one
-- that runs.
--- @include "clock"
--- @include "stats"
--- @include "jobs"
--- @include "followups"
local now = clock(ARGV[1])
local n = tonumber(ARGV[2])
local Q = {ready = K.ready, scheduled = K.scheduled, delayed = K.delayed, stats = K.stats, job = K.job_prefix, idem = K.idem_prefix,
  claims = K.claims, done_meta = K.done_meta, done = K.done_prefix, prio = K.prio, mark = K.lim_prefix,
  mark_ms = tonumber(ARGV[3 + n * 13])}
local known_ms = tonumber(ARGV[4 + n * 13])
-- The status of the burst's job an entry joined, as the first placement named it.
local function status_of(id)
  if redis.call('HEXISTS', K.claims, id) == 1 then return 'processing' end
  if redis.call('EXISTS', K.job_prefix .. id) == 1 then
    return redis.call('HGET', K.job_prefix .. id .. ':s', 'status') or 'queued'
  end
  return 'done'
end

local put = jobs_acc()
local out = {}
local absorbed = {}
for i = 0, n - 1 do
  local j = job_fields(ARGV, 3 + i * 13)
  j.priority = tonumber(ARGV[3 + i * 13 + 12]) or 0
  local debounced = j.meta ~= '' and string.find(j.meta, '"debounce":', 1, true)
  local absorbed_key = debounced and K.idem_prefix .. '~absorbed:' .. j.id
  local joined = absorbed_key and redis.call('GET', absorbed_key)
  if joined then
    -- Absorbed already: nothing merged again, and the burst's job still named.
    out[#out + 1] = 0
    absorbed[#absorbed + 1] = i
    absorbed[#absorbed + 1] = joined
    absorbed[#absorbed + 1] = status_of(joined)
  elseif job_known(Q, j.id) then
    out[#out + 1] = 0
  else
    local code, jid, status = job_put(Q, now, j, put)
    if code == 1 then tally('relayed|' .. j.type) end
    if code == 2 and absorbed_key then redis.call('SET', absorbed_key, jid, 'PX', known_ms) end
    if (code == 2 or code == 0) and jid ~= j.id then
      absorbed[#absorbed + 1] = i
      absorbed[#absorbed + 1] = jid
      absorbed[#absorbed + 1] = status
    end
    out[#out + 1] = code
  end
end
jobs_flush(Q, put, K.notify, K.census)
flush(K.stats)
for _, v in ipairs(absorbed) do out[#out + 1] = v end
return out
