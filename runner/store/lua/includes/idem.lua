-- Idempotency keys.

-- The namespaced key of an idempotency key: one function's keys never meet another's.
local function idem_key(idem_prefix, typ, key)
  return idem_prefix .. typ .. ':' .. key
end

-- Let go of an idempotency key if it still names this job (a job that died or was
-- deleted: the key is free for a new request). Never touches another job's key.
local function free_idem(idem_prefix, typ, key, id)
  if not key or key == '' or not typ then return end
  local ik = idem_key(idem_prefix, typ, key)
  local held = redis.pcall('GET', ik)
  if type(held) == 'string' and string.match(held, '^(%S+)') == id then redis.call('DEL', ik) end
end
