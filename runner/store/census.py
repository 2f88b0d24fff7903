"""What waits in a queue, read off Redis: every job of ready, leases, scheduled and
dead with some of its record's fields, and the counts per (queue, state, type, version)
that the deploy gate judges (catalog/checks.py).

It reads without SCAN: LRANGE/ZRANGE of each structure in chunks, then one pipelined
HMGET per chunk. It is a snapshot: a job that moves between two structures while the
read runs may be seen twice or not at all, which only matters for jobs that were
runnable anyway.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

from runner.store.keys import QueueKeys

CHUNK = 1000


def _ids(redis: Any, key: str, is_list: bool) -> Iterator[list[str]]:
    start = 0
    while True:
        end = start + CHUNK - 1
        chunk = redis.lrange(key, start, end) if is_list else redis.zrange(key, start, end)
        if not chunk:
            return
        yield chunk
        if len(chunk) < CHUNK:
            return
        start += CHUNK


def scan(redis: Any, k: QueueKeys, fields: tuple[str, ...] = ("type", "version"),
         states: tuple[str, ...] = ("queued", "processing", "scheduled", "dead"),
         ) -> Iterator[tuple[str, str, list[str | None]]]:
    """Every waiting job of a queue as (state, id, [field values]); records gone are skipped."""
    structures = (("queued", k.ready, True), ("processing", k.leases, False),
                  ("scheduled", k.scheduled, False), ("dead", k.dead, False))
    for state, key, is_list in structures:
        if state not in states:
            continue
        for chunk in _ids(redis, key, is_list):
            pipe = redis.pipeline(transaction=False)
            for job_id in chunk:
                pipe.hmget(k.job(job_id), list(fields))
            for job_id, values in zip(chunk, pipe.execute(), strict=True):
                if values[0] is not None:
                    yield state, job_id, values


def waiting_versions(redis: Any, keys: Mapping[str, QueueKeys]) -> tuple[int, Counter[tuple[str, str, str, str]]]:
    """(jobs read, counts per (queue, state, type, version)) over every queue."""
    read = 0
    groups: Counter[tuple[str, str, str, str]] = Counter()
    for queue, k in keys.items():
        for state, _job_id, (type_, version) in scan(redis, k):
            read += 1
            groups[(queue, state, type_ or "", version or "")] += 1
    return read, groups
