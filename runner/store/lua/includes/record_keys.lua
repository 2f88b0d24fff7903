-- Reading a job's record from its keys (one damaged is set aside), and their expiry.
--- @include "records"

-- Records. A job is two keys under its queue's tag:
--   <job prefix><id>     STRING  "1" then, separated by \31 (US): type, version,
--                                max_attempts, created_ms, idem_key, idem_hash,
--                                resource_key, limits, meta, and the payload (JSON) last
--   <job prefix><id>:s   HASH    its state once it has one: status (absent: queued),
--                                attempt, ready_ms, started_ms, finished_ms, error,
--                                reason, history, checkpoint, deferrals, woken,
--                                lost_token, refunds, rated, ratelimits, priority (1-9,
--                                absent: 0), requeued (times requeued from dead),
--                                absorbed and debounce (a DEBOUNCE burst's job: the
--                                enqueues merged into it; its burst marker's key while
--                                it was never claimed, see jobs.lua)
--                                (absent fields: their defaults)
-- A job that waits untouched is the string alone (one key, no hash: the payload is the
-- bulk of it). A done job keeps neither: its outcome goes to the done generations.

-- Read a job's record: (record, nil), or (nil, why) for a missing or malformed one. A
-- key of another type is renamed aside to <key>:corrupt.
local function rec_load(jk)
  local s = redis.pcall('GET', jk)
  if type(s) == 'table' and s.err then
    local kind = redis.call('TYPE', jk)['ok']
    redis.call('RENAME', jk, jk .. ':corrupt')
    return nil, 'malformed record: a Redis ' .. kind .. ' instead of a string; kept at ' .. jk .. ':corrupt'
  end
  if not s then return nil, 'malformed record: no job record for this id' end
  local rec = rec_parse(s)
  if not rec then return nil, 'malformed record: not a record of this runner (' .. string.format('%q', string.sub(s, 1, 40)) .. ')' end
  return rec, nil
end

-- A record's fields without its payload (payload nil), for a script that needs no
-- payload: a record longer than REC_HEAD bytes is read by its head (GETRANGE) when its
-- fields fit there, never whole (GET of a 1 MiB record into Lua cost Redis 7-25 ms, every
-- client waiting). Anything else is read as rec_load reads it, with the same answers.
local REC_HEAD = 8192
-- GETRANGE's bounds as text: a number passed to redis.call is formatted on every call
-- (%.17g, about 2,700 instructions each), two per job a claim reads.
local REC_HEAD_FIRST, REC_HEAD_LAST = '0', '8191'  -- (REC_HEAD - 1)
local REC_HEAD_PATTERN = '^1\31([^\31]*)\31([^\31]*)\31([^\31]*)\31([^\31]*)\31([^\31]*)\31([^\31]*)\31' ..
  '([^\31]*)\31([^\31]*)\31([^\31]*)\31'
local function rec_head(jk)
  local len = redis.pcall('STRLEN', jk)
  if type(len) ~= 'number' or len <= REC_HEAD then return rec_load(jk) end
  local head = redis.call('GETRANGE', jk, REC_HEAD_FIRST, REC_HEAD_LAST)
  local a, b, c, d, e, f, g, h, i = string.match(head, REC_HEAD_PATTERN)
  if not a then return rec_load(jk) end
  return {type = a, version = b, max_attempts = c, created_ms = d, idem_key = e, idem_hash = f, resource_key = g,
    limits = h, meta = i}, nil
end

-- rec_load for a script that sends the payload of only some of the jobs it reads (a
-- claim: not of those it holds for a pause): one GETRANGE of the first REC_HEAD bytes in
-- place of the GET, no command more. A shorter record is read whole; a longer one gives
-- its fields, its payload nil until rec_payload reads it where it is sent.
local function rec_peek(jk)
  local s = redis.pcall('GETRANGE', jk, REC_HEAD_FIRST, REC_HEAD_LAST)
  if type(s) ~= 'string' or s == '' then return rec_load(jk) end  -- (missing, or another type)
  local rec
  if #s < REC_HEAD then
    rec = rec_parse(s)
  else
    local a, b, c, d, e, f, g, h, i = string.match(s, REC_HEAD_PATTERN)
    if a then
      rec = {type = a, version = b, max_attempts = c, created_ms = d, idem_key = e, idem_hash = f,
        resource_key = g, limits = h, meta = i}
    end
  end
  if not rec then return rec_load(jk) end  -- (malformed: rec_load says why)
  return rec, nil
end

-- A record's payload, read whole when rec_peek left it out.
local function rec_payload(jk, rec)
  if rec.payload == nil then
    local whole = rec_parse(redis.call('GET', jk))
    rec.payload = whole and whole.payload or ''
  end
  return rec.payload
end

-- Both keys of a dead job expire an hour after the dead retention: the scheduler's trim
-- deletes them at the retention (and uncounts them in the census); the expiry only
-- bounds their life should no scheduler run.
local function rec_expire(jk, ms)
  if ms > 0 then
    redis.call('PEXPIRE', jk, ms + 3600000)
    redis.call('PEXPIRE', jk .. ':s', ms + 3600000)
  end
end

-- A count kept in a state hash (requeued), as readers take it: a whole number from 0, and
-- anything else (damaged, negative, a fraction) 0. records.py's view reads it alike.
local function whole_count(v)
  local n = tonumber(v or '')
  if not n or n < 0 or n ~= math.floor(n) then return 0 end
  return n
end
