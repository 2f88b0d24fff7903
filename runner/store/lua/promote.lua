-- promote: move due jobs (delayed, retrying, deferred) from scheduled to ready.
--
-- KEYS[1] scheduled    ZSET  id -> due ms
-- KEYS[2] ready        LIST
-- KEYS[3] notify       LIST
-- KEYS[4] job prefix   (string)
-- ARGV[1] now_ms
-- ARGV[2] the most jobs to move in this call
--
-- Returns {moved, next due ms or -1 when nothing is scheduled}.
local now, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, limit)
local moved = 0
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  local jk = KEYS[4] .. id
  local kind = redis.call('TYPE', jk)['ok']
  if kind == 'hash' then
    local st = redis.call('HGET', jk, 'status')
    if st == 'scheduled' or st == 'retrying' then
      redis.call('HSET', jk, 'status', 'queued')
    end
    -- Any other state is handed to claim, which buries a malformed record with a
    -- reason and drops a stray id; promote never decides that on its own.
    redis.call('LPUSH', KEYS[2], id)
    moved = moved + 1
  elseif kind ~= 'none' then
    redis.call('LPUSH', KEYS[2], id)
    moved = moved + 1
  end
end
if moved > 0 then wake(KEYS[3]) end
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local due = -1
if nxt[2] then due = tonumber(nxt[2]) end
return {moved, due}
