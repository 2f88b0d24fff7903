-- claim: move up to n ready jobs to in-flight, each with a lease deadline and a fresh
-- claim token. On the way it settles what must never reach a handler: a missing or
-- malformed record goes to the dead-letter set, a job whose idempotency key already
-- completed (another job, the same payload) is marked done as a duplicate, and a job
-- under a full limit (resource or concurrency key) is parked on that limit's waiter list
-- without spending an attempt, to be woken by the release that frees a slot.
--
-- The first k jobs claimed go to executors that are free now: their attempt is spent at
-- once. The rest are claimed ahead (prefetched): their claims carry 'p' and spend nothing
-- until the worker marks them started (start.lua). A job under limits is never
-- prefetched: reaching one past the first k puts it back at the consumer end of ready
-- and ends the call, so no prefetched job holds a slot it cannot use yet.
--
-- Ids are popped from ready in rounds (RPOP with a count of what is still wanted), and
-- every id popped is settled in this same call: claimed, buried, parked, marked a
-- duplicate, put back, or dropped as a stray. At most n * 4 ids are popped per call.
--
-- A claim costs one read of each record and no write to it: the claims (token, attempt,
-- start, flags) go in one variadic HSET on the claims hash and the leases in one
-- variadic ZADD. An id that already holds a claim or a done outcome (or comes twice in
-- one call) is a stray and is dropped, so no job runs twice.
--
-- KEYS[1] ready        LIST
-- KEYS[2] leases       ZSET  id -> lease deadline ms
-- KEYS[3] scheduled    ZSET  id -> due ms
-- KEYS[4] dead         ZSET  id -> time of death ms
-- KEYS[5] stats        HASH
-- KEYS[6] job prefix   (string)
-- KEYS[7] limit prefix (string; see parse_limits in _lib.lua)
-- KEYS[8] idem prefix  (string)
-- KEYS[9] claims       HASH  id -> "<token> <attempt> <started_ms> <flags>"
-- KEYS[10] done        HASH  id -> outcome
-- KEYS[11] limwait     ZSET  limit keys with parked jobs -> next sweep ms
-- KEYS[12] notify      LIST  (a job woken by a freed reserved slot)
-- ARGV[1] now, ms ('' for the server's clock)
-- ARGV[2] n, the most jobs to claim
-- ARGV[3] k, how many of them start at once (free executors); the rest are prefetched
-- ARGV[4] lease, ms
-- ARGV[5] token base (unique per call; the token is base .. ':' .. index)
-- ARGV[6] dead retention, ms
-- ARGV[7] done retention, ms
--
-- Returns a flat list: the server time of the claim (ms); 1 when the call stopped at a job
-- under limits that no free executor could start (0 otherwise: the worker then waits for
-- a free executor, not for new jobs); then 13 values per claimed job:
--   id, token, attempt, type, version, payload, max_attempts, idem_key,
--   resource_key, ready_ms, created_ms, checkpoint, started (1 at once, 0 prefetched)
local now = clock(ARGV[1])
local n = tonumber(ARGV[2])
local k_start = tonumber(ARGV[3])
local lease = tonumber(ARGV[4])
local base = ARGV[5]
local dead_ttl, done_ttl = tonumber(ARGV[6]), tonumber(ARGV[7])
local out = {now, 0}
local KNOWN = {queued = true, scheduled = true, processing = true, retrying = true,
  done = true, dead = true, deferred = true}
local FIELDS = {'type', 'version', 'payload', 'status', 'attempt', 'max_attempts', 'idem_key',
  'resource_key', 'ready_ms', 'created_ms', 'checkpoint', 'deferrals', 'limits', 'woken', 'idem_hash',
  'lost_token'}

-- Lease entries (deadline, id, ...) and claims (id, entry, ...) of the jobs claimed so
-- far, not yet written; taken[id] marks an id claimed in this call.
local leased, claimed, taken = {}, {}, {}
local function write_leases()
  call_many('ZADD', KEYS[2], leased, 2)
  call_many('HSET', KEYS[9], claimed, 2)
  leased, claimed = {}, {}
end

local function bury_raw(jk, id, reason)
  redis.call('HSET', jk, 'status', 'dead', 'reason', reason, 'finished_ms', now)
  redis.call('ZADD', KEYS[4], now, id)
  redis.call('PEXPIRE', jk, dead_ttl)
  tally('dead|?')
end

local i = 0
local stop = false  -- set by take() for a job that must go back to ready
-- Settle one popped id: claim it, or bury, park, mark a duplicate, put back or drop it.
local function take(id)
  local jk = KEYS[6] .. id
  -- One read for the record. An error reply (WRONGTYPE) means the key is not a hash;
  -- when every field is absent, EXISTS tells a missing record from a hash without them.
  local f = redis.pcall('HMGET', jk, unpack(FIELDS))
  local absent = not f.err
  if absent then
    for j = 1, #FIELDS do
      if f[j] then absent = false break end
    end
  end
  if f.err then
    local kind = redis.call('TYPE', jk)['ok']
    redis.call('RENAME', jk, jk .. ':corrupt')
    bury_raw(jk, id, 'malformed record: a Redis ' .. kind .. ' instead of a hash; kept at ' .. jk .. ':corrupt')
    return
  elseif absent and redis.call('EXISTS', jk) == 0 then
    bury_raw(jk, id, 'malformed record: no job record for this id')
    return
  end
  local missing = {}
  if not f[1] then missing[#missing + 1] = 'type' end
  if not f[2] then missing[#missing + 1] = 'version' end
  if not f[3] then missing[#missing + 1] = 'payload' end
  if not f[4] then missing[#missing + 1] = 'status' end
  -- Counters the scripts do arithmetic on must be integers (absent means 0).
  local badint = {}
  for _, pair in ipairs({{5, 'attempt'}, {6, 'max_attempts'}, {9, 'ready_ms'}, {10, 'created_ms'},
      {12, 'deferrals'}}) do
    local v = f[pair[1]]
    if v and not string.match(v, '^%-?%d+$') then badint[#badint + 1] = pair[2] end
  end
  if #missing > 0 then
    bury_raw(jk, id, 'malformed record: missing field(s) ' .. table.concat(missing, ', '))
    return
  elseif #badint > 0 then
    bury_raw(jk, id, 'malformed record: not an integer: ' .. table.concat(badint, ', '))
    return
  elseif not KNOWN[f[4]] then
    bury_raw(jk, id, 'malformed record: unknown status ' .. string.format('%q', f[4]))
    return
  elseif f[4] ~= 'queued' then
    -- A stray id (the record is done, dead or elsewhere): drop it, never run it twice.
    tally('stray')
    return
  end
  local typ = f[1]
  local ikey = f[7] or ''
  local limits = parse_limits(f[13])
  local starts = i < k_start
  if #limits > 0 and not starts then
    -- Never prefetch a job under limits: it goes back where the next claim takes it first.
    stop = true
    return
  end
  if ikey ~= '' or #limits > 0 then
    -- The keys below are not the queue's own: should one of them fail (a wrong
    -- type), the jobs claimed so far already hold their leases.
    write_leases()
  end
  if ikey ~= '' then
    -- A completed key of another job with this very payload: this job is its duplicate
    -- (two producers raced around an expiry, or one wrote the record itself). pcall: a
    -- damaged key reads as no completion mark instead of failing the call.
    local held = redis.pcall('GET', idem_key(KEYS[8], typ, ikey))
    if type(held) == 'string' then
      local hid, hhash, state = string.match(held, '^(%S+) (%S+) ?(%S*)')
      if state == 'done' and hid ~= id and (not f[15] or f[15] == hhash) then
        redis.call('HSET', jk, 'status', 'done', 'duplicate_of', hid, 'finished_ms', now)
        redis.call('PEXPIRE', jk, done_ttl)
        for _, l in ipairs(limits) do
          -- A slot reserved for it when it was woken goes to the next parked job.
          if redis.call('ZREM', KEYS[7] .. l.key, '=' .. id) == 1 then
            wake_parked(KEYS[7], l.key, l.n, now, KEYS[6], KEYS[1], KEYS[12], KEYS[11])
          end
        end
        tally('duplicates|' .. typ)
        return
      end
    end
  end
  local token = base .. ':' .. i
  if #limits > 0 then
    local full = acquire_limits(KEYS[7], limits, id, token, now, lease)
    if full then
      park(KEYS[7], full, id, jk, tonumber(f[12]) or 0, f[14] == '1', now, KEYS[11])
      tally('deferred|' .. typ)
      return
    end
    if f[14] then redis.call('HDEL', jk, 'woken') end
  end
  local attempt = (tonumber(f[5]) or 0) + 1
  -- A run of an earlier claim can no longer finish as a late success: this one owns it.
  if f[16] then redis.call('HDEL', jk, 'lost_token') end
  leased[#leased + 1] = now + lease
  leased[#leased + 1] = id
  claimed[#claimed + 1] = id
  claimed[#claimed + 1] = claim_entry(token, attempt, now, ikey ~= '', #limits > 0, not starts)
  taken[id] = true
  out[#out + 1] = id
  out[#out + 1] = token
  out[#out + 1] = attempt
  out[#out + 1] = typ
  out[#out + 1] = f[2]
  out[#out + 1] = f[3]
  out[#out + 1] = f[6] or ''
  out[#out + 1] = ikey
  out[#out + 1] = f[8] or ''
  out[#out + 1] = f[9] or ''
  out[#out + 1] = f[10] or ''
  out[#out + 1] = f[11] or ''
  out[#out + 1] = starts and 1 or 0
  i = i + 1
end

local popped = 0
-- Bound the work per call: strays, parked jobs and duplicates do not count as claims.
while i < n and popped < n * 4 and not stop do
  -- Pop no more than can still be claimed, so every id popped is settled here.
  local want = math.min(n - i, n * 4 - popped)
  local ids = redis.call('RPOP', KEYS[1], want)
  if not ids then break end
  popped = popped + #ids
  local ok_h, held = pcall(hmget_many, KEYS[9], ids)
  local ok_f, fin = pcall(hmget_many, KEYS[10], ids)
  local damaged = not ok_h and 'claims' or not ok_f and 'done' or nil
  if popped == #ids and not damaged then
    -- First round: every other key of the queue that settling an id may write must be
    -- of its type, or a write would fail with ids popped and not yet anywhere.
    -- (A damaged stats hash only loses counts: see flush.)
    for _, kn in ipairs({{2, 'leases'}, {3, 'scheduled'}, {4, 'dead'}}) do
      if type(redis.pcall('ZSCORE', KEYS[kn[1]], '')) == 'table' then damaged = kn[2] break end
    end
  end
  if damaged then
    -- A key of the queue is damaged (another type). Types cannot change within this
    -- call, so this is the first round and nothing is claimed yet: put the ids back at
    -- the consumer end, in order, and refuse, rather than lose them. The scheduler's
    -- reclaim renames the key aside.
    for j = #ids, 1, -1 do redis.call('RPUSH', KEYS[1], ids[j]) end
    return redis.error_reply('claim refused: the ' .. damaged .. ' key of this queue holds the wrong Redis type')
  end
  for j, id in ipairs(ids) do
    if held[j] or fin[j] or taken[id] then
      tally('stray')  -- claimed or finished already: never run it twice
    else
      take(id)
      if stop then
        out[2] = 1
        -- Put back this job and what this round popped after it, in order: the first
        -- pushed to the consumer end is the last taken.
        for q = #ids, j, -1 do redis.call('RPUSH', KEYS[1], ids[q]) end
        break
      end
    end
  end
  if #ids < want then break end
end
write_leases()
flush(KEYS[5])
return out
