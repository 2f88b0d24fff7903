-- reclaim: take back jobs whose lease lapsed (their worker died or froze). A lapsed
-- lease counts as an attempt when the handler had started: a job that keeps killing its
-- worker ends dead with reason "worker lost" instead of crash-looping. It spends none
--   - for a job claimed ahead that had not started ('p'), once: should it lapse
--     unstarted again, it counts (so a handler that kills its worker before its start
--     mark lands cannot loop for ever);
--   - for a job its worker gave up at shutdown with the handler still running ('x').
-- The lapsed claim's limit slots are released with it, and its token is kept on the
-- record as lost_token: should that run still finish, its ack is a late success.
--
-- KEYS[1] leases       ZSET  id -> lease deadline ms
-- KEYS[2] ready        LIST
-- KEYS[3] dead         ZSET
-- KEYS[4] notify       LIST
-- KEYS[5] stats        HASH
-- KEYS[6] job prefix   (string)
-- KEYS[7] limit prefix (string)
-- KEYS[8] scheduled    ZSET  (checked for damage)
-- KEYS[9] claims       HASH  id -> claim
-- KEYS[10] done meta   HASH  (checked for damage)
-- KEYS[11] limwait     ZSET  limit keys with parked jobs
-- KEYS[12] idem prefix (string)
-- KEYS[13] ended       channel  ids of waited jobs that ended (see waited in _lib.lua)
-- KEYS[14] group prefix (string; a member buried here counts down: group_settle in _lib.lua)
-- KEYS[15] done prefix (string)
-- KEYS[16] census      HASH
-- KEYS[17] outbox      LIST  (a complete group's then-job on another queue)
-- KEYS[18] lost        LIST  ids buried here, for their ON_FAILURE destinations: no
--                            worker settled them, so the scheduler writes those jobs
-- KEYS[19] prio        ZSET  (a job of priority 1-9 goes back there: to_ready in _lib.lua)
-- ARGV[1] now, ms ('' for the server's clock)
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
local now, limit, dead_ttl = clock(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local relet = false
for _, kn in ipairs({{KEYS[5], 'stats', 'hash'}, {KEYS[9], 'claims', 'hash'},
    {KEYS[10], 'done meta', 'hash'}, {KEYS[1], 'leases', 'zset'}, {KEYS[2], 'ready', 'list'},
    {KEYS[3], 'dead', 'zset'}, {KEYS[4], 'notify', 'list'}, {KEYS[8], 'scheduled', 'zset'},
    {KEYS[11], 'limwait', 'zset'}}) do
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
local ended = {}  -- waited jobs buried as "worker lost"
local err = '{"type":"WorkerLost","message":"the lease lapsed: the worker died or stopped renewing","traceback":""}'
local held = hmget_many(KEYS[9], ids)
unclaim(KEYS[9], KEYS[1], ids)
local G = {group = KEYS[14], notify = KEYS[4], census = KEYS[16], outbox = KEYS[17],
  Q = {ready = KEYS[2], scheduled = KEYS[8], stats = KEYS[5], job = KEYS[6], idem = KEYS[12], claims = KEYS[9],
    done_meta = KEYS[10], done = KEYS[15], prio = KEYS[19]}}
local lost = '{"type":"WorkerLost","message":"the lease lapsed: the worker died or stopped renewing"}'
for j, id in ipairs(ids) do
  local jk = KEYS[6] .. id
  local sk = jk .. ':s'
  local c = parse_claim(held[j])
  -- No record (done, or gone), a malformed one, or a job elsewhere: nothing to take back.
  local rec = rec_load(jk)
  local s = rec and redis.pcall('HMGET', sk, 'history', 'status', 'attempt', 'token', 'refunds', 'priority')
  local f = {}
  if rec and not s.err then
    f = {rec.max_attempts, rec.limits, rec.type, s[1], s[2] or 'queued', s[3], s[4], s[5], rec.idem_key, s[6]}
  end
  local live = f[3] and (f[5] == 'queued' or f[5] == 'processing')
  if live and not c then
    -- A damaged claim entry, or a claim an older release kept on the record (status
    -- processing, the attempt already counted, the token there): the job is still taken
    -- back, never dropped.
    local legacy = f[5] == 'processing'
    c = {attempt = (tonumber(f[6]) or 0) + (legacy and 0 or 1), started = now,
      token = legacy and f[7] or '', prefetched = false, exiting = false}
  end
  if live then
    local refunds = tonumber(f[8]) or 0
    local max = tonumber(f[1]) or 1
    local spend, entry, outcome = true, nil, 'worker lost'
    if c.exiting then
      spend, outcome = false, 'interrupted'
    elseif c.prefetched and refunds < 1 then
      -- Claimed ahead, no start mark: it may never have started (or its mark was lost
      -- with the worker). On record, without spending the attempt.
      spend, outcome = false, 'lost unstarted'
    end
    local attempt = spend and c.attempt or (tonumber(f[6]) or 0)
    local set
    if spend and attempt >= max then
      set = {'status', 'dead', 'reason', 'worker lost', 'error', err, 'finished_ms', now}
    elseif spend then
      set = {'status', 'queued', 'error', err, 'ready_ms', now}
    else
      set = {'status', 'queued', 'ready_ms', now}
      if c.prefetched then
        set[#set + 1] = 'refunds'
        set[#set + 1] = refunds + 1
      end
    end
    if c.token ~= '' then
      -- "<token> <attempt> <started_ms>": should this run still finish, its ack is a late
      -- success recorded as the attempt that ran (ack.lua).
      set[#set + 1] = 'lost_token'
      set[#set + 1] = c.token .. ' ' .. c.attempt .. ' ' .. c.started
    end
    set[#set + 1] = 'attempt'
    set[#set + 1] = attempt
    if spend then
      set[#set + 1] = 'started_ms'
      set[#set + 1] = c.started
    end
    if outcome then
      entry = '{"attempt":' .. c.attempt .. ',"outcome":"' .. outcome .. '","at_ms":' .. now .. '}'
    end
    with_history(set, f[4], entry)
    redis.call('HSET', sk, unpack(set))
    if f[7] then redis.call('HDEL', sk, 'token') end  -- a legacy claim's token, now lost_token
    if spend and attempt >= max then
      redis.call('ZADD', KEYS[3], now, id)
      rec_expire(jk, dead_ttl)
      free_idem(KEYS[12], f[3], f[9], id)
      tally('dead|' .. (f[3] or '?'))
      buried = buried + 1
      if KEYS[18] then redis.call('RPUSH', KEYS[18], id) end
      if waited(rec.meta) then ended[#ended + 1] = id end
      local gid, idx = group_of(rec.meta)
      if gid and KEYS[14] then
        group_settle(G, now, gid, idx, 'dead', '{"id":' .. cjson.encode(id) ..
          ',"status":"dead","reason":"worker lost","error":' .. lost .. '}')
      end
    else
      to_ready(KEYS[2], KEYS[19], id, f[10], now, true)
      tally((spend and 'lost|' or 'unspent|') .. (f[3] or '?'))
      requeued = requeued + 1
    end
    -- After the requeue, so a job parked on this limit runs before the reclaimed job
    -- takes the slot again (the first parked job gets the freed slot reserved).
    if c.token ~= '' then
      release_limits(KEYS[7], f[2], c.token, now, KEYS[6], KEYS[2], KEYS[4], KEYS[11], KEYS[19])
    end
  end
end
if requeued > 0 then wake(KEYS[4]) end
flush(KEYS[5])
announce(KEYS[13], ended)
return {requeued, buried}
