-- ack: finish claimed jobs as done, fenced by their claim tokens. The outcome, the
-- idempotency completion mark, the release of limit slots and the counters are written
-- in this one step, so no crash can split them.
--
-- KEYS[1] leases       ZSET  id -> lease deadline ms
-- KEYS[2] stats        HASH
-- KEYS[3] job_prefix   (string)
-- KEYS[4] lim_prefix   (string)
-- KEYS[5] idem_prefix  (string)
-- KEYS[6] tput_prefix  (string; unused: the worker adds the minute's throughput count)
-- KEYS[7] dead         ZSET  (a late success leaves it)
-- KEYS[8] ready        LIST  (a job woken by a freed slot goes here)
-- KEYS[9] notify       LIST
-- KEYS[10] claims      HASH  id -> claim
-- KEYS[11] done_meta   HASH  the current done generation (done_gen in includes/done.lua)
-- KEYS[12] done_prefix (string; a generation's hash is prefix .. gen, its log prefix .. gen .. ':log')
-- KEYS[13] limwait     ZSET  limit keys with parked jobs
-- KEYS[14] census      HASH  jobs not done per "<type>|<version>"
-- KEYS[15] res_prefix    (string; a result kept longer is prefix .. id)
-- KEYS[16] scheduled   ZSET  (a delayed follow-up goes here)
-- KEYS[17] outbox      LIST  follow-ups for other queues, JSON, until the relay moves them
-- KEYS[18] ended       channel  ids of waited jobs that ended (see waited in includes/ended.lua)
-- KEYS[19] group_prefix (string; a group's state, see group_settle in includes/groups.lua)
-- KEYS[20] prio        ZSET  (a job of priority 1-9 goes back there: to_ready in includes/ready.lua)
-- KEYS[21] delayed     ZSET  the ids of scheduled that are scheduled or retrying -> due (ms): the
--                            scheduled list's own index (see keys.py)
-- ARGV[1] now, ms ('' for the server's clock)
-- ARGV[2] idempotency retention, ms (counted from the completion)
-- ARGV[3] done retention, ms
-- ARGV[4] done count bound (the most done jobs kept)
-- ARGV[5] n
-- ARGV[6] the stats fields of the whole batch, summed ("field=N ..."; '' none): counted
--   at once when every job's ack lands, instead of each job's own (parsing those cost as
--   much as the rest of an ack); any refusal falls back to the jobs' own fields
-- then per job 9 fields:
--   id, token, result (JSON, '' none), "<type>|<version>" (the census field), stats fields
--   (space-separated), ms to keep the result on its own (KEEP_RESULT; 0 none), the
--   record's created_ms (the server's clock at its enqueue, as the claim read it; 0 unknown),
--   how many follow-ups the run staged (0 none: its follow-ups, if any, come below), the
--   handler's start, ms ('' the claim's: a run's start mark, start.lua, writes it there;
--   set for a run that ends in the same settle as its start, whose mark is not sent)
-- then m, the follow-ups (ctx.enqueue); per follow-up 15 fields: the index of its parent
--   in this batch (1-based), its queue ('' this one), the 12 fields of enqueue.lua, its
--   priority
-- then g, the group members among the jobs; per member 6 fields: its index in this batch,
--   its group id, its index in the group, 'done', its outcome (JSON), the traceparent of
--   its run ('' untraced: the then-job's run links to it)
--
-- Follow-ups are written only for a parent whose ack lands here (1 or 2), in this same
-- step: a failed or refused run leaves none. A run with many (scripts.py STAGE_OVER)
-- staged them before the ack, in the list K.job_prefix .. id .. ':fu:' .. token that nothing
-- reads: the ack that lands commits that list (its expiry lifted, its name put on the
-- outbox as ["@staged", suffix]), in constant work, and the relay places its jobs a batch
-- at a time; a refused ack commits nothing, and the stage expires. A follow-up of this queue is written as
-- enqueue writes a job; one of another queue (another slot) goes to the outbox, whose
-- relay places it there (relay.lua). Either is written once by its id (job_known): the
-- id is the parent's and the follow-up's index, the same on every attempt.
--
-- A success deletes the record: what a done job keeps is its outcome in the current done
-- generation, "<type> <version> <attempt> <started_ms> <finished_ms> =<created>\n<history>\n<result>"
-- (=<created>: ms from its creation to the finish, the server's times both; absent when unknown)
-- (the history only for a job that has one: retried, deferred...; JSON texts never hold a
-- raw newline), and records.py shows it as the job. For a job without idempotency key,
-- limits or state the whole batch costs one HMGET (the fences), one DEL, one HSET and one
-- LPUSH (the outcomes), one HDEL and one ZREM, whatever its size.
--
-- A late success: when the claim is gone because its lease lapsed while the handler
-- still ran (reclaim keeps the lapsed token as lost_token), and nobody has claimed the job
-- since (it waits in ready, or it was buried as "worker lost" on its last attempt), the
-- run is known to have finished: the job is done, not run again and not left dead.
--
-- Returns one code per job: 1 done, 2 done late (see above), -1 refused (lease lost to
-- another claim, or the job settled otherwise: nothing changed).
--- @include "clock"
--- @include "parking"
--- @include "stats"
--- @include "claims"
--- @include "idem"
--- @include "records"
--- @include "record_keys"
--- @include "done"
--- @include "followups"
--- @include "groups"
--- @include "ended"
local now, idem_ttl, n = clock(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[5])
local done_ttl, done_max = tonumber(ARGV[3]), tonumber(ARGV[4])
if (tonumber(ARGV[7 + n * 9]) or 0) > 0 then  -- follow-ups: a delayed one goes to scheduled
  local damaged = damaged_set({{'scheduled', K.scheduled}})
  if damaged then return damaged end
end
local out = {}
local seen = {}
local totals = ARGV[6]
local held = batch_claims(K.claims, 7, 9, n)
local finished, outcomes, gone = {}, {}, {}
local done_ids = {}
local ended = {}  -- waited jobs done in this batch
local uncounted = {}  -- census field -> jobs done in this batch
local counted, refused = {}, false  -- the stats fields of the jobs whose ack landed; any refused
local NO_STATE = {}  -- what a job without a state hash reads of it (nothing)
local last_field, last_typ, last_ver = nil, nil, nil  -- the last census field split (a batch's are alike)

-- The completion mark goes on the key only while the key still names this job. A late
-- success (its job was buried, which freed the key) takes the key back if it is free.
local function complete_idem(typ, ikey, id, free_hash)
  if not ikey or ikey == '' or not typ then return end
  local ik = idem_key(K.idem_prefix, typ, ikey)
  -- pcall: a key damaged to another type must not fail the batch part-way.
  local mark = redis.pcall('GET', ik)
  if type(mark) == 'string' then
    local hid, hash = string.match(mark, '^(%S+) (%S+)')
    if hid == id then redis.call('SET', ik, id .. ' ' .. hash .. ' done', 'PX', idem_ttl) end
  elseif not mark and free_hash then
    redis.call('SET', ik, id .. ' ' .. free_hash .. ' done', 'PX', idem_ttl)
  end
end

-- The finish is written as "+<ms after the start>" (a few digits, not thirteen), and
-- an empty history and result take no bytes at all: a done job's outcome is what a
-- queue keeps most of. A number parsed and one formatted cost a third of an ack of a plain job: the texts of the
-- run and the age are made again only for a start or a creation other than the last job's
-- (a batch's jobs come in runs that share them: the times of their claim or start mark, of
-- their enqueue), and no table is built for it (one per call is paid per job at light load).
local last_started, last_ran, last_created, last_age = nil, nil, nil, nil
local function outcome(typ, ver, attempt, started, history, result, created)
  if started ~= last_started then
    last_started, last_ran = started, ' +' .. (now - (tonumber(started) or now))
  end
  local age = ''
  if created then
    if created ~= last_created then
      local ms = tonumber(created)
      last_created, last_age = created, (ms and ms > 0 and ms <= now) and ' =' .. (now - ms) or ''
    end
    age = last_age
  end
  local head = typ .. ' ' .. ver .. ' ' .. attempt .. ' ' .. started .. last_ran .. age
  if (history or '') == '' and result == '' then return head end
  return head .. '\n' .. (history or '') .. '\n' .. result
end

-- A DEBOUNCE job's count of the enqueues it absorbed lives in its state, which a success
-- deletes: its outcome's meta line (after the result's, a JSON object) keeps it as
-- "absorbed", so the done job's view still says how many it merged.
local function with_absorbed(result, absorbed)
  local n = tonumber(absorbed)
  if not n or n <= 0 then return result end
  local nl = string.find(result, '\n', 1, true)
  if not nl or string.sub(result, nl + 1, nl + 2) ~= '{"' then return result end
  return string.sub(result, 1, nl) .. '{"absorbed":' .. string.format('%d', n) .. ',' .. string.sub(result, nl + 2)
end

-- Commit a run's staged follow-ups (see above): constant work whatever their number.
local function commit_stage(id, token, staged)
  if (tonumber(staged) or 0) <= 0 then return end
  local suffix = id .. ':fu:' .. token
  if redis.call('PERSIST', K.job_prefix .. suffix) == 1 or redis.call('EXISTS', K.job_prefix .. suffix) == 1 then
    redis.call('RPUSH', K.outbox, cjson.encode({'@staged', suffix}))
  end
end

-- ms: its text as sent ('0' none, most jobs: nothing to parse).
local function keep(id, value, ms)
  if ms == '0' then return end
  ms = tonumber(ms)
  if ms > 0 then redis.call('SET', K.res_prefix .. id, value, 'PX', ms) end
end

local function late(id, token, result, field, keep_ms, claimed_by_another)
  if claimed_by_another then return false end
  local jk = K.job_prefix .. id
  local sk = jk .. ':s'
  local f = redis.pcall('HMGET', sk, 'lost_token', 'status', 'reason', 'history', 'absorbed')
  if f.err or type(f[1]) ~= 'string' then return false end
  local lost, attempt, started = string.match(f[1], '^(%S+) (%d+) (%d+)$')
  if lost ~= token then return false end
  if not (f[2] == nil or f[2] == false or f[2] == 'queued' or (f[2] == 'dead' and f[3] == 'worker lost')) then
    return false
  end
  local rec = rec_load(jk)
  if not rec then return false end
  if f[2] == 'dead' then redis.pcall('ZREM', K.dead, id) end  -- (damaged: the reclaim puts it aside)
  -- The id may still wait in ready: claim drops it as a stray (it has no record).
  local value = outcome(rec.type, rec.version, attempt, started, f[4], with_absorbed(result, f[5]), rec.created_ms)
  done_ids[#done_ids + 1] = id
  outcomes[#outcomes + 1] = value
  keep(id, value, keep_ms)
  gone[#gone + 1] = jk
  gone[#gone + 1] = sk
  complete_idem(rec.type, rec.idem_key, id, rec.idem_hash ~= '' and rec.idem_hash or '-')
  uncounted[field] = (uncounted[field] or 0) + 1
  tally('late|' .. rec.type)
  if waited(rec.meta) then ended[#ended + 1] = id end
  return true
end

for i = 0, n - 1 do
  local b = 7 + i * 9
  local id, token, result, field, fields, keep_ms = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4],
    ARGV[b + 5]
  -- The same claim twice in one batch settles once (seen), refused the second time.
  local c = not seen[id] and fence(held[i + 1], token)
  if not c then
    if not seen[id] and late(id, token, result, field, keep_ms, type(held[i + 1]) == 'string') then
      seen[id] = true
      counted[#counted + 1] = fields
      commit_stage(id, token, ARGV[b + 7])
      out[#out + 1] = 2
    else
      refused = true
      out[#out + 1] = -1
    end
  else
    seen[id] = true
    local jk = K.job_prefix .. id
    if field ~= last_field then
      last_field, last_typ, last_ver = field, string.match(field, '^(.*)|(.*)$')
    end
    local typ, ver = last_typ, last_ver
    -- (A job without a state hash, most of them, reads nothing and builds no table here.)
    local got = NO_STATE
    if c.state then
      got = redis.pcall('HMGET', jk .. ':s', 'history', 'run_attempt', 'run_started_ms', 'absorbed')
      if type(got) ~= 'table' or got.err then got = NO_STATE end
    end
    local history = type(got[1]) == 'string' and got[1] or nil
    -- A durable function resumed within this attempt began at its first run (suspend.lua);
    -- a run whose start mark was not sent, at its handler's start, as its worker says.
    -- (got[2] first: tostring of the attempt formats a number, for the jobs that have one.)
    local started = (got[2] and got[2] == tostring(c.attempt) and tonumber(got[3]) and got[3])
      or (ARGV[b + 8] ~= '' and ARGV[b + 8]) or c.started
    if c.idem or c.res then
      local rec = rec_load(jk)
      if rec then
        release_limits(K.lim_prefix, rec.limits, token, now, K.job_prefix, K.ready, K.notify, K.limwait, K.prio)
        complete_idem(rec.type, rec.idem_key, id)
      end
    end
    local value = outcome(typ or '?', ver or '?', c.attempt_s, started, history,
      got[4] and with_absorbed(result, got[4]) or result, ARGV[b + 6])
    done_ids[#done_ids + 1] = id
    outcomes[#outcomes + 1] = value
    if keep_ms ~= '0' then keep(id, value, keep_ms) end
    finished[#finished + 1] = id
    gone[#gone + 1] = jk
    gone[#gone + 1] = jk .. ':s'
    uncounted[field] = (uncounted[field] or 0) + 1
    if c.waited then ended[#ended + 1] = id end
    counted[#counted + 1] = fields
    if ARGV[b + 7] ~= '0' then commit_stage(id, token, ARGV[b + 7]) end  -- ('0': none staged, most runs)
    out[#out + 1] = 1
  end
end
if #done_ids > 0 then
  local gen = done_gen(K.done_meta, K.done_prefix, now, done_ttl, done_max)
  done_put(K.done_meta, K.done_prefix, gen, done_ids, outcomes, done_max)
  for s = 1, #gone, 4000 do redis.call('DEL', unpack(gone, s, math.min(s + 3999, #gone))) end
  unclaim(K.claims, K.leases, finished)
  -- (The minute's throughput count is not written here: the worker sums it with a
  -- success's other figures and adds it within a second, see metrics.Pending.)
end
for field, c in pairs(uncounted) do census(K.census, field, -c) end
if totals ~= '' and not refused then
  bump(totals)
else
  for _, fields in ipairs(counted) do bump(fields) end
end
local fb = 7 + n * 9
local m = tonumber(ARGV[fb]) or 0
local Q = {ready = K.ready, scheduled = K.scheduled, delayed = K.delayed, stats = K.stats, job = K.job_prefix, idem = K.idem_prefix, prio = K.prio,
  claims = K.claims, done_meta = K.done_meta, done = K.done_prefix}
if m > 0 then write_followups(Q, now, out, fb, m, K.outbox, K.notify, K.census) end
-- A member's countdown in this same step: its group learns of the success exactly once.
local gb = fb + 1 + m * 15
if (tonumber(ARGV[gb]) or 0) > 0 then
  group_members({group = K.group_prefix, Q = Q, notify = K.notify, census = K.census, outbox = K.outbox}, now, out, gb)
end
flush(K.stats)
announce(K.ended, ended)
return out
