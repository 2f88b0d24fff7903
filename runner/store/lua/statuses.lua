-- statuses: the status of each of some jobs of one queue (partition), and nothing else:
-- what the waits of a process that may not subscribe to the ended channels read on a
-- timer (store/waiter.py), one call a tick for every such wait of the tag. A wait reads
-- its job whole (lookup.lua, about ten commands a queue) only once this says it ended.
-- Two commands a job at most (HGET, EXISTS); it reads, never writes.
--
-- KEYS[1] job_prefix   (string)  a job's record is this and its id (its state: and ':s')
-- ARGV[1..] job ids (at most waiter.PROBE_IDS a call)
--
-- Returns one string per id, in order: its state's status ('dead', 'cancelled',
-- 'scheduled', ...); '' for a record whose state says none (queued or running untouched:
-- lookup.lua tells which); '-' when Redis holds neither record nor state (done: a
-- success deletes both and keeps its outcome in a done generation; or removed, trimmed).
local out = {}
for i, id in ipairs(ARGV) do
  local jk = K.job_prefix .. id
  -- (pcall: a state damaged to another type says nothing; its record still does)
  local status = redis.pcall('HGET', jk .. ':s', 'status')
  if type(status) == 'string' and status ~= '' then
    out[i] = status
  elseif redis.call('EXISTS', jk) == 1 then
    out[i] = ''
  else
    out[i] = '-'
  end
end
return out
