-- The stats hash, counted once per call.

-- A field is "<figure>|<type>[|<bucket>]" (observe/metrics.py). A type name that could be
-- no function's (past 252 bytes, the longest file stem, or holding a space, a control
-- character, "|" or "=") is counted as the malformed "?": another producer's record cannot
-- make a field that splits wrong or one as long as its name.
--
-- Every writer counts through stat_add (the worker's summed successes too: count.lua), so
-- one rule decides, per type: a type counted before its hash held STATS_FIELDS fields owns
-- its names ("own|<type>" marks it), and every figure of it is counted under them, a
-- figure new to it too; a type first seen after has every figure added under "_other":
-- the hash stops growing, nothing is lost, and its readers fold the same way
-- (observe/figures.py). (A type that counted before the mark existed owns its names too:
-- it holds an enqueued, succeeded, retried or dead field.) Past STATS_MOST fields, which
-- only owned types' new figures or another writer reach, any new field goes to "_other".
local STATS_FIELDS = 10000
local STATS_MOST = 20000  -- (store/stats.py STATS_WHOLE: the most a reader reads whole)
local function stat_type(t)
  if #t > 252 or string.find(t, '[%s%c|=]') then return '?' end
  return t
end
-- A field's figure, type and bucket ('' or "|<le>"); nil for a per-queue field, a
-- damaged key's count ("corrupt|<key>") or a type's mark.
local function stat_split(field)
  local kind, rest = string.match(field, '^([%w_]+)|(.*)$')
  if not kind or kind == 'corrupt' or kind == 'own' then return nil end
  local bucket = ''
  if kind == 'lat' or kind == 'run' then
    local t, b = string.match(rest, '^(.*)|([%w%.]+)$')
    if t then rest, bucket = t, '|' .. b end
  end
  return kind, rest, bucket
end
-- HINCRBY of one field, bounded as above. A field the hash holds costs nothing more; a
-- new one asks whether its type owns names (HSETNX of its mark, O(1)) and the hash's size
-- (HLEN, O(1)), and moves to "_other" when it may not stay. pcall: a stats hash damaged to
-- another type loses these counts, never the transition (its writes are made; the
-- scheduler renames the key aside).
local function stat_add(key, field, n)
  if n == 0 then return end  -- (a field of 0 is no figure: it would only grow the hash)
  local kind, t, bucket = stat_split(field)
  if kind then
    t = stat_type(t)
    field = kind .. '|' .. t .. bucket
  end
  if redis.pcall('HINCRBY', key, field, n) ~= n or not kind or t == '_other' then return end
  local len = redis.pcall('HLEN', key)
  if type(len) ~= 'number' then return end
  local mark = 'own|' .. t
  local owned
  if redis.pcall('HSETNX', key, mark, 1) == 0 then
    owned = len <= STATS_MOST
  else
    owned = len <= STATS_FIELDS
    if not owned then  -- (one that counted before the mark: any of these is its own)
      local held = redis.pcall('HMGET', key, 'enqueued|' .. t, 'succeeded|' .. t, 'retried|' .. t, 'dead|' .. t)
      local names = {'enqueued|', 'succeeded|', 'retried|', 'dead|'}
      for i = 1, 4 do
        if type(held) == 'table' and held[i] and names[i] .. t ~= field then owned = len <= STATS_MOST end
      end
    end
    if not owned then redis.pcall('HDEL', key, mark) end
  end
  if not owned then
    redis.pcall('HDEL', key, field)
    redis.pcall('HINCRBY', key, kind .. '|_other' .. bucket, n)
  end
end

-- Count every stats field named in a space-separated list ("field" adds 1,
-- "field=N" adds N); tally() counts one field given whole (it may hold spaces);
-- flush() writes the totals with one HINCRBY per distinct field, however many jobs
-- the batch held, and starts the count again (a second flush writes only what was
-- counted since: a script that flushed per job counted a batch's k-th job k times).
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
  for f, n in pairs(acc) do stat_add(stats_key, f, n) end
  acc = {}
end
