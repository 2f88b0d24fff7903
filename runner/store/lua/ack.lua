-- ack: finish claimed jobs as done, fenced by their claim tokens. The outcome, the
-- idempotency completion mark, the release of limit slots and the counters are written
-- in this one step, so no crash can split them.
--
-- KEYS[1] leases       ZSET  id -> lease deadline ms
-- KEYS[2] stats        HASH
-- KEYS[3] job prefix   (string)
-- KEYS[4] limit prefix (string)
-- KEYS[5] idem prefix  (string)
-- KEYS[6] throughput prefix (string; the key of a minute is prefix .. minute)
-- KEYS[7] dead         ZSET  (a late success leaves it)
-- KEYS[8] ready        LIST  (a job woken by a freed slot goes here)
-- KEYS[9] notify       LIST
-- KEYS[10] claims      HASH  id -> claim
-- KEYS[11] done meta   HASH  the current done generation (done_gen in _lib.lua)
-- KEYS[12] done prefix (string; a generation's hash is prefix .. gen, its log prefix .. gen .. ':log')
-- KEYS[13] limwait     ZSET  limit keys with parked jobs
-- KEYS[14] census      HASH  jobs not done per "<type>|<version>"
-- KEYS[15] result prefix (string; a result kept longer is prefix .. id)
-- KEYS[16] scheduled   ZSET  (a delayed follow-up goes here)
-- KEYS[17] outbox      LIST  follow-ups for other queues, JSON, until the relay moves them
-- KEYS[18] ended       channel  ids of waited jobs that ended (see waited in _lib.lua)
-- KEYS[19] group prefix (string; a group's state, see group_settle in _lib.lua)
-- KEYS[20] prio        ZSET  (a job of priority 1-9 goes back there: to_ready in _lib.lua)
-- ARGV[1] now, ms ('' for the server's clock)
-- ARGV[2] idempotency retention, ms (counted from the completion)
-- ARGV[3] done retention, ms
-- ARGV[4] done count bound (the most done jobs kept)
-- ARGV[5] n
-- ARGV[6] the stats fields of the whole batch, summed ("field=N ..."; '' none): counted
--   at once when every job's ack lands, instead of each job's own (parsing those cost as
--   much as the rest of an ack); any refusal falls back to the jobs' own fields
-- then per job 6 fields:
--   id, token, result (JSON, '' none), "<type>|<version>" (the census field), stats fields
--   (space-separated), ms to keep the result on its own (KEEP_RESULT; 0 none)
-- then m, the follow-ups (ctx.enqueue); per follow-up 15 fields: the index of its parent
--   in this batch (1-based), its queue ('' this one), the 12 fields of enqueue.lua, its
--   priority
-- then g, the group members among the jobs; per member 5 fields: its index in this batch,
--   its group id, its index in the group, 'done', its outcome (JSON)
--
-- Follow-ups are written only for a parent whose ack lands here (1 or 2), in this same
-- step: a failed or refused run leaves none. A follow-up of this queue is written as
-- enqueue writes a job; one of another queue (another slot) goes to the outbox, whose
-- relay places it there (relay.lua). Either is written once by its id (job_known): the
-- id is the parent's and the follow-up's index, the same on every attempt.
--
-- A success deletes the record: what a done job keeps is its outcome in the current done
-- generation, "<type> <version> <attempt> <started_ms> <finished_ms>\n<history>\n<result>"
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
local now, idem_ttl, n = clock(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[5])
local done_ttl, done_max = tonumber(ARGV[3]), tonumber(ARGV[4])
local out = {}
local seen = {}
local totals = ARGV[6]
local held = batch_claims(KEYS[10], 7, 6, n)
local finished, outcomes, gone = {}, {}, {}
local done_ids = {}
local ended = {}  -- waited jobs done in this batch
local uncounted = {}  -- census field -> jobs done in this batch
local counted, refused = {}, false  -- the stats fields of the jobs whose ack landed; any refused

-- The completion mark goes on the key only while the key still names this job. A late
-- success (its job was buried, which freed the key) takes the key back if it is free.
local function complete_idem(typ, ikey, id, free_hash)
  if not ikey or ikey == '' or not typ then return end
  local ik = idem_key(KEYS[5], typ, ikey)
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
-- queue keeps most of.
local function outcome(typ, ver, attempt, started, history, result)
  local head = typ .. ' ' .. ver .. ' ' .. attempt .. ' ' .. started .. ' +' .. (now - (tonumber(started) or now))
  if (history or '') == '' and result == '' then return head end
  return head .. '\n' .. (history or '') .. '\n' .. result
end

local function keep(id, value, ms)
  if ms > 0 then redis.call('SET', KEYS[15] .. id, value, 'PX', ms) end
end

local function late(id, token, result, field, keep_ms, claimed_by_another)
  if claimed_by_another then return false end
  local jk = KEYS[3] .. id
  local sk = jk .. ':s'
  local f = redis.pcall('HMGET', sk, 'lost_token', 'status', 'reason', 'history')
  if f.err or type(f[1]) ~= 'string' then return false end
  local lost, attempt, started = string.match(f[1], '^(%S+) (%d+) (%d+)$')
  if lost ~= token then return false end
  if not (f[2] == nil or f[2] == false or f[2] == 'queued' or (f[2] == 'dead' and f[3] == 'worker lost')) then
    return false
  end
  local rec = rec_load(jk)
  if not rec then return false end
  if f[2] == 'dead' then redis.call('ZREM', KEYS[7], id) end
  -- The id may still wait in ready: claim drops it as a stray (it has no record).
  local value = outcome(rec.type, rec.version, attempt, started, f[4], result)
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
  local b = 7 + i * 6
  local id, token, result, field, fields, keep_ms = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4],
    tonumber(ARGV[b + 5])
  -- The same claim twice in one batch settles once (seen), refused the second time.
  local c = not seen[id] and fence(held[i + 1], token)
  if not c then
    if not seen[id] and late(id, token, result, field, keep_ms, type(held[i + 1]) == 'string') then
      seen[id] = true
      counted[#counted + 1] = fields
      out[#out + 1] = 2
    else
      refused = true
      out[#out + 1] = -1
    end
  else
    seen[id] = true
    local jk = KEYS[3] .. id
    local typ, ver = string.match(field, '^(.*)|(.*)$')
    local history = c.state and redis.pcall('HGET', jk .. ':s', 'history') or nil
    if type(history) ~= 'string' then history = nil end
    if c.idem or c.res then
      local rec = rec_load(jk)
      if rec then
        release_limits(KEYS[4], rec.limits, token, now, KEYS[3], KEYS[8], KEYS[9], KEYS[13], KEYS[20])
        complete_idem(rec.type, rec.idem_key, id)
      end
    end
    local value = outcome(typ or '?', ver or '?', c.attempt_s, c.started, history, result)
    done_ids[#done_ids + 1] = id
    outcomes[#outcomes + 1] = value
    keep(id, value, keep_ms)
    finished[#finished + 1] = id
    gone[#gone + 1] = jk
    gone[#gone + 1] = jk .. ':s'
    uncounted[field] = (uncounted[field] or 0) + 1
    if c.waited then ended[#ended + 1] = id end
    counted[#counted + 1] = fields
    out[#out + 1] = 1
  end
end
if #done_ids > 0 then
  local gen = done_gen(KEYS[11], KEYS[12], now, done_ttl, done_max)
  done_put(KEYS[11], KEYS[12], gen, done_ids, outcomes)
  for s = 1, #gone, 4000 do redis.call('DEL', unpack(gone, s, math.min(s + 3999, #gone))) end
  unclaim(KEYS[10], KEYS[1], finished)
  -- pcall: a damaged counter loses a count, never the acks (their writes are made).
  local tk = KEYS[6] .. math.floor(now / 60000)
  if type(redis.pcall('HINCRBY', tk, 'done', #done_ids)) == 'number' then
    redis.call('PEXPIRE', tk, 21600000)
  end
end
for field, c in pairs(uncounted) do census(KEYS[14], field, -c) end
if totals ~= '' and not refused then
  bump(totals)
else
  for _, fields in ipairs(counted) do bump(fields) end
end
local fb = 7 + n * 6
local m = tonumber(ARGV[fb]) or 0
local Q = {ready = KEYS[8], scheduled = KEYS[16], stats = KEYS[2], job = KEYS[3], idem = KEYS[5], prio = KEYS[20],
  claims = KEYS[10], done_meta = KEYS[11], done = KEYS[12]}
if m > 0 then write_followups(Q, now, out, fb, m, KEYS[17], KEYS[9], KEYS[14]) end
-- A member's countdown in this same step: its group learns of the success exactly once.
local gb = fb + 1 + m * 15
if (tonumber(ARGV[gb]) or 0) > 0 then
  group_members({group = KEYS[19], Q = Q, notify = KEYS[9], census = KEYS[14], outbox = KEYS[17]}, now, out, gb)
end
flush(KEYS[2])
announce(KEYS[18], ended)
return out
