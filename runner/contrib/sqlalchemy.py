"""SQLAlchemy: ``enqueue_on_commit(session, type, payload, ...)`` validates now and
enqueues once the session's transaction commits (its ``after_commit`` event); a rollback
drops what was pending. Jobs of a rolled-back SAVEPOINT (``begin_nested``) are still sent
when the outer transaction commits: put such work outside the savepoint.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Session

from runner.client import Client, Request
from runner.contrib.shared import shared_client

_PENDING = "runner.pending"  # the session.info key of the jobs waiting for the commit


def enqueue_on_commit(session: Session, type: str, payload: Any, *, client: Client | None = None,
                      version: int | None = None, delay: float | None = None,
                      idempotency_key: str | None = None) -> None:
    """Enqueue the job when ``session`` commits; never when it rolls back."""
    c = client or shared_client()
    c.prepare(Request(type, payload, version, delay, None, idempotency_key))  # raises ValidationFailed now
    if not event.contains(session, "after_commit", _after_commit):
        event.listen(session, "after_commit", _after_commit)
        event.listen(session, "after_rollback", _after_rollback)
    session.info.setdefault(_PENDING, []).append(
        (c, dict(type=type, payload=payload, version=version, delay=delay, idempotency_key=idempotency_key)))


def _after_commit(session: Session) -> None:
    pending = session.info.pop(_PENDING, [])
    for c, job in pending:
        c.enqueue(job.pop("type"), job.pop("payload"), **job)


def _after_rollback(session: Session) -> None:
    session.info.pop(_PENDING, None)
