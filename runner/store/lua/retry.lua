-- retry: a claimed job failed transiently; schedule its next attempt (fenced).
--
-- KEYS[1] leases       ZSET
-- KEYS[2] scheduled    ZSET  id -> due ms
-- KEYS[3] stats        HASH
-- KEYS[4] job prefix   (string)
-- KEYS[5] lock prefix  (string)
-- KEYS[6] ready        LIST  (to wake a job waiting on a released resource)
-- KEYS[7] notify       LIST
-- KEYS[8] claims       HASH  id -> claim
-- ARGV[1] now_ms
-- ARGV[2] n; then per job 6 fields:
--   id, token, due_ms, error (JSON), history entry (JSON), stats fields (space-separated)
--
-- Each job costs one HMGET and one HSET of its record (the attempt, its start and the
-- history move from the claim to the record); the batch's fences, claims, leases and
-- scheduled entries go in one variadic HMGET, HDEL, ZREM and ZADD, before any resource
-- lock is released.
--
-- Returns one code per job: 1 scheduled, -1 refused (lease lost: nothing changed).
local now, n = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = {}
local ids, due_ids, locks = {}, {}, {}
local held = batch_claims(KEYS[8], 3, 6, n)
for i = 0, n - 1 do
  local b = 3 + i * 6
  local id, token, due, err, entry, fields = ARGV[b], ARGV[b + 1], tonumber(ARGV[b + 2]), ARGV[b + 3], ARGV[b + 4], ARGV[b + 5]
  local jk = KEYS[4] .. id
  local c = fence(held[i + 1], token)
  local f = c and redis.pcall('HMGET', jk, 'resource_key', 'history')
  if not c or f.err then
    out[#out + 1] = -1
  else
    held[i + 1] = false
    local set = {'status', 'retrying', 'error', err, 'ready_ms', due, 'finished_ms', now,
      'attempt', c.attempt, 'started_ms', c.started}
    with_history(set, f[2], entry)
    redis.call('HSET', jk, unpack(set))
    ids[#ids + 1] = id
    due_ids[#due_ids + 1] = due
    due_ids[#due_ids + 1] = id
    if f[1] and f[1] ~= '' then locks[#locks + 1] = {f[1], token} end
    bump(fields)
    out[#out + 1] = 1
  end
end
unclaim(KEYS[8], KEYS[1], ids)
call_many('ZADD', KEYS[2], due_ids, 2)
for _, l in ipairs(locks) do
  release_lock(KEYS[5], l[1], l[2], KEYS[2], KEYS[6], KEYS[7], KEYS[4])
end
flush(KEYS[3])
return out
