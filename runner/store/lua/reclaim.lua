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
-- KEYS[9] claims       HASH  id -> claim
-- KEYS[10] done        HASH  id -> outcome (a lease left beside one is stray)
-- ARGV[1] now_ms
-- ARGV[2] the most jobs to reclaim in this call
-- ARGV[3] dead retention, ms
--
-- A key of the queue damaged to another Redis type would stop every claim (or ack, or
-- reclaim) of the queue; it is renamed aside to <key>:corrupt (kept for inspection,
-- counted as "corrupt|<name>"), and the queue goes on. The jobs of a damaged claims
-- hash are taken back by their leases like any other; with damaged leases, every job
-- still holding a claim gets a lapsed lease and is taken back at once (an attempt
-- counted: whether its worker lives is no longer known).
--
-- Returns {requeued, buried}.
local now, limit, dead_ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local relet = false
for _, kn in ipairs({{KEYS[5], 'stats', 'hash'}, {KEYS[9], 'claims', 'hash'},
    {KEYS[10], 'done', 'hash'}, {KEYS[1], 'leases', 'zset'}, {KEYS[2], 'ready', 'list'},
    {KEYS[3], 'dead', 'zset'}, {KEYS[4], 'notify', 'list'}, {KEYS[8], 'scheduled', 'zset'}}) do
  local kind = redis.call('TYPE', kn[1])['ok']
  if kind ~= kn[3] and kind ~= 'none' then
    redis.call('RENAME', kn[1], kn[1] .. ':corrupt')
    tally('corrupt|' .. kn[2])
    if kn[2] == 'leases' then relet = true end
  end
end
if relet then
  local lapsed = {}
  for _, id in ipairs(redis.call('HKEYS', KEYS[9])) do
    lapsed[#lapsed + 1] = now
    lapsed[#lapsed + 1] = id
  end
  call_many('ZADD', KEYS[1], lapsed, 2)
end
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, limit)
local requeued, buried = 0, 0
local err = '{"type":"WorkerLost","message":"the lease lapsed: the worker died or stopped renewing","traceback":""}'
local held, fin = hmget_many(KEYS[9], ids), hmget_many(KEYS[10], ids)
unclaim(KEYS[9], KEYS[1], ids)
for j, id in ipairs(ids) do
  local jk = KEYS[6] .. id
  local c = parse_claim(held[j])
  -- An error reply (not a hash), no record, or a job that is done or elsewhere: nothing
  -- to take back.
  local f = redis.pcall('HMGET', jk, 'max_attempts', 'resource_key', 'type', 'history', 'status',
    'attempt', 'token')
  local live = not f.err and f[3] and not fin[j] and (f[5] == 'queued' or f[5] == 'processing')
  if live and not c then
    -- A damaged claim entry, or a claim an older release kept on the record (status
    -- processing, the attempt already counted, the token there): the job is still taken
    -- back, never dropped.
    local legacy = f[5] == 'processing'
    c = {attempt = (tonumber(f[6]) or 0) + (legacy and 0 or 1), started = now,
      token = legacy and f[7] or ''}
  end
  if live then
    local attempt = c.attempt
    local max = tonumber(f[1]) or 1
    local set
    if attempt >= max then
      set = {'status', 'dead', 'reason', 'worker lost', 'error', err, 'finished_ms', now}
    else
      set = {'status', 'queued', 'error', err, 'ready_ms', now}
    end
    set[#set + 1] = 'attempt'
    set[#set + 1] = attempt
    set[#set + 1] = 'started_ms'
    set[#set + 1] = c.started
    with_history(set, f[4], '{"attempt":' .. attempt .. ',"outcome":"worker lost","at_ms":' .. now .. '}')
    redis.call('HSET', jk, unpack(set))
    if attempt >= max then
      redis.call('ZADD', KEYS[3], now, id)
      redis.call('PEXPIRE', jk, dead_ttl)
      tally('dead|' .. (f[3] or '?'))
      buried = buried + 1
    else
      redis.call('RPUSH', KEYS[2], id)
      tally('lost|' .. (f[3] or '?'))
      requeued = requeued + 1
    end
    -- After the requeue, so a job that waited on this resource runs before the
    -- reclaimed holder takes it again (waiters are served first).
    release_lock(KEYS[7], f[2], c.token, KEYS[8], KEYS[2], KEYS[4], KEYS[6])
  end
end
if requeued > 0 then wake(KEYS[4]) end
flush(KEYS[5])
return {requeued, buried}
