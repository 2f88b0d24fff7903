"""The record of recent events: each queue partition keeps the events whose home it is
(lua/emit.lua writes them), newest first and capped; a listing merges them by time."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from runner.store import codec, damage, records
from runner.store.keys import QueueKeys

# Which write sets a partition's damaged list of events aside (damage.py).
MENDS = "The next event emitted whose home is this partition"


def recent(redis: Any, homes: Iterable[QueueKeys], limit: int, name: str | None = None,
           damaged: list[damage.Damaged] | None = None) -> list[dict[str, Any]]:
    """The ``limit`` newest events of every partition in ``homes`` (of ``name`` only when
    given), newest first; each partition's list is read once, in one round trip. A list
    of another Redis type reads as none, named in ``damaged``."""
    homes = list(homes)
    pipe = redis.pipeline(transaction=False)
    for k in homes:
        pipe.lrange(k.emitted, 0, -1 if name else limit - 1)
    out: list[dict[str, Any]] = []
    for k, raw in zip(homes, pipe.execute(raise_on_error=False), strict=True):
        if isinstance(raw, Exception):
            if not damage.wrong_type(raw):
                raise raw
            if damaged is not None:
                damaged.append(damage.found(redis, k.emitted, "list", MENDS))
            continue
        for item in raw:
            try:
                rec = codec.loads(item)
            except codec.DecodeError:
                continue
            if isinstance(rec, dict) and (name is None or rec.get("name") == name):
                out.append(_shown(rec))
    out.sort(key=lambda r: (r["at_ms"] or 0, str(r.get("id", ""))), reverse=True)
    return out[:limit]


def _shown(rec: dict[str, Any]) -> dict[str, Any]:
    """A record as every view takes it: ``at_ms`` a time a date can show (else None), and
    ``jobs`` a list of objects with a string id (else left out); what was out of shape is
    named in "damaged". emit.lua writes only such records: another writer's at_ms "soon"
    made every listing fail (its sort compared a string with numbers), and jobs "abc" or
    [null] the console's and `runner events`'s."""
    damaged: list[str] = []
    at = rec.get("at_ms")
    at_ms = at if isinstance(at, int) and not isinstance(at, bool) and 0 < at <= records.MAX_TIME_MS else None
    if at_ms is None:
        damaged.append("at_ms")
    jobs = rec.get("jobs", [])
    if not isinstance(jobs, list):
        damaged.append("jobs")
        jobs = []
    kept = []
    for i, job in enumerate(jobs):
        if isinstance(job, dict) and isinstance(job.get("id"), str):
            kept.append(job)
        else:
            damaged.append(f"jobs[{i}]")
    out = {**rec, "at_ms": at_ms, "jobs": kept}
    if damaged:
        out["damaged"] = damaged
    return out


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
