-- A batch of new jobs from ARGV, as enqueue.lua and emit.lua take it.
--- @include "jobs"

-- Write the batch of ``ARGV[2]`` jobs, 13 fields each from ARGV[3] (the order of
-- enqueue.lua), ARGV[3 + 13 n] how long a limit key's marker lives, into the queue of K:
-- appends code, id, status per job to `out`, and calls each(j, code, id, status) per job
-- when given (after its write, before the batch's flush). Returns n.
local function batch_put(now, out, each)
  local n = tonumber(ARGV[2])
  local Q = {ready = K.ready, scheduled = K.scheduled, delayed = K.delayed, stats = K.stats, job = K.job_prefix, idem = K.idem_prefix,
    claims = K.claims, prio = K.prio, mark = K.lim_prefix, mark_ms = tonumber(ARGV[3 + n * 13])}
  local put = jobs_acc()
  for i = 0, n - 1 do
    local b = 3 + i * 13
    local j = job_fields(ARGV, b)
    local prio = ARGV[b + 12]
    j.priority = prio == '0' and 0 or tonumber(prio) or 0
    local code, id, status = job_put(Q, now, j, put)
    out[#out + 1] = code
    out[#out + 1] = id
    out[#out + 1] = status
    if each then each(j, code, id, status) end
  end
  jobs_flush(Q, put, K.notify, K.census)
  return n
end
