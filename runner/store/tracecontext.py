"""The W3C trace context a job carries from its producer to the worker that runs it.

It travels in the job record's ``meta`` (the JSON object of a producer's annotations) as
``{"traceparent": "00-<trace id>-<span id>-<flags>"}``. The claim does not return meta,
so a worker that traces reads it for a claimed batch with one pipelined round trip; a
worker that does not trace never reads it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from runner.store import codec
from runner.store.keys import QueueKeys

FIELD = "traceparent"


def meta_for(traceparent: str | None) -> str:
    """The meta to enqueue with: '' (none) without a trace context."""
    return codec.dumps({FIELD: traceparent}) if traceparent else ""


def read(redis: Any, keys: QueueKeys, ids: Sequence[str]) -> list[str]:
    """The traceparent of each job ('' none), in the order of ``ids``."""
    if not ids:
        return []
    pipe = redis.pipeline(transaction=False)
    for job_id in ids:
        pipe.hget(keys.job(job_id), "meta")
    out = []
    for raw in pipe.execute(raise_on_error=False):
        tp = ""
        if isinstance(raw, str) and raw:
            try:
                meta = codec.loads(raw)
            except codec.DecodeError:
                meta = None
            if isinstance(meta, dict) and isinstance(meta.get(FIELD), str):
                tp = meta[FIELD]
        out.append(tp)
    return out
