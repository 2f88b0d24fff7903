-- A job's limits: parsing them, their holders and rate tokens.

-- Limits: a job's `limits` field holds one "<n> <key>" line per limit it is under (a
-- RESOURCE_KEY is limit 1 on "r:<resource>"). Each limit key has a holders set,
--   <lim prefix><key>      ZSET  claim token -> lease deadline ms; "=<job id>" -> the
--                                 end of a slot reserved for a woken waiter
--   <lim prefix><key>:w    LIST  ids of jobs parked until a slot frees, oldest first
-- and the queue's `limwait` ZSET names the keys with parked jobs (the scheduler's sweep
-- wakes what a lost release would strand). A job is parked once (one entry per waiting
-- job); a release hands its slot to the first parked job by reserving it, so the woken job
-- gets the slot and no later arrival can take it first.
local RESERVE_MS = 10000
-- A handler's RateLimited is free this many times per job (retry.lua); then it counts.
local RATE_LIMITED_FREE = 100

local LIMIT_LINE = '^(%d+) (.+)$'
local function parse_limits(raw)
  local out = {}
  if type(raw) ~= 'string' or raw == '' then return out end
  if not string.find(raw, '\n', 1, true) then
    -- One line (a job under one limit, the common case): the loop's match, without the loop.
    local n, key = string.match(raw, LIMIT_LINE)
    if n then out[1] = {n = tonumber(n), key = key} end
    return out
  end
  for line in string.gmatch(raw, '[^\n]+') do
    local n, key = string.match(line, LIMIT_LINE)
    if n then out[#out + 1] = {n = tonumber(n), key = key} end
  end
  return out
end

-- Rate limits share the field: a line "<n>/<period ms> <key>" (which parse_limits skips)
-- is a token bucket of n starts per period on the STRING <lim prefix><key>, kept as GCRA's
-- theoretical arrival time (ms): a burst of n, then one start every period / n.
local function parse_rates(raw)
  local out = {}
  -- (Every rate line holds a '/'; a concurrency key may too, so one means a look.)
  if type(raw) ~= 'string' or raw == '' or not string.find(raw, '/', 1, true) then return out end
  for line in string.gmatch(raw, '[^\n]+') do
    local n, p, key = string.match(line, '^(%d+)/(%d+) (.+)$')
    if n and tonumber(n) > 0 then out[#out + 1] = {n = tonumber(n), period = tonumber(p), key = key} end
  end
  return out
end

-- Take the next token of a rate for one start: 0 when it is due now, else the ms it is
-- due at. Either way it is this job's (reserved), so held-back jobs are spread one per
-- token instead of all waking for the same one. The key expires once the bucket is full
-- again. (SET replaces a key damaged to another type: the bucket starts afresh.)
local function take_rate(lim_prefix, r, now, not_after)
  local k = lim_prefix .. r.key
  local step = r.period / r.n
  local raw = redis.pcall('GET', k)
  local tat = type(raw) == 'string' and tonumber(raw) or now
  if tat < now then tat = now end
  local at = tat - (r.period - step)
  -- A token due after the job's MAX_AGE would only be spent on a job that expires then:
  -- left for the jobs behind it (-1: the caller expires this one now).
  if not_after and at > not_after then return -1 end
  redis.call('SET', k, string.format('%.3f', tat + step), 'PX', math.ceil(tat + step - now) + 1)
  if at <= now then return 0 end
  return math.ceil(at)
end

-- A limit's keys damaged to another Redis type would fail every transition of the jobs
-- under it, with ids already popped or unclaimed: they are renamed aside to
-- <key>:corrupt (what a damaged waiter list held is gone with it, as for ready) and the
-- limit starts afresh.
local function heal_limit(k)
  for _, kk in ipairs({{k, 'zset'}, {k .. ':w', 'list'}}) do
    local kind = redis.call('TYPE', kk[1])['ok']
    if kind ~= kk[2] and kind ~= 'none' then redis.call('RENAME', kk[1], kk[1] .. ':corrupt') end
  end
end

-- A command on a limit's holders: a key damaged to another type is renamed aside
-- (heal_limit) and the command runs again on the fresh key. The common case costs no
-- TYPE check.
local function on_holders(cmd, k, ...)
  local r = redis.pcall(cmd, k, ...)
  if type(r) == 'table' and r.err then
    heal_limit(k)
    r = redis.call(cmd, k, ...)
  end
  return r
end

-- Drop holders whose lease lapsed (their worker died and nobody released them).
local function purge_holders(k, now)
  on_holders('ZREMRANGEBYSCORE', k, '-inf', now)
end
