-- enqueue: accept a batch of new jobs, each to ready (now) or scheduled (later),
-- with an atomic idempotency check-and-set.
--
-- KEYS[1] ready        LIST
-- KEYS[2] scheduled    ZSET  id -> due ms
-- KEYS[3] notify       LIST
-- KEYS[4] stats        HASH
-- KEYS[5] job_prefix   (string; the job key is prefix .. id)
-- KEYS[6] idem_prefix  (string; a key is prefix .. type .. ':' .. idempotency key)
-- KEYS[7] claims       HASH  (a duplicate's status: a claimed job is processing)
-- KEYS[8] census       HASH  "<type>|<version>" -> jobs not done (the deploy gate)
-- KEYS[9] prio         ZSET  ready ids of priority 1-9 -> -priority * 1e13 + enqueue ms
-- KEYS[10] lim_prefix  (string; a job under limits marks its first key, "<prefix><key>:at",
--                      for producers on another count of partitions: see routing.py)
-- ARGV[1] now, ms ('' for the server's clock; tests pass their own)
-- ARGV[2] n, the number of jobs; then 13 fields per job:
--   id, type, version, payload (JSON), max_attempts,
--   run_at_ms (absolute, the caller's clock; 0 none), delay_ms (relative to the server's
--   clock; 0 none), idempotency key ('' none), payload hash, resource key ('' none),
--   limits ("<n> <key>" lines, '' none), meta (a JSON object, '' none), priority (0-9; a
--   job of 1-9 due now goes to the priority set, served before ready, highest first and
--   in arrival order within a priority; 0 is plain ready)
-- ARGV[3 + 13 n] how long a limit key's marker lives, ms (the done retention and a margin)
--
-- An idempotency key has no expiry while its job is unfinished (so it cannot lapse under a
-- delayed or retrying job and let a second request in); the ack of that job starts its
-- retention, and a job that dies or is deleted frees it.
--
-- Returns, per job, three values: code, job id, status.
--   1  created: the new id and its status (queued | scheduled)
--   0  duplicate: the id and status of the job that holds the key, same payload
--  -1  conflict: the id of the job that holds the key with another payload
--- @include "clock"
--- @include "jobs"
local now = clock(ARGV[1])
local n = tonumber(ARGV[2])
local Q = {ready = K.ready, scheduled = K.scheduled, stats = K.stats, job = K.job_prefix, idem = K.idem_prefix, claims = K.claims,
  prio = K.prio, mark = K.lim_prefix, mark_ms = tonumber(ARGV[3 + n * 13])}
local put = jobs_acc()
local out = {}
for i = 0, n - 1 do
  local b = 3 + i * 13
  local j = job_fields(ARGV, b)
  j.priority = tonumber(ARGV[b + 12]) or 0
  local code, id, status = job_put(Q, now, j, put)
  out[#out + 1] = code
  out[#out + 1] = id
  out[#out + 1] = status
end
jobs_flush(Q, put, K.notify, K.census)
return out
