-- Shared helpers, prepended to every script by scripts.py (Lua scripts cannot import).
-- None of them builds a key from anything but a prefix passed in KEYS.

-- Append one JSON history entry to the record's comma-joined history.
local function append_history(job_key, entry)
  if entry == nil or entry == '' then return end
  local old = redis.call('HGET', job_key, 'history')
  if old and old ~= '' then
    redis.call('HSET', job_key, 'history', old .. ',' .. entry)
  else
    redis.call('HSET', job_key, 'history', entry)
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
-- promoted by their fallback timer, or finished) are skipped.
local function release_lock(lock_prefix, resource, token, scheduled_key, ready_key, notify_key, job_prefix)
  if resource and resource ~= '' and token and token ~= '' then
    local k = lock_prefix .. resource
    local holder = redis.call('GET', k)
    if holder == token or not holder then
      if holder then redis.call('DEL', k) end
      local wk = k .. ':waiters'
      for _ = 1, 16 do
        local w = redis.call('LPOP', wk)
        if not w then break end
        if redis.call('ZREM', scheduled_key, w) == 1 then
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
-- "field=N" adds N); flush() writes the totals
-- with one HINCRBY per distinct field, however many jobs the batch held.
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
local function flush(stats_key)
  for f, n in pairs(acc) do
    redis.call('HINCRBY', stats_key, f, n)
  end
end

-- The fence: the record must be processing under this very token.
local function owns(job_key, token)
  local f = redis.call('HMGET', job_key, 'status', 'token')
  return f[1] == 'processing' and f[2] == token
end
