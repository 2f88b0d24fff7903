-- Groups: counting members down and firing the then-job.
--- @include "followups"
--- @include "jobs"
--- @include "stats"

-- Groups (fan-out/fan-in, group.lua): a group's members are jobs of one queue, each with
-- its group id and 1-based index in its record's meta ("group", "member"). The group:
--   <group prefix><gid>     HASH  total, left (members not finished), done, dead, cancelled,
--                                 bytes (of the outcomes so far), sealed ('1' once every
--                                 member is written), then (the then-job: JSON list of its
--                                 queue, '' this one, its 12 enqueue fields and priority, the payload
--                                 without the group field), inline (the most outcome bytes
--                                 put in its payload), keep (ms kept once complete),
--                                 created_ms, completed_ms, links (the W3C traceparents
--                                 of the first GROUP_LINKS members' runs, space-separated,
--                                 in the order they settled; absent when none traced),
--                                 linked (how many traced members' runs it was offered)
--   <group prefix><gid>:o   HASH  member index -> its outcome, {"id","status",...} JSON
--   <group prefix><gid>:m   LIST  the members' ids in member order (group.lua writes it)
--   <group prefix><gid>:f   STRING a byte per member, at its index less one: its outcome as
--                                 counted, d done, x dead, c cancelled (\0, or past the
--                                 end: not finished), so a page of one outcome's members is
--                                 found without reading the outcomes (member_page.lua)
-- A member counts once: its outcome is set with HSETNX, and only the settle that set it
-- counts down, so a re-delivered ack, a late success after a burial or a requeued dead
-- member changes nothing. The settle that brings a sealed group to 0 writes its then-job.
-- G holds the keys: group (prefix), Q (as job_put takes them), notify, census, outbox.

-- A member's group id and index from its record's meta (nil for no group's member).
local function group_of(meta)
  if type(meta) ~= 'string' or not string.find(meta, '"member"', 1, true) then return nil end
  local ok, m = pcall(cjson.decode, meta)
  if not ok or type(m) ~= 'table' or type(m.group) ~= 'string' or not tonumber(m.member) then return nil end
  return m.group, string.format('%d', m.member)
end

-- A then-job's trace has many parents: its run links to the members' runs, the first
-- GROUP_LINKS of them (a bound on the meta of a big group's then-job and on the copy each
-- settle makes of the list): with the link to its producer, the 128 links a span keeps
-- under the OpenTelemetry SDK's default limit.
local GROUP_LINKS = 127

-- A member's mark (the byte of <gid>:f) for the outcome the group counted, and the most
-- members a group has (groups.MAX_MEMBERS).
local MARKS = {done = 'd', dead = 'x', cancelled = 'c'}
local MAX_MEMBERS = 100000

-- Write a complete group's then-job: its payload is the caller's with "group" first,
-- {"id","total","done","dead","cancelled","outcomes"}; the outcomes are a list in member
-- order while they fit the group's inline bound, else null (the handler reads them from
-- the outcomes hash: ctx.group_outcomes). Once: completed_ms marks it done.
local function group_fire(G, now, gid)
  local gk = G.group .. gid
  local g = redis.call('HMGET', gk, 'then', 'total', 'done', 'dead', 'cancelled', 'bytes', 'inline', 'keep',
    'completed_ms', 'links')
  if g[9] or not g[1] then return end
  redis.call('HSET', gk, 'completed_ms', now)
  local t = cjson.decode(g[1])
  local total = tonumber(g[2]) or 0
  local outcomes = 'null'
  if (tonumber(g[6]) or 0) <= (tonumber(g[7]) or 0) then
    local parts = {}
    for s = 1, total, 1000 do
      local fields = {}
      for i = s, math.min(s + 999, total) do fields[#fields + 1] = i end
      for _, v in ipairs(redis.call('HMGET', gk .. ':o', unpack(fields))) do parts[#parts + 1] = v or 'null' end
    end
    outcomes = '[' .. table.concat(parts, ',') .. ']'
  end
  local head = string.format('{"group":{"id":%s,"total":%d,"done":%d,"dead":%d,"cancelled":%d,"outcomes":%s}',
    cjson.encode(gid), total, tonumber(g[3]) or 0, tonumber(g[4]) or 0, tonumber(g[5]) or 0, outcomes)
  -- The caller's payload is a JSON object (checked at creation): "group" goes in front.
  t[5] = t[5] == '{}' and head .. '}' or head .. ',' .. string.sub(t[5], 2)
  if g[10] then
    -- The members' runs, for the then-job's run to link to (tracecontext.py: "links").
    local links = {}
    for tp in string.gmatch(g[10], '%S+') do links[#links + 1] = cjson.encode(tp) end
    local field = '"links":[' .. table.concat(links, ',') .. ']'
    t[13] = (t[13] == '' or t[13] == '{}') and '{' .. field .. '}' or '{' .. field .. ',' .. string.sub(t[13], 2)
  end
  if t[1] == '' then
    local j = job_fields(t, 2)
    j.priority = tonumber(t[14]) or 0
    if not job_known(G.Q, j.id) then
      local put = jobs_acc()
      job_put(G.Q, now, j, put)
      jobs_flush(G.Q, put, G.notify, G.census)
    end
  else
    redis.call('RPUSH', G.outbox, cjson.encode(t))
  end
  local keep = tonumber(g[8]) or 0
  if keep > 0 then
    redis.call('PEXPIRE', gk, keep)
    redis.call('PEXPIRE', gk .. ':o', keep)
    redis.call('PEXPIRE', gk .. ':m', keep)
    redis.call('PEXPIRE', gk .. ':f', keep)
  end
  tally('groups_completed')
end

-- One member finished (status done, dead or cancelled; its outcome JSON; the traceparent
-- of the run that ended it, '' or nil untraced): counted once, and the group's then-job
-- written when it was the last. A group that is gone (expired) or damaged counts nothing.
-- A group not in this partition may live in the queue's home partition (a member its keys
-- routed elsewhere: groups.py): the count goes there through the outbox and the relay
-- (group_count.lua, which sets G.home), once by the HSETNX.
local function group_settle(G, now, gid, idx, status, outcome, link)
  local gk = G.group .. gid
  if redis.call('TYPE', gk)['ok'] ~= 'hash' then
    if G.outbox and not G.home then
      redis.call('RPUSH', G.outbox, cjson.encode({'#group', gid, idx, status, outcome, link or ''}))
    end
    return
  end
  local set = redis.pcall('HSETNX', gk .. ':o', idx, outcome)
  if set ~= 1 then return end
  -- Its mark (pcall: marks of another type, damage, lose the mark, never the count); an
  -- index past the most members a group has (another writer's meta) marks nothing, so no
  -- SETRANGE grows the string far.
  local at = tonumber(idx)
  if at and at >= 1 and at <= MAX_MEMBERS and at == math.floor(at) then
    redis.pcall('SETRANGE', gk .. ':f', at - 1, MARKS[status] or '?')
  end
  if link and link ~= '' and #link <= 64 and not string.find(link, '%s')
      and redis.call('HINCRBY', gk, 'linked', 1) <= GROUP_LINKS then
    local links = redis.call('HGET', gk, 'links')
    redis.call('HSET', gk, 'links', links and links .. ' ' .. link or link)
  end
  redis.call('HINCRBY', gk, status, 1)
  redis.call('HINCRBY', gk, 'bytes', #outcome)
  local left = redis.call('HINCRBY', gk, 'left', -1)
  if redis.call('HGET', gk, 'sealed') == '1' then
    if left <= 0 then group_fire(G, now, gid) end
  else
    -- Not sealed yet (being written, or its sender failed): its outcomes expire with it.
    local ttl = redis.call('PTTL', gk)
    if ttl > 0 then
      redis.call('PEXPIRE', gk .. ':o', ttl)
      redis.call('PEXPIRE', gk .. ':f', ttl)
    end
  end
end

-- A member that a cancel ended before it ran (cancel.lua, and the claim or release that
-- completes a cancel): counted as cancelled; a job of no group, nothing.
local function group_cancelled(G, now, id, rec)
  local gid, idx = group_of(rec.meta)
  if gid then
    group_settle(G, now, gid, idx, 'cancelled', '{"id":' .. cjson.encode(id) ..
      ',"status":"cancelled","reason":"cancelled","error":{"type":"Cancelled","message":"cancelled"}}')
  end
end

-- The members a worker settled in this batch, from ARGV at gb: g, then 6 fields each (its
-- place in the batch, group id, index, status, outcome JSON, the run's traceparent or '');
-- counted only for a member whose settle landed (out[place] > 0).
local function group_members(G, now, out, gb)
  local g = tonumber(ARGV[gb]) or 0
  for i = 0, g - 1 do
    local b = gb + 1 + i * 6
    if (out[tonumber(ARGV[b])] or -1) > 0 then
      group_settle(G, now, ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4], ARGV[b + 5])
    end
  end
end
