"""Which partition of its queue a job goes to (see docs/partitions.md, "Routing").

Locks, limits and deduplication live in a partition's slot, so every job that must meet
the same lock or idempotency key goes where that key sends it: the first of its limit
keys (RESOURCE_KEY, then CONCURRENCY, then RATE_LIMIT, the order of the ``limits`` lines
catalog/limits.py writes), else its idempotency key, else nowhere in particular.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # scripts.py routes follow-ups with this module
    from runner.store.scripts import NewJob


def route(job: NewJob) -> str:
    """The key that decides the job's partition, '' when it may go to any."""
    return route_of(job.type, job.idem_key, job.limits)


def route_of(type_: str, idem_key: str, limits: str) -> str:
    """``route`` from a job's fields (its type, idempotency key and limit lines)."""
    if limits:
        first = limits.split("\n", 1)[0]
        return first.partition(" ")[2]
    if idem_key:
        return f"i:{type_}:{idem_key}"
    return ""


def partition_of(key: str, n: int) -> int:
    """The partition a route key goes to: a stable hash (every process agrees)."""
    return zlib.crc32(key.encode("utf-8", "surrogatepass")) % n if n > 1 else 0


def stays(job: NewJob, partition: int, n: int) -> bool:
    """Whether a job may be written in ``partition`` of its queue: it routes there, or it
    has no route (a follow-up then stays with its parent, in the parent's own step)."""
    key = route(job)
    return not key or partition_of(key, n) == partition


class Spread:
    """Where jobs without a route go: all of one round trip to one partition, the next
    round trip to the next, so a batch costs one script call more at most and the
    partitions fill evenly. Shared by threads: a lost update only repeats a partition."""

    def __init__(self) -> None:
        self._turn = itertools.count()

    def next(self, n: int) -> int:
        return next(self._turn) % n if n > 1 else 0


def split(jobs: Sequence[NewJob], n: int, spread: Spread) -> dict[int, list[int]]:
    """The indexes of ``jobs`` by partition (in order within each)."""
    if n <= 1:
        return {0: list(range(len(jobs)))}
    loose = -1
    out: dict[int, list[int]] = {}
    for i, job in enumerate(jobs):
        key = route(job)
        if key:
            p = partition_of(key, n)
        else:
            if loose < 0:
                loose = spread.next(n)
            p = loose
        out.setdefault(p, []).append(i)
    return out
