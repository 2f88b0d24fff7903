"""The record of recent events: each queue partition keeps the events whose home it is
(lua/emit.lua writes them), newest first and capped; a listing merges them by time."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from runner.store import codec
from runner.store.keys import QueueKeys


def recent(redis: Any, homes: Iterable[QueueKeys], limit: int, name: str | None = None) -> list[dict[str, Any]]:
    """The ``limit`` newest events of every partition in ``homes`` (of ``name`` only when
    given), newest first; each partition's list is read once, in one round trip."""
    homes = list(homes)
    pipe = redis.pipeline(transaction=False)
    for k in homes:
        pipe.lrange(k.emitted, 0, -1 if name else limit - 1)
    out: list[dict[str, Any]] = []
    for raw in pipe.execute():
        for item in raw:
            try:
                rec = codec.loads(item)
            except codec.DecodeError:
                continue
            if isinstance(rec, dict) and (name is None or rec.get("name") == name):
                out.append(rec)
    out.sort(key=lambda r: (r.get("at_ms", 0), r.get("id", "")), reverse=True)
    return out[:limit]


def held(redis: Any, homes: Iterable[QueueKeys], name: str, key: str) -> tuple[str, bytes] | None:
    """(data hash, record) of an emit of ``name`` that holds Idempotency-Key ``key`` on one
    of ``homes``, or None; one round trip."""
    pipe = redis.pipeline(transaction=False)
    for k in homes:
        pipe.hmget(f"{k.emit_prefix}{name}:{key}", "hash", "record")
    for got_hash, record in pipe.execute():
        if record is not None:
            h = got_hash.decode() if isinstance(got_hash, bytes) else str(got_hash)
            return h, record
    return None
