-- retry: claimed jobs go back to scheduled for a later attempt (fenced): a transient
-- failure (the attempt is spent), or a job handed back without spending one (a worker
-- that does not know its type or version yet, a handler's RateLimited).
--
-- KEYS[1] leases       ZSET
-- KEYS[2] scheduled    ZSET  id -> due ms
-- KEYS[3] stats        HASH
-- KEYS[4] job_prefix   (string)
-- KEYS[5] lim_prefix   (string)
-- KEYS[6] ready        LIST  (a job woken by a freed slot goes here)
-- KEYS[7] notify       LIST
-- KEYS[8] claims       HASH  id -> claim
-- KEYS[9] limwait      ZSET  limit keys with parked jobs
-- KEYS[10] prio        ZSET  (a job of priority 1-9 goes back there: to_ready in includes/ready.lua)
-- KEYS[11] delayed     ZSET  the ids of scheduled that are scheduled or retrying -> due (ms): the
--                            scheduled list's own index (see keys.py)
-- KEYS[12] log_prefix  (string) the job's log, LIST (joblog.lua)
-- KEYS[13] stream_prefix (string) the job's stream, LIST (joblog.lua)
-- ARGV[1] now, ms ('' for the server's clock)
-- ARGV[2] n; then per job 8 fields:
--   id, token, delay ms (from now), error (JSON), history entry (JSON, '' none),
--   refund (1: no attempt spent; the job is counted as a deferral; 2: a handler's
--   RateLimited, no attempt spent for the first RATE_LIMITED_FREE of the job, the
--   attempt spent after that, as any retry; 3: the same on the job's last attempt,
--   where past the bound nothing is written and the code is 2: the worker buries it),
--   stats fields, the handler's start, ms ('' the claim's: a run's start mark, start.lua,
--   writes it there; set for a run that ends in the same settle as its start, whose mark
--   is not sent, as in ack.lua: a fresh child's imports came between claim and start)
-- ARGV[3 + 8n] the retention of the job's log, ms ('' or 0: its expiry is left as it is)
--
-- Each job costs one HMGET and one HSET of its state hash (the attempt, its start and the
-- history move from the claim to the state); the batch's fences, claims, leases and
-- scheduled entries go in one variadic HMGET, HDEL, ZREM and ZADD, before any limit
-- slot is released.
--
-- Returns one code per job: 1 scheduled, -1 refused (lease lost: nothing changed), 2 a
-- RateLimited past its free uses on the last attempt (nothing changed: still claimed; the
-- attempts are the budget, so the worker buries it rather than run it once more).
--- @include "clock"
--- @include "history"
--- @include "calls"
--- @include "limits"
--- @include "parking"
--- @include "stats"
--- @include "claims"
--- @include "record_keys"
local now, n = clock(ARGV[1]), tonumber(ARGV[2])
local keep = tonumber(ARGV[3 + 8 * n]) or 0
local damaged = damaged_set({{'scheduled', K.scheduled}})
if damaged then return damaged end
local out = {}
local ids, due_ids, slots = {}, {}, {}
local seen = {}
local held = batch_claims(K.claims, 3, 8, n)
for i = 0, n - 1 do
  local b = 3 + i * 8
  local id, token, delay, err = ARGV[b], ARGV[b + 1], tonumber(ARGV[b + 2]), ARGV[b + 3]
  local entry, refund, fields = ARGV[b + 4], ARGV[b + 5] == '1', ARGV[b + 6]
  local jk = K.job_prefix .. id
  local sk = jk .. ':s'
  -- The same claim twice in one batch settles once (seen), refused the second time.
  local c = not seen[id] and fence(held[i + 1], token)
  local f = c and redis.pcall('HMGET', sk, 'history', 'deferrals', 'ratelimits')
  if not c or f.err then
    out[#out + 1] = -1
  elseif ARGV[b + 5] == '3' and (tonumber(f[3]) or 0) + 1 > RATE_LIMITED_FREE then
    out[#out + 1] = 2
  else
    seen[id] = true
    local due = now + delay
    if ARGV[b + 5] == '2' or ARGV[b + 5] == '3' then
      local used = (tonumber(f[3]) or 0) + 1
      redis.call('HSET', sk, 'ratelimits', used)
      refund = used <= RATE_LIMITED_FREE
    end
    local set = {'status', refund and 'scheduled' or 'retrying', 'ready_ms', due}
    if refund then
      set[#set + 1] = 'deferrals'
      set[#set + 1] = (tonumber(f[2]) or 0) + 1
    else
      for _, kv in ipairs({{'error', err}, {'finished_ms', now}, {'attempt', c.attempt},
          {'started_ms', ARGV[b + 7] ~= '' and ARGV[b + 7] or c.started}}) do
        set[#set + 1] = kv[1]
        set[#set + 1] = kv[2]
      end
    end
    with_history(set, f[1], entry)
    redis.call('HSET', sk, unpack(set))
    ids[#ids + 1] = id
    due_ids[#due_ids + 1] = due
    due_ids[#due_ids + 1] = id
    if c.res then
      local rec = rec_load(jk)
      if rec then slots[#slots + 1] = {rec.limits, token} end
    end
    -- The log and stream were kept the retention from their last write: a retry due
    -- later than that would find them gone. They are kept until it is due, plus the
    -- retention (never shortened).
    if keep > 0 then
      for _, key in ipairs({K.log_prefix .. id, K.stream_prefix .. id}) do
        local left = redis.call('PTTL', key)
        if left >= 0 and left < delay + keep then redis.call('PEXPIRE', key, delay + keep) end
      end
    end
    bump(fields)
    out[#out + 1] = 1
  end
end
unclaim(K.claims, K.leases, ids)
call_many('ZADD', K.scheduled, due_ids, 2)
-- pcall: a list index only feeds the job lists; damaged, it must cost no job.
for s = 1, #due_ids, 4000 do redis.pcall('ZADD', K.delayed, unpack(due_ids, s, math.min(s + 3999, #due_ids))) end
for _, s in ipairs(slots) do
  release_limits(K.lim_prefix, s[1], s[2], now, K.job_prefix, K.ready, K.notify, K.limwait, K.prio)
end
flush(K.stats)
return out
