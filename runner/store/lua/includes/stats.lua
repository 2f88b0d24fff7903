-- The stats hash, counted once per call.

-- A field is "<figure>|<type>[|<bucket>]" (observe/metrics.py). A type name that could be
-- no function's (past 252 bytes, the longest file stem, or holding a space, a control
-- character, "|" or "=") is counted as the malformed "?": another producer's record cannot
-- make a field that splits wrong or one as long as its name. Once a hash holds STATS_FIELDS
-- fields, a figure it holds no field for yet (another producer's type names, one each) is
-- added under the type "_other" instead: the hash stops growing, nothing is lost, and its
-- readers fold the same way (observe/figures.py).
local STATS_FIELDS = 10000
local function stat_type(t)
  if #t > 252 or string.find(t, '[%s%c|=]') then return '?' end
  return t
end
-- field's name with its type made countable, or folded into "_other" (``other``).
local function stat_field(field, other)
  local kind, rest = string.match(field, '^([%w_]+)|(.*)$')
  if not kind or kind == 'corrupt' then return field end  -- (a per-queue field, or a key's name)
  local bucket = ''
  if kind == 'lat' or kind == 'run' then
    local t, b = string.match(rest, '^(.*)|([%w%.]+)$')
    if t then rest, bucket = t, '|' .. b end
  end
  return kind .. '|' .. (other and '_other' or stat_type(rest)) .. bucket
end
-- HINCRBY of one field, bounded as above: a field new to the hash (its count is what was
-- just added) asks its size (HLEN, O(1)), and past STATS_FIELDS moves to "_other"; a field
-- it holds costs nothing more. pcall: a stats hash damaged to another type loses these
-- counts, never the transition (its writes are made; the scheduler renames the key aside).
local function stat_add(key, field, n)
  field = stat_field(field, false)
  if redis.pcall('HINCRBY', key, field, n) ~= n or n == 0 then return end
  local len = redis.pcall('HLEN', key)
  if type(len) == 'number' and len > STATS_FIELDS then
    redis.pcall('HDEL', key, field)
    redis.pcall('HINCRBY', key, stat_field(field, true), n)
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
