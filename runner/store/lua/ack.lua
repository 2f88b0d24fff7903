-- ack: finish claimed jobs as done, fenced by their claim tokens. The outcome, the
-- idempotency completion mark, the lock release and the counters are written in this
-- one step, so no crash can split them.
--
-- KEYS[1] leases       ZSET  id -> lease deadline ms
-- KEYS[2] stats        HASH
-- KEYS[3] job prefix   (string)
-- KEYS[4] lock prefix  (string)
-- KEYS[5] idem prefix  (string)
-- KEYS[6] throughput   HASH  this minute's counters
-- KEYS[7] scheduled    ZSET  (to wake a job waiting on a released resource)
-- KEYS[8] ready        LIST
-- KEYS[9] notify       LIST
-- KEYS[10] claims      HASH  id -> claim
-- KEYS[11] done        HASH  id -> outcome
-- KEYS[12] finished    ZSET  id -> finish time ms
-- ARGV[1] now_ms
-- ARGV[2] idempotency retention, ms
-- ARGV[3] n; then per job 5 fields:
--   id, token, result (JSON, '' none), history entry (JSON), stats fields (space-separated)
--
-- A success does not write the record: the outcome goes to the done hash as
-- "<finished_ms> <attempt> <started_ms>\n<history entry>\n<result>" (JSON texts never
-- hold a raw newline), and store.py shows record and outcome as one. For a job without
-- idempotency or resource keys the whole batch costs one HMGET (the fences), one HSET
-- (the outcomes), one ZADD (the retention index), one HDEL and one ZREM, whatever its
-- size; a key adds one HMGET of the record, the completion mark and the lock release.
--
-- Returns one code per job: 1 done, -1 refused (lease lost: nothing changed).
local now, idem_ttl, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {}
local held = batch_claims(KEYS[10], 4, 5, n)
local finished, outcomes, index = {}, {}, {}
for i = 0, n - 1 do
  local b = 4 + i * 5
  local id, token, result, entry, fields = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4]
  local c = fence(held[i + 1], token)
  if not c then
    out[#out + 1] = -1
  else
    held[i + 1] = false  -- the same claim twice in one batch settles once
    outcomes[#outcomes + 1] = id
    outcomes[#outcomes + 1] = now .. ' ' .. c.attempt .. ' ' .. c.started .. '\n' .. entry .. '\n' .. result
    index[#index + 1] = now
    index[#index + 1] = id
    finished[#finished + 1] = id
    if c.idem or c.res then
      local jk = KEYS[3] .. id
      -- pcall: a record damaged to another type has no keys to settle.
      local f = redis.pcall('HMGET', jk, 'idem_key', 'resource_key')
      if f.err then f = {false, false} end
      release_lock(KEYS[4], f[2], token, KEYS[7], KEYS[8], KEYS[9], KEYS[3])
      if f[1] and f[1] ~= '' then
        local ik = KEYS[5] .. f[1]
        -- pcall: a key damaged to another type must not fail the batch part-way; the
        -- SET below replaces it.
        local mark = redis.pcall('GET', ik)
        local hash = '-'
        if type(mark) == 'string' then hash = string.match(mark, '^%S+ (%S+)') or '-' end
        redis.call('SET', ik, id .. ' ' .. hash .. ' done', 'PX', idem_ttl)
      end
    end
    bump(fields)
    out[#out + 1] = 1
  end
end
if #finished > 0 then
  call_many('HSET', KEYS[11], outcomes, 2)
  call_many('ZADD', KEYS[12], index, 2)
  unclaim(KEYS[10], KEYS[1], finished)
  -- pcall: a damaged counter loses a count, never the acks (their writes are made).
  if type(redis.pcall('HINCRBY', KEYS[6], 'done', #finished)) == 'number' then
    redis.call('PEXPIRE', KEYS[6], 21600000)
  end
end
flush(KEYS[2])
return out
