-- requeue: move one dead job back to ready with a fresh attempt budget, optionally
-- with a new (already validated) payload and version. Its idempotency key (freed when it
-- died) is taken again when it is free; when another job took it meanwhile, the job goes
-- back without its key, and its history says so.
--
-- KEYS[1] dead         ZSET
-- KEYS[2] ready        LIST
-- KEYS[3] notify       LIST
-- KEYS[4] job          HASH  the record
-- KEYS[5] idem prefix  (string)
-- ARGV[1] now, ms ('' for the server's clock)
-- ARGV[2] job id
-- ARGV[3] payload (JSON, '' to keep)
-- ARGV[4] version ('' to keep)
-- ARGV[5] payload hash of the payload it goes back with ('' to keep the stored one)
-- ARGV[6] history entry (JSON, '' none): who requeued it
--
-- Returns 1 requeued, 2 requeued without its idempotency key, -1 not in the dead-letter set.
local now, id = clock(ARGV[1]), ARGV[2]
if redis.call('ZREM', KEYS[1], id) == 0 then return -1 end
if redis.call('TYPE', KEYS[4])['ok'] ~= 'hash' then return -1 end
local code = 1
local f = redis.call('HMGET', KEYS[4], 'type', 'idem_key', 'idem_hash', 'history')
local set = {'status', 'queued', 'attempt', 0, 'ready_ms', now, 'enqueued_ms', now, 'deferrals', 0}
local entry = ARGV[6]
if f[2] and f[2] ~= '' then
  local hash = ARGV[5] ~= '' and ARGV[5] or (f[3] or '-')
  local ik = idem_key(KEYS[5], f[1], f[2])
  local mark = redis.pcall('GET', ik)
  if not mark or (type(mark) == 'string' and string.match(mark, '^(%S+)') == id) then
    redis.call('SET', ik, id .. ' ' .. hash)
    set[#set + 1] = 'idem_hash'
    set[#set + 1] = hash
  else
    code = 2
    redis.call('HDEL', KEYS[4], 'idem_key', 'idem_hash')
    local note = '{"outcome":"key dropped","message":"idempotency key ' .. cjson.encode(f[2]):sub(2, -2) ..
      ' is held by another job","at_ms":' .. now .. '}'
    with_history(set, f[4], note)
    f[4] = set[#set]
  end
end
if entry ~= '' then with_history(set, f[4], entry) end
redis.call('HSET', KEYS[4], unpack(set))
redis.call('HDEL', KEYS[4], 'reason', 'finished_ms', 'token', 'lost_token', 'refunds')
if ARGV[3] ~= '' then redis.call('HSET', KEYS[4], 'payload', ARGV[3]) end
if ARGV[4] ~= '' then redis.call('HSET', KEYS[4], 'version', ARGV[4]) end
redis.call('PERSIST', KEYS[4])
redis.call('LPUSH', KEYS[2], id)
wake(KEYS[3])
return code
