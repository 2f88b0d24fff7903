-- lookup: what Redis holds of one job, in one call (it reads, never writes): the record,
-- its state, its claim while it runs, and its outcome once done (the result kept on its
-- own for KEEP_RESULT, else the done generations, newest first).
--
-- KEYS[1] job          STRING  the record (its state hash is K.job .. ':s')
-- KEYS[2] claims       HASH    id -> claim
-- KEYS[3] done_meta    HASH    the current done generation
-- KEYS[4] done_prefix  (string)
-- KEYS[5] res_prefix   (string)
-- KEYS[6] dead         ZSET    id -> time of death ms
-- KEYS[7] scheduled    ZSET    id -> due ms
-- KEYS[8] cancelled    ZSET    id -> time of the cancel ms
-- KEYS[9] sleeping     ZSET    the ids of scheduled that are sleeping durable functions
-- KEYS[10] waiting     ZSET    the ids of scheduled that wait (a signal, an event, a child)
-- ARGV[1] job id
-- ARGV[2] cut (bytes, optional): a listing's bound. The record's payload, each state
--         value and the outcome's result and payload lines longer than this come back
--         cut to this many bytes, so a page of big jobs moves kilobytes, not megabytes.
--
-- ARGV[3] read (bytes, optional, with a cut): the most bytes of state values past the cut
--         this call reads whole to cut them (a big error keeps its type and message); a
--         value past what is left comes back empty, its size alone said.
-- ARGV[4] inline (bytes, optional, with a cut): a step log entry (step:<i>) up to this
--         long is read whole; a longer one is read as its summary (stephead:<i>, the
--         entry without its value, and its size: written beside it by step.lua and
--         wait.lua), or, for an entry written before summaries were kept, summarised here
--         within what is left of ARGV[3] (else its size alone). A summary read counts
--         against ARGV[3] too: past it, the step says its size alone.
-- ARGV[5] listed (with a cut): a row lists the last this many steps of the log
--         (records.LIST_STEPS), naming in sizes ('steps') how many before them it leaves out.
--
-- Returns {record or false, {state field, value, ...}, claim or false, outcome or false};
-- given a cut, a fifth element: {name, full length in bytes, ...} of what was cut.
--
-- Given a cut (a job list), the state hash is read whole (HGETALL) only when it is small
-- (MEMORY USAGE, SMALL): a durable
-- function's holds its checkpoint and its step log (4 MiB), which cost Redis 3-12 ms a
-- job to read into Lua, every client waiting. Its field names are read (HKEYS, at most
-- MAX_FIELDS), each value's size (HSTRLEN, O(1)), then only what the row shows:
-- kept signals' bodies never, big values within ARGV[3], steps as above.
--
-- A state hash of more than MAX_FIELDS fields (HLEN first, with or without a cut; a list
-- row's bound is LIST_FIELDS) is damage: only the fields of SHOWN are read, by name (with a cut, as above), and the
-- state's reply ends with the pair '\0wide', its count of fields (records.WIDE); a state
-- key of another type is the pair alone, with the count 0. A damaged state whose status
-- was not read gets the one its sets say (dead, cancelled, sleeping, waiting, scheduled:
-- a ZSCORE each, O(1)), else the view's default (queued; a claim says processing).
--
-- Given a cut, a record's first HEAD + cut bytes are read (GETRANGE: the whole record
-- when shorter). A big record is not read whole: GET of a 1 MiB record into Lua cost Redis
-- about 7 ms, during which every client waited (a page of 200 blocked it for a second).
-- Its first HEAD + cut bytes (GETRANGE) hold its fields and the payload's preview
-- whenever its fields before the payload take at most HEAD bytes; else it is read whole.
local HEAD = 8192

