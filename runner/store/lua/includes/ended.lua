-- A job's end: waiters told, a cancelled job ended.
--- @include "idem"
--- @include "record_keys"
--- @include "records"

-- Waiting for a job's end: a caller that waits (call and wait, GET ?wait) marks the job
-- with "waited":1 in its record's meta (at enqueue, or later by watch.lua), claim copies
-- that into the claim's 'w' flag, and the script that ends the job publishes its id on
-- the queue's ended channel. A job nobody waits for costs no command at all.
local function waited(meta)
  return type(meta) == 'string' and string.find(meta, '"waited":1', 1, true) ~= nil
end

-- Publish the ids of jobs that ended in this call, one message for the batch.
local function announce(channel, ids)
  -- (pcall: a user refused the channels, an ACL user with none, still ends its jobs;
  -- its waits read them on a timer, store/waiter.py)
  if #ids > 0 then redis.pcall('PUBLISH', channel, table.concat(ids, ' ')) end
end

-- A job that never ran (or whose run stopped) ends cancelled: a terminal status in its
-- state, kept with its record for the retention given, indexed in the cancelled set,
-- its idempotency key freed and the census told. Its claim, lease and queue entries
-- are the caller's to remove.
local function end_cancelled(jk, id, rec, now, ttl, idem_prefix, census_key, cancelled_key, ended)
  local sk = jk .. ':s'
  redis.call('HSET', sk, 'status', 'cancelled', 'reason', 'cancelled', 'finished_ms', now)
  redis.call('HDEL', sk, 'cancel_requested')
  debounce_release(sk, id, rec.version)
  redis.call('ZADD', cancelled_key, now, id)
  rec_expire(jk, ttl)
  free_idem(idem_prefix, rec.type, rec.idem_key, id, ttl)
  census(census_key, rec.type .. '|' .. rec.version, -1)
  if waited(rec.meta) then announce(ended, {id}) end
end
