-- reclaim: take back jobs whose lease lapsed (their worker died or froze). A lapsed
-- lease counts as an attempt when the handler had started: a job that keeps killing its
-- worker ends dead with reason "worker lost" instead of crash-looping (one whose run was
-- asked to stop goes back to ready instead, and its claim ends it cancelled). It spends none
--   - for a job claimed ahead that had not started ('p'), once: should it lapse
--     unstarted again, it counts (so a handler that kills its worker before its start
--     mark lands cannot loop for ever);
--   - for a job its worker gave up at shutdown with the handler still running ('x');
--   - for a job that was waiting for its executor ('h', hold.lua), however often: a
--     child's job claimed ahead, held from its claim until its worker hands it to a
--     child, one whose child was still starting, and a thread job claimed ahead again
--     after such a loss, held until its start mark lands before its handler runs
--     (claim.lua); no handler had the job, so none could have killed its worker (the hold ends just before the hand-off, and from
--     there the once-rule above applies).
-- The lapsed claim's limit slots are released with it, and its token is kept on the
-- record as lost_token: should that run still finish, its ack is a late success.
--
-- KEYS[1] leases       ZSET  id -> lease deadline ms
-- KEYS[2] ready        LIST
-- KEYS[3] dead         ZSET
-- KEYS[4] notify       LIST
-- KEYS[5] stats        HASH
-- KEYS[6] job_prefix   (string)
-- KEYS[7] lim_prefix   (string)
-- KEYS[8] scheduled    ZSET  (checked for damage)
-- KEYS[9] claims       HASH  id -> claim
-- KEYS[10] done_meta   HASH  (checked for damage)
-- KEYS[11] limwait     ZSET  limit keys with parked jobs
-- KEYS[12] idem_prefix (string)
-- KEYS[13] ended       channel  ids of waited jobs that ended (see waited in includes/ended.lua)
-- KEYS[14] group_prefix (string; a member buried here counts down: group_settle in includes/groups.lua)
-- KEYS[15] done_prefix (string)
-- KEYS[16] census      HASH
-- KEYS[17] outbox      LIST  (a complete group's then-job on another queue)
-- KEYS[18] lost        LIST  ids buried here, for their ON_FAILURE destinations: no
--                            worker settled them, so the scheduler writes those jobs
-- KEYS[19] prio        ZSET  (a job of priority 1-9 goes back there: to_ready in includes/ready.lua)
-- KEYS[20] delayed     ZSET  the ids of scheduled that are scheduled or retrying -> due (ms): the
--                            scheduled list's own index (see keys.py); checked for damage
-- KEYS[21] sleeping    ZSET  (a list index: checked for damage)
-- KEYS[22] waiting     ZSET  (a list index: checked for damage)
-- ARGV[1] now, ms ('' for the server's clock)
-- ARGV[2] the most jobs to reclaim in this call
-- ARGV[3] dead retention, ms
-- ARGV[4] 0: skip the damage check below (its TYPE per key); the scheduler asks for it
--         now and then and after an error reply, not on every pass (absent: check)
-- ARGV[5] the most bytes of records to read ('' or absent: no bound; at least one job):
--         each lapsed job's record is read whole (about 7 ms of Redis a MiB), so the call
--         stops before the lease whose record would take it past this (a STRLEN each)
--
-- Returns {requeued, buried}, and a third element, 1, when ARGV[5] left lapsed leases
-- for another call.
--
-- A key of the queue damaged to another Redis type would stop every claim (or ack, or
-- reclaim) of the queue; it is renamed aside to <key>:corrupt (kept for inspection,
-- counted as "corrupt|<name>"), and the queue goes on. The jobs of a damaged claims
-- hash are taken back by their leases like any other; with damaged leases, every job
-- still holding a claim gets a lapsed lease and is taken back at once (an attempt
-- counted: whether its worker lives is no longer known).
--
-- Returns {requeued, buried}.
--- @include "clock"
--- @include "history"
--- @include "calls"
--- @include "ready"
--- @include "parking"
--- @include "stats"
--- @include "claims"
--- @include "idem"
--- @include "record_keys"
--- @include "groups"
--- @include "ended"
local now, limit, dead_ttl = clock(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
-- The lapsed ids in the order their jobs were claimed: by lease deadline (an earlier claim
-- lapses first), then, among one claim call's jobs (one token base, 'base:i'), by their
-- index in it (the order they left ready), not by id. Other ties keep the range's order.
-- ``lapsed``: id, score pairs (WITHSCORES). -> ids, their claim entries.
local function claim_order(lapsed)
  local ids = {}
  for i = 1, #lapsed, 2 do ids[#ids + 1] = lapsed[i] end
  local held = hmget_many(K.claims, ids)
  local keys, first = {}, {}
  for j, id in ipairs(ids) do
    local base, idx = string.match(type(held[j]) == 'string' and held[j] or '', '^(%S*):(%d+) ')
    local score = tonumber(lapsed[2 * j])
    local group = base and (score .. ' ' .. base) or nil
    if group and not first[group] then first[group] = j end
    keys[j] = {id = id, held = held[j], score = score, group = group and first[group] or j,
      idx = tonumber(idx) or 0, pos = j}
  end
  table.sort(keys, function(a, b)
    if a.score ~= b.score then return a.score < b.score end
    if a.group ~= b.group then return a.group < b.group end
    if a.idx ~= b.idx then return a.idx < b.idx end
    return a.pos < b.pos
  end)
  local out_ids, out_held = {}, {}
  for j, e in ipairs(keys) do
    out_ids[j] = e.id
    out_held[j] = e.held
  end
  return out_ids, out_held
end
local relet = false
for _, kn in ipairs(ARGV[4] == '0' and {} or {{K.stats, 'stats', 'hash'}, {K.claims, 'claims', 'hash'},
    {K.done_meta, 'done meta', 'hash'}, {K.leases, 'leases', 'zset'}, {K.ready, 'ready', 'list'},
    {K.dead, 'dead', 'zset'}, {K.notify, 'notify', 'list'}, {K.scheduled, 'scheduled', 'zset'},
    {K.limwait, 'limwait', 'zset'}, {K.delayed, 'delayed', 'zset'}, {K.sleeping, 'sleeping', 'zset'},
    {K.waiting, 'waiting', 'zset'}}) do
  local kind = redis.call('TYPE', kn[1])['ok']
  if kind ~= kn[3] and kind ~= 'none' then
    redis.call('RENAME', kn[1], kn[1] .. ':corrupt')
    tally('corrupt|' .. kn[2])
    if kn[2] == 'leases' then relet = true end
  end
end
if relet then
  local lapsed = {}
  for _, id in ipairs(redis.call('HKEYS', K.claims)) do
    lapsed[#lapsed + 1] = now
    lapsed[#lapsed + 1] = id
  end
  call_many('ZADD', K.leases, lapsed, 2)
end
local lapsed = redis.call('ZRANGEBYSCORE', K.leases, '-inf', now, 'WITHSCORES', 'LIMIT', 0, limit)
local most, more = tonumber(ARGV[5] or ''), false
if most then
  local read = 0
  for i = 1, #lapsed, 2 do
    local size = redis.pcall('STRLEN', K.job_prefix .. lapsed[i])
    size = type(size) == 'number' and size or 0
    if i > 1 and read + size > most then
      for j = #lapsed, i, -1 do lapsed[j] = nil end
      more = true
      break
    end
    read = read + size
  end
end
local requeued, buried = 0, 0
local ended = {}  -- waited jobs buried as "worker lost"
local err = '{"type":"WorkerLost","message":"the lease lapsed: the worker died or stopped renewing","traceback":""}'
local ids, held = claim_order(lapsed)
unclaim(K.claims, K.leases, ids)
local G = {group = K.group_prefix, notify = K.notify, census = K.census, outbox = K.outbox,
  Q = {ready = K.ready, scheduled = K.scheduled, delayed = K.delayed, stats = K.stats, job = K.job_prefix, idem = K.idem_prefix, claims = K.claims,
    done_meta = K.done_meta, done = K.done_prefix, prio = K.prio}}
local lost = '{"type":"WorkerLost","message":"the lease lapsed: the worker died or stopped renewing"}'
local back = {}  -- the jobs going back to ready: {id, priority, token, limits}
for j, id in ipairs(ids) do
  local jk = K.job_prefix .. id
  local sk = jk .. ':s'
  local c = parse_claim(held[j])
  -- No record (done, or gone), a malformed one, or a job elsewhere: nothing to take back.
  local rec = rec_head(jk)  -- (its payload is not needed: a big record is not read whole)
  local s = rec and redis.pcall('HMGET', sk, 'history', 'status', 'attempt', 'refunds', 'priority')
  local f = {}
  if rec and not s.err then
    f = {rec.max_attempts, rec.limits, rec.type, s[1], s[2] or 'queued', s[3], s[4], rec.idem_key, s[5]}
  end
  local live = f[3] and f[5] == 'queued'
  if live and not c then
    -- A damaged claim entry: the job is still taken back, never dropped.
    c = {attempt = (tonumber(f[6]) or 0) + 1, started = now, token = '', prefetched = false, exiting = false}
  end
  if live then
    local refunds = tonumber(f[7]) or 0
    local max = tonumber(f[1]) or 1
    local spend, entry, outcome = true, nil, 'worker lost'
    if c.exiting then
      spend, outcome = false, 'interrupted'
    elseif c.held then
      spend, outcome = false, 'lost unstarted'
    elseif c.prefetched and refunds < 1 then
      -- Claimed ahead, no start mark: it may never have started (or its mark was lost
      -- with the worker). On record, without spending the attempt.
      spend, outcome = false, 'lost unstarted'
    end
    local attempt = spend and c.attempt or (tonumber(f[6]) or 0)
    -- Out of attempts: dead, unless a cancel was asked of this run (the claim's 'c'
    -- flag): then back to ready, where the claim ends it cancelled as asked, never dead.
    local buries = spend and attempt >= max and not c.cancel
    local set
    if buries then
      set = {'status', 'dead', 'reason', 'worker lost', 'error', err, 'finished_ms', now}
    elseif spend then
      set = {'status', 'queued', 'error', err, 'ready_ms', now}
    else
      set = {'status', 'queued', 'ready_ms', now}
      if c.prefetched and not c.held then
        set[#set + 1] = 'refunds'
        set[#set + 1] = refunds + 1
      end
    end
    if c.token ~= '' then
      -- "<token> <attempt> <started_ms>": should this run still finish, its ack is a late
      -- success recorded as the attempt that ran (ack.lua).
      set[#set + 1] = 'lost_token'
      set[#set + 1] = c.token .. ' ' .. c.attempt .. ' ' .. c.started
      -- Follow-ups that run staged (scripts.py STAGE_OVER) go now, not at their expiry:
      -- its late ack, if any, stages them again whole before committing. UNLINK frees a
      -- big stage off the main thread.
      redis.call('UNLINK', K.job_prefix .. id .. ':fu:' .. c.token)
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
    if buries then
      redis.call('ZADD', K.dead, now, id)
      rec_expire(jk, dead_ttl)
      free_idem(K.idem_prefix, f[3], f[8], id, dead_ttl)
      tally('dead|' .. (f[3] or '?'))
      buried = buried + 1
      if K.lost then redis.call('RPUSH', K.lost, id) end
      if waited(rec.meta) then ended[#ended + 1] = id end
      local gid, idx = group_of(rec.meta)
      if gid and K.group_prefix then
        group_settle(G, now, gid, idx, 'dead', '{"id":' .. cjson.encode(id) ..
          ',"status":"dead","reason":"worker lost","error":' .. lost .. '}')
      end
      if c.token ~= '' then
        release_limits(K.lim_prefix, f[2], c.token, now, K.job_prefix, K.ready, K.notify, K.limwait, K.prio)
      end
    else
      back[#back + 1] = {id, f[9], c.token ~= '' and c.token or nil, f[2]}
      tally((spend and 'lost|' or 'unspent|') .. (f[3] or '?'))
      requeued = requeued + 1
    end
  end
end
-- Each push goes in front of the one before it, so the jobs are pushed last first: the
-- first claimed runs first again, in the order they were claimed (as release.lua).
for i = #back, 1, -1 do to_ready(K.ready, K.prio, back[i][1], back[i][2], now, true) end
-- After the pushes, so a job parked on a freed limit runs before the reclaimed job takes
-- the slot again (the first parked job gets the freed slot reserved).
for _, b in ipairs(back) do
  if b[3] then release_limits(K.lim_prefix, b[4], b[3], now, K.job_prefix, K.ready, K.notify, K.limwait, K.prio) end
end
if requeued > 0 then wake(K.notify) end
flush(K.stats)
announce(K.ended, ended)
if more then return {requeued, buried, 1} end
return {requeued, buried}
