"""The lists follow-ups wait on between a write and their queue (layout in keys.py): a
partition's outbox (jobs to place where their keys route them, and group counts), a
committed stage (the follow-ups of one ack, placed a batch at a time) and the lost list
(jobs the reclaim buried, whose ON_FAILURE destination is still to write).

Reads take a bounded head (``n`` entries); removals take each placed entry off once, in
one round trip, so an entry leaves its list only after its job is placed (relay.lua
places once by id, so a pass that dies between the two places nothing twice).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from runner.store.keys import QueueKeys


def outbox_head(redis: Any, k: QueueKeys, n: int) -> list[str]:
    """The first ``n`` entries of ``k``'s outbox, oldest first."""
    return list(redis.lrange(k.outbox, 0, n - 1))


def take_off_outbox(redis: Any, k: QueueKeys, entries: Sequence[str]) -> None:
    """Take placed entries off ``k``'s outbox (one each), in one round trip."""
    _remove(redis, k.outbox, entries)


def stage_head(redis: Any, key: str, n: int) -> list[str]:
    """The first ``n`` follow-ups of a committed stage; an empty stage is deleted (its
    list is gone once drained, so [] then means done)."""
    chunk = list(redis.lrange(key, 0, n - 1))
    if not chunk:
        redis.delete(key)
    return chunk


# Take a stage's first placed entries off it, and move the entries for queues this process
# does not know to the outbox, in one step, only while the stage still starts with the
# entry read: every worker's scheduler relays committed stages, and two that read the same
# head both placed it (once each by id) and both trimmed it, the second dropping the next
# entries, unplaced (every loss a multiple of the batch). Entries are unique (each names
# its follow-up's id), so the first one says whether the head is still the one read.
# KEYS[1] the stage, KEYS[2] the outbox; ARGV[1] the first entry read, ARGV[2] how many
# were placed, ARGV[3..] the waiting entries. -> 1 trimmed, 0 another relay was first.
_ADVANCE_LUA = """
local K = {stage = KEYS[1], outbox = KEYS[2]}
if redis.call('LINDEX', K.stage, 0) ~= ARGV[1] then return 0 end
if #ARGV > 2 then redis.call('RPUSH', K.outbox, unpack(ARGV, 3)) end
redis.call('LTRIM', K.stage, tonumber(ARGV[2]), -1)
return 1
"""


def advance_stage(redis: Any, k: QueueKeys, key: str, head: str, placed: int, waiting: Sequence[str]) -> bool:
    """Drop the first ``placed`` entries of a stage and move ``waiting`` (entries for a
    queue this process does not know) to ``k``'s outbox, in one step, when the stage still
    starts with ``head`` (the first entry read): nothing is lost or placed twice whichever
    of the two a crash would have split, nor when another relay took the same head. False:
    another relay advanced it first (what this one placed was placed once, by id)."""
    return bool(redis.eval(_ADVANCE_LUA, 2, key, k.outbox, head, placed, *waiting))


def lost_head(redis: Any, k: QueueKeys, n: int) -> list[str]:
    """The first ``n`` ids of jobs the reclaim buried as "worker lost" (reclaim.lua)."""
    return list(redis.lrange(k.lost, 0, n - 1))


def forget_lost(redis: Any, k: QueueKeys, ids: Sequence[str]) -> None:
    """Take handled ids off the lost list (one each), in one round trip."""
    _remove(redis, k.lost, ids)


def _remove(redis: Any, key: str, entries: Sequence[str]) -> None:
    if entries:
        pipe = redis.pipeline(transaction=False)
        for raw in entries:
            pipe.lrem(key, 1, raw)
        pipe.execute()
