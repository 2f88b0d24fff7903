-- lookup: what Redis holds of one job, in one call (it reads, never writes): the record,
-- its state, its claim while it runs, and its outcome once done (the result kept on its
-- own for KEEP_RESULT, else the done generations, newest first).
--
-- KEYS[1] job          STRING  the record (its state hash is KEYS[1] .. ':s')
-- KEYS[2] claims       HASH    id -> claim
-- KEYS[3] done meta    HASH    the current done generation
-- KEYS[4] done prefix  (string)
-- KEYS[5] result prefix (string)
-- ARGV[1] job id
--
-- Returns {record or false, {state field, value, ...}, claim or false, outcome or false}.
local id = ARGV[1]
local rec = redis.pcall('GET', KEYS[1])
if type(rec) == 'table' then rec = rec.err and ('\0' .. redis.call('TYPE', KEYS[1])['ok']) or false end
local state = redis.pcall('HGETALL', KEYS[1] .. ':s')
if state.err then state = {} end
local claim = redis.pcall('HGET', KEYS[2], id)
if type(claim) ~= 'string' then claim = false end
local outcome = redis.pcall('GET', KEYS[5] .. id)
if type(outcome) ~= 'string' then
  outcome = false
  local gen = tonumber(redis.pcall('HGET', KEYS[3], 'gen')) or 0
  for g = gen, gen - 3, -1 do
    local o = redis.pcall('HGET', KEYS[4] .. g, id)
    if type(o) == 'string' then outcome = o break end
  end
end
return {rec, state, claim, outcome}
