-- aside: rename a key that holds another Redis type than runner keeps there to
-- <key>:corrupt (kept for inspection), so that its writer goes on (store/damage.py). A
-- writer that was answered WRONGTYPE calls it, then writes again; the check and the
-- rename are one step, so a key written afresh meanwhile by another of its writers (of
-- the right type by then) is left as it is.
--
-- KEYS[1] damaged      any   the key (the roster, store/roster.py)
-- ARGV[1] the type runner keeps there: 'hash', 'list', ...
--
-- Returns 1 renamed aside, 0 left as it was (of that type, or gone).
local kind = redis.call('TYPE', K.damaged)['ok']
if kind == ARGV[1] or kind == 'none' then return 0 end
redis.call('RENAME', K.damaged, K.damaged .. ':corrupt')
return 1
