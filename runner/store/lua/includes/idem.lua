-- Idempotency keys.

-- The namespaced key of an idempotency key: one function's keys never meet another's.
local function idem_key(idem_prefix, typ, key)
  return idem_prefix .. typ .. ':' .. key
end

-- Let go of an idempotency key if it still names this job (a job that died or was
-- deleted: the key is free for a new request). Never touches another job's key. A job
-- that ended (dead or cancelled, ``keep_ms`` its retention) is remembered under
-- idem:~ended:<type>:<key> for as long as its record is kept, so a search by key finds
-- it (GET /jobs?idempotency_key=): the latest such job of the key, whoever holds it now.
local function free_idem(idem_prefix, typ, key, id, keep_ms)
  if not key or key == '' or not typ then return end
  if keep_ms and keep_ms > 0 then
    redis.call('SET', idem_prefix .. '~ended:' .. typ .. ':' .. key, id, 'PX', keep_ms)
  end
  local ik = idem_key(idem_prefix, typ, key)
  local held = redis.pcall('GET', ik)
  if type(held) == 'string' and string.match(held, '^(%S+)') == id then redis.call('DEL', ik) end
end
