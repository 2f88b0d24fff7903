-- audit: put one operator action on the audit trail, stamped with the server's time, and
-- keep the trail bounded by count and by age: the newest `most` entries at most, and
-- none whose last action is older than `max_age` (the oldest, at the tail, leave first;
-- at most 1000 per call, so one call's work stays bounded whatever the trail held before).
--
-- An action that repeats an earlier one (the same caller, action, queue and target: the
-- schedule, function, job type; see fold_key) whose entry was written less than `fold`
-- ms ago is folded into that entry instead of pushed: `repeats` (how many actions it
-- stands for), `last_at_ms`, `count` summed (a job's action counts 1), its job ids
-- gathered in `ids` (the first `max_ids`). So a flood of single actions from one token
-- is one entry an hour per target, and cannot push that token's own earlier, distinct
-- actions off the trail. A bulk action is folded at its end ("done"), never while it
-- runs; an interrupted one stays on its own.
--
-- The trail is newest first by each entry's last action (`last_at_ms`, else `at_ms`): an
-- entry folded into stands for the action just made, so it leaves its place and goes to
-- the head, with a new place number (it kept its place, below the actions between, and
-- the action just made was off the first page once enough came between). A bulk action's
-- entry rewritten as it goes keeps its place (its time is when it began) until it ends
-- folded into another.
--
-- KEYS[1] audit        LIST  JSON entries, newest first
-- ARGV[1] now, ms ('' for the server's clock)
-- ARGV[2] the entry: a JSON object without at_ms (added here)
-- ARGV[3] most entries kept
-- ARGV[4] max age, ms
-- ARGV[5] a bulk action's id ('' none): its entry, written when the action starts, is
--         replaced in place as the action goes (its count so far, then how it ended),
--         keeping its time; looked for among the newest 1000 entries, pushed anew if
--         it is not there (1000 other actions since)
-- ARGV[6] the fold window, ms ('' or 0: no folding)
-- ARGV[7] the most ids a folded entry names
--
-- Each entry gets a place number `n`, one more than the newest numbered entry's (or the
-- time in ms, when that is greater): the numbers fall strictly from head to tail whatever
-- the clock does. An entry keeps its number when it is rewritten in place; one folded into
-- goes to the head with a new one. So a reader's cursor finds where it stopped however
-- many entries landed, moved or left since (seek_trail.lua): an entry that keeps its
-- place is shown once, and one that moved to the head is not shown again.
--
-- Returns the entries the trail holds after the call.
--- @include "clock"
--- @include "history"
--- @include "places"
local now = clock(ARGV[1])
local most, max_age = tonumber(ARGV[3]), tonumber(ARGV[4])
-- A trail of another Redis type (another program's write, or damage) would refuse every
-- entry, each action done yet unaudited: it is renamed aside to <key>:corrupt (kept for
-- inspection) and the trail starts afresh (store/damage.py).
local kind = redis.call('TYPE', K.audit)['ok']
if kind ~= 'list' and kind ~= 'none' then redis.call('RENAME', K.audit, K.audit .. ':corrupt') end
local bulk = ARGV[5] or ''
local fold = tonumber(ARGV[6] or '') or 0
local max_ids = tonumber(ARGV[7] or '') or 100

local function numbered(entry, n)
  if n == nil then return entry end
  return string.sub(entry, 1, -2) .. ',"n":' .. string.format('%d', n) .. '}'
end

-- A place above every entry's: one more than the newest numbered entry's (an earlier
-- release's, unnumbered, may have landed above it during a rolling deploy; the newest 64
-- are looked at), or the time in ms when that is greater; nil only past another writer's
-- number.
local function fresh_place()
  local head = 0
  for _, e in ipairs(redis.call('LRANGE', K.audit, 0, 63)) do
    head = place_of(e) or 0
    if head > 0 then break end
  end
  local n = math.max(head + 1, tonumber(now))
  if n > 1125899906842624 then return nil end
  return n
end

-- The entry's place: a bulk action's own, replaced in place, or a new one at the head.
local here, fresh = nil, nil
if bulk ~= '' then
  local mark = '"bulk":' .. cjson.encode(bulk)
  for i, old in ipairs(redis.call('LRANGE', K.audit, 0, 999)) do
    if string.find(old, mark, 1, true) then
      local ok, entry = pcall(cjson.decode, old)
      local at = ok and type(entry) == 'table' and tonumber(entry.at_ms) or now
      redis.call('LSET', K.audit, i - 1, numbered(stamped(ARGV[2], string.format('%d', at)), place_of(old)))
      here = i - 1
      break
    end
  end
end
if here == nil then
  fresh = fresh_place()
  redis.call('LPUSH', K.audit, numbered(stamped(ARGV[2], now), fresh))
  here = 0
end

local function text(v)
  if v == nil or v == cjson.null then return '' end
  return tostring(v)
end

local FOLD_FIELDS = {'by', 'action', 'queue', 'schedule', 'function', 'type', 'edited', 'unconfirmed'}
local function fold_key(e)
  local parts = {e.bulk ~= nil and 'bulk' or 'one'}
  for _, f in ipairs(FOLD_FIELDS) do parts[#parts + 1] = text(e[f]) end
  return table.concat(parts, '\0')
end

local function final(e)
  return e.state == nil or e.state == 'done'
end

-- The ids and the job count an entry stands for (a job's action: its one id, count 1).
local function jobs_of(e)
  if type(e.ids) == 'table' then return e.ids, tonumber(e.count) or #e.ids end
  if e.job_id ~= nil and e.job_id ~= cjson.null then return {e.job_id}, 1 end
  return nil, tonumber(e.count)
end

local function merged(into, e)
  into.repeats = (tonumber(into.repeats) or 1) + (tonumber(e.repeats) or 1)
  into.last_at_ms = now
  into.n = nil  -- (its place goes with it: numbered() writes the new one)
  local ids, n = jobs_of(into)
  local more, m = jobs_of(e)
  if ids or more then
    local all = {}
    for _, list in ipairs({ids or {}, more or {}}) do
      for _, id in ipairs(list) do
        if #all < max_ids then all[#all + 1] = id end
      end
    end
    into.ids = #all > 0 and all or nil
    into.job_id = nil
  end
  if n or m then into.count = (n or 0) + (m or 0) end
  if into.expected ~= nil or e.expected ~= nil then
    into.expected = (tonumber(into.expected) or 0) + (tonumber(e.expected) or 0)
  end
  return cjson.encode(into)
end

-- Marks an entry of the same caller and action must hold (as JSON writes them), so the
-- look decodes those alone: a trail with 1000 other entries in the window took ~4 ms a
-- call decoding them all. A caller's name JSON could write another way (a '/', a letter
-- past ASCII) is no mark; the action, one of a few words, always is.
local function marks(e)
  local out = {'"action":' .. cjson.encode(text(e.action))}
  local by = text(e.by)
  if string.match(by, '^[%w%.:_@-]+$') then out[2] = '"by":"' .. by .. '"' end
  return out
end

local function has(old, wanted)
  for _, m in ipairs(wanted) do
    if not string.find(old, m, 1, true) then return false end
  end
  return true
end

-- An entry's times as the script writes them (digits): when it was written, and its
-- last action (a folded entry's last_at_ms, else at_ms); an entry without is as old as
-- can be.
local function times(old)
  local at = tonumber(string.match(old, '"at_ms":(%d+)')) or 0
  return at, tonumber(string.match(old, '"last_at_ms":(%d+)')) or at
end

-- Takes the entries at these indexes off the trail (each marked, then removed: the
-- first such mark from the head).
local function take(indexes)
  for k, i in ipairs(indexes) do
    local gone = 'folded:' .. now .. ':' .. k .. ':' .. redis.call('LLEN', K.audit)
    redis.call('LSET', K.audit, i, gone)
    redis.call('LREM', K.audit, 1, gone)
  end
end

-- The older entry of the same caller and target written within the window, looked for
-- below this one, newest first: its index and its entry (decoded), or nil. The trail is
-- in the order of its entries' last actions, so the first one whose last action is past
-- the window ends the look (none below could be within it).
local function prior_of(entry)
  local key, since, wanted = fold_key(entry), now - fold, marks(entry)
  local from = here + 1
  while from < here + 1000 do
    local chunk = redis.call('LRANGE', K.audit, from, from + 99)
    if #chunk == 0 then return nil end
    for i, old in ipairs(chunk) do
      local at, last = times(old)
      if last < since then return nil end
      local good, prior = false, nil
      if at >= since and has(old, wanted) then good, prior = pcall(cjson.decode, old) end
      if good and type(prior) == 'table' and final(prior) and fold_key(prior) == key then
        return from + i - 1, prior
      end
    end
    from = from + 100
  end
  return nil
end

local ok, entry = pcall(cjson.decode, ARGV[2])
if fold > 0 and ok and type(entry) == 'table' and final(entry) then
  local at, prior = prior_of(entry)
  if at then
    -- The older entry and this one go; what they stand for together goes to the head,
    -- the newest action's place (this one's, when it was pushed there).
    local together = merged(prior, entry)
    if here == 0 and fresh ~= nil then
      redis.call('LSET', K.audit, 0, numbered(together, fresh))
      take({at})
    else
      take({at, here})
      redis.call('LPUSH', K.audit, numbered(together, fresh_place()))
    end
  end
end

redis.call('LTRIM', K.audit, 0, most - 1)
for _ = 1, 1000 do
  local oldest = redis.call('LINDEX', K.audit, -1)
  if not oldest then break end
  local good, old = pcall(cjson.decode, oldest)
  -- An entry that is not JSON, or has no time, is as old as can be; one folded into is
  -- as old as its last action.
  local last = good and type(old) == 'table' and (tonumber(old.last_at_ms) or tonumber(old.at_ms)) or 0
  if last >= now - max_age then break end
  redis.call('RPOP', K.audit)
end
return redis.call('LLEN', K.audit)
