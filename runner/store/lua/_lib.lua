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

-- Wake idle workers, keeping the wake-up list short. pcall: a wake-up list damaged to
-- another type must not fail a transition whose writes are already made (workers still
-- poll on their own; the scheduler renames the key aside).
local function wake(notify_key)
  local len = redis.pcall('LLEN', notify_key)
  if type(len) == 'number' and len < 64 then
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
    -- pcall: a stats hash damaged to another type loses these counts, never the
    -- transition (its writes are made; the scheduler renames the key aside).
    redis.pcall('HINCRBY', stats_key, f, n)
  end
end

-- Claims live in the queue's claims hash: id -> "<token> <attempt> <started_ms> <flags>",
-- where flags holds 'i' when the record has an idempotency key and 'r' when it has a
-- resource key ('-' neither), so a settling script reads the record only for those.
-- hmget_many() reads the entries of many ids with one HMGET per 4000; parse_claim()
-- splits one (nil for none or a damaged one).
local function hmget_many(key, ids)
  local out = {}
  for s = 1, #ids, 4000 do
    local part = redis.call('HMGET', key, unpack(ids, s, math.min(s + 3999, #ids)))
    for j = 1, #part do out[#out + 1] = part[j] end
  end
  return out
end
local function parse_claim(raw)
  if type(raw) ~= 'string' then return nil end
  local tok, attempt, started, flags = string.match(raw, '^(%S+) (%d+) (%d+) (%S+)$')
  if not tok then return nil end
  return {token = tok, attempt = tonumber(attempt), started = started,
    idem = string.find(flags, 'i', 1, true) ~= nil, res = string.find(flags, 'r', 1, true) ~= nil}
end

-- The claim entries of a batch whose ids stand in ARGV from index `first`, one every
-- `stride` arguments (one HMGET for the whole batch).
local function batch_claims(claims_key, first, stride, n)
  local ids = {}
  for i = 0, n - 1 do ids[#ids + 1] = ARGV[first + i * stride] end
  return hmget_many(claims_key, ids)
end

-- Settled jobs give up their claims and leases: one HDEL and one ZREM for the batch.
local function unclaim(claims_key, leases_key, ids)
  call_many('HDEL', claims_key, ids, 1)
  call_many('ZREM', leases_key, ids, 1)
end

-- The fence: the job must hold a claim under this very token (no claim hands out an
-- empty one). Returns the parsed claim, or nil when the token does not own the job.
local function fence(raw, token)
  local c = parse_claim(raw)
  if not c or token == '' or c.token ~= token then return nil end
  return c
end