-- A step's summary past this many bytes is cut down to its short scalar fields (no
-- match, no error): one an earlier release wrote kept a wait's match, 4 KiB a step
-- (records.STEP_HEAD_MAX; step.lua and wait.lua write them within it).
local HEAD_MAX = 512
-- A state hash this small (MEMORY USAGE) is read whole, in one command, as before the
-- careful read below: the common case, a job without a durable log, costs what it did.
local SMALL = 16384
-- A state hash of more fields (HLEN, O(1)) is damage (another writer's): the scripts
-- write at most about 4,100 (records.MAX_STATE_FIELDS). Its field names are never read,
-- nor it whole: one of 300,000 fields held Redis 2.5 s a call (MEMORY USAGE, HKEYS, one
-- HSTRLEN a field). Only the fields a view shows of it are read, by name (SHOWN), and
-- the reply names it damaged (records.WIDE: its count of fields).
local MAX_FIELDS = 10000
-- A list row (given a cut) reads the field names of a state hash of at most LIST_FIELDS
-- fields (a sound one holds about 30 of its own, two per step of its log, MAX_STEPS 1,000,
-- and two per signal name kept), and sizes at most LIST_OTHER of its fields apart from the
-- steps: 150 rows of 9,990 fields each (just under MAX_FIELDS) held Redis 0.35-0.7 s for
-- one page. A wider one is read as a wide one, by name (SHOWN).
local LIST_FIELDS = 2200
local LIST_OTHER = 256
local SHOWN = {'status', 'attempt', 'reason', 'error', 'history', 'progress', 'checkpoint', 'children',
               'priority', 'requeued', 'deferrals', 'absorbed', 'enqueued_ms', 'ready_ms', 'started_ms',
               'finished_ms', 'lease_ms', 'run_attempt', 'run_started_ms', 'token', 'cancel_requested'}

local function trimmed(head)
  if #head <= HEAD_MAX then return head end
  local ok, e = pcall(cjson.decode, head)
  if not ok or type(e) ~= 'table' then return '\0' end
  local out = {}
  for _, key in ipairs({'name', 'kind', 'status', 'event', 'signal', 'child', 'ms', 'started_ms',
                        'finished_ms', 'until_ms', 'size'}) do
    local v = e[key]
    -- (a string is dropped, never cut: a cut could split a character)
    if type(v) == 'number' or type(v) == 'boolean' or (type(v) == 'string' and #v <= 128) then out[key] = v end
  end
  return cjson.encode(out)
end

-- A step log entry as a list shows it, from the entry itself (one written before
-- step.lua kept summaries): what it is, without its value, and its size.
local function summary(entry, len)
  local ok, e = pcall(cjson.decode, entry)
  -- (not JSON: damage, which the view shows as an unreadable step, as it would the entry)
  if not ok or type(e) ~= 'table' then return '\0' end
  if e[1] == 's' and type(e[2]) == 'string' then  -- a returned step, compact (records.py)
    e = {name = e[2], kind = 'step', status = 'ok', ms = e[4], finished_ms = e[5]}
  elseif e[1] == 'z' and type(e[2]) == 'string' then  -- a sleep, compact
    e = {name = e[2], kind = 'sleep', status = 'ok', started_ms = e[3], until_ms = e[4]}
  elseif e[1] ~= nil then
    return '\0'
  end
  e.value = nil
  e.size = len
  return trimmed(cjson.encode(e))
end

-- HMGET of many fields, in chunks (unpack's stack holds a few thousand at most).
local function hmget(key, fields)
  local out = {}
  for from = 1, #fields, 500 do
    local got = redis.call('HMGET', key, unpack(fields, from, math.min(from + 499, #fields)))
    for i = 1, #got do out[from + i - 1] = got[i] end
  end
  return out
end

-- The state a list row shows (see the header); big values named in sizes. Of the step
-- log, its last ARGV[5] entries (sizes says how many before them it leaves out); each
-- summary read counts against ARGV[3], so a row is bounded whatever the job holds.
-- ``all``: the whole hash (HGETALL) when it is small, read from it alike; else one
-- HSTRLEN a field, then one HMGET of what is read whole and one of the steps' summaries.
-- The state's field names and its readers: from the HGETALL ``all`` when given, else
-- from the hash itself (nil when it is no hash).
local function state_reader(sk, all, shown)
  local names, vals = {}, nil
  if shown then
    names = shown
  elseif all then
    vals = {}
    for i = 1, #all, 2 do
      names[#names + 1] = all[i]
      vals[all[i]] = all[i + 1]
    end
  else
    names = redis.pcall('HKEYS', sk)
    if names.err then return nil end
  end
  local function strlen(f)
    if vals then return vals[f] and #vals[f] or 0 end
    return redis.call('HSTRLEN', sk, f)
  end
  local function get(f)
    if vals then return vals[f] or false end
    return redis.call('HGET', sk, f)
  end
  local function mget(fs)
    if not vals then return hmget(sk, fs) end
    local got = {}
    for i, f in ipairs(fs) do got[i] = vals[f] or false end
    return got
  end
  return names, strlen, get, mget
end

-- The listed steps' summaries into ``out`` (``heads``: field, size pairs): each summary's
-- size first, those within the budget read, the rest say their size. Returns the budget left.
local function listed_heads(heads, budget, strlen, get, mget, out)
  local want, read = {}, {}
  for i = 1, #heads, 2 do
    local h = 'stephead:' .. string.sub(heads[i], 6)
    local hl = strlen(h)
    if hl > 0 and hl <= budget then
      budget = budget - hl
      want[#want + 1] = h
      read[i] = #want
    end
  end
  local got = #want > 0 and mget(want) or {}
  for i = 1, #heads, 2 do
    local f, len = heads[i], heads[i + 1]
    local v = read[i] and got[read[i]]
    if v then
      v = trimmed(v)
    elseif len <= budget and strlen('stephead:' .. string.sub(f, 6)) == 0 then
      -- an entry written before summaries were kept
      budget = budget - len
      v = summary(get(f), len)
    end
    out[#out + 1] = f
    out[#out + 1] = v or ('{"name":null,"status":"not listed","size":' .. len .. '}')
  end
  return budget
end

-- ``out`` with each field of ``names`` that ``got`` (an HMGET's reply) holds, and its value.
local function found_pairs(out, names, got)
  for i, f in ipairs(names) do
    if got[i] then
      out[#out + 1] = f
      out[#out + 1] = got[i]
    end
  end
  return out
end

local function listed_state(sk, cut, budget, inline, listed, sizes, all, shown)
  local names, strlen, get, mget = state_reader(sk, all, shown)
  if not names then return {} end
  -- The steps listed: [from, count) (none when the count is damaged: the view says so).
  -- (a damaged hash's steps are not listed: its step fields are not among those shown)
  -- (a sleeping job's count is the first number of its 'sleep' field: includes/asleep.lua)
  local count = not shown and (tonumber(get('steps')) or tonumber(string.match(get('sleep') or '', '^(%d+) ')))
  if not count or count ~= math.floor(count) or count < 0 then count = 0 end
  local from = math.max(0, count - listed)
  if from > 0 then
    sizes[#sizes + 1] = 'steps'
    sizes[#sizes + 1] = from
  end
  local whole, heads, out = {}, {}, {}
  local other = LIST_OTHER
  for _, f in ipairs(names) do
    local step = string.sub(f, 1, 5) == 'step:'
    local i = step and tonumber(string.sub(f, 6))
    if step and not (i and i >= from and i < count) then
      -- (a step the row does not list)
    elseif not step and other <= 0 then
      -- (past the fields a row sizes: another writer's)
    elseif string.sub(f, 1, 4) ~= 'sig:' and string.sub(f, 1, 9) ~= 'stephead:' then
      if not step then other = other - 1 end
      -- (not a kept signal's body, never shown; nor a step's summary, read with its step)
      local len = strlen(f)
      if len <= (step and inline or cut) then
        whole[#whole + 1] = f
      elseif step then
        heads[#heads + 1] = f
        heads[#heads + 1] = len
      else
        sizes[#sizes + 1] = f
        sizes[#sizes + 1] = len
        local v = ''
        if len <= budget then
          budget = budget - len
          v = string.sub(get(f), 1, cut)
        end
        out[#out + 1] = f
        out[#out + 1] = v
      end
    end
  end
  if #whole > 0 then found_pairs(out, whole, mget(whole)) end
  if #heads > 0 then listed_heads(heads, budget, strlen, get, mget, out) end
  return out
end
local id = ARGV[1]
local cut = tonumber(ARGV[2])
local sizes = {}
local rec, headed = nil, false
if cut then
  -- The first HEAD + cut bytes: the whole record when it is shorter (one command, as GET).
  local head = redis.pcall('GETRANGE', K.job, 0, HEAD + cut - 1)
  if type(head) == 'string' and #head > 0 and #head < HEAD + cut then
    rec = head
  elseif type(head) == 'string' and #head > 0 then
    local len = redis.call('STRLEN', K.job)
    local at = 0
    for _ = 1, 10 do
      at = string.find(head, '\31', at + 1, true)
      if not at or at > HEAD then at = nil break end
    end
    if len > HEAD + cut and at then
      -- As the cut below would have it: len - at > cut, since len > HEAD + cut >= at + cut.
      rec = head:sub(1, at + cut)
      sizes[1], sizes[2] = 'payload', len - at
      headed = true
    elseif len == HEAD + cut then
      rec, headed = head, false  -- (whole: cut below as a record read by GET)
    end
  end
end
if not rec then
  rec = redis.pcall('GET', K.job)
  if type(rec) == 'table' then rec = rec.err and ('\0' .. redis.call('TYPE', K.job)['ok']) or false end
end
local sk = K.job .. ':s'
local state
local width = redis.pcall('HLEN', sk)
if type(width) ~= 'number' then
  state = {'\0wide', '0'}  -- a key of another type: damage, which the view names (records.WIDE)
elseif width == 0 then
  state = {}  -- (no state hash)
elseif width > MAX_FIELDS or (cut and width > LIST_FIELDS) then
  if cut then
    state = listed_state(sk, cut, tonumber(ARGV[3]) or 0, 0, 0, sizes, false, SHOWN)
  else
    state = found_pairs({}, SHOWN, redis.call('HMGET', sk, unpack(SHOWN)))
  end
  state[#state + 1] = '\0wide'
  state[#state + 1] = tostring(width)
elseif cut then
  local all = false
  local bytes = redis.pcall('MEMORY', 'USAGE', sk, 'SAMPLES', 0)
  if type(bytes) == 'number' and bytes <= SMALL then
    all = redis.pcall('HGETALL', sk)
    if all.err then all = {} end
  end
  state = listed_state(sk, cut, tonumber(ARGV[3]) or 0, tonumber(ARGV[4]) or 0, tonumber(ARGV[5]) or 0,
                       sizes, all)
else
  state = redis.pcall('HGETALL', sk)
  if state.err then state = {} end
end
if state[#state - 1] == '\0wide' then
  local has = false
  for i = 1, #state - 2, 2 do
    if state[i] == 'status' then has = true end
  end
  if not has then  -- (its status unread: where the job is says it, else the view's default)
    -- (sleeping and waiting before scheduled: their ids are in scheduled too)
    for _, held in ipairs({{K.dead, 'dead'}, {K.cancelled, 'cancelled'}, {K.sleeping, 'sleeping'},
                           {K.waiting, 'waiting'}, {K.scheduled, 'scheduled'}}) do
      if type(redis.pcall('ZSCORE', held[1], id)) == 'string' then
        table.insert(state, 1, held[2]); table.insert(state, 1, 'status')
        break
      end
    end
  end
end
local claim = redis.pcall('HGET', K.claims, id)
if type(claim) ~= 'string' then claim = false end
local outcome = redis.pcall('GET', K.res_prefix .. id)
if type(outcome) ~= 'string' then
  outcome = false
  local gen = tonumber(redis.pcall('HGET', K.done_meta, 'gen')) or 0
  for g = gen, gen - 3, -1 do
    local o = redis.pcall('HGET', K.done_prefix .. g, id)
    if type(o) == 'string' then outcome = o break end
  end
end
if cut then
  -- The record's payload is its last part, after ten separators (records.py).
  if not headed and type(rec) == 'string' and #rec > cut and rec:sub(1, 1) ~= '\0' then
    local at = 0
    for _ = 1, 10 do
      at = string.find(rec, '\31', at + 1, true)
      if not at then break end
    end
    if at and #rec - at > cut then
      sizes[#sizes + 1] = 'payload'
      sizes[#sizes + 1] = #rec - at
      rec = rec:sub(1, at + cut)
    end
  end
  -- An outcome's lines: head, history, result, meta, payload (records.view).
  if outcome and #outcome > cut then
    local lines, from = {}, 1
    for _ = 1, 4 do
      local nl = string.find(outcome, '\n', from, true)
      if not nl then break end
      lines[#lines + 1] = outcome:sub(from, nl - 1)
      from = nl + 1
    end
    lines[#lines + 1] = outcome:sub(from)
    for i, name in pairs({[3] = 'result', [5] = 'payload'}) do
      if lines[i] and #lines[i] > cut then
        sizes[#sizes + 1] = name
        sizes[#sizes + 1] = #lines[i]
        lines[i] = lines[i]:sub(1, cut)
      end
    end
    outcome = table.concat(lines, '\n')
  end
  return {rec, state, claim, outcome, sizes}
end
return {rec, state, claim, outcome}
