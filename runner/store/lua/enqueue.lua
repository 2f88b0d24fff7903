-- enqueue: accept a batch of new jobs, each to ready (now) or scheduled (later),
-- with an atomic idempotency check-and-set.
--
-- KEYS[1] ready        LIST
-- KEYS[2] scheduled    ZSET  id -> due ms
-- KEYS[3] notify       LIST
-- KEYS[4] stats        HASH
-- KEYS[5] job prefix   (string; the job key is prefix .. id)
-- KEYS[6] idem prefix  (string; a key is prefix .. type .. ':' .. idempotency key)
-- KEYS[7] claims       HASH  (a duplicate's status: a claimed job is processing)
-- KEYS[8] census       HASH  "<type>|<version>" -> jobs not done (the deploy gate)
-- KEYS[9] prio         ZSET  ready ids of priority 1-9 -> -priority * 1e13 + enqueue ms
-- ARGV[1] now, ms ('' for the server's clock; tests pass their own)
-- ARGV[2] n, the number of jobs; then 13 fields per job:
--   id, type, version, payload (JSON), max_attempts,
--   run_at_ms (absolute, the caller's clock; 0 none), delay_ms (relative to the server's
--   clock; 0 none), idempotency key ('' none), payload hash, resource key ('' none),
--   limits ("<n> <key>" lines, '' none), meta (a JSON object, '' none), priority (0-9; a
--   job of 1-9 due now goes to the priority set, served before ready, highest first and
--   in arrival order within a priority; 0 is plain ready)
--
-- An idempotency key has no expiry while its job is unfinished (so it cannot lapse under a
-- delayed or retrying job and let a second request in); the ack of that job starts its
-- retention, and a job that dies or is deleted frees it.
--
-- Returns, per job, three values: code, job id, status.
--   1  created: the new id and its status (queued | scheduled)
--   0  duplicate: the id and status of the job that holds the key, same payload
--  -1  conflict: the id of the job that holds the key with another payload
local now = clock(ARGV[1])
local n = tonumber(ARGV[2])
local out = {}
local ready = {}
local counts, versions = {}, {}
local prio_n = 0
for i = 0, n - 1 do
  local b = 3 + i * 13
  local id, typ, ver, payload = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3]
  local max_attempts, run_at, delay = ARGV[b + 4], tonumber(ARGV[b + 5]), tonumber(ARGV[b + 6])
  local ikey, phash, rkey, limits, meta = ARGV[b + 7], ARGV[b + 8], ARGV[b + 9], ARGV[b + 10], ARGV[b + 11]
  local due = 0
  if run_at > 0 then due = run_at elseif delay > 0 then due = now + delay end
  local dup = false
  if ikey ~= '' then
    local ik = idem_key(KEYS[6], typ, ikey)
    -- pcall: a key damaged to another type reads as free (the SET below replaces it)
    -- rather than failing the batch part-way.
    local held = redis.pcall('GET', ik)
    if type(held) == 'string' then
      local hid, hhash, state = string.match(held, '^(%S+) (%S+) ?(%S*)')
      local st
      if state == 'done' then
        st = 'done'
      elseif redis.call('HEXISTS', KEYS[7], hid or '') == 1 then
        st = 'processing'
      elseif redis.call('EXISTS', KEYS[5] .. (hid or '')) == 1 then
        st = redis.call('HGET', KEYS[5] .. hid .. ':s', 'status') or 'queued'
      end
      if st then
        out[#out + 1] = hhash == phash and 0 or -1
        out[#out + 1] = hid
        out[#out + 1] = st
        if hhash == phash then redis.pcall('HINCRBY', KEYS[4], 'deduplicated|' .. typ, 1) end
        dup = true
      end
      -- Else the key names a job that no longer exists: it is stale, and taken over.
    end
    if not dup then redis.call('SET', ik, id .. ' ' .. phash) end
  end
  if not dup then
    -- The record is one string; a job due now has no state hash at all (see _lib.lua).
    local jk = KEYS[5] .. id
    redis.call('SET', jk, rec_encode({type = typ, version = ver, max_attempts = max_attempts, created_ms = now,
      idem_key = ikey, idem_hash = ikey ~= '' and phash or '', resource_key = rkey, limits = limits,
      meta = meta, payload = payload}))
    local status = 'queued'
    if due > now then
      status = 'scheduled'
      redis.call('HSET', jk .. ':s', 'status', status, 'ready_ms', due)
      redis.call('ZADD', KEYS[2], due, id)
    elseif (tonumber(ARGV[b + 12]) or 0) > 0 then
      redis.call('ZADD', KEYS[9], -tonumber(ARGV[b + 12]) * 1e13 + now, id)
      prio_n = prio_n + 1
    else
      ready[#ready + 1] = id
    end
    counts[typ] = (counts[typ] or 0) + 1
    versions[typ .. '|' .. ver] = (versions[typ .. '|' .. ver] or 0) + 1
    out[#out + 1] = 1
    out[#out + 1] = id
    out[#out + 1] = status
  end
end
-- One push and one counter per type for the whole batch, in the order given.
if #ready > 0 then
  for i = 1, #ready, 1000 do
    redis.call('LPUSH', KEYS[1], unpack(ready, i, math.min(i + 999, #ready)))
  end
  wake(KEYS[3])
elseif prio_n > 0 then
  wake(KEYS[3])
end
for typ, c in pairs(counts) do
  -- pcall: the jobs are in; a damaged stats hash must not turn that into an error.
  redis.pcall('HINCRBY', KEYS[4], 'enqueued|' .. typ, c)
end
for field, c in pairs(versions) do census(KEYS[8], field, c) end
return out
