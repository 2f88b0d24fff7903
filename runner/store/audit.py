"""The audit trail: one capped Redis list of who did what to which job, newest first.

Each entry is a JSON object: ``at_ms``, ``by`` (a token's name, or ``cli:<user>``),
``action`` (requeue, delete, purge, cancel, pause, resume), ``queue`` and, for one job, ``job_id``, plus
what the action adds (``edited``, ``count``). An entry is pushed and the list trimmed in
one MULTI, so the list never holds more than MAX_ENTRIES whatever the writers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runner.store import codec

# About 2 MB of Redis at ~200 bytes an entry; older entries are dropped (the log keeps them).
MAX_ENTRIES = 10_000


def record(redis: Any, key: str, entry: Mapping[str, Any]) -> None:
    pipe = redis.pipeline(transaction=True)
    pipe.lpush(key, codec.dumps(dict(entry)))
    pipe.ltrim(key, 0, MAX_ENTRIES - 1)
    pipe.execute()


def read(redis: Any, key: str, offset: int, limit: int) -> tuple[int, list[dict[str, Any]]]:
    """(entries held, one page newest first); an entry that is not JSON is shown as such."""
    pipe = redis.pipeline(transaction=False)
    pipe.llen(key)
    pipe.lrange(key, offset, offset + max(limit, 1) - 1)
    total, raw = pipe.execute()
    page = []
    for item in raw:
        try:
            entry = codec.loads(item)
        except codec.DecodeError:
            entry = None
        page.append(entry if isinstance(entry, dict) else {"unparsable": str(item)[:200]})
    return int(total), page
