-- Claims: their entries, the token fence, and letting them go.
--- @include "calls"

-- Claims live in the queue's claims hash: id -> "<token> <attempt> <started_ms> <flags>",
-- where flags holds 'i' when the record has an idempotency key, 'r' when it is under
-- limits (a resource or concurrency key), so a settling script reads the record only for
-- those; 'p' while the job is claimed ahead of a free executor and has not started (its
-- attempt is not spent until it does), 'x' once its worker gave it up at shutdown with the
-- handler still running, 's' when the job has a state hash (a history, an error, a
-- checkpoint: see the records below), 'w' when someone waits for its end (the settling
-- script then publishes its id; see waited below), 'c' once a cancel asked the run to stop
-- (cancel.lua; renew tells the worker), 'h' (with 'p') while it waits for its executor to
-- be ready to start it (a child's job claimed ahead from its claim, claim.lua; one whose
-- child is starting, hold.lua: a lapse then spends nothing, however often)
-- ('-': none of these).
-- hmget_many() reads the entries of many ids with one HMGET per 4000; parse_claim()
-- splits one (nil for none or a damaged one).
-- A settle gives up its claim before it writes the set its job goes to (scheduled, dead):
-- a set damaged to another type would fail that write with the claim already gone, and
-- leave the job in no structure. Such a script checks its sets first and refuses whole,
-- before any write: the claim stays, the worker settles again, and the settle lands once
-- the scheduler's reclaim has put the damaged key aside. ``sets``: {{name, key}, ...}.
-- -> an error reply, or nil when every set is sound.
local function damaged_set(sets)
  for _, s in ipairs(sets) do
    if type(redis.pcall('ZSCORE', s[2], '')) == 'table' then
      return redis.error_reply('settle refused: the ' .. s[1] .. ' key of this queue holds the wrong Redis type')
    end
  end
  return nil
end

local function hmget_many(key, ids)
  local out = {}
  for s = 1, #ids, 4000 do
    local part = redis.call('HMGET', key, unpack(ids, s, math.min(s + 3999, #ids)))
    for j = 1, #part do out[#out + 1] = part[j] end
  end
  return out
end
local function parse_claim(raw)
  if type(raw) ~= 'string' then return nil end
  local tok, attempt, started, flags = string.match(raw, '^(%S+) (%d+) (%d+) (%S+)$')
  if not tok then return nil end
  -- attempt_s: the attempt as written, for text built from it (formatting a number costs
  -- more than the rest of a settle), unless it has leading zeros (damage: "007" would be
  -- no JSON number in a done job's view). No flags ('-', most claims): every flag field nil.
  local n = attempt == '1' and 1 or tonumber(attempt)  -- (a first attempt, most: no strtod)
  local c = {token = tok, attempt = n, attempt_s = string.byte(attempt) == 48 and tostring(n) or attempt,
    started = started, flags = flags}
  if flags ~= '-' then
    c.idem = string.find(flags, 'i', 1, true) ~= nil
    c.res = string.find(flags, 'r', 1, true) ~= nil
    c.prefetched = string.find(flags, 'p', 1, true) ~= nil
    c.exiting = string.find(flags, 'x', 1, true) ~= nil
    c.state = string.find(flags, 's', 1, true) ~= nil
    c.waited = string.find(flags, 'w', 1, true) ~= nil
    c.cancel = string.find(flags, 'c', 1, true) ~= nil
    c.held = string.find(flags, 'h', 1, true) ~= nil
  end
  return c
end

-- The claim entries of a batch whose ids stand in ARGV from index `first`, one every
-- `stride` arguments (one HMGET for the whole batch).
local function batch_claims(claims_key, first, stride, n)
  local ids = {}
  for i = 0, n - 1 do ids[#ids + 1] = ARGV[first + i * stride] end
  return hmget_many(claims_key, ids)
end

-- Settled jobs give up their claims and leases: one HDEL and two ZREMs for the batch
-- (the leases and their claim times, leases_key .. ':since', the processing list's index).
local function unclaim(claims_key, leases_key, ids)
  call_many('HDEL', claims_key, ids, 1)
  call_many('ZREM', leases_key, ids, 1)
  call_many('ZREM', leases_key .. ':since', ids, 1)
end

-- The fence: the job must hold a claim under this very token (no claim hands out an
-- empty one). Returns the parsed claim, or nil when the token does not own the job.
local function fence(raw, token)
  local c = parse_claim(raw)
  if not c or token == '' or c.token ~= token then return nil end
  return c
end

-- A claim entry as written: "<token> <attempt> <started_ms> <flags>", the flags made by
-- claim_flags (in its order, '-' for none); flags_of(c) gives those of a parsed claim.
-- The flags go positionally, not in a table: a claim writes an entry for every job.
local function claim_flags(idem, res, prefetched, exiting, state, waited, cancel, held)
  -- (Most claims: none but perhaps 'p', no string built.)
  if not (idem or res or exiting or state or waited or cancel or held) then return prefetched and 'p' or '-' end
  local flags = (idem and 'i' or '') .. (res and 'r' or '') .. (prefetched and 'p' or '') ..
    (exiting and 'x' or '') .. (state and 's' or '') .. (waited and 'w' or '') .. (cancel and 'c' or '') ..
    (held and 'h' or '')
  return flags == '' and '-' or flags
end
local function flags_of(c)
  return claim_flags(c.idem, c.res, c.prefetched, c.exiting, c.state, c.waited, c.cancel, c.held)
end
local function claim_entry(token, attempt, started, flags)
  return token .. ' ' .. attempt .. ' ' .. started .. ' ' .. flags
end
