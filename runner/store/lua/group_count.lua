-- group_count: count down members of groups of this partition that finished in another
-- partition of the queue (their keys routed them there: groups.py); their settles put the
-- counts in that partition's outbox (group_settle in includes/groups.lua) and the relay brings them
-- here. Each member counts once (HSETNX of its outcome), so a count relayed twice changes
-- nothing; the count that finishes a sealed group writes its then-job.
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
-- KEYS[10] group_prefix (string)
-- KEYS[11] done_meta   HASH
-- KEYS[12] done_prefix (string)
-- KEYS[13] outbox      LIST  (a then-job on another queue or partition)
-- KEYS[14] delayed     ZSET  the ids of scheduled that are scheduled or retrying -> due (ms): the
--                            scheduled list's own index (see keys.py)
-- ARGV[1] now, ms ('' for the server's clock)
-- ARGV[2] n; then 5 fields per count: group id, member index, status, outcome JSON, the
--         traceparent of the run that ended it ('' none)
--
-- Returns n.
--- @include "clock"
--- @include "stats"
--- @include "groups"
local now = clock(ARGV[1])
local n = tonumber(ARGV[2])
local G = {group = K.group_prefix, notify = K.notify, census = K.census, outbox = K.outbox, home = true,
  Q = {ready = K.ready, scheduled = K.scheduled, delayed = K.delayed, stats = K.stats, job = K.job_prefix, idem = K.idem_prefix, claims = K.claims,
    prio = K.prio, done_meta = K.done_meta, done = K.done_prefix}}
for i = 0, n - 1 do
  local b = 3 + i * 5
  group_settle(G, now, ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4])
end
flush(K.stats)
return n
