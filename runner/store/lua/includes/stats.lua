-- The stats hash, counted once per call.

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
  for f, n in pairs(acc) do
    -- pcall: a stats hash damaged to another type loses these counts, never the
    -- transition (its writes are made; the scheduler renames the key aside).
    redis.pcall('HINCRBY', stats_key, f, n)
  end
  acc = {}
end
