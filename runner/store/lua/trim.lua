-- trim: forget dead-letter entries past the dead retention (their records go too), and
-- start a new done generation when the current one is a quarter of the retention old
-- (done_gen in includes/done.lua: acks start one too, but an idle queue must age as well). Bounded
-- per call, whatever the backlog.
--
-- KEYS[1] dead         ZSET  id -> time of death ms
-- KEYS[2] done_meta    HASH  the current done generation
-- KEYS[3] done_prefix  (string)
-- KEYS[4] job_prefix   (string)
-- KEYS[5] census       HASH  jobs not done per "<type>|<version>"
-- KEYS[6] cancelled    ZSET  cancelled ids -> time of the cancel ms (entries past the done
--                            retention go, with their records; cancelled jobs left the census)
-- ARGV[1] now, ms ('' for the server's clock)
-- ARGV[2] dead retention, ms
-- ARGV[3] done retention, ms
-- ARGV[4] the most dead entries to remove in this call (<= 4000)
-- ARGV[5] done count bound
--
-- Returns {dead entries removed, the current done generation}.
--- @include "clock"
--- @include "calls"
--- @include "records"
--- @include "done"
local now = clock(ARGV[1])
local limit = tonumber(ARGV[4])
local dead = redis.call('ZRANGEBYSCORE', K.dead, '-inf', now - tonumber(ARGV[2]), 'LIMIT', 0, limit)
if #dead > 0 then
  local gone = {}
  for _, id in ipairs(dead) do
    local jk = K.job_prefix .. id
    local s = redis.pcall('GET', jk)
    local rec = type(s) == 'string' and rec_parse(s) or nil
    if rec then census(K.census, rec.type .. '|' .. rec.version, -1) end
    gone[#gone + 1] = jk
    gone[#gone + 1] = jk .. ':s'
  end
  redis.call('DEL', unpack(gone))  -- the caller keeps the limit within unpack's
end
call_many('ZREM', K.dead, dead, 1)
local old = redis.call('ZRANGEBYSCORE', K.cancelled, '-inf', now - tonumber(ARGV[3]), 'LIMIT', 0, limit)
if #old > 0 then
  local gone = {}
  for _, id in ipairs(old) do
    gone[#gone + 1] = K.job_prefix .. id
    gone[#gone + 1] = K.job_prefix .. id .. ':s'
  end
  redis.call('DEL', unpack(gone))
  call_many('ZREM', K.cancelled, old, 1)
end
local gen = done_gen(K.done_meta, K.done_prefix, now, tonumber(ARGV[3]), tonumber(ARGV[5]))
return {#dead, gen}
