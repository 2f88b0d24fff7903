"""A child job's end as its parent's signal (ctx.invoke): the meta field that names the
parent, the body its end sends, and the sending. The worker that settles a child sends
it (the settler, once the child's ack or burial landed); a parent due before it came
looks for the child itself (executors.py), so a crash between the two loses nothing."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from runner.client import Client
from runner.errors import RunnerError, SignalPending
from runner.store import codec
from runner.store.records import ENDED
from runner.worker.execute import CANCELLED, Dead, Done
from runner.worker.ledger import Settlement

log = logging.getLogger("runner.worker")

INVOKED_BY = "invoked_by"  # a child's meta: {"id": parent id, "signal": the signal its end sends}


def end_of(view: dict[str, Any]) -> str | None:
    """The body a child's end sends its parent (JSON), from its job view; None while it runs."""
    status = view.get("status")
    if status not in ENDED:
        return None
    if status == "done":
        return codec.dumps({"status": "done", "result": view.get("result")})
    return codec.dumps({"status": status, "error": view.get("last_error"), "reason": view.get("reason")})


def _parent_of(meta_raw: str) -> tuple[str, str] | None:
    if not meta_raw or f'"{INVOKED_BY}"' not in meta_raw:
        return None
    try:
        by = codec.loads(meta_raw).get(INVOKED_BY)
    except (codec.DecodeError, AttributeError):
        return None
    if isinstance(by, dict) and isinstance(by.get("id"), str) and isinstance(by.get("signal"), str):
        return by["id"], by["signal"]
    return None


def notify_parents(client: Client, batch: Sequence[Settlement]) -> None:
    """Send each child that ended in ``batch`` (its settlement landed) to its parent."""
    for s in batch:
        o = s.outcome
        if not isinstance(o, Done | Dead) or not s.run.job.meta_raw:
            continue
        parent = _parent_of(s.run.job.meta_raw)
        if parent is None:
            continue
        if isinstance(o, Done):
            body = f'{{"status":"done","result":{o.result or "null"}}}'
        else:
            body = codec.dumps({"status": "cancelled" if o.reason == CANCELLED else "dead", "error": o.error,
                                "reason": o.reason})
        try:
            client.deliver_signal(parent[0], parent[1], body)
        except SignalPending:
            pass
        except RunnerError as exc:  # the parent ended (cancelled) or is gone: nobody waits
            log.info("job %s: its parent %s was not told of its end (%s)", s.run.job.id, parent[0], exc)
        except Exception:  # Redis away: the parent looks for the child itself when it is due
            log.warning("job %s: its parent %s was not told of its end; it looks itself within %d s",
                        s.run.job.id, parent[0], 30, exc_info=True)
