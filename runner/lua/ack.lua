-- ack: finish claimed jobs as done, fenced by their claim tokens. The result, the
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
-- ARGV[1] now_ms
-- ARGV[2] done retention, ms
-- ARGV[3] idempotency retention, ms
-- ARGV[4] n; then per job 5 fields:
--   id, token, result (JSON, '' none), history entry (JSON), stats fields (space-separated)
--
-- Each job costs one HMGET (the fence, and what the ack needs), one HSET (status,
-- result, history; the token is emptied, so the claim can no longer act) and its
-- PEXPIRE, plus an HDEL only when an earlier attempt left an error; the leases of the
-- whole batch go in one variadic ZREM.
--
-- Returns one code per job: 1 done, -1 refused (lease lost: nothing changed).
local now, done_ttl, idem_ttl, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local out = {}
local finished = {}
for i = 0, n - 1 do
  local b = 5 + i * 5
  local id, token, result, entry, fields = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4]
  local jk = KEYS[3] .. id
  -- The fence and the fields the ack needs, in one read.
  local f = fenced(jk, token, 'idem_key', 'resource_key', 'history', 'error')
  if not f then
    out[#out + 1] = -1
  else
    local set = {'status', 'done', 'finished_ms', now, 'result', result, 'token', ''}
    with_history(set, f[5], entry)
    redis.call('HSET', jk, unpack(set))
    -- The error of an earlier attempt is the last error only while the job is unfinished.
    if f[6] then redis.call('HDEL', jk, 'error') end
    release_lock(KEYS[4], f[4], token, KEYS[7], KEYS[8], KEYS[9], KEYS[3])
    if f[3] and f[3] ~= '' then
      local ik = KEYS[5] .. f[3]
      -- pcall: a key damaged to another type must not fail the batch part-way; the SET
      -- below replaces it.
      local held = redis.pcall('GET', ik)
      local hash = '-'
      if type(held) == 'string' then hash = string.match(held, '^%S+ (%S+)') or '-' end
      redis.call('SET', ik, id .. ' ' .. hash .. ' done', 'PX', idem_ttl)
    end
    redis.call('PEXPIRE', jk, done_ttl)
    bump(fields)
    finished[#finished + 1] = id
    out[#out + 1] = 1
  end
end
if #finished > 0 then
  call_many('ZREM', KEYS[1], finished, 1)
  redis.call('HINCRBY', KEYS[6], 'done', #finished)
  redis.call('PEXPIRE', KEYS[6], 21600000)
end
flush(KEYS[2])
return out
