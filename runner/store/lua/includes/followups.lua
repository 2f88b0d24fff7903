-- The follow-ups of a batch of settled jobs, each written once.
--- @include "done"
--- @include "jobs"
--- @include "stats"

-- A follow-up is written once by its id (parent id and index, see scripts.py): one whose
-- record exists (queued, running, dead) or whose outcome is kept is not written again.
local function job_known(Q, id)
  return redis.call('EXISTS', Q.job .. id) == 1 or done_has(Q.done_meta, Q.done, id)
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
          stat_add(Q.stats, 'followups_refused|' .. j.type, 1)
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
