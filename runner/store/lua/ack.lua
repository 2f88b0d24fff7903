-- ack: finish claimed jobs as done, fenced by their claim tokens. The outcome, the
-- idempotency completion mark, the release of limit slots and the counters are written
-- in this one step, so no crash can split them.
--
-- KEYS[1] leases       ZSET  id -> lease deadline ms
-- KEYS[2] stats        HASH
-- KEYS[3] job prefix   (string)
-- KEYS[4] limit prefix (string)
-- KEYS[5] idem prefix  (string)
-- KEYS[6] throughput prefix (string; the key of a minute is prefix .. minute)
-- KEYS[7] dead         ZSET  (a late success leaves it)
-- KEYS[8] ready        LIST  (a job woken by a freed slot goes here)
-- KEYS[9] notify       LIST
-- KEYS[10] claims      HASH  id -> claim
-- KEYS[11] done        HASH  id -> outcome
-- KEYS[12] finished    ZSET  id -> finish time ms
-- KEYS[13] limwait     ZSET  limit keys with parked jobs
-- ARGV[1] now, ms ('' for the server's clock)
-- ARGV[2] idempotency retention, ms (counted from the completion)
-- ARGV[3] n; then per job 5 fields:
--   id, token, result (JSON, '' none), history entry (JSON), stats fields (space-separated)
--
-- A success does not write the record: the outcome goes to the done hash as
-- "<finished_ms> <attempt> <started_ms>\n<history entry>\n<result>" (JSON texts never
-- hold a raw newline), and records.py shows record and outcome as one. For a job without
-- idempotency key or limits the whole batch costs one HMGET (the fences), one HSET (the
-- outcomes), one ZADD (the retention index), one HDEL and one ZREM, whatever its size;
-- a key or a limit adds one HMGET of the record, the completion mark and the release.
--
-- A late success: when the claim is gone because its lease lapsed while the handler
-- still ran (reclaim keeps the lapsed token as lost_token), and nobody has claimed the job
-- since (it waits in ready, or it was buried as "worker lost" on its last attempt), the
-- run is known to have finished: the job is done, not run again and not left dead.
--
-- Returns one code per job: 1 done, 2 done late (see above), -1 refused (lease lost to
-- another claim, or the job settled otherwise: nothing changed).
local now, idem_ttl, n = clock(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {}
local seen = {}
local held = batch_claims(KEYS[10], 4, 5, n)
local finished, outcomes, index = {}, {}, {}

-- The completion mark goes on the key only while the key still names this job. A late
-- success (its job was buried, which freed the key) takes the key back if it is free.
local function complete_idem(typ, ikey, id, free_hash)
  if not ikey or ikey == '' or not typ then return end
  local ik = idem_key(KEYS[5], typ, ikey)
  -- pcall: a key damaged to another type must not fail the batch part-way.
  local mark = redis.pcall('GET', ik)
  if type(mark) == 'string' then
    local hid, hash = string.match(mark, '^(%S+) (%S+)')
    if hid == id then redis.call('SET', ik, id .. ' ' .. hash .. ' done', 'PX', idem_ttl) end
  elseif not mark and free_hash then
    redis.call('SET', ik, id .. ' ' .. free_hash .. ' done', 'PX', idem_ttl)
  end
end

local function late(id, token, entry, result, claimed_by_another)
  if claimed_by_another then return false end
  local jk = KEYS[3] .. id
  local f = redis.pcall('HMGET', jk, 'lost_token', 'status', 'reason', 'type', 'idem_key', 'idem_hash')
  if f.err or type(f[1]) ~= 'string' then return false end
  local lost, attempt, started = string.match(f[1], '^(%S+) (%d+) (%d+)$')
  if lost ~= token or redis.call('HEXISTS', KEYS[11], id) == 1 then return false end
  if not (f[2] == 'queued' or (f[2] == 'dead' and f[3] == 'worker lost')) then return false end
  if f[2] == 'dead' then
    redis.call('ZREM', KEYS[7], id)
    redis.call('PERSIST', jk)
  end
  -- The id may still wait in ready: claim drops it as a stray (it has a done outcome).
  redis.call('HSET', jk, 'status', 'done')
  redis.call('HDEL', jk, 'reason', 'lost_token')
  outcomes[#outcomes + 1] = id
  outcomes[#outcomes + 1] = now .. ' ' .. attempt .. ' ' .. started .. '\n' .. entry .. '\n' .. result
  index[#index + 1] = now
  index[#index + 1] = id
  complete_idem(f[4], f[5], id, f[6] or '-')
  tally('late|' .. (f[4] or '?'))
  return true
end

for i = 0, n - 1 do
  local b = 4 + i * 5
  local id, token, result, entry, fields = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4]
  -- The same claim twice in one batch settles once (seen), refused the second time.
  local c = not seen[id] and fence(held[i + 1], token)
  if not c then
    if late(id, token, entry, result, type(held[i + 1]) == 'string') then
      bump(fields)
      out[#out + 1] = 2
    else
      out[#out + 1] = -1
    end
  else
    seen[id] = true
    outcomes[#outcomes + 1] = id
    outcomes[#outcomes + 1] = now .. ' ' .. c.attempt .. ' ' .. c.started .. '\n' .. entry .. '\n' .. result
    index[#index + 1] = now
    index[#index + 1] = id
    finished[#finished + 1] = id
    if c.idem or c.res then
      local jk = KEYS[3] .. id
      -- pcall: a record damaged to another type has no keys to settle.
      local f = redis.pcall('HMGET', jk, 'idem_key', 'limits', 'type')
      if f.err then f = {false, false, false} end
      release_limits(KEYS[4], f[2], token, now, KEYS[3], KEYS[8], KEYS[9], KEYS[13])
      complete_idem(f[3], f[1], id)
    end
    bump(fields)
    out[#out + 1] = 1
  end
end
if #outcomes > 0 then
  call_many('HSET', KEYS[11], outcomes, 2)
  call_many('ZADD', KEYS[12], index, 2)
  unclaim(KEYS[10], KEYS[1], finished)
  -- pcall: a damaged counter loses a count, never the acks (their writes are made).
  local tk = KEYS[6] .. math.floor(now / 60000)
  if type(redis.pcall('HINCRBY', tk, 'done', #outcomes / 2)) == 'number' then
    redis.call('PEXPIRE', tk, 21600000)
  end
end
flush(KEYS[2])
return out
