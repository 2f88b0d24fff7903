"""Reading a job's log and its stream: the lines lua/joblog.lua kept in ``log:<id>`` and
the chunks in ``stream:<id>`` (JSON objects, oldest first), written by the worker with
the lease renewal and the run's settlement (worker/joblog.py)."""

from __future__ import annotations

import json
from typing import Any

from runner.store.keys import QueueKeys


def read(redis: Any, k: QueueKeys, job_id: str) -> list[dict[str, Any]]:
    """The job's log lines, oldest first ([] for none). A line that is not a JSON object
    (damage) reads as its text, so a view shows it rather than failing."""
    return _objects(redis.lrange(k.log(job_id), 0, -1))


def read_stream(redis: Any, k: QueueKeys, job_id: str) -> list[dict[str, Any]]:
    """The job's streamed chunks kept (ctx.stream), oldest first: {"a": attempt, "i":
    its number in the attempt, "ts", "data"}."""
    return [c for c in _objects(redis.lrange(k.stream(job_id), 0, -1)) if "i" in c]


def _objects(raws: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for raw in raws or ():
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        try:
            one = json.loads(text)
        except ValueError:
            one = None
        out.append(one if isinstance(one, dict) else {"ts": None, "level": "INFO", "src": "log", "msg": text})
    return out
