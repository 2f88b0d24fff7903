-- A job's history entries.

-- Add the history field to a list of HSET field/value pairs: the record's current
-- comma-joined history (old; false/nil when none yet) with one more JSON entry. No
-- entry, no field: the history is left as it is. The caller writes the history in the
-- same HSET as the status, so the old value comes from the caller's fence read.
local function with_history(set, old, entry)
  if entry == nil or entry == '' then return end
  set[#set + 1] = 'history'
  if old and old ~= '' then
    set[#set + 1] = old .. ',' .. entry
  else
    set[#set + 1] = entry
  end
end

-- A history entry a client wrote (a JSON object: who requeued or cancelled a job) with
-- the time of this call added as at_ms: the server's, as every other time of a job is,
-- not the operator's host's. '' stays '' (no entry); an entry with its own at_ms (a client
-- of the release before, during a rolling deploy) is kept as it is.
local function stamped(entry, now)
  if entry == nil or entry == '' then return '' end
  if string.find(entry, '"at_ms"', 1, true) then return entry end
  return string.sub(entry, 1, -2) .. ',"at_ms":' .. now .. '}'
end

-- A JSON object with one more field, a time of this call (a step log entry's
-- finished_ms: the server's clock, as every time of a job is). A compact entry (a JSON
-- array: a returned step, a sleep; see records.py) gets the time as its next element.
local function stamped_as(entry, field, now)
  if string.byte(entry, 1) == 91 then return string.sub(entry, 1, -2) .. ',' .. now .. ']' end  -- '['
  if entry == '{}' then return '{"' .. field .. '":' .. now .. '}' end
  return string.sub(entry, 1, -2) .. ',"' .. field .. '":' .. now .. '}'
end
