-- Writing new jobs: enqueue, the follow-ups of a settle, the relay.
--- @include "idem"
--- @include "ready"
--- @include "records"
--- @include "stats"

-- Writing a new job, shared by enqueue, the follow-ups an ack writes and the relay. Q
-- holds the queue's keys: ready, scheduled, delayed (the scheduled list's index, kept with
-- scheduled), stats, job (prefix), idem (prefix), claims;
-- put gathers what a batch writes once (ready ids, enqueued and census counts), and
-- jobs_flush() writes it. j holds the enqueue fields (see enqueue.lua). Returns code, id,
-- status: 1 created, 0 duplicate of the key's job, -1 conflict with it.
local function jobs_acc()
  return {ready = {}, counts = {}, versions = {}, marked = {}}
end

-- Mark that a job under limit key `first` was enqueued in this partition (Q.mark: the
-- limits' prefix, Q.mark_ms: how long; once a batch per key): after a change of the count
-- of partitions, producers on the new count look for it and send the key's jobs here
-- while it lives (routing.py), so the limit keeps holding across the change.
local function mark_placed(Q, put, limits)
  local first = string.match(limits, '^[%d/]+ ([^\n]+)')
  if first and not put.marked[first] then
    put.marked[first] = true
    redis.call('SET', Q.mark .. first .. ':at', '1', 'PX', Q.mark_ms)
  end
end

-- A DEBOUNCE function's job (its meta holds "debounce": key, period_ms, max_wait_ms): one
-- burst per key and version, its marker a hash under the idempotency prefix (fields
-- id:<version>, first:<version>). While the burst's job still waits for its debounce
-- (scheduled, and never claimed: claim clears its state's 'debounce' field, see
-- debounce_release in idem.lua), this enqueue replaces its payload and the keys rendered
-- from it (resource key, limits), moves its start to a period from now, never past
-- max_wait after the burst's first enqueue, and returns 2, its id, 'scheduled'. Else it
-- starts a burst (the marker names this job) and returns nil and the marker's key: the
-- job is written as any other, due a period on, its state naming the marker. The marker
-- has no TTL: it lives as long as its job waits, and goes when the job is claimed or ends.
local function debounce_put(Q, now, j, put)
  local ok, m = pcall(cjson.decode, j.meta)
  local d = ok and type(m) == 'table' and m.debounce
  if type(d) ~= 'table' then return nil end
  -- Under the idempotency prefix, after a '~' that no function name (an identifier) has.
  local mk = Q.idem .. '~debounce:' .. j.type .. ':' .. tostring(d.key)
  local v = tostring(j.version)
  local held = redis.call('HMGET', mk, 'id:' .. v, 'first:' .. v)
  local hid = held[1]
  if hid and redis.call('HEXISTS', Q.job .. hid .. ':s', 'debounce') == 1
      and redis.call('ZSCORE', Q.scheduled, hid) then
    local jk = Q.job .. hid
    local rec = rec_parse(redis.call('GET', jk))
    if rec and tostring(rec.version) == v then
      rec.payload = j.payload
      rec.resource_key = j.rkey
      rec.limits = j.limits
      redis.call('SET', jk, rec_encode(rec))
      if Q.mark and (Q.mark_ms or 0) > 0 and j.limits ~= '' then mark_placed(Q, put, j.limits) end
      local due = math.min(now + tonumber(d.period_ms), tonumber(held[2]) + tonumber(d.max_wait_ms))
      redis.call('ZADD', Q.scheduled, due, hid)
      redis.pcall('ZADD', Q.delayed, due, hid)
      redis.call('HSET', jk .. ':s', 'ready_ms', due)
      redis.call('HINCRBY', jk .. ':s', 'absorbed', 1)
      return 2, hid, 'scheduled'
    end
  end
  redis.call('HSET', mk, 'id:' .. v, j.id, 'first:' .. v, now)
  -- (A marker of an earlier release: fields id and first, and a TTL.)
  if redis.call('PERSIST', mk) == 1 then redis.call('HDEL', mk, 'id', 'first') end
  return nil, mk
end

-- An idempotency key's enqueue (j.ikey set): code, id, status of the key's job when it
-- still stands (0 duplicate, -1 conflict), else nil once the key names this job.
local function idem_put(Q, j)
  local ik = idem_key(Q.idem, j.type, j.ikey)
  -- pcall: a key damaged to another type reads as free (the SET below replaces it)
  -- rather than failing the batch part-way.
  local held = redis.pcall('GET', ik)
  if type(held) == 'string' then
    local hid, hhash, state = string.match(held, '^(%S+) (%S+) ?(%S*)')
    local st
    if state == 'done' then
      st = 'done'
    elseif redis.call('HEXISTS', Q.claims, hid or '') == 1 then
      st = 'processing'
    elseif redis.call('EXISTS', Q.job .. (hid or '')) == 1 then
      st = redis.call('HGET', Q.job .. hid .. ':s', 'status') or 'queued'
    end
    if st then
      if hhash == j.phash then stat_add(Q.stats, 'deduplicated|' .. j.type, 1) end
      return hhash == j.phash and 0 or -1, hid, st
    end
    -- Else the key names a job that no longer exists: it is stale, and taken over.
  end
  redis.call('SET', ik, j.id .. ' ' .. j.phash)
  return nil
end

local function job_put(Q, now, j, put)
  local debounced = nil  -- the burst marker this job starts (see debounce_put)
  if j.meta ~= '' and string.find(j.meta, '"debounce":', 1, true) then
    local code, hid, st = debounce_put(Q, now, j, put)
    if code then return code, hid, st end
    debounced = hid
  end
  local due = 0
  if j.run_at > 0 then due = j.run_at elseif j.delay > 0 then due = now + j.delay end
  if j.ikey ~= '' then
    local code, hid, st = idem_put(Q, j)
    if code then return code, hid, st end
  end
  if Q.mark and (Q.mark_ms or 0) > 0 and j.limits ~= '' then mark_placed(Q, put, j.limits) end
  -- The record is one string; a plain job due now has no state hash at all (see above).
  local jk = Q.job .. j.id
  redis.call('SET', jk, rec_encode({type = j.type, version = j.version, max_attempts = j.max_attempts,
    created_ms = now_text(now), idem_key = j.ikey, idem_hash = j.ikey ~= '' and j.phash or '', resource_key = j.rkey,
    limits = j.limits, meta = j.meta, payload = j.payload}))
  local status = 'queued'
  local prio = j.priority or 0
  if prio > 0 then
    -- Kept in the state, so wherever the job comes back to waiting it goes back to the
    -- priority set.
    redis.call('HSET', jk .. ':s', 'priority', prio)
  end
  if debounced then redis.call('HSET', jk .. ':s', 'debounce', debounced) end
  if due > now then
    status = 'scheduled'
    redis.call('HSET', jk .. ':s', 'status', status, 'ready_ms', due)
    redis.call('ZADD', Q.scheduled, due, j.id)
    redis.pcall('ZADD', Q.delayed, due, j.id)
  elseif prio > 0 and Q.prio then
    -- The priority set: highest first, then arrival (the claim serves it before ready).
    redis.call('ZADD', Q.prio, -prio * 1e13 + now, j.id)
    put.prio = true
  else
    put.ready[#put.ready + 1] = j.id
  end
  put.counts[j.type] = (put.counts[j.type] or 0) + 1
  local field = j.type .. '|' .. j.version
  put.versions[field] = (put.versions[field] or 0) + 1
  return 1, j.id, status
end

-- The 12 enqueue fields of one job from ARGV at b (the order of enqueue.lua), or from
-- a list t at b (a relayed outbox entry).
-- ('0', most jobs' run_at and delay, is 0 without a parse: tonumber is a strtod, and
-- with the priority's that was about 2,200 server instructions of an enqueue's 43,000.)
local function job_fields(t, b)
  local run_at, delay = t[b + 5], t[b + 6]
  return {id = t[b], type = t[b + 1], version = t[b + 2], payload = t[b + 3], max_attempts = t[b + 4],
    run_at = run_at == '0' and 0 or tonumber(run_at) or 0, delay = delay == '0' and 0 or tonumber(delay) or 0,
    ikey = t[b + 7], phash = t[b + 8], rkey = t[b + 9], limits = t[b + 10], meta = t[b + 11]}
end

local function jobs_flush(Q, put, notify_key, census_key)
  local ready = put.ready
  -- One push and one counter per type for the whole batch, in the order given.
  if #ready > 0 then
    for i = 1, #ready, 1000 do
      redis.call('LPUSH', Q.ready, unpack(ready, i, math.min(i + 999, #ready)))
    end
    wake(notify_key)
  elseif put.prio then
    wake(notify_key)
  end
  for typ, c in pairs(put.counts) do
    -- pcall: the jobs are in; a damaged stats hash must not turn that into an error.
    stat_add(Q.stats, 'enqueued|' .. typ, c)
  end
  for field, c in pairs(put.versions) do census(census_key, field, c) end
end
