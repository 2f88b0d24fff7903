-- claim: move up to n ready jobs to in-flight, each with a lease deadline and a fresh
-- claim token. On the way it settles what must never reach a handler: a missing or
-- malformed record goes to the dead-letter set, a job whose idempotency key already
-- completed (another job, the same payload) is done as a duplicate, and a job under a
-- full limit (resource or concurrency key) is parked on that limit's waiter list without
-- spending an attempt, to be woken by the release that frees a slot.
--
-- The first k jobs claimed go to executors that are free now: their attempt is spent at
-- once, unless their function runs in a child process (ARGV[11]): then it is spent when
-- the child says the handler started, as for a prefetched job. The rest are claimed
-- ahead (prefetched): their claims carry 'p' and spend nothing until the worker marks
-- them started (start.lua); one lost unstarted before is also held ('h', below), and
-- its mark lands before its handler runs. A job under limits is never
-- prefetched: reaching one past the first k puts it back at the consumer end of ready
-- and ends the call, so no prefetched job holds a slot it cannot use yet. The first k
-- count executors, not jobs: a BATCH function without a key (ARGV[12], "<type>=<size>")
-- runs up to size of its jobs in one executor's call, so the jobs of such a function
-- claimed after one that took a free executor ride in that executor's batch, up to its
-- size, and take no executor of their own (each still takes its own limit slot). A
-- batch with a key cannot be told here (its key is rendered from the upgraded payload):
-- each of its jobs takes an executor.
--
-- Ids are popped from ready in rounds (RPOP with a count of what is still wanted), and
-- every id popped is settled in this same call: claimed, buried, parked, marked a
-- duplicate, put back, or dropped as a stray. At most n * 4 ids are popped per call, and
-- up to 256 more parked on a key already found full in the call.
--
-- A call sends at most CLAIM_BYTES of records (ARGV[13]; payloads, metas, checkpoints): the
-- job that would take it past goes back, with the rest, in order and untouched, and the
-- call says 2 (below) so the worker claims again at once. The first job claimed is sent
-- whatever its size (a record is bounded at enqueue). Sending a record costs Redis about
-- 9 ms per MiB, every other client waiting meanwhile: 800 jobs of 1 MiB in one call held
-- Redis 7.6 s (BUSY to everyone else past 5 s) and sent the worker 800 MiB at once.
--
-- A claim costs two reads per job (the record string and its state hash, when it has
-- one) and no write to them: the claims (token, attempt, start, flags) go in one variadic
-- HSET on the claims hash and the leases in one variadic ZADD. An id that already holds a
-- claim, has no record because it is done, or comes twice in one call is a stray and is
-- dropped, so no job runs twice.
--
-- KEYS[1] ready        LIST
-- KEYS[2] leases       ZSET  id -> lease deadline ms (and K.leases .. ":since": id -> claim ms)
-- KEYS[3] scheduled    ZSET  id -> due ms
-- KEYS[4] dead         ZSET  id -> time of death ms
-- KEYS[5] stats        HASH
-- KEYS[6] job_prefix   (string; see the records in includes/records.lua)
-- KEYS[7] lim_prefix   (string; see parse_limits in includes/limits.lua)
-- KEYS[8] idem_prefix  (string)
-- KEYS[9] claims       HASH  id -> "<token> <attempt> <started_ms> <flags>"
-- KEYS[10] done_meta   HASH  the current done generation (see done_gen in includes/done.lua)
-- KEYS[11] limwait     ZSET  limit keys with parked jobs -> next sweep ms
-- KEYS[12] notify      LIST  (a job woken by a freed reserved slot; emptied by a call that
--                            emptied the queue: see the end)
-- KEYS[13] done_prefix (string; a generation's hash is prefix .. gen)
-- KEYS[14] census      HASH  jobs not done per "<type>|<version>"
-- KEYS[15] paused      HASH  "queue" | "fn:<type>" -> paused since ms (a paused queue
--                            claims nothing; a paused function's jobs are held)
-- KEYS[16] held_prefix (string; a paused function's held ids: LIST prefix .. type)
-- KEYS[17] prio        ZSET  ready ids of priority 1-9 (see enqueue.lua): popped before
--                            ready, strictly (no aging)
-- KEYS[18] ended       channel  ids of waited jobs that ended (see waited in includes/ended.lua)
-- KEYS[19] cancelled   ZSET  cancelled ids -> time ms (a job cancelled while it ran, back)
-- KEYS[20] group_prefix (string; such a job of a group counts down: group_settle in includes/groups.lua)
-- KEYS[21] outbox      LIST  (its group's then-job, when that runs on another queue)
-- KEYS[22] delayed     ZSET  the ids of scheduled that are scheduled or retrying -> due (ms): the
--                            scheduled list's own index (see keys.py)
-- ARGV[1] now, ms ('' for the server's clock)
-- ARGV[2] n, the most jobs to claim
-- ARGV[3] k, how many of them start at once (free executors); the rest are prefetched
-- ARGV[4] lease, ms
-- ARGV[5] token base (unique per call; the token is base .. ':' .. index)
-- ARGV[6] dead retention, ms
-- ARGV[7] done retention, ms
-- ARGV[8] done count bound (the most done jobs kept)
-- ARGV[9] MAX_AGE of this queue's functions that have one, "<type>=<ms> ..." ('' none)
-- ARGV[10] priority floor, 0-9 ('' or 0: none): a floor f > 0 claims only jobs of
--          priority f or more (another partition of the queue holds one of f, which must
--          start first: see the fetcher), none from ready
-- ARGV[11] the types whose jobs, among the first k, start at once but spend their
--          attempt later, as prefetched jobs do ('p', start.lua), when their executor
--          says the handler started, "<type> <type> ..." ('' none): the functions that run
--          in child processes, whose child reports the start (a worker killed before then
--          charges nothing, see reclaim.lua); a job of any other type spends it here. Such
--          a job claimed ahead is also held ('h', see hold.lua) until its worker hands it
--          to a child: lost before then, it goes back unspent however often
-- ARGV[12] the types whose jobs are held ('h') from their claim, among the first k too,
--          spending their attempt only at their start mark, "<type> ..." ('' none): BATCH
--          functions, whose jobs wait for their batch to fill (seconds) before any
--          handler has them, so a worker lost in that wait, however often, charges none.
--          "<type>=<size>": a BATCH function without a key, whose jobs share an executor
--          up to size (see above)
-- ARGV[13] the most bytes of records one call sends, CLAIM_BYTES (see above)
--
-- A job under a rate limit (RATE_LIMIT) takes a token to start; with none due now it is
-- scheduled for when its (reserved) token is due, spending no attempt.
--
-- MAX_AGE: a job whose attempt would start more than its function's MAX_AGE after its
-- enqueue (created_ms, the server's clock) is claimed as expired (started = 2, no limit
-- taken): its worker buries it at once, reason "expired", without running it, so it dies
-- as any other job (ON_FAILURE, the dead-letter set) and spends no attempt.
--
-- A job of a paused function is held: it moves to the function's held list, oldest first,
-- with status 'deferred' and no attempt spent, until resume.lua puts it back.
--
-- Returns a flat list: the server time of the claim (ms); 1 when the call stopped at a job
-- under limits that no free executor could start (the worker then waits for a free
-- executor, not for new jobs), 2 when it stopped at its bound of popped ids short of n
-- claims (parked jobs, strays: ready may hold more, so the worker claims again at once
-- rather than wait for a wake-up; or at its bound of bytes sent, CLAIM_BYTES; or at a key
-- of the queue found damaged after it claimed jobs, which keep their claims: the next call
-- refuses), 0 otherwise; then 15 values per
-- claimed job:
--   id, token, attempt, type, version, payload, max_attempts, idem_key,
--   resource_key, ready_ms, created_ms, checkpoint, started (1 at once, its attempt spent;
--   0 prefetched, or at once with its attempt spent at its start mark (ARGV[11]); 2
--   expired: bury it; 3 prefetched (or a BATCH function's, ARGV[12]) and held, 'h', until
--   its worker marks it started (start.lua) or hands it to its child (hold.lua): a
--   child's job, or one lost unstarted before; 4 as 0 and 5 as 3, for a durable job
--   resumed after a sleep or a wait, whose MAX_AGE is behind it; 6 a child's job lost
--   unstarted before, held until its child asks for its start before its handler runs
--   (never handed to a child unheld), 7 as 6 for a durable job resumed), meta, steps (the entries of its durable step log:
--   0 for a job without one, whose run then makes no round trip to read it; its handler
--   replays that many durable calls, and keeps its log quiet until past them)
--- @include "clock"
--- @include "calls"
--- @include "limits"
--- @include "parking"
--- @include "stats"
--- @include "claims"
--- @include "idem"
--- @include "records"
--- @include "record_keys"
--- @include "done"
--- @include "groups"
--- @include "ended"
local now = clock(ARGV[1])
local n = tonumber(ARGV[2])
local k_start = tonumber(ARGV[3])
local lease = tonumber(ARGV[4])
local base = ARGV[5]
local dead_ttl, done_ttl, done_max = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local floor = tonumber(ARGV[10]) or 0
local later = {}
for typ in string.gmatch(ARGV[11] or '', '%S+') do later[typ] = true end
local gathered = {}
local shares = {}  -- type -> how many of its jobs one executor's batch takes (keyless BATCH)
for entry in string.gmatch(ARGV[12] or '', '%S+') do
  local typ, size = string.match(entry, '^(.+)=(%d+)$')
  if typ then
    gathered[typ] = true
    shares[typ] = tonumber(size)
  else
    gathered[entry] = true
  end
end
local out = {now, 0}
local KNOWN = {queued = true, scheduled = true, processing = true, retrying = true,
  done = true, dead = true, deferred = true, cancelled = true}
local STATE = {'status', 'attempt', 'ready_ms', 'checkpoint', 'deferrals', 'woken', 'lost_token', 'rated',
  'cancel_requested', 'priority', 'suspended', 'debounce', 'steps', 'refunds'}
local NO_STATE = {}  -- what HMGET of STATE reads of a job without a state hash
local NONE = {}  -- the limits of a job under none
-- A token's index as text: its digits as characters up to 99, no number formatted
-- (sprintf's %.14g cost about 1,500 server instructions a job), and no table built per call.
local function index_text(q)
  if q < 10 then return string.char(48 + q) end
  if q < 100 then
    local units = q % 10
    return string.char(48 + (q - units) / 10, 48 + units)
  end
  return q
end
-- Ids popped from the priority set in this call, with their scores (see put_back below).
local from_prio = {}
-- Numbers are formatted on every use (a concat, an argument of redis.call): the ones every
-- claim of this call writes are formatted once. now_s as a concatenation formats it; the
-- deadline exactly, as redis.call sends a number (an integer's digits, else 17 digits).
local now_s, deadline = now_text(now), now + lease
if deadline == math.floor(deadline) and math.abs(deadline) < 2 ^ 53 then
  deadline = string.format('%d', deadline)
end
local MAX_ATTEMPT = 1000000000  -- config.MAX_COUNT: the most max_attempts may be
local function int_or_absent(v)
  return not v or string.match(v, '^%-?%d+$') ~= nil
end
local max_age = {}
for typ, ms in string.gmatch(ARGV[9] or '', '(%S+)=(%d+)') do max_age[typ] = tonumber(ms) end

-- Pauses, whether a job of priority waits, and whether the first jobs have state hashes:
-- the first round's ids are popped from ready first (no priority floor), and one EXISTS
-- of the pause hash, the priority set and those ids' state hashes answers all three when
-- none exists (the common case: an empty hash or set does not exist). Else one EXISTS
-- of the first two: with neither, the ids are kept and each one's state asked for on its
-- own (read_job); with either, the ids go back to the consumer end of ready, in order,
-- before anything else is written (no other client runs meanwhile), and the claim goes
-- on as if it had not popped them. Then the pauses are read, one small read, and what is
-- left of the count is the priority set. pcall: a damaged pause hash pauses nothing (it
-- still exists: counted as the pause hash).
local paused = {}
local prio_at_start = false  -- the first round's answer for the priority set (see pop)
local early = nil  -- the first round's ids, popped before the pauses were known
local stateless = {}  -- ids of early whose state hash is known not to exist
local present = nil
if floor == 0 and n > 0 then
  local got = redis.call('RPOP', K.ready, n)
  if got then
    local ks = {K.paused, K.prio}
    for j = 1, #got do ks[j + 2] = K.job_prefix .. got[j] .. ':s' end
    if redis.call('EXISTS', unpack(ks)) == 0 then
      present = 0
      for _, id in ipairs(got) do stateless[id] = true end
    else
      present = redis.call('EXISTS', K.paused, K.prio)
    end
    if present == 0 then
      early = got
    else
      local back = {}
      for j = #got, 1, -1 do back[#back + 1] = got[j] end
      redis.call('RPUSH', K.ready, unpack(back))
    end
  end
end
if not present then present = redis.call('EXISTS', K.paused, K.prio) end
if present > 0 then
  local praw = redis.pcall('HGETALL', K.paused)
  local has_pauses = type(praw) ~= 'table' or praw.err ~= nil or #praw > 0
  if type(praw) == 'table' and not praw.err then
    for j = 1, #praw, 2 do paused[praw[j]] = true end
  end
  prio_at_start = present > (has_pauses and 1 or 0)
end
if paused['queue'] then return out end
local any_paused = next(paused) ~= nil
-- (The ready list came back empty, and no job of priority waits: nothing to claim.)
if floor == 0 and n > 0 and not early and present == 0 then return out end

-- Lease entries (deadline, id, ...) and claims (id, entry, ...) of the jobs claimed so
-- far, not yet written; taken[id] marks an id claimed in this call.
local leased, claimed, taken = {}, {}, {}
local sound = {}  -- the keys found of their type in this call (see sound_keys below)
-- A lone id (the call popped one, all there was) is not looked up in the claims hash
-- before it is settled: a plain job's claim is written with HSETNX, whose 0 says the id
-- holds a claim already (a stray, never run twice), and a job whose settle writes
-- anything asks first (lone_is_stray). At light load that is an HMGET less per claim.
local unchecked = nil
-- Write them; false and the damaged key's name, with nothing written, when the leases
-- or the claims turn out damaged (a leases key of any other type fails this write).
-- Until the leases are known sound, every job claimed so far is plain (a job whose
-- gates write checks them first, see take()), so a failed first write has changed
-- nothing of theirs: the caller puts them back and refuses. (A batch past one chunk
-- checks them with a ZSCORE first.)
local function write_leases()
  if #leased == 0 then return true end
  local lone = unchecked ~= nil and claimed[1] == unchecked
  if lone then
    unchecked = nil
    local set = redis.pcall('HSETNX', K.claims, claimed[1], claimed[2])
    if type(set) == 'table' then return false, 'claims' end
    if set == 0 then
      -- A stray: the claim it holds, its lease and claim time stay as they are.
      tally('stray')
      for q = #out, #out - 14, -1 do out[q] = nil end
      leased, claimed = {}, {}
      return true
    end
  end
  local written = false
  if not sound.leases then
    if #leased <= 4000 then
      if type(redis.pcall('ZADD', K.leases, unpack(leased))) == 'table' then
        if lone then redis.call('HDEL', K.claims, claimed[1]) end
        return false, 'leases'
      end
      written = true
    elseif type(redis.pcall('ZSCORE', K.leases, '')) == 'table' then
      return false, 'leases'
    end
    sound.leases = true
  end
  if not written then call_many('ZADD', K.leases, leased, 2) end
  -- Their claim time, the processing list's order (K.leases .. ':since'; see keys.py):
  -- now_s, the text of now, as the deadline is sent (a number would be formatted again
  -- for each job by redis.call).
  local since = {}
  for j = 2, #leased, 2 do
    since[j - 1] = now_s
    since[j] = leased[j]
  end
  call_many('ZADD', K.leases .. ':since', since, 2)
  if not lone then call_many('HSET', K.claims, claimed, 2) end
  leased, claimed = {}, {}
  return true
end

local function bury_raw(jk, id, reason)
  redis.call('HSET', jk .. ':s', 'status', 'dead', 'reason', reason, 'finished_ms', now)
  redis.call('ZADD', K.dead, now, id)
  rec_expire(jk, dead_ttl)
  tally('dead|?')
end

-- Limit keys found full in this call: only this call's own claims change them meanwhile
-- (and those only add holders), so the next job of the key parks without asking again.
local full_keys = {}
local cheap = 0  -- ids parked on such a key (see the bound below)
local i = 0
local stop = false  -- set by take() for a job that must go back to ready
-- Executors the jobs claimed so far take (of the k free ones first), and for a keyless
-- BATCH function the jobs that still fit in the batch of the free executor its last
-- claimed job took (none past the k: a prefetched job's batch is no free executor's).
local used = 0
local seats = {}
-- Whether a job of typ claimed now starts at once: its executor is one of the k free ones.
local function on_free_executor(typ)
  return used < k_start or (seats[typ] or 0) > 0
end
local function take_executor(typ)
  local s = seats[typ]
  if s and s > 0 then
    seats[typ] = s - 1
    return
  end
  if shares[typ] then seats[typ] = used < k_start and shares[typ] - 1 or 0 end
  used = used + 1
end
-- The most bytes of records (payloads, metas, checkpoints) one call sends (ARGV[13],
-- records.SCRIPT_BYTES, 8 MiB: about 75 ms of Redis, against 7.6 s for 800 jobs of 1 MiB
-- unbounded). A claim of 800 small jobs sends well under it (200 KiB at 256 bytes each).
local CLAIM_BYTES = tonumber(ARGV[13]) or 8 * 1024 * 1024
local sent = 0  -- bytes of the records claimed so far
local full = false  -- set by take() with stop: the next job would pass CLAIM_BYTES
-- The other keys of the queue that settling an id may write (or, the done meta, must
-- read) must be of their type, or a write would fail with ids popped and not yet
-- anywhere. Each is checked once per call, just before the first settle that needs it
-- (a plain job needs none of them), and a damaged one is named in `refused`: the id in
-- hand and the rest go back, and the claim refuses (see the loop below). (The leases,
-- which every claim writes: a job whose settle writes anything, a burial included,
-- checks them here first, and a plain job's claim finds out at its lease write: see
-- write_leases. A damaged stats hash only loses counts: see flush.)
local PROBE = {leases = 'ZSCORE', scheduled = 'ZSCORE', dead = 'ZSCORE', done_meta = 'HGET'}
local KEY_NAME = {leases = 'leases', scheduled = 'scheduled', dead = 'dead', done_meta = 'done generation'}
local refused = nil
local function sound_keys(...)
  for _, kn in ipairs({...}) do
    if not sound[kn] then
      if type(redis.pcall(PROBE[kn], K[kn], '')) == 'table' then
        refused = KEY_NAME[kn]
        return false
      end
      sound[kn] = true
    end
  end
  return true
end

-- Whether the lone id (see unchecked) holds a claim already: asked once, before the first
-- write of its settle; a damaged claims hash refuses the call (refused), as the HMGET of
-- a call of several ids does. True when it is a stray or the call refuses.
local function lone_is_stray(id)
  if unchecked ~= id then return false end
  unchecked = nil
  local c = redis.pcall('HEXISTS', K.claims, id)
  if type(c) == 'table' then
    refused = 'claims'
    return true
  end
  if c == 1 then
    tally('stray')  -- claimed already: never run it twice
    return true
  end
  return false
end
-- The gates below settle one popped id each, in claim order (take() runs them): read the
-- job, hold a paused function's job, end a cancelled one, expire one past its MAX_AGE,
-- settle a duplicate, hold one back for a rate token or park one under a full limit, and
-- claim it. A gate that settles the job ends its take().

-- Whether a job has a state hash worth reading when it settles (history, error,
-- checkpoint...): any field of STATE read.
local function has_state(f)
  for q = 1, #STATE do
    if f[q] then return true end
  end
  return false
end

-- Why a record cannot be run as it is (its reason for the dead-letter set), or nil.
local function malformed(rec, f, status)
  if rec.type == '' or rec.version == '' then
    return 'malformed record: missing field(s) ' .. (rec.type == '' and 'type' or 'version')
  elseif not ((rec.ints or (int_or_absent(rec.max_attempts) and int_or_absent(rec.created_ms))) and
      (f == NO_STATE or (int_or_absent(f[2]) and int_or_absent(f[3]) and int_or_absent(f[5])))) then
    -- Counters the scripts do arithmetic on must be integers (absent means 0): the
    -- record's two are known so when its read matched them as such (rec.ints, see
    -- REC_PATTERN_INTS in includes/records.lua), a job without a state hash has no others.
    local badint = {}
    for _, pair in ipairs({{f[2], 'attempt'}, {rec.max_attempts, 'max_attempts'}, {f[3], 'ready_ms'},
        {rec.created_ms, 'created_ms'}, {f[5], 'deferrals'}}) do
      if not int_or_absent(pair[1]) then badint[#badint + 1] = pair[2] end
    end
    return 'malformed record: not an integer: ' .. table.concat(badint, ', ')
  elseif f[2] and (tonumber(f[2]) < 0 or tonumber(f[2]) > MAX_ATTEMPT) then
    -- Digits but no attempt runner counts: below 0 the lease's fence never matched (the
    -- job ran again every lease), past 2^53 the count lost its last digit.
    return 'malformed record: attempt out of range 0..' .. MAX_ATTEMPT .. ': ' .. string.sub(f[2], 1, 24)
  elseif not KNOWN[status] then
    return 'malformed record: unknown status ' .. string.format('%q', status)
  end
  return nil
end

-- Gate 1, read the job: its record and state (rec, f, state key), or nil once the id is
-- settled here: a stray (done already, or not queued) is dropped, a missing or malformed
-- record buried.
local function read_job(id, jk)
  -- (A big record's payload is read only when the job is claimed: not for a pause's hold.)
  local rec, why = rec_peek(jk)
  if not rec then
    if lone_is_stray(id) or not sound_keys('leases', 'done_meta', 'dead') then return nil end
    if done_has(K.done_meta, K.done_prefix, id) then
      tally('stray')  -- done already (its record is gone with it): never run it twice
    else
      bury_raw(jk, id, why)
    end
    return nil
  end
  local sk = jk .. ':s'
  -- A plain job that waits untouched has no state hash (most jobs of a deep queue): one EXISTS
  -- answers for it, where HMGET of ten fields cost four times as much.
  local f = NO_STATE
  -- (Known once: a gate may write this id's state, and the same id may come twice.)
  local known = stateless[id]
  stateless[id] = nil
  if not known and redis.call('EXISTS', sk) == 1 then
    -- pcall: a state key of another type is a damaged record, buried with its reason.
    f = redis.pcall('HMGET', sk, unpack(STATE))
    if f.err then
      if lone_is_stray(id) or not sound_keys('leases', 'dead') then return nil end
      redis.call('RENAME', sk, sk .. ':corrupt')
      bury_raw(jk, id, 'malformed record: its state is not a hash; kept at ' .. sk .. ':corrupt')
      return nil
    end
  end
  local status = f[1] or 'queued'
  local bad = malformed(rec, f, status)
  if bad then
    if lone_is_stray(id) or not sound_keys('leases', 'dead') then return nil end
    bury_raw(jk, id, bad)
    return nil
  elseif status ~= 'queued' then
    -- A stray id (the record is dead or elsewhere): drop it, never run it twice.
    tally('stray')
    return nil
  end
  return rec, f, sk
end

-- Gate 2, hold a paused function's job: to its function's held list, deferred.
local function hold_paused(id, rec, sk)
  redis.call('HSET', sk, 'status', 'deferred')
  redis.call('RPUSH', K.held_prefix .. rec.type, id)
  tally('paused|' .. rec.type)  -- held back by a pause
end

-- Gate 3, end a cancelled one: a run asked to stop came back (its worker died, or it
-- failed and is retried): the cancel stands, and the job ends cancelled instead of
-- running again.
local function end_cancelled_run(id, jk, rec)
  end_cancelled(jk, id, rec, now, done_ttl, K.idem_prefix, K.census, K.cancelled, K.ended)
  if K.group_prefix then
    group_cancelled({group = K.group_prefix, notify = K.notify, census = K.census, outbox = K.outbox,
      Q = {ready = K.ready, scheduled = K.scheduled, delayed = K.delayed, stats = K.stats, job = K.job_prefix, idem = K.idem_prefix,
        claims = K.claims, prio = K.prio, done_meta = K.done_meta, done = K.done_prefix}}, now, id, rec)
  end
  tally('cancelled|' .. rec.type)
end

-- Claim a job past its MAX_AGE as expired: a claim like any other (so its burial is
-- fenced), taking no limit and marked started = 2 for the worker.
local function expire(id, rec, f, sk)
  if f[7] then redis.call('HDEL', sk, 'lost_token') end
  if f[12] then debounce_release(sk, id, rec.version, f[12]) end
  local token = base .. ':' .. index_text(i)
  leased[#leased + 1] = deadline
  leased[#leased + 1] = id
  claimed[#claimed + 1] = id
  claimed[#claimed + 1] = claim_entry(token, (tonumber(f[2]) or 0) + 1, now_s,
    claim_flags(rec.idem_key ~= '', false, false, false, has_state(f), waited(rec.meta), false))
  taken[id] = true
  for _, v in ipairs({id, token, (tonumber(f[2]) or 0) + 1, rec.type, rec.version,
      rec_payload(K.job_prefix .. id, rec), rec.max_attempts,
      rec.idem_key, rec.resource_key, f[3] or '', rec.created_ms, f[4] or '', 2, rec.meta or '', f[13] or 0}) do
    out[#out + 1] = v
  end
  i = i + 1
end

-- Gate 4, bury one past its MAX_AGE: claimed as expired, for its worker to bury.
local function expire_old(id, rec, f, sk)
  if f[6] == '1' and rec.limits ~= '' then
    -- Woken from a limit's waiters with a slot reserved: the slot goes to the next one
    -- at once (held until the reservation lapsed, each stale job blocked the key 10 s).
    give_up_reserved(K.lim_prefix, parse_limits(rec.limits), id, now, K.job_prefix, K.ready, K.notify, K.limwait,
      K.prio)
  end
  expire(id, rec, f, sk)
end

-- Gate 5, settle a duplicate: a completed key of another job with this very payload
-- makes this job its duplicate (two producers raced around an expiry, or one wrote the
-- record itself, or a dead job was requeued after another completed its key), done at
-- once, and its end published when a caller waits for it (as every other end is: the
-- wait ran out its timeout). pcall: a damaged key reads as no completion mark instead
-- of failing the call.
local function settled_as_duplicate(id, jk, sk, rec, f, limits)
  local typ = rec.type
  local held = redis.pcall('GET', idem_key(K.idem_prefix, typ, rec.idem_key))
  if type(held) ~= 'string' then return false end
  local hid, hhash, state = string.match(held, '^(%S+) (%S+) ?(%S*)')
  if not (state == 'done' and hid ~= id and (rec.idem_hash == '' or rec.idem_hash == hhash)) then return false end
  if not sound_keys('done_meta') then return true end
  local gen = done_gen(K.done_meta, K.done_prefix, now, done_ttl, done_max)
  local made = tonumber(rec.created_ms)
  done_put(K.done_meta, K.done_prefix, gen, {id}, {typ .. ' ' .. rec.version .. ' ' .. (f[2] or 0) .. ' 0 ' .. now ..
    ' ' .. hid .. ((made and made > 0 and made <= now) and (' =' .. (now - made)) or '') .. '\n\n'}, done_max)
  redis.call('DEL', jk, sk)
  census(K.census, typ .. '|' .. rec.version, -1)
  -- A slot reserved for it when it was woken goes to the next parked job.
  give_up_reserved(K.lim_prefix, limits, id, now, K.job_prefix, K.ready, K.notify, K.limwait, K.prio)
  tally('duplicates|' .. typ)
  if waited(rec.meta) then announce(K.ended, {id}) end
  return true
end

-- Gate 6a, a rate token: true when one is taken for this start (kept should the job
-- park below), false once the job is settled here: scheduled for when its token is due
-- (no attempt spent; 'rated' says the token is its own), or expired when that is past
-- its MAX_AGE.
local function rate_token(id, rec, f, sk, rates)
  if not sound_keys('scheduled') then return false end
  local typ = rec.type
  local due = 0
  -- (f[11]: a resumed durable function: MAX_AGE bounds its first start only, its rate
  -- token's wait too)
  local not_after = max_age[typ] and not f[11] and tonumber(rec.created_ms) + max_age[typ] or nil
  for _, r in ipairs(rates) do
    local at = take_rate(K.lim_prefix, r, now, not_after)
    if at < 0 then
      expire(id, rec, f, sk)
      return false
    end
    due = math.max(due, at)
  end
  if due > 0 then
    redis.call('HSET', sk, 'status', 'scheduled', 'ready_ms', due, 'rated', '1')
    redis.call('ZADD', K.scheduled, due, id)
    redis.pcall('ZADD', K.delayed, due, id)
    tally('ratelimited|' .. typ)
    return false
  end
  return true
end

-- Gate 6b, park one under a full limit: a slot of every limit for this claim, or the
-- job parks on the first full one's waiter list.
local function parked_on_full(id, jk, sk, f, limits, token, rated_now, typ)
  local full = nil
  if f[6] ~= '1' then
    -- (A woken job may hold a reserved slot of a key that looks full: it always asks.)
    for _, l in ipairs(limits) do
      if full_keys[l.key] then full = l break end
    end
    if full and cheap < 256 then cheap = cheap + 1 end
  end
  full = full or acquire_limits(K.lim_prefix, limits, id, token, now, lease, f[6] == '1')
  if full then
    full_keys[full.key] = true
    if rated_now then redis.call('HSET', sk, 'rated', '1') end
    park(K.lim_prefix, full, id, jk, tonumber(f[5]) or 0, f[6] == '1', now, K.limwait)
    tally('deferred|' .. typ)
    return true
  end
  if f[6] then redis.call('HDEL', sk, 'woken') end
  return false
end

local plain = 0  -- ids claimed by claim_job (no gate settled them elsewhere: see the end)
-- Gate 7, claim it: its lease and claim entry (written by write_leases), and its 15
-- values in the reply.
local function claim_job(id, rec, f, sk, token, limits, starts)
  local attempt = (tonumber(f[2]) or 0) + 1
  -- A run of an earlier claim can no longer finish as a late success: this one owns it.
  if f[7] then redis.call('HDEL', sk, 'lost_token') end
  if f[8] then redis.call('HDEL', sk, 'rated') end  -- a later attempt takes a token of its own
  -- A DEBOUNCE job no longer waits for its debounce: the next enqueue starts a new burst.
  if f[12] then debounce_release(sk, id, rec.version, f[12]) end
  -- A state hash (history, error, checkpoint): settling reads it.
  local stateful = f ~= NO_STATE and has_state(f)
  local n_l = #leased
  leased[n_l + 1] = deadline
  leased[n_l + 2] = id
  local n_c = #claimed
  claimed[n_c + 1] = id
  local spent = starts and not later[rec.type] and not gathered[rec.type]
  -- A child's job claimed ahead is held ('h') from its claim: it waits in its worker until
  -- a child is free and ready, and its worker ends the hold just before the child gets it
  -- (hold.lua), so a worker lost in the wait, however often, charges it nothing. So is a
  -- thread job claimed ahead that was lost unstarted before (refunds, f[14]: its once is
  -- used): its worker's start mark (start.lua) lands before its handler runs, so a loss
  -- in the wait charges nothing however often, and one after counts. (A first claim
  -- ahead is not held: its start mark goes with the settler's next batch, often with its
  -- ack, for nothing; a loss before it lands is given back once.) So is a BATCH
  -- function's job (ARGV[12]), until its batch's call.
  -- A child's job lost unstarted before (its once used, as above) is held however it is
  -- claimed, and stays held in its child until the child asks for its start, which lands
  -- (start.lua) before its handler runs (started 6): a loss before charges nothing however
  -- often, also while it waits in the child's queue behind a job that kills the worker,
  -- and one after counts (a handler that kills its worker cannot loop for ever).
  local once_used = (tonumber(f[14]) or 0) >= 1
  local confirm = later[rec.type] == true and once_used and not gathered[rec.type]
  local held = (not starts and (later[rec.type] == true or once_used)) or gathered[rec.type] == true or confirm
  claimed[n_c + 2] = claim_entry(token, attempt == 1 and '1' or attempt, now_s,
    claim_flags(rec.idem_key ~= '', #limits > 0, not spent, false, stateful, waited(rec.meta), false, held))
  taken[id] = true
  take_executor(rec.type)
  plain = plain + 1
  local o = #out
  out[o + 1] = id
  out[o + 2] = token
  out[o + 3] = attempt
  out[o + 4] = rec.type
  out[o + 5] = rec.version
  out[o + 6] = rec.payload or rec_payload(K.job_prefix .. id, rec)  -- (read whole already, most records)
  out[o + 7] = rec.max_attempts
  out[o + 8] = rec.idem_key
  out[o + 9] = rec.resource_key
  out[o + 10] = f[3] or ''
  out[o + 11] = rec.created_ms
  out[o + 12] = f[4] or ''
  -- (4: a durable job resumed after a sleep or a wait, not started here: its worker must
  -- not judge its MAX_AGE again at the start, which bounds the first start only; 5: both
  -- that and held)
  out[o + 13] = spent and 1 or (confirm and (f[11] and 7 or 6)) or (held and (f[11] and 5 or 3)) or (f[11] and 4 or 0)
  out[o + 14] = rec.meta or ''
  out[o + 15] = f[13] or 0
  i = i + 1
end

-- Settle one popped id: the gates in order, each condition here and its work in its
-- own function (a plain job calls three: a call per gate added 2.5% to the server
-- instructions per job of enqueue, claim, start and ack). A job under limits past the
-- free executors stops the call (stop): it goes back where the next claim takes it
-- first.
-- What a job's claim sends: its payload and meta (the rest of its record is a few short
-- fields), or for a record rec_peek read by its head, the whole record's length; and its
-- checkpoint.
local function size_of(jk, rec, f)
  local p = rec.payload
  local size = p and #p + #rec.meta or redis.call('STRLEN', jk)
  if f[4] then size = size + #f[4] end
  return size
end

local function take(id)
  local jk = K.job_prefix .. id
  local rec, f, sk = read_job(id, jk)
  if not rec then return end
  -- The byte bound, before any gate writes: past it the job goes back untouched (the
  -- first claimed is sent whatever its size).
  local size = size_of(jk, rec, f)
  if i > 0 and sent + size > CLAIM_BYTES then
    stop, full = true, true
    return
  end
  local typ = rec.type
  -- A job with a state, limits or an idempotency key, or held by a pause, may be written
  -- to by the gates below before its lease is: a lone id is looked up in the claims, and
  -- the leases are checked, first (a plain job's claim writes nothing before its lease
  -- and its claim, see write_leases).
  local writes = f ~= NO_STATE or rec.limits ~= '' or rec.idem_key ~= ''
  if (writes or (any_paused and paused['fn:' .. typ])) and lone_is_stray(id) then return end
  if any_paused and paused['fn:' .. typ] then return hold_paused(id, rec, sk) end
  if writes and not sound_keys('leases') then return end
  if f[9] then
    -- (Its group's countdown may write any of them.)
    if not sound_keys('scheduled', 'dead', 'done_meta') then return end
    return end_cancelled_run(id, jk, rec)
  end
  -- (f[11]: a durable function resumed after a sleep or a wait: MAX_AGE bounds its first start only)
  if max_age[typ] and not f[11] and now - tonumber(rec.created_ms) > max_age[typ] then
    sent = sent + size
    return expire_old(id, rec, f, sk)
  end
  local limits, rates = NONE, NONE
  if rec.limits ~= '' then
    limits, rates = parse_limits(rec.limits), parse_rates(rec.limits)
  end
  local starts = on_free_executor(typ)
  if (#limits > 0 or #rates > 0 or (f[11] and max_age[typ])) and not starts then
    -- Never prefetch a job under limits, nor a resumed durable function with a MAX_AGE
    -- (its worker would judge its age again at the start, where only the first counts).
    stop = true
    return
  end
  local ikey = rec.idem_key
  if ikey ~= '' or #limits > 0 then
    -- The keys below are not the queue's own: should one of them fail (a wrong
    -- type), the jobs claimed so far already hold their leases.
    write_leases()
  end
  if ikey ~= '' and settled_as_duplicate(id, jk, sk, rec, f, limits) then return end
  local token = base .. ':' .. index_text(i)
  local rated_now = false  -- a token taken for this start, kept should the job park below
  if #rates > 0 and f[8] ~= '1' then
    rated_now = rate_token(id, rec, f, sk, rates)
    if not rated_now then return end
  end
  if #limits > 0 and parked_on_full(id, jk, sk, f, limits, token, rated_now, typ) then return end
  sent = sent + size
  claim_job(id, rec, f, sk, token, limits, starts)
end

local popped = 0
-- An id popped from the priority set and put back goes back there, in its place, not to
-- ready.
local function put_back(id)
  if from_prio[id] then
    redis.call('ZADD', K.prio, from_prio[id], id)
  else
    redis.call('RPUSH', K.ready, id)
  end
end
-- ids[j..] back, in order: the first pushed to the consumer end is the last taken. Those of
-- ready in one RPUSH (a claim stopped by its byte bound may put back hundreds).
local function put_back_from(ids, j)
  local back = {}
  for q = #ids, j, -1 do
    local id = ids[q]
    if from_prio[id] then
      redis.call('ZADD', K.prio, from_prio[id], id)
    else
      back[#back + 1] = id
    end
  end
  if #back > 0 then call_many('RPUSH', K.ready, back, 1) end
end
-- Pop up to `want` ids: the priority set first (only priority `floor` or more, when
-- set, and nothing from ready), then ready. false: none left. The first round knows
-- whether the priority set exists from the call's first EXISTS; a later one asks again
-- (a settle may have put a job of priority back, as give_up_reserved does).
local function pop(want, first)
  local ids
  if first and early then
    ids = early
  elseif floor > 0 then
    -- Priority f or more only: scores below -(f - 1) * 1e13 (see enqueue.lua).
    local got = redis.call('ZRANGEBYSCORE', K.prio, '-inf', '(' .. string.format('%d', -(floor - 1) * 1e13),
      'WITHSCORES', 'LIMIT', 0, want)
    ids = {}
    for j = 1, #got, 2 do
      ids[#ids + 1] = got[j]
      from_prio[got[j]] = got[j + 1]
    end
    if #ids == 0 then return false end
    redis.call('ZREM', K.prio, unpack(ids))
  elseif (first and prio_at_start) or (not first and redis.call('EXISTS', K.prio) == 1) then
    local got = redis.call('ZPOPMIN', K.prio, want)
    ids = {}
    for j = 1, #got, 2 do
      ids[#ids + 1] = got[j]
      from_prio[got[j]] = got[j + 1]
    end
    if #ids < want then
      local more = redis.call('RPOP', K.ready, want - #ids)
      if more then for _, x in ipairs(more) do ids[#ids + 1] = x end end
    end
    if #ids == 0 then return false end
  else
    ids = redis.call('RPOP', K.ready, want)
  end
  return ids
end
-- Bound the work per call: strays, parked jobs and duplicates do not count as claims.
-- A job parked on a key already known full (a few writes) widens the bound by one, up
-- to 256, so one key's backlog in ready is parked in few calls, not n * 4 at a time.
local emptied = false  -- a pop came back short: ready and the priority set held no more
while i < n and popped < n * 4 + cheap and not stop and not refused do
  -- Pop no more than can still be claimed, so every id popped is settled here.
  local want = math.min(n - i, n * 4 + cheap - popped)
  local ids = pop(want, popped == 0)
  if not ids then
    emptied = floor == 0
    break
  end
  popped = popped + #ids
  local ok_h, held = true, {false}
  if popped == 1 and #ids == 1 and want > 1 then
    unchecked = ids[1]  -- all there was: looked up only if need be (see unchecked)
  else
    ok_h, held = pcall(hmget_many, K.claims, ids)
  end
  local damaged = not ok_h and 'claims' or nil
  -- No key's type is checked here before the first settle: the leases are written with
  -- a pcall before any other write of a plain job (write_leases), and a settle that
  -- writes anything checks the keys it needs first (sound_keys). The scheduled and dead
  -- sets are not written by a plain claim at all: the retry, deferral or burial that
  -- later gives up the claim checks the set it writes next and refuses whole, the claim
  -- kept (damaged_set in includes/claims.lua), until the scheduler's reclaim, which an
  -- error reply sends looking, puts the key aside. (A check of the three here, one
  -- ZINTERCARD, was a command per call, paid per job at light load.)
  if damaged then
    -- The claims hash is damaged (another type). Types cannot change within this call,
    -- so this is the first round and nothing is claimed yet: put the ids back at the
    -- consumer end, in order, and refuse, rather than lose them. The scheduler's reclaim
    -- renames the key aside.
    for j = #ids, 1, -1 do put_back(ids[j]) end
    return redis.error_reply('claim refused: the ' .. damaged .. ' key of this queue holds the wrong Redis type')
  end
  for j, id in ipairs(ids) do
    if held[j] or taken[id] then
      tally('stray')  -- claimed already: never run it twice
    else
      take(id)
      if refused then
        -- A key that settling this id needs is damaged (sound_keys): this id and the rest
        -- of the round go back, in order, untouched.
        put_back_from(ids, j)
        break
      elseif stop then
        -- A job under limits that no free executor can start (1), or the byte bound (2).
        out[2] = full and 2 or 1
        -- Put back this job and what this round popped after it, in order.
        put_back_from(ids, j)
        break
      end
    end
  end
  if #ids < want then
    emptied = floor == 0 and not stop and not refused
    break
  end
end
if refused then
  if i == 0 then
    flush(K.stats)  -- what the call did settle (a burial, a stray) is counted all the same
    return redis.error_reply('claim refused: the ' .. refused .. ' key of this queue holds the wrong Redis type')
  end
  -- Jobs claimed before the damaged key was met keep their claims (nothing of theirs
  -- needs it); the worker claims again at once, and that call, whose first id is the
  -- one in hand, refuses.
  out[2] = 2
elseif not stop and i < n and popped >= n * 4 + cheap then
  out[2] = 2
end
local wrote, bad_key = write_leases()
if not wrote then
  -- The leases are of another type, or the claims hash of a lone id is damaged (see
  -- write_leases): every job claimed here is plain and nothing of it is written. They go
  -- back to the consumer end, in claim order, before any id put back above, and the
  -- claim refuses.
  for j = #claimed - 1, 1, -2 do put_back(claimed[j]) end
  flush(K.stats)
  return redis.error_reply('claim refused: the ' .. bad_key .. ' key of this queue holds the wrong Redis type')
end
-- Wake-ups left behind: each enqueue call pushes one, and a fetcher takes one per claim,
-- so a claim that took the jobs of two enqueues left a wake-up for nobody, and a fetcher
-- woke for it to claim nothing (at light load, about a third of all claims with one
-- worker). A call that emptied the queue, with every id it popped claimed here (no gate
-- put a job back in ready or woke a parked one), drops them: there is nothing to claim,
-- and the next enqueue pushes one again. One DEL, only in a call that took two or more.
if emptied and popped > 1 and plain == popped then redis.call('DEL', K.notify) end
flush(K.stats)
return out
