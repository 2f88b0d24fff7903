"""Job records in and out of Redis: the hash fields of a record and their decoding.

A record is a Redis hash under ``<prefix>:{<queue>}:job:<id>`` with these fields:

    type, version, payload (JSON), status, attempt, max_attempts,
    created_ms, enqueued_ms, ready_ms, started_ms, finished_ms,
    token (the claim token while processing; empty once settled),
    idem_key, resource_key, deferrals,
    error (JSON: type, message, traceback), reason (dead only),
    history (comma-joined JSON entries, one per attempt), result (JSON),
    checkpoint (JSON), duplicate_of (done as a duplicate of that job),
    meta (JSON object: extra fields a producer attached, e.g. a schedule's id and tick;
    laid at the top level of the job view, never over a field above)

A field at its default is not written: attempt and deferrals 0, enqueued_ms and ready_ms
equal to created_ms, no idem_key or resource_key; readers supply the default.

A claim and a success are not written to the record (see keys.py): while a job is claimed
its entry in the queue's claims hash holds the token, the attempt and the start, and a
done job's outcome in the done hash holds its finish, attempt, start, last history entry
and result. ``merge`` lays both over the record, so a reader sees the fields above.

Statuses: queued, scheduled, processing, retrying, deferred (parked on a full limit), done,
dead.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from runner.store import codec

STATUSES = ("queued", "scheduled", "processing", "retrying", "deferred", "done", "dead")


def merge(record: Mapping[str, str], claim: str | None, outcome: str | None) -> dict[str, str]:
    """The record as a reader sees it, with its claim or done outcome laid over it."""
    fields = dict(record)
    if not fields:
        return fields  # no record (expired or deleted): nothing to lay over
    if outcome:
        head, _, rest = outcome.partition("\n")
        entry, _, result = rest.partition("\n")
        parts = head.split(" ")
        if len(parts) == 3:
            fields.update(status="done", finished_ms=parts[0], attempt=parts[1], started_ms=parts[2])
        else:
            fields.update(status="done")
        if result:
            fields["result"] = result
        if entry:
            old = fields.get("history")
            fields["history"] = f"{old},{entry}" if old else entry
        fields.pop("error", None)  # an earlier attempt's error is not a done job's last error
    elif claim:
        parts = claim.split(" ")
        if len(parts) == 4:
            fields.update(status="processing", token=parts[0], attempt=parts[1], started_ms=parts[2])
    return fields


class _Entropy(threading.local):
    """Random bytes read from the OS 4 KiB at a time, per thread: one getrandom() call per
    800 ids instead of one per id (a syscall is a few microseconds on a VM)."""

    buf = b""
    pos = 0


_entropy = _Entropy()


def _fresh_entropy() -> None:
    # A forked child must not hand out the random bytes its parent will use too.
    global _entropy
    _entropy = _Entropy()


os.register_at_fork(after_in_child=_fresh_entropy)


def new_id() -> str:
    """Time-ordered, unique job id: 12 hex digits of ms since epoch + 10 random hex."""
    e = _entropy
    if e.pos + 5 > len(e.buf):
        e.buf, e.pos = os.urandom(4096), 0
    rnd = e.buf[e.pos:e.pos + 5]
    e.pos += 5
    return f"{int(time.time() * 1000):012x}{rnd.hex()}"


def now_ms() -> int:
    return int(time.time() * 1000)


def _int(v: Any, default: int = 0) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def _json(v: Any) -> Any:
    if v is None or v == "":
        return None
    try:
        return codec.loads(v)
    except codec.DecodeError:
        return {"unparsable": str(v)[:200]}


def _ts(v: Any) -> float | None:
    ms = _int(v, 0)
    return ms / 1000 if ms else None


@dataclass(frozen=True, slots=True)
class Job:
    id: str
    queue: str
    fields: Mapping[str, str]

    def as_dict(self) -> dict[str, Any]:
        f = self.fields
        history_raw = f.get("history") or ""
        try:
            history = codec.loads("[" + history_raw + "]") if history_raw else []
        except codec.DecodeError:
            history = [{"unparsable": history_raw[:200]}]
        view = {
            "id": self.id,
            "type": f.get("type"),
            "version": _int(f.get("version"), 0) or None,
            "queue": self.queue,
            "status": f.get("status"),
            "attempt": _int(f.get("attempt")),
            "max_attempts": _int(f.get("max_attempts")),
            "payload": _json(f.get("payload")),
            "created_at": _ts(f.get("created_ms")),
            # The enqueue script leaves out times equal to created_ms.
            "enqueued_at": _ts(f.get("enqueued_ms") or f.get("created_ms")),
            "ready_at": _ts(f.get("ready_ms") or f.get("created_ms")),
            "started_at": _ts(f.get("started_ms")),
            "finished_at": _ts(f.get("finished_ms")),
            "idempotency_key": f.get("idem_key") or None,
            "resource_key": f.get("resource_key") or None,
            "deferrals": _int(f.get("deferrals")),
            "last_error": _json(f.get("error")),
            "reason": f.get("reason") or None,
            "history": history,
            "result": _json(f.get("result")),
            "checkpoint": _json(f.get("checkpoint")),
            "duplicate_of": f.get("duplicate_of") or None,
        }
        meta = _json(f.get("meta"))
        if isinstance(meta, dict):
            for key, value in meta.items():
                view.setdefault(key, value)
        return view

    @property
    def status(self) -> str | None:
        return self.fields.get("status")
