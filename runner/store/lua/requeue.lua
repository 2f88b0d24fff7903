-- requeue: move dead jobs back to ready with a fresh attempt budget, each optionally
-- with a new (already validated) payload and version. A bulk requeue sends its jobs in
-- batches (the caller bounds a batch), so 500,000 dead jobs take a few hundred calls. Its idempotency key (freed when it
-- died) is taken again when it is free; when another job completed it with the same
-- payload, the job keeps it and is acknowledged as that job's duplicate at its claim,
-- without running; when another job holds it otherwise, the job goes back without its
-- key, and its history says so. Its state counts the requeues ('requeued').
--
-- KEYS[1] dead         ZSET
-- KEYS[2] ready        LIST
-- KEYS[3] notify       LIST
-- KEYS[4] job_prefix   (string; a job's record is prefix .. id, its state that .. ':s')
-- KEYS[5] idem_prefix  (string)
-- KEYS[6] census       HASH  jobs not done per "<type>|<version>"
-- KEYS[7] prio         ZSET  (a job of priority 1-9 goes back there: to_ready in includes/ready.lua)
-- ARGV[1] now, ms ('' for the server's clock)
-- ARGV[2] n; then 5 fields per job:
--   job id
--   payload (JSON, '' to keep)
--   version ('' to keep)
--   payload hash of the payload it goes back with ('' to keep the stored one)
--   history entry (a JSON object without at_ms, '' none): who requeued it; stamped here
--
-- Returns one code per job: 1 requeued, 2 requeued without its idempotency key, 3
-- requeued to end as the duplicate of the job that completed its key, -1 not in the
-- dead-letter set.
--- @include "clock"
--- @include "history"
--- @include "calls"
--- @include "ready"
--- @include "idem"
--- @include "records"
--- @include "record_keys"
local now, n = clock(ARGV[1]), tonumber(ARGV[2])

-- The batch's ids leave the dead set, and its plain ones go to ready, in one variadic
-- ZREM and one LPUSH at the end (an id twice in a batch is requeued once).
local unburied, ready, seen = {}, {}, {}
-- Which ids are dead letters: one ZMSCORE for the batch.
local ids = {}
for i = 0, n - 1 do ids[i + 1] = ARGV[3 + i * 5] end
local dead = {}
for s = 1, #ids, 4000 do
  local got = redis.call('ZMSCORE', K.dead, unpack(ids, s, math.min(s + 3999, #ids)))
  for j = 1, #got do dead[s + j - 1] = got[j] end
end

-- A requeued job's idempotency key: taken again (code 1), or, held by another job, kept
-- as that completed job's duplicate (3) or dropped with a history note (2). Returns the
-- code and the history as it now stands.
local function rekey(id, rec, phash, set, history)
  local code = 1
  local hash = phash ~= '' and phash or (rec.idem_hash ~= '' and rec.idem_hash or '-')
  local ik = idem_key(K.idem_prefix, rec.type, rec.idem_key)
  local mark = redis.pcall('GET', ik)
  local hid, hhash, state
  if type(mark) == 'string' then hid, hhash, state = string.match(mark, '^(%S+) (%S+) ?(%S*)') end
  if not mark or hid == id then
    redis.call('SET', ik, id .. ' ' .. hash)
    rec.idem_hash = hash
  elseif state == 'done' and hhash == hash then
    -- Another job with this very payload completed the key meanwhile (a caller retried
    -- after this one died): the job keeps its key, and its claim acknowledges it as that
    -- job's duplicate without running it (claim.lua), as the key promises.
    code = 3
    rec.idem_hash = hash
  else
    code = 2
    local note = '{"outcome":"key dropped","message":"idempotency key ' .. cjson.encode(rec.idem_key):sub(2, -2) ..
      ' is held by another job","at_ms":' .. now .. '}'
    rec.idem_key, rec.idem_hash = '', ''
    with_history(set, history, note)
    history = set[#set]
  end
  return code, history
end

local function requeue(i, id, payload, version, phash, by)
  if seen[id] or not dead[i + 1] then return -1 end
  local jk = K.job_prefix .. id
  -- Read whole only when it is written back (an edit, or its idempotency key's fields):
  -- a plain requeue of a big record reads its head alone.
  local rec = (payload ~= '' or version ~= '') and rec_load(jk) or rec_head(jk)
  if rec and rec.payload == nil and rec.idem_key ~= '' then rec = rec_load(jk) end
  if not rec then return -1 end
  seen[id] = true
  unburied[#unburied + 1] = id
  local sk = jk .. ':s'
  local code = 1
  local read = redis.pcall('HMGET', sk, 'history', 'priority', 'requeued')
  if read.err then
    -- A state key of another type (damage, another writer): the requeue starts the job's
    -- state afresh. Raised, it failed this call after the jobs before it in the call were
    -- rewritten but before they left the dead set: every requeue of the queue failed.
    redis.call('DEL', sk)
    read = {false, false, false}
  end
  local history, prio, requeued = unpack(read)
  -- Counted for readers, and for the next burial: its ON_FAILURE job is <id>.f<requeued + 1>
  -- (a damaged count reads as 0: whole_count, as bury.lua and the job view read it).
  local set = {'attempt', 0, 'ready_ms', now, 'enqueued_ms', now, 'deferrals', 0,
    'requeued', whole_count(requeued) + 1}
  local entry = stamped(by, now)
  local changed = payload ~= '' or version ~= ''  -- else the record is written back only for its key
  if rec.idem_key ~= '' then
    changed = true
    code, history = rekey(id, rec, phash, set, history)
  end
  if entry ~= '' then with_history(set, history, entry) end
  if payload ~= '' or version ~= '' then
    census(K.census, rec.type .. '|' .. rec.version, -1)
    if payload ~= '' then rec.payload = payload end
    if version ~= '' then rec.version = version end
    census(K.census, rec.type .. '|' .. rec.version, 1)
  end
  if changed then
    redis.call('SET', jk, rec_encode(rec))  -- SET drops the dead retention's expiry
  else
    redis.call('PERSIST', jk)  -- the record as it was, without the dead retention's expiry
  end
  redis.call('HDEL', sk, 'status', 'reason', 'finished_ms', 'token', 'lost_token', 'refunds', 'error', 'children')
  redis.call('HSET', sk, unpack(set))
  redis.call('PERSIST', sk)
  if (tonumber(prio) or 0) > 0 then
    to_ready(K.ready, K.prio, id, prio, now, false)
  else
    ready[#ready + 1] = id
  end
  return code
end

local out = {}
for i = 0, n - 1 do
  local a = 3 + i * 5
  out[#out + 1] = requeue(i, ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4])
end
call_many('ZREM', K.dead, unburied, 1)
call_many('LPUSH', K.ready, ready, 1)
wake(K.notify)
return out
