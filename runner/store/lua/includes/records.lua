-- A job's record as stored, and the census of jobs not done.

-- One match for the whole record (a find and a sub per field cost 2.5 times as much, on
-- every claim): each field runs to the next separator, the payload is the rest.
local REC_PATTERN = '^1\31([^\31]*)\31([^\31]*)\31([^\31]*)\31([^\31]*)\31([^\31]*)\31([^\31]*)\31([^\31]*)\31([^\31]*)\31([^\31]*)\31(.*)$'
-- The same match with max_attempts and created_ms integers ('-'?digits), tried first: a
-- record it reads is known sound there (ints = true: the claim's check of them is free),
-- any other is read by REC_PATTERN and judged field by field (a damaged one, rare). (Each
-- pattern one literal: a concatenation is made again on every call of every script that
-- includes this file.)
local REC_PATTERN_INTS = '^1\31([^\31]*)\31([^\31]*)\31(%-?%d+)\31(%-?%d+)\31([^\31]*)\31([^\31]*)\31([^\31]*)\31([^\31]*)\31([^\31]*)\31(.*)$'
-- tostring(now), formatted once per call however many jobs a script writes with it.
local fmt_now_n, fmt_now_s
local function now_text(now)
  if now ~= fmt_now_n then fmt_now_n, fmt_now_s = now, tostring(now) end
  return fmt_now_s
end

local function rec_parse(s)
  if type(s) ~= 'string' then return nil end
  local a, b, c, d, e, f, g, h, i, p = string.match(s, REC_PATTERN_INTS)
  if a then
    return {type = a, version = b, max_attempts = c, created_ms = d, idem_key = e, idem_hash = f, resource_key = g,
      limits = h, meta = i, payload = p, ints = true}
  end
  a, b, c, d, e, f, g, h, i, p = string.match(s, REC_PATTERN)
  if not a then return nil end
  return {type = a, version = b, max_attempts = c, created_ms = d, idem_key = e, idem_hash = f, resource_key = g,
    limits = h, meta = i, payload = p}
end

local function rec_encode(t)
  -- One concatenation (one string built), the fields in the order drawn above.
  return '1\31' .. (t.type or '') .. '\31' .. (t.version or '') .. '\31' .. (t.max_attempts or '') .. '\31' ..
    (t.created_ms or '') .. '\31' .. (t.idem_key or '') .. '\31' .. (t.idem_hash or '') .. '\31' ..
    (t.resource_key or '') .. '\31' .. (t.limits or '') .. '\31' .. (t.meta or '') .. '\31' .. (t.payload or '')
end

-- The census: jobs not done, per "<type>|<version>", for the deploy gate (one HGETALL,
-- whatever the depth). Counted at enqueue, uncounted when a job is done or deleted. A
-- field at 0 stays (its readers, census.py and tagset.py, count it as no job): at light
-- load each job takes its type from 1 to 0 and back, and an HDEL at 0 cost a command a
-- job. The fields are one per type and version ever enqueued. Below 0 (damage, or jobs
-- of a release that counted otherwise) the field is dropped, so it counts from 0 again.
-- Another writer's records (an outbox entry) name any type: one no function can have
-- (past 252 bytes, or holding a space, a control character, "|" or "="; a version not
-- digits) is counted as "?|<version>" ("?|?"), the same going in and out, so a 100 KB
-- name is no 100 KB field kept for ever. (A field per well-formed name stays: bounding
-- their count asked HLEN whenever a type's count left 0, every job at light load.)
-- A limit key's placement marker, "<lim prefix><key>:at" (jobs.lua, mark_placed): the
-- count of this partition's jobs under that first key not yet done, counted in and out
-- where the census counts them (a dead job stays in until it is deleted: it may be
-- requeued here). unplace counts one job out of marker `mk`: one GETDEL when it was the
-- last, and a SET of the rest when others remain, their TTL a day again (a bound for a
-- count some end missed; the next enqueue of the key sets the retention's).
local PLACED_KEEP_MS = 25 * 3600000
local function unplace(mk)
  local v = redis.pcall('GETDEL', mk)
  if type(v) ~= 'string' then return end  -- absent (or damaged: the next mark replaces it)
  local n = tonumber(v)
  if n and n > 1 then redis.call('SET', mk, n - 1, 'PX', PLACED_KEEP_MS) end
end

-- A job counted into its first key's marker says so in its record: its limits field ends
-- in an empty line ("\n", one byte written with the record, no command; parse_limits skips
-- it). Only such a job counts out at its end: one never counted (a follow-up its parent's
-- ack wrote, a job of a queue of one partition, one of a release before the count) would
-- take the count of a job that is, and its key would not be found where that job waits.
-- An old job's marker ("1", never counted out) goes by its TTL.
local function counted_in(limits)
  return type(limits) == 'string' and string.byte(limits, -1) == 10
end
local function counted_key(limits)
  if not counted_in(limits) then return nil end
  return string.match(limits, '^[%d/]+ ([^\n]+)')
end

-- A job's limits as rendered, without that flag (another writer's entry that carries it is
-- counted by this enqueue alone).
local function unflagged_limits(limits)
  if string.byte(limits, -1) ~= 10 then return limits end
  return (string.match(limits, '^(.-)\n*$'))
end

-- unplace for a job of `limits` (its record's field) counted out of the census `census_key`
-- (the marker sits under the same queue tag: "<base>census" and "<base>lim:"): nothing for a
-- job never counted in (no command: a queue of one partition pays none).
local function unmark(census_key, limits)
  local first = counted_key(limits)
  if first and string.sub(census_key, -6) == 'census' then
    unplace(string.sub(census_key, 1, -7) .. 'lim:' .. first .. ':at')
  end
end

local function census(key, field, n)
  if not field or field == '|' then return end
  local t, ver = string.match(field, '^(.*)|([^|]*)$')
  if not t or #t > 252 or string.find(t, '[%s%c|=]') or not string.match(ver, '^%d+$') then
    field = '?|' .. ((ver and string.match(ver, '^%d+$') and #ver <= 10) and ver or '?')
  end
  local v = redis.pcall('HINCRBY', key, field, n)
  if type(v) ~= 'number' then return end
  if v < 0 then redis.pcall('HDEL', key, field) end
end
