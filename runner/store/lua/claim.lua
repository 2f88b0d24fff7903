-- claim: move up to n ready jobs to in-flight, each with a lease deadline and a fresh
-- claim token. On the way it settles what must never reach a handler: a missing or
-- malformed record goes to the dead-letter set, a job whose idempotency key already
-- completed is marked done as a duplicate, and a job whose resource lock is held is
-- deferred to scheduled without spending an attempt, and queued on the resource's
-- waiter list (FIFO) so the holder's release wakes it.
--
-- Ids are popped from ready in rounds (RPOP with a count of what is still wanted), and
-- every id popped is settled in this same call: claimed, buried, deferred, marked a
-- duplicate, or dropped as a stray. At most n * 4 ids are popped per call.
--
-- A claim costs one read of each record and no write to it: the claims (token, attempt,
-- start) go in one variadic HSET on the claims hash and the leases in one variadic ZADD.
-- An id that already holds a claim or a done outcome (or comes twice in one call) is a
-- stray and is dropped, so no job runs twice.
--
-- KEYS[1] ready        LIST
-- KEYS[2] leases       ZSET  id -> lease deadline ms
-- KEYS[3] scheduled    ZSET  id -> due ms
-- KEYS[4] dead         ZSET  id -> time of death ms
-- KEYS[5] stats        HASH
-- KEYS[6] job prefix   (string)
-- KEYS[7] lock prefix  (string)
-- KEYS[8] idem prefix  (string)
-- KEYS[9] claims       HASH  id -> "<token> <attempt> <started_ms> <flags>"
-- KEYS[10] done        HASH  id -> outcome
-- ARGV[1] now_ms
-- ARGV[2] n, the most jobs to claim
-- ARGV[3] lease, ms
-- ARGV[4] token base (unique per call; the token is base .. ':' .. index)
-- ARGV[5] deferral base delay, ms
-- ARGV[6] deferral cap, ms
-- ARGV[7] a random number in [0, 1) for deferral jitter
-- ARGV[8] dead retention, ms
-- ARGV[9] done retention, ms
--
-- Returns a flat list, 12 values per claimed job:
--   id, token, attempt, type, version, payload, max_attempts, idem_key,
--   resource_key, ready_ms, created_ms, checkpoint
local now = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local lease = tonumber(ARGV[3])
local base = ARGV[4]
local dbase, dcap = tonumber(ARGV[5]), tonumber(ARGV[6])
local rnd = tonumber(ARGV[7])
local dead_ttl, done_ttl = tonumber(ARGV[8]), tonumber(ARGV[9])
local out = {}
local KNOWN = {queued = true, scheduled = true, processing = true, retrying = true,
  done = true, dead = true}
local FIELDS = {'type', 'version', 'payload', 'status', 'attempt', 'max_attempts', 'idem_key',
  'resource_key', 'ready_ms', 'created_ms', 'checkpoint', 'deferrals'}

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
-- Settle one popped id: claim it, or bury, defer, mark a duplicate or drop it.
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
  elseif absent and redis.call('EXISTS', jk) == 0 then
    bury_raw(jk, id, 'malformed record: no job record for this id')
  else
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
    elseif #badint > 0 then
      bury_raw(jk, id, 'malformed record: not an integer: ' .. table.concat(badint, ', '))
    elseif not KNOWN[f[4]] then
      bury_raw(jk, id, 'malformed record: unknown status ' .. string.format('%q', f[4]))
    elseif f[4] ~= 'queued' then
      -- A stray id (the record is done, dead or elsewhere): drop it, never run it twice.
      tally('stray')
    else
      local typ = f[1]
      local ikey = f[7] or ''
      local rkey = f[8] or ''
      local settled = false
      if ikey ~= '' or rkey ~= '' then
        -- The keys below are not the queue's own: should one of them fail (a wrong
        -- type), the jobs claimed so far already hold their leases.
        write_leases()
      end
      if ikey ~= '' then
        -- pcall: a damaged key (not a string) reads as no completion mark instead of
        -- failing the call with ids already popped.
        local held = redis.pcall('GET', KEYS[8] .. ikey)
        if type(held) == 'string' then
          local hid, _, state = string.match(held, '^(%S+) (%S+) ?(%S*)')
          if state == 'done' and hid ~= id then
            redis.call('HSET', jk, 'status', 'done', 'duplicate_of', hid, 'finished_ms', now)
            redis.call('PEXPIRE', jk, done_ttl)
            tally('duplicates|' .. typ)
            settled = true
          end
        end
      end
      local token = base .. ':' .. i
      if not settled and rkey ~= '' then
        local got = redis.call('SET', KEYS[7] .. rkey, token, 'NX', 'PX', lease)
        if not got then
          local d = (tonumber(f[12]) or 0) + 1
          local delay = math.min(dcap, dbase * math.pow(2, math.min(d - 1, 12)))
          local r = (rnd + i * 0.618033988749895) % 1
          delay = math.floor(delay * (0.5 + 0.5 * r)) + 1
          redis.call('HSET', jk, 'status', 'scheduled', 'ready_ms', now + delay, 'deferrals', d)
          redis.call('ZADD', KEYS[3], now + delay, id)
          -- Queue behind the holder: its release wakes the first waiter at once; the
          -- scheduled entry is only the fallback timer.
          local wk = KEYS[7] .. rkey .. ':waiters'
          -- pcall: with a damaged waiter list the fallback timer still wakes the job.
          if type(redis.pcall('RPUSH', wk, id)) == 'number' then
            redis.call('PEXPIRE', wk, 3600000)
          end
          tally('deferred|' .. typ)
          settled = true
        end
      end
      if not settled then
        local attempt = (tonumber(f[5]) or 0) + 1
        local flags = (ikey ~= '' and 'i' or '') .. (rkey ~= '' and 'r' or '')
        if flags == '' then flags = '-' end
        leased[#leased + 1] = now + lease
        leased[#leased + 1] = id
        claimed[#claimed + 1] = id
        claimed[#claimed + 1] = token .. ' ' .. attempt .. ' ' .. now .. ' ' .. flags
        taken[id] = true
        out[#out + 1] = id
        out[#out + 1] = token
        out[#out + 1] = attempt
        out[#out + 1] = typ
        out[#out + 1] = f[2]
        out[#out + 1] = f[3]
        out[#out + 1] = f[6] or ''
        out[#out + 1] = ikey
        out[#out + 1] = rkey
        out[#out + 1] = f[9] or ''
        out[#out + 1] = f[10] or ''
        out[#out + 1] = f[11] or ''
        i = i + 1
      end
    end
  end
end

local popped = 0
-- Bound the work per call: strays and deferrals do not count as claims.
while i < n and popped < n * 4 do
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
    end
  end
  if #ids < want then break end
end
write_leases()
flush(KEYS[5])
return out
