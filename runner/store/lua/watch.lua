-- watch: mark a job as waited for (see waited in includes/ended.lua), so its end is published: its
-- record's meta for every claim to come, and its claim entry while it runs. A caller
-- subscribes first, then watches, then reads the job: an end after the watch is
-- published, an end before it is seen by the read.
--
-- KEYS[1] job          STRING  the record
-- KEYS[2] claims       HASH    id -> claim
-- ARGV[1] job id
--
-- Returns 1 marked (or marked already), 0 no record (ended, or no such job).
--- @include "claims"
--- @include "records"
--- @include "record_keys"
--- @include "ended"
local jk, id = K.job, ARGV[1]
local rec = rec_load(jk)
if not rec then return 0 end
if not waited(rec.meta) then
  local meta = rec.meta or ''
  if meta == '' or meta == '{}' then
    rec.meta = '{"waited":1}'
  else
    rec.meta = '{"waited":1,' .. string.sub(meta, 2)
  end
  redis.call('SET', jk, rec_encode(rec), 'KEEPTTL')
end
local c = parse_claim(redis.call('HGET', K.claims, id))
if c and not c.waited then
  c.waited = true
  redis.call('HSET', K.claims, id, claim_entry(c.token, c.attempt, c.started, flags_of(c)))
end
return 1
