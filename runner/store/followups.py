"""The lists follow-ups wait on between a write and their queue (layout in keys.py): a
partition's outbox (jobs to place where their keys route them, and group counts), a
committed stage (the follow-ups of one ack, placed a batch at a time) and the lost list
(jobs the reclaim buried, whose ON_FAILURE destination is still to write).

Reads take a bounded head (``n`` entries); removals take each placed entry off once, in
one round trip, so an entry leaves its list only after its job is placed (relay.lua
places once by id, so a pass that dies between the two places nothing twice). A stage's
placed head leaves it by a script (Scripts.unstage: unstage.lua), as two relays may read
the same head.
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
