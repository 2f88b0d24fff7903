-- enqueue: accept a batch of new jobs, each to ready (now) or scheduled (later),
-- with an atomic idempotency check-and-set.
--
-- KEYS[1] ready        LIST
-- KEYS[2] scheduled    ZSET  id -> due ms
-- KEYS[3] notify       LIST
-- KEYS[4] stats        HASH
-- KEYS[5] job prefix   (string; the job key is prefix .. id)
-- KEYS[6] idem prefix  (string; the idempotency key is prefix .. key)
-- KEYS[7] claims       HASH  (a duplicate's status: a claimed job is processing)
-- KEYS[8] done         HASH  (a duplicate's status: a finished job is done)
-- ARGV[1] now_ms
-- ARGV[2] idempotency retention, ms
-- ARGV[3] n, the number of jobs; then 10 fields per job:
--   id, type, version, payload (JSON), max_attempts, run_at_ms (0: now),
--   idempotency key ('' none), payload hash, resource key ('' none),
--   meta (a small JSON object of extra top-level fields; '' none)
--
-- Returns, per job, three values: code, job id, status.
--   1  created: the new id and its status (queued | scheduled)
--   0  duplicate: the id and status of the job that holds the key, same payload
--  -1  conflict: the id of the job that holds the key with another payload
local now = tonumber(ARGV[1])
local idem_ttl = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local out = {}
local ready = {}
local counts = {}
for i = 0, n - 1 do
  local b = 4 + i * 10
  local id, typ, ver, payload = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3]
  local max_attempts, run_at = ARGV[b + 4], tonumber(ARGV[b + 5])
  local ikey, phash, rkey, meta = ARGV[b + 6], ARGV[b + 7], ARGV[b + 8], ARGV[b + 9]
  local dup = false
  if ikey ~= '' then
    -- pcall: a key damaged to another type reads as free (the SET below replaces it)
    -- rather than failing the batch part-way.
    local held = redis.pcall('GET', KEYS[6] .. ikey)
    if type(held) == 'string' then
      local hid, hhash = string.match(held, '^(%S+) (%S+)')
      local st = redis.call('HGET', KEYS[5] .. hid, 'status') or 'expired'
      if redis.call('HEXISTS', KEYS[8], hid) == 1 then
        st = 'done'
      elseif redis.call('HEXISTS', KEYS[7], hid) == 1 then
        st = 'processing'
      end
      if hhash == phash then
        out[#out + 1] = 0
      else
        out[#out + 1] = -1
      end
      out[#out + 1] = hid
      out[#out + 1] = st
      if hhash == phash then redis.pcall('HINCRBY', KEYS[4], 'deduplicated|' .. typ, 1) end
      dup = true
    else
      redis.call('SET', KEYS[6] .. ikey, id .. ' ' .. phash, 'PX', idem_ttl)
    end
  end
  if not dup then
    -- Fields at their defaults are not written (attempt, deferrals: 0; enqueued_ms,
    -- ready_ms: created_ms; idem_key, resource_key: none): readers supply them.
    local status = 'queued'
    local f = {'type', typ, 'version', ver, 'payload', payload, 'status', status,
      'max_attempts', max_attempts, 'created_ms', now}
    if run_at > now then
      status = 'scheduled'
      f[8] = status
      f[#f + 1] = 'ready_ms'
      f[#f + 1] = run_at
      redis.call('ZADD', KEYS[2], run_at, id)
    else
      ready[#ready + 1] = id
    end
    if ikey ~= '' then
      f[#f + 1] = 'idem_key'
      f[#f + 1] = ikey
    end
    if rkey ~= '' then
      f[#f + 1] = 'resource_key'
      f[#f + 1] = rkey
    end
    if meta ~= '' then
      f[#f + 1] = 'meta'
      f[#f + 1] = meta
    end
    redis.call('HSET', KEYS[5] .. id, unpack(f))
    counts[typ] = (counts[typ] or 0) + 1
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
end
for typ, c in pairs(counts) do
  -- pcall: the jobs are in; a damaged stats hash must not turn that into an error.
  redis.pcall('HINCRBY', KEYS[4], 'enqueued|' .. typ, c)
end
return out
