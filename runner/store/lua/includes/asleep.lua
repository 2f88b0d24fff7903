-- A sleeping job's state (suspend.lua): its status, its step log's entries, and one field
-- 'sleep' = "<steps> <step_bytes> <run_started_ms>" for the log's count and bytes and when
-- the attempt's first run began. What its wake can derive is not kept: the due time (its
-- score in the sleeping set, and its sleep's until_ms), 'suspended' (its status says it
-- started) and 'run_attempt' (no attempt is spent while it sleeps: the state's attempt + 1).
-- Whatever wakes it writes the regular fields back (asleep_woken), so a woken job's state
-- is a waiting one's for every script of this release and the one's before.

-- The three numbers of a 'sleep' field (nil each when it is absent or damaged).
local function asleep_parts(v)
  local n, bytes, first = string.match(v or '', '^(%d+) (%d+) (%-?%d+)$')
  return tonumber(n), tonumber(bytes), first
end

-- Appends to ``set`` (an HSET's pairs) the fields a woken sleeper gets back: its due ms,
-- 'suspended', 'run_attempt' (kept when its state has one: ran), and, from its 'sleep'
-- field, 'steps', 'step_bytes' and 'run_started_ms' (a job an earlier release suspended
-- has those already, and no 'sleep' field).
local function asleep_woken(set, due, attempt, ran, sleep)
  for _, v in ipairs({'ready_ms', due, 'suspended', '1', 'run_attempt', ran or (tonumber(attempt) or 0) + 1}) do
    set[#set + 1] = v
  end
  local n, bytes, first = asleep_parts(sleep)
  if n then
    for _, v in ipairs({'steps', n, 'step_bytes', bytes, 'run_started_ms', first}) do set[#set + 1] = v end
  end
  return set
end
