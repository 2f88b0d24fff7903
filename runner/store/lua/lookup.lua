-- lookup: what Redis holds of one job, in one call (it reads, never writes): the record,
-- its state, its claim while it runs, and its outcome once done (the result kept on its
-- own for KEEP_RESULT, else the done generations, newest first).
--
-- KEYS[1] job          STRING  the record (its state hash is K.job .. ':s')
-- KEYS[2] claims       HASH    id -> claim
-- KEYS[3] done_meta    HASH    the current done generation
-- KEYS[4] done_prefix  (string)
-- KEYS[5] res_prefix   (string)
-- ARGV[1] job id
-- ARGV[2] cut (bytes, optional): a listing's bound. The record's payload, each state
--         value and the outcome's result and payload lines longer than this come back
--         cut to this many bytes, so a page of big jobs moves kilobytes, not megabytes.
--
-- Returns {record or false, {state field, value, ...}, claim or false, outcome or false};
-- given a cut, a fifth element: {name, full length in bytes, ...} of what was cut.
--
-- Given a cut, a big record is not read whole: GET of a 1 MiB record into Lua cost Redis
-- about 7 ms, during which every client waited (a page of 200 blocked it for a second).
-- Its first HEAD + cut bytes (GETRANGE) hold its fields and the payload's preview
-- whenever its fields before the payload take at most HEAD bytes; else it is read whole.
local HEAD = 8192
local id = ARGV[1]
local cut = tonumber(ARGV[2])
local sizes = {}
local rec, headed = nil, false
if cut then
  local len = redis.pcall('STRLEN', K.job)
  if type(len) == 'number' and len > HEAD + cut then
    local head = redis.call('GETRANGE', K.job, 0, HEAD + cut - 1)
    local at = 0
    for _ = 1, 10 do
      at = string.find(head, '\31', at + 1, true)
      if not at or at > HEAD then at = nil break end
    end
    if at then
      -- As the cut below would have it: len - at > cut, since len > HEAD + cut >= at + cut.
      rec = head:sub(1, at + cut)
      sizes[1], sizes[2] = 'payload', len - at
      headed = true
    end
  end
end
if not headed then
  rec = redis.pcall('GET', K.job)
  if type(rec) == 'table' then rec = rec.err and ('\0' .. redis.call('TYPE', K.job)['ok']) or false end
end
local state = redis.pcall('HGETALL', K.job .. ':s')
if state.err then state = {} end
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
  for i = 2, #state, 2 do
    if #state[i] > cut then
      sizes[#sizes + 1] = state[i - 1]
      sizes[#sizes + 1] = #state[i]
      state[i] = state[i]:sub(1, cut)
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
