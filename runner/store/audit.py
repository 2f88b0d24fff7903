"""The audit trail: one capped Redis list of who did what to which job, newest first.

Each entry is a JSON object: ``at_ms``, ``by`` (a token's name, or ``cli:<user>``),
``action`` (requeue, delete, purge, cancel, pause, resume), ``queue`` and, for one job, ``job_id``, plus
what the action adds (``edited``, ``count``). An action on many jobs at once (a bulk
requeue or purge) is one entry: its ``count`` and the first MAX_IDS of its ``ids``, so
one bulk action never pushes the earlier ones out. An entry is pushed and the list
trimmed by one script (lua/audit.lua), so the list never holds more than MAX_ENTRIES,
nor an entry older than MAX_AGE_MS once the next one is written, whatever the writers.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from runner.store import codec

# About 2 MB of Redis at ~200 bytes an entry; older entries are dropped (the log keeps them).
MAX_ENTRIES = 10_000
MAX_AGE_MS = 90 * 86_400_000  # a quarter of a year
MAX_IDS = 100  # the ids a bulk action's entry names (its count says how many it had)


def bulk(ids: Sequence[str]) -> dict[str, Any]:
    """What a bulk action's entry says of its jobs: how many, and the first MAX_IDS."""
    return {"count": len(ids), "ids": list(ids[:MAX_IDS])}


def record(scripts: Any, key: str, entry: Mapping[str, Any]) -> None:
    """Put an action on the trail at the server's time (``entry`` without at_ms); an
    entry with a ``bulk`` id replaces that bulk action's entry (see Bulk)."""
    bulk = entry.get("bulk")
    scripts.audit(key, codec.dumps(dict(entry)), MAX_ENTRIES, MAX_AGE_MS, bulk=bulk if isinstance(bulk, str) else "")


class Bulk:
    """A bulk action's one entry, on the trail from its start ("state": "running", the
    ``expected`` count) and rewritten in place after each batch (``count`` so far and
    the first ids) and at its end ("done", or "interrupted" by an error): a bulk action
    killed half-way (SIGKILL) still shows who started it and how far it got. ``put``
    writes the entry (a callable taking its fields: the caller's trail and log)."""

    def __init__(self, put: Any, expected: int) -> None:
        self.put = put
        self.id = os.urandom(8).hex()
        self.expected = expected
        self.put({"bulk": self.id, "state": "running", "expected": expected, **bulk([])})

    def progress(self, done: Sequence[str]) -> None:
        self.put({"bulk": self.id, "state": "running", "expected": self.expected, **bulk(done)})

    def end(self, done: Sequence[str], ok: bool) -> None:
        self.put({"bulk": self.id, "state": "done" if ok else "interrupted", "expected": self.expected,
                  **bulk(done)})


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
