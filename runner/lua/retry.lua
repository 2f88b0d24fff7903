-- retry: a claimed job failed transiently; schedule its next attempt (fenced).
--
-- KEYS[1] leases       ZSET
-- KEYS[2] scheduled    ZSET  id -> due ms
-- KEYS[3] stats        HASH
-- KEYS[4] job prefix   (string)
-- KEYS[5] lock prefix  (string)
-- KEYS[6] ready        LIST  (to wake a job waiting on a released resource)
-- KEYS[7] notify       LIST
-- ARGV[1] now_ms
-- ARGV[2] n; then per job 6 fields:
--   id, token, due_ms, error (JSON), history entry (JSON), stats fields (space-separated)
--
-- Each job costs one HMGET and one HSET; the batch's leases and scheduled entries go in
-- one variadic ZREM and one variadic ZADD, before any resource lock is released.
--
-- Returns one code per job: 1 scheduled, -1 refused (lease lost: nothing changed).
local now, n = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = {}
local ids, due_ids, locks = {}, {}, {}
for i = 0, n - 1 do
  local b = 3 + i * 6
  local id, token, due, err, entry, fields = ARGV[b], ARGV[b + 1], tonumber(ARGV[b + 2]), ARGV[b + 3], ARGV[b + 4], ARGV[b + 5]
  local jk = KEYS[4] .. id
  local f = fenced(jk, token, 'resource_key', 'history')
  if not f then
    out[#out + 1] = -1
  else
    local set = {'status', 'retrying', 'error', err, 'ready_ms', due, 'finished_ms', now, 'token', ''}
    with_history(set, f[4], entry)
    redis.call('HSET', jk, unpack(set))
    ids[#ids + 1] = id
    due_ids[#due_ids + 1] = due
    due_ids[#due_ids + 1] = id
    if f[3] and f[3] ~= '' then locks[#locks + 1] = {f[3], token} end
    bump(fields)
    out[#out + 1] = 1
  end
end
call_many('ZREM', KEYS[1], ids, 1)
call_many('ZADD', KEYS[2], due_ids, 2)
for _, l in ipairs(locks) do
  release_lock(KEYS[5], l[1], l[2], KEYS[2], KEYS[6], KEYS[7], KEYS[4])
end
flush(KEYS[3])
return out
