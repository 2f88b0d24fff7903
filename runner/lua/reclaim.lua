-- reclaim: take back jobs whose lease lapsed (their worker died or froze). A lapsed
-- lease counts as an attempt: a job that keeps killing its worker ends dead with
-- reason "worker lost" instead of crash-looping. The lapsed claim's resource lock is
-- released with it.
--
-- KEYS[1] leases       ZSET  id -> lease deadline ms
-- KEYS[2] ready        LIST
-- KEYS[3] dead         ZSET
-- KEYS[4] notify       LIST
-- KEYS[5] stats        HASH
-- KEYS[6] job prefix   (string)
-- KEYS[7] lock prefix  (string)
-- KEYS[8] scheduled    ZSET  (to wake a job waiting on a released resource)
-- ARGV[1] now_ms
-- ARGV[2] the most jobs to reclaim in this call
-- ARGV[3] dead retention, ms
--
-- Returns {requeued, buried}.
local now, limit, dead_ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, limit)
local requeued, buried = 0, 0
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  local jk = KEYS[6] .. id
  if redis.call('TYPE', jk)['ok'] == 'hash' then
    local f = redis.call('HMGET', jk, 'attempt', 'max_attempts', 'token', 'resource_key', 'type', 'status')
    if f[6] == 'processing' then
      local attempt = tonumber(f[1]) or 0
      local max = tonumber(f[2]) or 1
      redis.call('HDEL', jk, 'token')
      append_history(jk, '{"attempt":' .. attempt .. ',"outcome":"worker lost","at_ms":' .. now .. '}')
      local err = '{"type":"WorkerLost","message":"the lease lapsed: the worker died or stopped renewing","traceback":""}'
      if attempt >= max then
        redis.call('HSET', jk, 'status', 'dead', 'reason', 'worker lost', 'error', err, 'finished_ms', now)
        redis.call('ZADD', KEYS[3], now, id)
        redis.call('PEXPIRE', jk, dead_ttl)
        redis.call('HINCRBY', KEYS[5], 'dead|' .. (f[5] or '?'), 1)
        buried = buried + 1
      else
        redis.call('HSET', jk, 'status', 'queued', 'error', err, 'ready_ms', now)
        redis.call('RPUSH', KEYS[2], id)
        redis.call('HINCRBY', KEYS[5], 'lost|' .. (f[5] or '?'), 1)
        requeued = requeued + 1
      end
      -- After the requeue, so a job that waited on this resource runs before the
      -- reclaimed holder takes it again (waiters are served first).
      release_lock(KEYS[7], f[4], f[3], KEYS[8], KEYS[2], KEYS[4], KEYS[6])
    end
  end
end
if requeued > 0 then wake(KEYS[4]) end
return {requeued, buried}
