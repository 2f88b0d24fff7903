-- Shared helpers, prepended to every script by scripts.py (Lua scripts cannot import).
-- None of them builds a key from anything but a prefix passed in KEYS.

-- The time of this call, in ms: the server's (TIME), so deadlines written by a worker on
-- one host are judged by a scheduler on another against the same clock. A test may pass
-- its own clock as a positive number; production passes '' (Redis 7 replicates a
-- script's effects, so reading TIME before writing is safe).
local function clock(arg)
  local t = tonumber(arg)
  if t and t > 0 then return t end
  local s = redis.call('TIME')
  return tonumber(s[1]) * 1000 + math.floor(tonumber(s[2]) / 1000)
end

-- Add the history field to a list of HSET field/value pairs: the record's current
-- comma-joined history (old; false/nil when none yet) with one more JSON entry. No
-- entry, no field: the history is left as it is. The caller writes the history in the
-- same HSET as the status, so the old value comes from the caller's fence read.
local function with_history(set, old, entry)
  if entry == nil or entry == '' then return end
  set[#set + 1] = 'history'
  if old and old ~= '' then
    set[#set + 1] = old .. ',' .. entry
  else
    set[#set + 1] = entry
  end
end

-- A history entry a client wrote (a JSON object: who requeued or cancelled a job) with
-- the time of this call added as at_ms: the server's, as every other time of a job is,
-- not the operator's host's. '' stays '' (no entry); an entry with its own at_ms (a client
-- of the release before, during a rolling deploy) is kept as it is.
local function stamped(entry, now)
  if entry == nil or entry == '' then return '' end
  if string.find(entry, '"at_ms"', 1, true) then return entry end
  return string.sub(entry, 1, -2) .. ',"at_ms":' .. now .. '}'
end

-- Run one variadic command (ZADD, ZREM, ...) over a flat list of arguments, in chunks
-- (a multiple of `step`, so member/score pairs stay together) to keep within Lua's
-- unpack limit. Nothing is sent for an empty list.
local function call_many(cmd, key, args, step)
  local chunk = 4000 - 4000 % step
  for s = 1, #args, chunk do
    redis.call(cmd, key, unpack(args, s, math.min(s + chunk - 1, #args)))
  end
end

-- Wake idle workers, keeping the wake-up list short. pcall: a wake-up list damaged to
-- another type must not fail a transition whose writes are already made (workers still
-- poll on their own; the scheduler renames the key aside).
local function wake(notify_key)
  local len = redis.pcall('LLEN', notify_key)
  if type(len) == 'number' and len < 64 then
    redis.call('LPUSH', notify_key, '1')
  end
end

-- Limits: a job's `limits` field holds one "<n> <key>" line per limit it is under (a
-- RESOURCE_KEY is limit 1 on "r:<resource>"). Each limit key has a holders set,
--   <lim prefix><key>      ZSET  claim token -> lease deadline ms; "=<job id>" -> the
--                                 end of a slot reserved for a woken waiter
--   <lim prefix><key>:w    LIST  ids of jobs parked until a slot frees, oldest first
-- and the queue's `limwait` ZSET names the keys with parked jobs (the scheduler's sweep
-- wakes what a lost release would strand). A job is parked once (one entry per waiting
-- job); a release hands its slot to the first parked job by reserving it, so the woken job
-- gets the slot and no later arrival can take it first.
local RESERVE_MS = 10000
-- A handler's RateLimited is free this many times per job (retry.lua); then it counts.
local RATE_LIMITED_FREE = 100

local LIMIT_LINE = '^(%d+) (.+)$'
local function parse_limits(raw)
  local out = {}
  if type(raw) ~= 'string' or raw == '' then return out end
  if not string.find(raw, '\n', 1, true) then
    -- One line (a job under one limit, the common case): the loop's match, without the loop.
    local n, key = string.match(raw, LIMIT_LINE)
    if n then out[1] = {n = tonumber(n), key = key} end
    return out
  end
  for line in string.gmatch(raw, '[^\n]+') do
    local n, key = string.match(line, LIMIT_LINE)
    if n then out[#out + 1] = {n = tonumber(n), key = key} end
  end
  return out
end

-- Rate limits share the field: a line "<n>/<period ms> <key>" (which parse_limits skips)
-- is a token bucket of n starts per period on the STRING <lim prefix><key>, kept as GCRA's
-- theoretical arrival time (ms): a burst of n, then one start every period / n.
local function parse_rates(raw)
  local out = {}
  -- (Every rate line holds a '/'; a concurrency key may too, so one means a look.)
  if type(raw) ~= 'string' or raw == '' or not string.find(raw, '/', 1, true) then return out end
  for line in string.gmatch(raw, '[^\n]+') do
    local n, p, key = string.match(line, '^(%d+)/(%d+) (.+)$')
    if n and tonumber(n) > 0 then out[#out + 1] = {n = tonumber(n), period = tonumber(p), key = key} end
  end
  return out
end

-- Take the next token of a rate for one start: 0 when it is due now, else the ms it is
-- due at. Either way it is this job's (reserved), so held-back jobs are spread one per
-- token instead of all waking for the same one. The key expires once the bucket is full
-- again. (SET replaces a key damaged to another type: the bucket starts afresh.)
local function take_rate(lim_prefix, r, now, not_after)
  local k = lim_prefix .. r.key
  local step = r.period / r.n
  local raw = redis.pcall('GET', k)
  local tat = type(raw) == 'string' and tonumber(raw) or now
  if tat < now then tat = now end
  local at = tat - (r.period - step)
  -- A token due after the job's MAX_AGE would only be spent on a job that expires then:
  -- left for the jobs behind it (-1: the caller expires this one now).
  if not_after and at > not_after then return -1 end
  redis.call('SET', k, string.format('%.3f', tat + step), 'PX', math.ceil(tat + step - now) + 1)
  if at <= now then return 0 end
  return math.ceil(at)
end

-- A limit's keys damaged to another Redis type would fail every transition of the jobs
-- under it, with ids already popped or unclaimed: they are renamed aside to
-- <key>:corrupt (what a damaged waiter list held is gone with it, as for ready) and the
-- limit starts afresh.
local function heal_limit(k)
  for _, kk in ipairs({{k, 'zset'}, {k .. ':w', 'list'}}) do
    local kind = redis.call('TYPE', kk[1])['ok']
    if kind ~= kk[2] and kind ~= 'none' then redis.call('RENAME', kk[1], kk[1] .. ':corrupt') end
  end
end

-- A command on a limit's holders: a key damaged to another type is renamed aside
-- (heal_limit) and the command runs again on the fresh key. The common case costs no
-- TYPE check.
local function on_holders(cmd, k, ...)
  local r = redis.pcall(cmd, k, ...)
  if type(r) == 'table' and r.err then
    heal_limit(k)
    r = redis.call(cmd, k, ...)
  end
  return r
end

-- Drop holders whose lease lapsed (their worker died and nobody released them).
local function purge_holders(k, now)
  on_holders('ZREMRANGEBYSCORE', k, '-inf', now)
end

-- A job back to waiting for a worker (due after a delay or a backoff, released, its lease
-- lapsed, woken by a limit, resumed, requeued): one of priority 1-9 (its state's
-- 'priority', written at enqueue) goes to the priority set, so it keeps its place ahead
-- of plain jobs wherever it comes back from; else to ready. ``next``: it is the next of
-- its kind to run (the consumer end of ready; the front of its priority), else the last.
local function to_ready(ready_key, prio_key, id, prio, now, next)
  local p = tonumber(prio)
  if p and p > 0 and prio_key then
    redis.call('ZADD', prio_key, -p * 1e13 + (next and 0 or now), id)
  elseif next then
    redis.call('RPUSH', ready_key, id)
  else
    redis.call('LPUSH', ready_key, id)
  end
end

-- Wake parked jobs of one limit key while it has free slots: each woken job gets a
-- reserved slot and goes to the consumer end of ready (or the front of its priority).
-- Stale entries (a job cancelled, requeued or otherwise no longer parked) are skipped.
-- Returns how many were woken.
local function wake_parked(lim_prefix, key, n, now, job_prefix, ready_key, notify_key, limwait_key, prio_key)
  local k = lim_prefix .. key
  local wk = k .. ':w'
  local parked = redis.pcall('LLEN', wk)
  if type(parked) ~= 'number' or parked == 0 then
    -- Nobody waits (the common case of a release): nothing to wake, and the key leaves
    -- the sweep's index. A damaged waiter list is renamed aside.
    if type(parked) ~= 'number' then heal_limit(k) end
    if limwait_key then redis.call('ZREM', limwait_key, key) end
    return 0
  end
  purge_holders(k, now)
  local woke = 0
  for _ = 1, 64 do
    if redis.call('ZCARD', k) >= n then break end
    local w = redis.pcall('LPOP', wk)
    if type(w) ~= 'string' then break end
    local sk = job_prefix .. w .. ':s'
    local st = redis.pcall('HMGET', sk, 'status', 'priority')
    if type(st) == 'table' and st[1] == 'deferred' then
      redis.call('ZADD', k, now + RESERVE_MS, '=' .. w)
      redis.call('HSET', sk, 'status', 'queued', 'ready_ms', now, 'woken', '1')
      to_ready(ready_key, prio_key, w, st[2], now, true)
      woke = woke + 1
    end
  end
  if woke > 0 then wake(notify_key) end
  if limwait_key and redis.call('EXISTS', wk) == 0 then redis.call('ZREM', limwait_key, key) end
  return woke
end

-- A woken job that will not take the slots reserved for it (a duplicate, expired or
-- cancelled before its claim) hands each to the next parked job of its key now.
local function give_up_reserved(lim_prefix, limits, id, now, job_prefix, ready_key, notify_key, limwait_key,
    prio_key)
  for _, l in ipairs(limits) do
    if redis.call('ZREM', lim_prefix .. l.key, '=' .. id) == 1 then
      wake_parked(lim_prefix, l.key, l.n, now, job_prefix, ready_key, notify_key, limwait_key, prio_key)
    end
  end
end

-- Give back every slot a claim token holds and wake the next parked job of each key.
local function release_limits(lim_prefix, raw, token, now, job_prefix, ready_key, notify_key, limwait_key,
    prio_key)
  for _, l in ipairs(parse_limits(raw)) do
    on_holders('ZREM', lim_prefix .. l.key, token)
    wake_parked(lim_prefix, l.key, l.n, now, job_prefix, ready_key, notify_key, limwait_key, prio_key)
  end
end

-- Take a slot of every limit for this claim, or none: returns nil when all were taken,
-- else the limit that is full (the job is parked on it). Only a woken job can hold a
-- reserved slot ("=<id>", see wake_parked) to take over; another never looks for one.
local function acquire_limits(lim_prefix, limits, id, token, now, lease, woken)
  for _, l in ipairs(limits) do
    local k = lim_prefix .. l.key
    -- Lapsed holders (their worker died before a reclaim released them) are purged only
    -- when the key looks full: purging only lowers the count, so it never turns a free
    -- slot into a full one (and it costs a command a start).
    local count = on_holders('ZCARD', k)
    local mine = woken and redis.call('ZSCORE', k, '=' .. id) and 1 or 0
    if count - mine >= l.n then
      purge_holders(k, now)
      mine = woken and redis.call('ZSCORE', k, '=' .. id) and 1 or 0
      if redis.call('ZCARD', k) - mine >= l.n then return l end
    end
  end
  for _, l in ipairs(limits) do
    local k = lim_prefix .. l.key
    if woken then redis.call('ZREM', k, '=' .. id) end
    redis.call('ZADD', k, now + lease, token)
  end
  return nil
end

-- Park a job on a full limit: it leaves every structure but the key's waiter list. A job
-- that was woken before and lost its reserved slot goes back to the head of the line.
local function park(lim_prefix, l, id, jk, deferrals, woken, now, limwait_key)
  heal_limit(lim_prefix .. l.key)
  local wk = lim_prefix .. l.key .. ':w'
  redis.call('HSET', jk .. ':s', 'status', 'deferred', 'deferrals', deferrals + 1)
  redis.call('HDEL', jk .. ':s', 'woken')
  if woken then redis.call('LPUSH', wk, id) else redis.call('RPUSH', wk, id) end
  redis.call('ZADD', limwait_key, 'NX', now + 1000, l.key)
end

-- Count every stats field named in a space-separated list ("field" adds 1,
-- "field=N" adds N); tally() counts one field given whole (it may hold spaces);
-- flush() writes the totals with one HINCRBY per distinct field, however many jobs
-- the batch held.
local acc = {}
local function bump(fields)
  if fields == nil or fields == '' then return end
  for tok in string.gmatch(fields, '%S+') do
    local f, n = string.match(tok, '^(.-)=(%d+)$')
    if f then
      acc[f] = (acc[f] or 0) + tonumber(n)
    else
      acc[tok] = (acc[tok] or 0) + 1
    end
  end
end
local function tally(field)
  acc[field] = (acc[field] or 0) + 1
end
local function flush(stats_key)
  for f, n in pairs(acc) do
    -- pcall: a stats hash damaged to another type loses these counts, never the
    -- transition (its writes are made; the scheduler renames the key aside).
    redis.pcall('HINCRBY', stats_key, f, n)
  end
end

-- Claims live in the queue's claims hash: id -> "<token> <attempt> <started_ms> <flags>",
-- where flags holds 'i' when the record has an idempotency key, 'r' when it is under
-- limits (a resource or concurrency key), so a settling script reads the record only for
-- those; 'p' while the job is claimed ahead of a free executor and has not started (its
-- attempt is not spent until it does), 'x' once its worker gave it up at shutdown with the
-- handler still running, 's' when the job has a state hash (a history, an error, a
-- checkpoint: see the records below), 'w' when someone waits for its end (the settling
-- script then publishes its id; see waited below), 'c' once a cancel asked the run to stop
-- (cancel.lua; renew tells the worker) ('-': none of these).
-- hmget_many() reads the entries of many ids with one HMGET per 4000; parse_claim()
-- splits one (nil for none or a damaged one).
local function hmget_many(key, ids)
  local out = {}
  for s = 1, #ids, 4000 do
    local part = redis.call('HMGET', key, unpack(ids, s, math.min(s + 3999, #ids)))
    for j = 1, #part do out[#out + 1] = part[j] end
  end
  return out
end
local function parse_claim(raw)
  if type(raw) ~= 'string' then return nil end
  local tok, attempt, started, flags = string.match(raw, '^(%S+) (%d+) (%d+) (%S+)$')
  if not tok then return nil end
  -- attempt_s: the attempt as written, for text built from it (formatting a number costs
  -- more than the rest of a settle), unless it has leading zeros (damage: "007" would be
  -- no JSON number in a done job's view). No flags ('-', most claims): every flag field nil.
  local n = tonumber(attempt)
  local c = {token = tok, attempt = n, attempt_s = string.byte(attempt) == 48 and tostring(n) or attempt,
    started = started, flags = flags}
  if flags ~= '-' then
    c.idem = string.find(flags, 'i', 1, true) ~= nil
    c.res = string.find(flags, 'r', 1, true) ~= nil
    c.prefetched = string.find(flags, 'p', 1, true) ~= nil
    c.exiting = string.find(flags, 'x', 1, true) ~= nil
    c.state = string.find(flags, 's', 1, true) ~= nil
    c.waited = string.find(flags, 'w', 1, true) ~= nil
    c.cancel = string.find(flags, 'c', 1, true) ~= nil
  end
  return c
end

-- The claim entries of a batch whose ids stand in ARGV from index `first`, one every
-- `stride` arguments (one HMGET for the whole batch).
local function batch_claims(claims_key, first, stride, n)
  local ids = {}
  for i = 0, n - 1 do ids[#ids + 1] = ARGV[first + i * stride] end
  return hmget_many(claims_key, ids)
end

-- Settled jobs give up their claims and leases: one HDEL and one ZREM for the batch.
local function unclaim(claims_key, leases_key, ids)
  call_many('HDEL', claims_key, ids, 1)
  call_many('ZREM', leases_key, ids, 1)
end

-- The fence: the job must hold a claim under this very token (no claim hands out an
-- empty one). Returns the parsed claim, or nil when the token does not own the job.
local function fence(raw, token)
  local c = parse_claim(raw)
  if not c or token == '' or c.token ~= token then return nil end
  return c
end

-- A claim entry as written: "<token> <attempt> <started_ms> <flags>", the flags made by
-- claim_flags (in its order, '-' for none); flags_of(c) gives those of a parsed claim.
-- The flags go positionally, not in a table: a claim writes an entry for every job.
local function claim_flags(idem, res, prefetched, exiting, state, waited, cancel)
  local flags = (idem and 'i' or '') .. (res and 'r' or '') .. (prefetched and 'p' or '') ..
    (exiting and 'x' or '') .. (state and 's' or '') .. (waited and 'w' or '') .. (cancel and 'c' or '')
  return flags == '' and '-' or flags
end
local function flags_of(c)
  return claim_flags(c.idem, c.res, c.prefetched, c.exiting, c.state, c.waited, c.cancel)
end
local function claim_entry(token, attempt, started, flags)
  return token .. ' ' .. attempt .. ' ' .. started .. ' ' .. flags
end

-- The namespaced key of an idempotency key: one function's keys never meet another's.
local function idem_key(idem_prefix, typ, key)
  return idem_prefix .. typ .. ':' .. key
end

-- Let go of an idempotency key if it still names this job (a job that died or was
-- deleted: the key is free for a new request). Never touches another job's key.
local function free_idem(idem_prefix, typ, key, id)
  if not key or key == '' or not typ then return end
  local ik = idem_key(idem_prefix, typ, key)
  local held = redis.pcall('GET', ik)
  if type(held) == 'string' and string.match(held, '^(%S+)') == id then redis.call('DEL', ik) end
end

-- Records. A job is two keys under its queue's tag:
--   <job prefix><id>     STRING  "1" then, separated by \31 (US): type, version,
--                                max_attempts, created_ms, idem_key, idem_hash,
--                                resource_key, limits, meta, and the payload (JSON) last
--   <job prefix><id>:s   HASH    its state once it has one: status (absent: queued),
--                                attempt, ready_ms, started_ms, finished_ms, error,
--                                reason, history, checkpoint, deferrals, woken,
--                                lost_token, refunds, rated, ratelimits, priority (1-9,
--                                absent: 0), requeued (times requeued from dead)
--                                (absent fields: their defaults)
-- A job that waits untouched is the string alone (one key, no hash: the payload is the
-- bulk of it). A done job keeps neither: its outcome goes to the done generations.
local LEGACY = {'type', 'version', 'payload', 'max_attempts', 'created_ms', 'idem_key', 'idem_hash',
  'resource_key', 'limits', 'meta', 'status', 'attempt', 'ready_ms', 'started_ms', 'finished_ms', 'error',
  'reason', 'history', 'checkpoint', 'deferrals', 'woken', 'lost_token', 'refunds', 'token', 'duplicate_of',
  'enqueued_ms'}

-- One match for the whole record (a find and a sub per field cost 2.5 times as much, on
-- every claim): each field runs to the next separator, the payload is the rest.
local REC_PATTERN = '^1\31([^\31]*)\31([^\31]*)\31([^\31]*)\31([^\31]*)\31([^\31]*)\31([^\31]*)\31([^\31]*)\31' ..
  '([^\31]*)\31([^\31]*)\31(.*)$'
-- tostring(now), formatted once per call however many jobs a script writes with it.
local fmt_now_n, fmt_now_s
local function now_text(now)
  if now ~= fmt_now_n then fmt_now_n, fmt_now_s = now, tostring(now) end
  return fmt_now_s
end

local function rec_parse(s)
  if type(s) ~= 'string' then return nil end
  local a, b, c, d, e, f, g, h, i, p = string.match(s, REC_PATTERN)
  if not a then return nil end
  return {type = a, version = b, max_attempts = c, created_ms = d, idem_key = e, idem_hash = f, resource_key = g,
    limits = h, meta = i, payload = p}
end

local function rec_encode(t)
  -- One concatenation (one string built), the fields in the order drawn above.
  return '1\31' .. (t.type or '') .. '\31' .. (t.version or '') .. '\31' .. (t.max_attempts or '') .. '\31' ..
    (t.created_ms or '') .. '\31' .. (t.idem_key or '') .. '\31' .. (t.idem_hash or '') .. '\31' ..
    (t.resource_key or '') .. '\31' .. (t.limits or '') .. '\31' .. (t.meta or '') .. '\31' .. (t.payload or '')
end

-- Read a job's record: (record, nil), or (nil, why) for a missing or malformed one. A
-- record of the release before this one (a hash holding record and state) is converted
-- in place first, so jobs queued before an upgrade run. A key of another type is renamed
-- aside to <key>:corrupt.
local function rec_load(jk)
  local s = redis.pcall('GET', jk)
  if type(s) == 'table' and s.err then
    local kind = redis.call('TYPE', jk)['ok']
    if kind ~= 'hash' then
      redis.call('RENAME', jk, jk .. ':corrupt')
      return nil, 'malformed record: a Redis ' .. kind .. ' instead of a string; kept at ' .. jk .. ':corrupt'
    end
    local v = redis.call('HMGET', jk, unpack(LEGACY))
    local f = {}
    for i, name in ipairs(LEGACY) do f[name] = v[i] end
    local missing = {}
    for _, name in ipairs({'type', 'version', 'payload', 'status'}) do
      if not f[name] then missing[#missing + 1] = name end
    end
    if #missing > 0 then return nil, 'malformed record: missing field(s) ' .. table.concat(missing, ', ') end
    local ttl = redis.call('PTTL', jk)
    redis.call('DEL', jk)
    redis.call('SET', jk, rec_encode({type = f.type, version = f.version, max_attempts = f.max_attempts or '1',
      created_ms = f.created_ms or '0', idem_key = f.idem_key, idem_hash = f.idem_hash,
      resource_key = f.resource_key, limits = f.limits or (f.resource_key and f.resource_key ~= '' and
      '1 r:' .. f.resource_key) or '', meta = f.meta, payload = f.payload}))
    local set = {}
    for i = 11, #LEGACY do
      local name = LEGACY[i]
      -- (A legacy claim's token stays in the state: reclaim reads it for the late ack.)
      if f[name] and not (name == 'status' and f[name] == 'queued') then
        set[#set + 1] = name
        set[#set + 1] = f[name]
      end
    end
    if #set > 0 then redis.call('HSET', jk .. ':s', unpack(set)) end
    if ttl > 0 then
      redis.call('PEXPIRE', jk, ttl)
      if #set > 0 then redis.call('PEXPIRE', jk .. ':s', ttl) end
    end
    s = redis.call('GET', jk)
  end
  if not s then return nil, 'malformed record: no job record for this id' end
  local rec = rec_parse(s)
  if not rec then return nil, 'malformed record: not a record of this runner (' .. string.format('%q', string.sub(s, 1, 40)) .. ')' end
  return rec, nil
end

-- Both keys of a dead job expire an hour after the dead retention: the scheduler's trim
-- deletes them at the retention (and uncounts them in the census); the expiry only
-- bounds their life should no scheduler run.
local function rec_expire(jk, ms)
  if ms > 0 then
    redis.call('PEXPIRE', jk, ms + 3600000)
    redis.call('PEXPIRE', jk .. ':s', ms + 3600000)
  end
end

-- The census: jobs not done, per "<type>|<version>", for the deploy gate (one HGETALL,
-- whatever the depth). Counted at enqueue, uncounted when a job is done or deleted.
local function census(key, field, n)
  if not field or field == '|' then return end
  local v = redis.pcall('HINCRBY', key, field, n)
  if type(v) == 'number' and v <= 0 then redis.call('HDEL', key, field) end
end

-- Done jobs: their outcomes live in generations of hashes, <done prefix><gen>, id ->
-- "<type> <version> <attempt> <started_ms> +<run ms>[\n<history (retried jobs)>\n<result>[\n<meta>]]",
-- with <done prefix><gen>:log listing the ids newest first. The meta hash holds the
-- current generation, when it began and how many it holds; a new one begins once it holds
-- a quarter of the count bound or is a quarter of the retention old, and the fifth
-- oldest goes at once (UNLINK: freed in the background). So a done job is kept between
-- three quarters and all of both bounds, and a lookup reads at most four hashes.
local DONE_GENS = 4
local function done_gen(meta_key, done_prefix, now, keep_ms, keep_n)
  local m = redis.call('HMGET', meta_key, 'gen', 'since', 'n')
  local gen, since, n = tonumber(m[1]) or 0, tonumber(m[2]) or now, tonumber(m[3]) or 0
  if not m[1] then
    redis.call('HSET', meta_key, 'gen', 0, 'since', now, 'n', 0)
  elseif n >= math.max(1, math.ceil(keep_n / DONE_GENS)) or now - since >= keep_ms / DONE_GENS then
    gen = gen + 1
    redis.call('HSET', meta_key, 'gen', gen, 'since', now, 'n', 0)
    local old = done_prefix .. (gen - DONE_GENS)
    redis.call('UNLINK', old, old .. ':log')
  end
  return gen
end

local function done_put(meta_key, done_prefix, gen, ids, values)
  if #ids == 0 then return end
  local pairs_ = {}
  for i, id in ipairs(ids) do
    pairs_[#pairs_ + 1] = id
    pairs_[#pairs_ + 1] = values[i]
  end
  call_many('HSET', done_prefix .. gen, pairs_, 2)
  call_many('LPUSH', done_prefix .. gen .. ':log', ids, 1)
  redis.call('HINCRBY', meta_key, 'n', #ids)
end

-- Whether an id has a done outcome in any generation kept.
local function done_has(meta_key, done_prefix, id)
  local gen = tonumber(redis.call('HGET', meta_key, 'gen')) or 0
  for g = gen, gen - DONE_GENS + 1, -1 do
    -- pcall: a damaged generation reads as holding no outcome (the id is buried, not lost).
    if redis.pcall('HEXISTS', done_prefix .. g, id) == 1 then return true end
  end
  return false
end

-- Writing a new job, shared by enqueue, the follow-ups an ack writes and the relay. Q
-- holds the queue's keys: ready, scheduled, stats, job (prefix), idem (prefix), claims;
-- put gathers what a batch writes once (ready ids, enqueued and census counts), and
-- jobs_flush() writes it. j holds the enqueue fields (see enqueue.lua). Returns code, id,
-- status: 1 created, 0 duplicate of the key's job, -1 conflict with it.
local function jobs_acc()
  return {ready = {}, counts = {}, versions = {}}
end

local function job_put(Q, now, j, put)
  local due = 0
  if j.run_at > 0 then due = j.run_at elseif j.delay > 0 then due = now + j.delay end
  if j.ikey ~= '' then
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
        if hhash == j.phash then redis.pcall('HINCRBY', Q.stats, 'deduplicated|' .. j.type, 1) end
        return hhash == j.phash and 0 or -1, hid, st
      end
      -- Else the key names a job that no longer exists: it is stale, and taken over.
    end
    redis.call('SET', ik, j.id .. ' ' .. j.phash)
  end
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
  if due > now then
    status = 'scheduled'
    redis.call('HSET', jk .. ':s', 'status', status, 'ready_ms', due)
    redis.call('ZADD', Q.scheduled, due, j.id)
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
local function job_fields(t, b)
  return {id = t[b], type = t[b + 1], version = t[b + 2], payload = t[b + 3], max_attempts = t[b + 4],
    run_at = tonumber(t[b + 5]) or 0, delay = tonumber(t[b + 6]) or 0, ikey = t[b + 7], phash = t[b + 8],
    rkey = t[b + 9], limits = t[b + 10], meta = t[b + 11]}
end

-- A follow-up is written once by its id (parent id and index, see scripts.py): one whose
-- record exists (queued, running, dead) or whose outcome is kept is not written again.
local function job_known(Q, id)
  return redis.call('EXISTS', Q.job .. id) == 1 or done_has(Q.done_meta, Q.done, id)
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
    redis.pcall('HINCRBY', Q.stats, 'enqueued|' .. typ, c)
  end
  for field, c in pairs(put.versions) do census(census_key, field, c) end
end

-- A count kept in a state hash (requeued), as readers take it: a whole number from 0, and
-- anything else (damaged, negative, a fraction) 0. records.py's view reads it alike.
local function whole_count(v)
  local n = tonumber(v or '')
  if not n or n < 0 or n ~= math.floor(n) then return 0 end
  return n
end

-- The follow-ups of a batch of settled jobs (ack: ctx.enqueue and ON_SUCCESS; bury:
-- ON_FAILURE), ARGV from fb: m, then 15 fields each (the settled job's place in the
-- batch, its queue or '' for this one, the 12 job fields, its priority). Written only for jobs whose
-- settle landed (out[place] > 0), each once by its id; another queue's go to the outbox.
-- suffix (optional: place -> string) is appended to the ids of that place's follow-ups.
local function write_followups(Q, now, out, fb, m, outbox_key, notify_key, census_key, suffix)
  local put = jobs_acc()
  for i = 0, m - 1 do
    local b = fb + 1 + i * 15
    local place = tonumber(ARGV[b])
    if (out[place] or -1) > 0 then
      local tail = suffix and suffix[place]
      if ARGV[b + 1] == '' then
        local j = job_fields(ARGV, b + 2)
        j.priority = tonumber(ARGV[b + 14]) or 0
        if tail then j.id = j.id .. tail end
        if not job_known(Q, j.id) and job_put(Q, now, j, put) == -1 then
          -- Its key was taken by another payload after ctx.enqueue checked it: not written.
          redis.pcall('HINCRBY', Q.stats, 'followups_refused|' .. j.type, 1)
        end
      else
        local e = {unpack(ARGV, b + 1, b + 14)}
        if tail then e[2] = e[2] .. tail end
        redis.call('RPUSH', outbox_key, cjson.encode(e))
      end
    end
  end
  jobs_flush(Q, put, notify_key, census_key)
end

-- Groups (fan-out/fan-in, group.lua): a group's members are jobs of one queue, each with
-- its group id and 1-based index in its record's meta ("group", "member"). The group:
--   <group prefix><gid>     HASH  total, left (members not finished), done, dead, cancelled,
--                                 bytes (of the outcomes so far), sealed ('1' once every
--                                 member is written), then (the then-job: JSON list of its
--                                 queue, '' this one, its 12 enqueue fields and priority, the payload
--                                 without the group field), inline (the most outcome bytes
--                                 put in its payload), keep (ms kept once complete),
--                                 created_ms, completed_ms
--   <group prefix><gid>:o   HASH  member index -> its outcome, {"id","status",...} JSON
-- A member counts once: its outcome is set with HSETNX, and only the settle that set it
-- counts down, so a re-delivered ack, a late success after a burial or a requeued dead
-- member changes nothing. The settle that brings a sealed group to 0 writes its then-job.
-- G holds the keys: group (prefix), Q (as job_put takes them), notify, census, outbox.

-- A member's group id and index from its record's meta (nil for no group's member).
local function group_of(meta)
  if type(meta) ~= 'string' or not string.find(meta, '"member"', 1, true) then return nil end
  local ok, m = pcall(cjson.decode, meta)
  if not ok or type(m) ~= 'table' or type(m.group) ~= 'string' or not tonumber(m.member) then return nil end
  return m.group, string.format('%d', m.member)
end

-- Write a complete group's then-job: its payload is the caller's with "group" first,
-- {"id","total","done","dead","cancelled","outcomes"}; the outcomes are a list in member
-- order while they fit the group's inline bound, else null (the handler reads them from
-- the outcomes hash: ctx.group_outcomes). Once: completed_ms marks it done.
local function group_fire(G, now, gid)
  local gk = G.group .. gid
  local g = redis.call('HMGET', gk, 'then', 'total', 'done', 'dead', 'cancelled', 'bytes', 'inline', 'keep',
    'completed_ms')
  if g[9] or not g[1] then return end
  redis.call('HSET', gk, 'completed_ms', now)
  local t = cjson.decode(g[1])
  local total = tonumber(g[2]) or 0
  local outcomes = 'null'
  if (tonumber(g[6]) or 0) <= (tonumber(g[7]) or 0) then
    local parts = {}
    for s = 1, total, 1000 do
      local fields = {}
      for i = s, math.min(s + 999, total) do fields[#fields + 1] = i end
      for _, v in ipairs(redis.call('HMGET', gk .. ':o', unpack(fields))) do parts[#parts + 1] = v or 'null' end
    end
    outcomes = '[' .. table.concat(parts, ',') .. ']'
  end
  local head = string.format('{"group":{"id":%s,"total":%d,"done":%d,"dead":%d,"cancelled":%d,"outcomes":%s}',
    cjson.encode(gid), total, tonumber(g[3]) or 0, tonumber(g[4]) or 0, tonumber(g[5]) or 0, outcomes)
  -- The caller's payload is a JSON object (checked at creation): "group" goes in front.
  t[5] = t[5] == '{}' and head .. '}' or head .. ',' .. string.sub(t[5], 2)
  if t[1] == '' then
    local j = job_fields(t, 2)
    j.priority = tonumber(t[14]) or 0  -- absent from an entry of the release before
    if not job_known(G.Q, j.id) then
      local put = jobs_acc()
      job_put(G.Q, now, j, put)
      jobs_flush(G.Q, put, G.notify, G.census)
    end
  else
    redis.call('RPUSH', G.outbox, cjson.encode(t))
  end
  local keep = tonumber(g[8]) or 0
  if keep > 0 then
    redis.call('PEXPIRE', gk, keep)
    redis.call('PEXPIRE', gk .. ':o', keep)
  end
  tally('groups_completed')
end

-- One member finished (status done, dead or cancelled; its outcome JSON): counted once,
-- and the group's then-job written when it was the last. A group that is gone (expired)
-- or damaged counts nothing.
local function group_settle(G, now, gid, idx, status, outcome)
  local gk = G.group .. gid
  if redis.call('TYPE', gk)['ok'] ~= 'hash' then return end
  local set = redis.pcall('HSETNX', gk .. ':o', idx, outcome)
  if set ~= 1 then return end
  redis.call('HINCRBY', gk, status, 1)
  redis.call('HINCRBY', gk, 'bytes', #outcome)
  local left = redis.call('HINCRBY', gk, 'left', -1)
  if redis.call('HGET', gk, 'sealed') == '1' then
    if left <= 0 then group_fire(G, now, gid) end
  else
    -- Not sealed yet (being written, or its sender failed): its outcomes expire with it.
    local ttl = redis.call('PTTL', gk)
    if ttl > 0 then redis.call('PEXPIRE', gk .. ':o', ttl) end
  end
end

-- A member that a cancel ended before it ran (cancel.lua, and the claim or release that
-- completes a cancel): counted as cancelled; a job of no group, nothing.
local function group_cancelled(G, now, id, rec)
  local gid, idx = group_of(rec.meta)
  if gid then
    group_settle(G, now, gid, idx, 'cancelled', '{"id":' .. cjson.encode(id) ..
      ',"status":"cancelled","reason":"cancelled","error":{"type":"Cancelled","message":"cancelled"}}')
  end
end

-- The members a worker settled in this batch, from ARGV at gb: g, then 5 fields each (its
-- place in the batch, group id, index, status, outcome JSON); counted only for a member
-- whose settle landed (out[place] > 0).
local function group_members(G, now, out, gb)
  local g = tonumber(ARGV[gb]) or 0
  for i = 0, g - 1 do
    local b = gb + 1 + i * 5
    if (out[tonumber(ARGV[b])] or -1) > 0 then
      group_settle(G, now, ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4])
    end
  end
end

-- Waiting for a job's end: a caller that waits (call and wait, GET ?wait) marks the job
-- with "waited":1 in its record's meta (at enqueue, or later by watch.lua), claim copies
-- that into the claim's 'w' flag, and the script that ends the job publishes its id on
-- the queue's ended channel. A job nobody waits for costs no command at all.
local function waited(meta)
  return type(meta) == 'string' and string.find(meta, '"waited":1', 1, true) ~= nil
end

-- Publish the ids of jobs that ended in this call, one message for the batch.
local function announce(channel, ids)
  if #ids > 0 then redis.call('PUBLISH', channel, table.concat(ids, ' ')) end
end

-- A job that never ran (or whose run stopped) ends cancelled: a terminal status in its
-- state, kept with its record for the retention given, indexed in the cancelled set,
-- its idempotency key freed and the census told. Its claim, lease and queue entries
-- are the caller's to remove.
local function end_cancelled(jk, id, rec, now, ttl, idem_prefix, census_key, cancelled_key, ended)
  local sk = jk .. ':s'
  redis.call('HSET', sk, 'status', 'cancelled', 'reason', 'cancelled', 'finished_ms', now)
  redis.call('HDEL', sk, 'cancel_requested')
  redis.call('ZADD', cancelled_key, now, id)
  rec_expire(jk, ttl)
  free_idem(idem_prefix, rec.type, rec.idem_key, id)
  census(census_key, rec.type .. '|' .. rec.version, -1)
  if waited(rec.meta) then announce(ended, {id}) end
end
