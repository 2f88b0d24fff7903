-- start: the handlers of prefetched jobs have started; their claims lose the 'p' mark, so
-- their attempts count from now on (a reclaim after this spends one). A held claim
-- (hold.lua) loses its 'h' with it. Fenced.
--
-- KEYS[1] claims       HASH  id -> "<token> <attempt> <started_ms> <flags>"
-- ARGV[1] now, ms ('' for the server's clock): the start time written
-- ARGV[2] n; then per job: id, token
--
-- Returns one code per job: 1 marked, 2 marked but a cancel asked it to stop (it was
-- cancelled while claimed ahead, and its worker had not heard yet), 0 started already,
-- -1 refused (lease lost).
--- @include "clock"
--- @include "calls"
--- @include "claims"
--- @include "records"
local now, n = clock(ARGV[1]), tonumber(ARGV[2])
local now_s = now_text(now)
local out, entries = {}, {}
local held = batch_claims(K.claims, 3, 2, n)
-- Most marks are of a plain claim made ahead ('p'; a BATCH member's, 'ph'): its entry is
-- read with parse_claim's pattern and written back with no flags, without the parsed
-- claim and its flags being built (a third of a mark's work; a batch marks every member).
local PLAIN = {p = true, ph = true}
for i = 0, n - 1 do
  local id, token = ARGV[3 + i * 2], ARGV[4 + i * 2]
  local raw = held[i + 1]
  local tok, attempt, flags
  if type(raw) == 'string' then tok, attempt, flags = string.match(raw, '^(%S+) (%d+) %d+ (%S+)$') end
  if tok == token and token ~= '' and PLAIN[flags] and string.byte(attempt) ~= 48 then
    entries[#entries + 1] = id
    entries[#entries + 1] = claim_entry(token, attempt, now_s, '-')
    out[#out + 1] = 1
  else
    local c = fence(raw, token)
    if not c then
      out[#out + 1] = -1
    elseif not c.prefetched then
      out[#out + 1] = 0
    else
      entries[#entries + 1] = id
      entries[#entries + 1] = claim_entry(token, c.attempt_s, now_s,
        claim_flags(c.idem, c.res, false, c.exiting, c.state, c.waited, c.cancel))
      out[#out + 1] = c.cancel and 2 or 1
    end
  end
end
call_many('HSET', K.claims, entries, 2)
return out
