-- group: write one chunk of a group's members, as enqueue.lua writes jobs, and count them
-- into the group (see group_settle in includes/groups.lua). The first chunk creates the group; the
-- last seals it, and a sealed group whose members have all finished already writes its
-- then-job at once. Until it is sealed no settle can complete it, so a group sent in
-- several calls never fires early; one whose sender failed half-way stays unsealed (its
-- members run, its then-job never does) and expires after the keep time.
--
-- KEYS[1] ready        LIST
-- KEYS[2] scheduled    ZSET
-- KEYS[3] notify       LIST
-- KEYS[4] stats        HASH
-- KEYS[5] job_prefix   (string)
-- KEYS[6] idem_prefix  (string)
-- KEYS[7] claims       HASH
-- KEYS[8] census       HASH
-- KEYS[9] prio         ZSET
-- KEYS[10] group_prefix (string; the group is prefix .. id, its outcomes prefix .. id .. ':o',
--                        its member list prefix .. id .. ':m', its marks prefix .. id .. ':f')
-- KEYS[11] done_meta   HASH
-- KEYS[12] done_prefix (string)
-- KEYS[13] outbox      LIST  (a then-job on another queue)
-- KEYS[14] delayed     ZSET  the ids of scheduled that are scheduled or retrying -> due (ms): the
--                            scheduled list's own index (see keys.py)
-- ARGV[1] now, ms ('' for the server's clock)
-- ARGV[2] group id
-- ARGV[3] 1: the first chunk (creates the group from ARGV[5..7]); 0: a later one
-- ARGV[4] 1: the last chunk (seals the group)
-- ARGV[5] the then-job: a JSON list of its queue ('' this one), its 12 enqueue fields and
--         its priority (all strings; the payload a JSON object without the group field)
-- ARGV[6] inline bound: the most outcome bytes passed in the then-job's payload
-- ARGV[7] keep, ms: how long the group is kept once complete (and while unsealed)
-- ARGV[8] n; then 13 fields per member, as enqueue.lua (no idempotency key)
-- ARGV[9 + n * 13] members counted into the group but written in other partitions of the
--         queue, where their keys route them ('' none; groups.py writes them after this
--         call and seals the group after them)
-- ARGV[10 + n * 13 ..] member ids, appended to the group's member list (LIST, the ids in
--         member order, which member_page.lua pages through): the calls of one group
--         carry every member's id in turn, in member order, whichever partition it is in
--
-- Returns {code, status per member}: 1 written, 2 written and the group complete (its
-- then-job written), -1 refused: a first chunk for a group that exists, -2 refused: a
-- later chunk for no open group.
--- @include "clock"
--- @include "stats"
--- @include "jobs"
--- @include "groups"
local now = clock(ARGV[1])
local gk = K.group_prefix .. ARGV[2]
local first, seal, keep = ARGV[3] == '1', ARGV[4] == '1', tonumber(ARGV[7]) or 0
local exists = redis.call('EXISTS', gk) == 1
if first and exists then return {-1} end
if not first and (not exists or redis.call('HGET', gk, 'sealed') == '1') then return {-2} end
local n = tonumber(ARGV[8])
if first then
  redis.call('HSET', gk, 'then', ARGV[5], 'inline', ARGV[6], 'keep', keep, 'created_ms', now, 'total', 0, 'left', 0,
    'done', 0, 'dead', 0, 'cancelled', 0, 'bytes', 0, 'sealed', 0)
  if keep > 0 then redis.call('PEXPIRE', gk, keep) end
end
local Q = {ready = K.ready, scheduled = K.scheduled, delayed = K.delayed, stats = K.stats, job = K.job_prefix, idem = K.idem_prefix, claims = K.claims,
  prio = K.prio, done_meta = K.done_meta, done = K.done_prefix}
local put = jobs_acc()
local out = {1}
for i = 0, n - 1 do
  local b = 9 + i * 13
  local j = job_fields(ARGV, b)
  j.priority = tonumber(ARGV[b + 12]) or 0
  local _, _, status = job_put(Q, now, j, put)
  out[#out + 1] = status
end
jobs_flush(Q, put, K.notify, K.census)
local also = tonumber(ARGV[9 + n * 13]) or 0
redis.call('HINCRBY', gk, 'total', n + also)
local left = redis.call('HINCRBY', gk, 'left', n + also)
-- (pcall: a member list of another type, damage, loses the list, never the members)
local listed = 10 + n * 13
for s = listed, #ARGV, 4000 do
  redis.pcall('RPUSH', gk .. ':m', unpack(ARGV, s, math.min(s + 3999, #ARGV)))
end
if not seal and #ARGV >= listed then  -- (unsealed, the list lives as long as the group)
  local ttl = redis.call('PTTL', gk)
  if ttl > 0 then redis.call('PEXPIRE', gk .. ':m', ttl) end
end
if seal then
  redis.call('HSET', gk, 'sealed', 1)
  -- Sealed, it lives until its members finish (then for the keep time: group_fire).
  redis.call('PERSIST', gk)
  redis.call('PERSIST', gk .. ':o')
  redis.call('PERSIST', gk .. ':m')
  redis.call('PERSIST', gk .. ':f')
  if left <= 0 then
    group_fire({group = K.group_prefix, Q = Q, notify = K.notify, census = K.census, outbox = K.outbox}, now, ARGV[2])
    out[1] = 2
  end
end
flush(K.stats)
return out
