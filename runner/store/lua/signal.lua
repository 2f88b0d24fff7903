-- signal: deliver a signal to a durable function (POST /jobs/{id}/signals/{name},
-- Client.signal, `runner signal`). The body is kept in the job's state hash as
-- 'sig:<name>' until a ctx.wait_for_signal of that name reads it (wait.lua); a job that
-- waits for it now (status 'waiting', 'waiting_for' this name) leaves scheduled for ready
-- in this same step, so a delivery and a wake-up are one transition.
--
-- KEYS[1] job          STRING  the record (state: K.job .. ':s')
-- KEYS[2] claims       HASH    id -> claim
-- KEYS[3] scheduled    ZSET
-- KEYS[4] ready        LIST
-- KEYS[5] notify       LIST
-- KEYS[6] prio         ZSET
-- KEYS[7] done_meta    HASH
-- KEYS[8] done_prefix  (string)
-- KEYS[9] stats        HASH
-- KEYS[10] waiting     ZSET  the waiting ids of scheduled (the waiting list's index)
-- ARGV[1] now, ms ('' for the server's clock)
-- ARGV[2] job id
-- ARGV[3] signal name
-- ARGV[4] body (JSON)
-- ARGV[5] most signals kept unread for one job, count (0: unbounded, a child's end)
-- ARGV[6] most bytes of bodies kept unread for one job (0: unbounded)
-- ARGV[7] the wait's position in the step log ('' any): an event's delivery to a waiter
--         (ctx.wait_for_event, client/waking.py) is refused once that wait is over
-- ARGV[8] the delivery's key ('' none): a caller's signal carries one (Client.signal),
--         kept as 'sigkey:<name>' for as long as the job's state lives, so a signal sent
--         again with it (after a NotReplicated answer) is known for the same delivery
--         whether a wait has read it or not, and is never delivered twice
--
-- Returns {code, status}: 1 kept for the job's next wait of that name, 2 kept and the
-- waiting job woken (status 'queued'), -1 no such job, -2 the job ended (done, dead or
-- cancelled), -3 a signal of that name is kept already, unread, -4 the job keeps its
-- most signals unread already, -5 this body would pass its most bytes kept (nothing
-- changed on a refusal), -6 the wait at ARGV[7] is over (its entry says so), 3 a
-- duplicate: the last signal of that name the job took carried this key (kept or read
-- already; nothing changed). The state's 'sigs' and 'sig_bytes' count what is kept.
--- @include "clock"
--- @include "record_keys"
--- @include "done"
--- @include "stats"
--- @include "ready"
local now, id, name = clock(ARGV[1]), ARGV[2], ARGV[3]
local jk = K.job
local sk = jk .. ':s'
local rec = rec_load(jk)
if not rec then
  if done_has(K.done_meta, K.done_prefix, id) then return {-2, 'done'} end
  return {-1, ''}
end
local f = redis.call('HMGET', sk, 'status', 'waiting_for', 'priority')
local status = f[1] or 'queued'
local claimed = redis.call('HEXISTS', K.claims, id) == 1
if claimed then status = 'processing' end
if status == 'done' or status == 'dead' or status == 'cancelled' then return {-2, status} end
local key = ARGV[8] or ''
if key ~= '' and redis.call('HGET', sk, 'sigkey:' .. name) == key then return {3, status} end
if redis.call('HEXISTS', sk, 'sig:' .. name) == 1 then return {-3, status} end
local at = tonumber(ARGV[7] or '')
if at then
  local e = redis.call('HGET', sk, 'step:' .. at)
  if e and not string.find(e, '"status":"waiting"', 1, true) then return {-6, status} end
end
local kept = redis.call('HMGET', sk, 'sigs', 'sig_bytes')
local most, most_bytes = tonumber(ARGV[5]) or 0, tonumber(ARGV[6]) or 0
local count, size = (tonumber(kept[1]) or 0) + 1, (tonumber(kept[2]) or 0) + #ARGV[4]
if most > 0 and count > most then return {-4, status} end
if most_bytes > 0 and size > most_bytes then return {-5, status} end
redis.call('HSET', sk, 'sig:' .. name, ARGV[4], 'sigs', count, 'sig_bytes', size)
if key ~= '' then redis.call('HSET', sk, 'sigkey:' .. name, key) end
if not at then tally('signals|' .. rec.type) end  -- (an event's delivery is not a signal sent)
local code = 1
if status == 'waiting' and f[2] == name and redis.call('ZREM', K.scheduled, id) == 1 then
  redis.pcall('ZREM', K.waiting, id)
  redis.call('HSET', sk, 'status', 'queued', 'ready_ms', now)
  to_ready(K.ready, K.prio, id, f[3], now, false)
  wake(K.notify)
  code, status = 2, 'queued'
end
flush(K.stats)
return {code, status}
