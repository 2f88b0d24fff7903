-- Done outcomes, in generations of hashes.
--- @include "calls"

-- Done jobs: their outcomes live in generations of hashes, <done prefix><gen>, id ->
-- "<type> <version> <attempt> <started_ms> +<run ms>[\n<history (retried jobs)>\n<result>[\n<meta>]]",
-- with <done prefix><gen>:log listing the ids newest first. The meta hash holds the
-- current generation, when it began and how many it holds (n: written once that reaches a
-- quarter of the count bound; until then the log's length, the reply of its push, is the
-- count, so a put sends no count of its own); a new one begins once it holds a quarter
-- of the count bound or is a quarter of the retention old, and the fifth
-- oldest goes at once (UNLINK: freed in the background). So a done job is kept between
-- three quarters and all of both bounds, and a lookup reads at most four hashes.
local DONE_GENS = 4
local function done_bound(keep_n)
  return math.max(1, math.ceil(keep_n / DONE_GENS))
end
local function done_gen(meta_key, done_prefix, now, keep_ms, keep_n)
  local m = redis.call('HMGET', meta_key, 'gen', 'since', 'n')
  local gen, since, n = tonumber(m[1]) or 0, tonumber(m[2]) or now, tonumber(m[3]) or 0
  if not m[1] then
    redis.call('HSET', meta_key, 'gen', 0, 'since', now, 'n', 0)
  elseif n >= done_bound(keep_n) or now - since >= keep_ms / DONE_GENS then
    gen = gen + 1
    redis.call('HSET', meta_key, 'gen', gen, 'since', now, 'n', 0)
    local old = done_prefix .. (gen - DONE_GENS)
    redis.call('UNLINK', old, old .. ':log')
  end
  return gen
end

local function done_put(meta_key, done_prefix, gen, ids, values, keep_n)
  if #ids == 0 then return end
  local pairs_ = {}
  for i, id in ipairs(ids) do
    pairs_[#pairs_ + 1] = id
    pairs_[#pairs_ + 1] = values[i]
  end
  call_many('HSET', done_prefix .. gen, pairs_, 2)
  local log, n = done_prefix .. gen .. ':log', 0
  for s = 1, #ids, 4000 do n = redis.call('LPUSH', log, unpack(ids, s, math.min(s + 3999, #ids))) end
  if n >= done_bound(keep_n) then redis.call('HSET', meta_key, 'n', n) end
end

-- Whether an id has a done outcome in any generation kept.
local function done_has(meta_key, done_prefix, id)
  local gen = tonumber(redis.call('HGET', meta_key, 'gen')) or 0
  for g = gen, gen - DONE_GENS + 1, -1 do
    -- pcall: a damaged generation reads as holding no outcome (the id is buried, not lost).
    if redis.pcall('HEXISTS', done_prefix .. g, id) == 1 then return true end
  end
  return false
end
