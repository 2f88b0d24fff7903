-- Shared helpers, prepended to every script by scripts.py (Lua scripts cannot import).
-- None of them builds a key from anything but a prefix passed in KEYS.

-- Add the history field to a list of HSET field/value pairs: the record's current
-- comma-joined history (old; false/nil when none yet) with one more JSON entry. No
-- entry, no field: the history is left as it is. The caller writes the history in the
-- same HSET as the status, so the old value comes from the caller's fence read.
local function with_history(set, old, entry)
  if entry == nil or entry == '' then return end
  set[#set + 1] = 'history'
  if old and old ~= '' then
    set[#set + 1] = old .. ',' .. entry
  else
    set[#set + 1] = entry
  end
end

-- Run one variadic command (ZADD, ZREM, ...) over a flat list of arguments, in chunks
-- (a multiple of `step`, so member/score pairs stay together) to keep within Lua's
-- unpack limit. Nothing is sent for an empty list.
local function call_many(cmd, key, args, step)
  local chunk = 4000 - 4000 % step
  for s = 1, #args, chunk do
    redis.call(cmd, key, unpack(args, s, math.min(s + chunk - 1, #args)))
  end
end

-- Wake idle workers, keeping the wake-up list short.
local function wake(notify_key)
  if redis.call('LLEN', notify_key) < 64 then
    redis.call('LPUSH', notify_key, '1')
  end
end

-- Compare-and-delete: drop the resource lock only if this claim token holds it, then
-- wake the longest-waiting deferred job of that resource (FIFO, so no waiter starves):
-- it moves from scheduled to the consumer end of ready. Stale waiter ids (already
-- promoted by their fallback timer, finished, or since scheduled for a retry: only a
-- deferral leaves the status 'scheduled') are skipped.
local function release_lock(lock_prefix, resource, token, scheduled_key, ready_key, notify_key, job_prefix)
  if resource and resource ~= '' and token and token ~= '' then
    local k = lock_prefix .. resource
    -- pcall: a key damaged to another type is no one's lock; it is dropped, so the
    -- resource cannot stay blocked, and the batch is not failed part-way.
    local holder = redis.pcall('GET', k)
    if type(holder) == 'table' then
      redis.call('DEL', k)
      holder = false
    end
    if holder == token or not holder then
      if holder then redis.call('DEL', k) end
      local wk = k .. ':waiters'
      for _ = 1, 16 do
        local w = redis.pcall('LPOP', wk)
        if type(w) ~= 'string' then break end  -- empty, or damaged: the fallback timers wake them
        if redis.call('HGET', job_prefix .. w, 'status') == 'scheduled'
            and redis.call('ZREM', scheduled_key, w) == 1 then
          redis.call('HSET', job_prefix .. w, 'status', 'queued')
          redis.call('RPUSH', ready_key, w)
          wake(notify_key)
          break
        end
      end
    end
  end
end

-- Count every stats field named in a space-separated list ("field" adds 1,
-- "field=N" adds N); tally() counts one field given whole (it may hold spaces);
-- flush() writes the totals with one HINCRBY per distinct field, however many jobs
-- the batch held.
local acc = {}
local function bump(fields)
  if fields == nil or fields == '' then return end
  for tok in string.gmatch(fields, '%S+') do
    local f, n = string.match(tok, '^(.-)=(%d+)$')
    if f then
      acc[f] = (acc[f] or 0) + tonumber(n)
    else
      acc[tok] = (acc[tok] or 0) + 1
    end
  end
end
local function tally(field)
  acc[field] = (acc[field] or 0) + 1
end
local function flush(stats_key)
  for f, n in pairs(acc) do
    redis.call('HINCRBY', stats_key, f, n)
  end
end

-- The fence: the record must be processing under this very token. A settled record's
-- token is empty (or absent), and no claim hands out an empty one. fenced() returns
-- the record's fields status, token and then those named (one HMGET for the fence and
-- what the caller needs), or nil when the token does not own the record.
local function fenced(job_key, token, ...)
  local f = redis.call('HMGET', job_key, 'status', 'token', ...)
  if f[1] ~= 'processing' or f[2] ~= token or token == '' then return nil end
  return f
end
local function owns(job_key, token)
  return fenced(job_key, token) ~= nil
end
