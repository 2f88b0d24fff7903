-- requeue: move one dead job back to ready with a fresh attempt budget, optionally
-- with a new (already validated) payload and version. Its idempotency key (freed when it
-- died) is taken again when it is free; when another job completed it with the same
-- payload, the job keeps it and is acknowledged as that job's duplicate at its claim,
-- without running; when another job holds it otherwise, the job goes back without its
-- key, and its history says so. Its state counts the requeues ('requeued').
--
-- KEYS[1] dead         ZSET
-- KEYS[2] ready        LIST
-- KEYS[3] notify       LIST
-- KEYS[4] job          STRING  the record (its state hash is KEYS[4] .. ':s')
-- KEYS[5] idem prefix  (string)
-- KEYS[6] census       HASH  jobs not done per "<type>|<version>"
-- KEYS[7] prio         ZSET  (a job of priority 1-9 goes back there: to_ready in _lib.lua)
-- ARGV[1] now, ms ('' for the server's clock)
-- ARGV[2] job id
-- ARGV[3] payload (JSON, '' to keep)
-- ARGV[4] version ('' to keep)
-- ARGV[5] payload hash of the payload it goes back with ('' to keep the stored one)
-- ARGV[6] history entry (a JSON object without at_ms, '' none): who requeued it; stamped here
--
-- Returns 1 requeued, 2 requeued without its idempotency key, 3 requeued to end as the
-- duplicate of the job that completed its key, -1 not in the dead-letter set.
local now, id = clock(ARGV[1]), ARGV[2]
if redis.call('ZSCORE', KEYS[1], id) == false then return -1 end
local rec = rec_load(KEYS[4])
if not rec then return -1 end
redis.call('ZREM', KEYS[1], id)
local sk = KEYS[4] .. ':s'
local code = 1
local history, prio, requeued = unpack(redis.call('HMGET', sk, 'history', 'priority', 'requeued'))
-- Counted for readers, and for the next burial: its ON_FAILURE job is <id>.f<requeued + 1>
-- (a damaged count reads as 0: whole_count, as bury.lua and the job view read it).
local set = {'attempt', 0, 'ready_ms', now, 'enqueued_ms', now, 'deferrals', 0,
  'requeued', whole_count(requeued) + 1}
local entry = stamped(ARGV[6], now)
if rec.idem_key ~= '' then
  local hash = ARGV[5] ~= '' and ARGV[5] or (rec.idem_hash ~= '' and rec.idem_hash or '-')
  local ik = idem_key(KEYS[5], rec.type, rec.idem_key)
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
end
if entry ~= '' then with_history(set, history, entry) end
if ARGV[3] ~= '' or ARGV[4] ~= '' then
  census(KEYS[6], rec.type .. '|' .. rec.version, -1)
  if ARGV[3] ~= '' then rec.payload = ARGV[3] end
  if ARGV[4] ~= '' then rec.version = ARGV[4] end
  census(KEYS[6], rec.type .. '|' .. rec.version, 1)
end
redis.call('SET', KEYS[4], rec_encode(rec))  -- SET drops the dead retention's expiry
redis.call('HDEL', sk, 'status', 'reason', 'finished_ms', 'token', 'lost_token', 'refunds', 'error', 'children')
redis.call('HSET', sk, unpack(set))
redis.call('PERSIST', sk)
to_ready(KEYS[2], KEYS[7], id, prio, now, false)
wake(KEYS[3])
return code
