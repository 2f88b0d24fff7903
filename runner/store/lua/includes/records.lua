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
