"""The ``ctx`` a handler receives: who the job is, its deadline, a bound logger, lease
extension, a checkpoint that survives a crash, progress, follow-up jobs, and what the
worker has learnt while the handler runs (a lost resource lock, a cancel request).

The worker and ``runner.testing.run_inline`` build the same Context; they differ only in
the callables behind it (Redis and a client there, a recorder in inline mode)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runner.config import MAX_RESULT_BYTES
from runner.errors import Cancelled, PermanentFailure, StaleLease
from runner.store import codec

# Progress rides on every lease renewal into the job's state: a message is shown cut to
# this many characters, and a report whose JSON is still longer is dropped.
PROGRESS_MESSAGE_CHARS = 1000
PROGRESS_MAX_BYTES = 4096


class CheckpointTooLarge(PermanentFailure, ValueError):
    """A checkpoint over ``[worker] max_result_bytes``: not saved, and the job goes to the
    dead letters, as a retry would resume from the checkpoint before and grow it again."""


@dataclass(slots=True)
class Flags:
    """What the worker tells a running handler, set from other threads (or, for a child
    process, from messages its parent sends)."""

    lock_lost: bool = False
    cancelled: bool = False


def progress_view(value: Any) -> Any:
    """A report as readers see it: a bare number is a percentage without a message."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return {"percent": value, "message": None}
    return value


@dataclass(slots=True)
class Context:
    job_id: str
    type: str
    version: int
    queue: str
    attempt: int
    max_attempts: int
    token: str
    deadline: float  # epoch seconds after which the attempt is timed out
    idempotency_key: str | None
    resource_key: str | None
    logger: logging.LoggerAdapter[logging.Logger]
    traceparent: str | None = None  # the producer's W3C trace context, when it sent one
    _checkpoint: Any = None
    _save: Callable[[str], bool] | None = field(default=None, repr=False)
    _extend: Callable[[], bool] | None = field(default=None, repr=False)
    _flags: Flags = field(default_factory=Flags, repr=False)
    _progress: Callable[[Any], None] | None = field(default=None, repr=False)
    _enqueue: Callable[..., Any] | None = field(default=None, repr=False)
    _group: Callable[[str], list[Any]] | None = field(default=None, repr=False)
    # A checkpoint is kept in Redis with the job: held to [worker] max_result_bytes, as a result.
    _max_bytes: int = field(default=MAX_RESULT_BYTES, repr=False)
    _progress_warned: bool = field(default=False, repr=False)  # one warning per job, not per call

    @property
    def checkpoint(self) -> Any:
        """The last checkpoint saved by an earlier attempt of this job (or this one)."""
        return self._checkpoint

    def save_checkpoint(self, data: Any) -> None:
        """Save progress (any JSON value), fenced by the claim token.

        Raises StaleLease when this worker no longer owns the job: stop working then.
        """
        raw = codec.dumpb(data)
        if len(raw) > self._max_bytes:
            raise CheckpointTooLarge(
                f"checkpoint of {len(raw):,} bytes of JSON is over [worker] max_result_bytes = {self._max_bytes:,}: "
                "keep a checkpoint to where the work stands (a cursor, an offset, the ids done), or raise "
                "the limit in runner.toml")
        body = raw.decode()
        if self._save is not None and not self._save(body):
            raise StaleLease(f"job {self.job_id}: lease lost, checkpoint refused")
        self._checkpoint = data

    def extend_lease(self) -> None:
        """Renew the lease now (it is also renewed in the background while the handler runs).

        Raises StaleLease when the lease was already lost.
        """
        if self._extend is not None and not self._extend():
            raise StaleLease(f"job {self.job_id}: lease lost")

    @property
    def lock_lost(self) -> bool:
        """True once the job's resource (or concurrency) slot went to another job: its lease
        lapsed while this handler ran (a stall longer than the visibility timeout). The
        exclusion RESOURCE_KEY promised no longer holds; stop, or fence writes with ``token``."""
        return self._flags.lock_lost

    @property
    def remaining_s(self) -> float:
        return max(0.0, self.deadline - time.time())

    @property
    def cancelled(self) -> bool:
        """True once someone asked this job to stop: return (or raise) at the next safe point."""
        return self._flags.cancelled

    def raise_if_cancelled(self) -> None:
        """Raise Cancelled once someone asked this job to stop: the job then ends cancelled
        (not retried). Call it at the handler's safe points."""
        if self._flags.cancelled:
            raise Cancelled(f"job {self.job_id} was cancelled")

    def progress(self, percent: Any, message: str | None = None) -> None:
        """Report progress: a percentage (0 to 100) and an optional message, shown as
        ``progress`` by GET /jobs/{id} and `runner job` within 2 s. Batched: the latest
        report rides on the next lease renewal, so a call costs no round trip. Never fails
        the job: progress is advice to whoever watches, not state the job depends on. A
        message is shown cut to its first 1,000 characters; a report that is not JSON, or
        whose JSON is over 4 KiB even so, is dropped (the first with a warning in the job's
        log), leaving the last one shown."""
        if isinstance(message, str) and len(message) > PROGRESS_MESSAGE_CHARS:
            message = message[:PROGRESS_MESSAGE_CHARS] + "\u2026"
        value = percent if message is None else {"percent": percent, "message": message}
        try:
            size = len(codec.dumpb(value))  # JSON only, as everything a job leaves behind
        except TypeError as exc:  # a Decimal, bytes, a lone surrogate: not JSON
            return self._drop_progress(f"progress report dropped: not JSON ({exc})")
        if size > PROGRESS_MAX_BYTES:
            return self._drop_progress(f"progress report of {size} bytes of JSON dropped (at most "
                                       f"{PROGRESS_MAX_BYTES})")
        if self._progress is not None:
            self._progress(value)
        else:
            self.logger.debug("progress %s", value)

    def _drop_progress(self, why: str) -> None:
        if not self._progress_warned:
            self._progress_warned = True
            self.logger.warning("%s; later ones that cannot be shown are dropped without a word", why)

    def enqueue(self, type: str, payload: Any, *, version: int | None = None, delay: float | None = None,
                idempotency_key: str | None = None, priority: int | None = None) -> Any:
        """Enqueue a follow-up job, validated now like any other (an invalid one raises
        here). It is written with this run's success, in the same step as the ack: a run
        that fails or crashes leaves none. Returns an ``Enqueued`` with status "pending"
        and the follow-up's id (the same on every attempt of this job). ``priority``
        (0-9) overrides its function's PRIORITY, as an enqueue's does."""
        if self._enqueue is None:
            raise RuntimeError("this context cannot enqueue (no client was given)")
        return self._enqueue(type, payload, version=version, delay=delay, idempotency_key=idempotency_key,
                             priority=priority)


    def group_outcomes(self, group_id: str) -> list[Any]:
        """Every member's outcome of a group, in member order: for a then-job whose payload
        carries ``"outcomes": null`` (a group too big to carry them; see runner/groups.py)."""
        if self._group is None:
            raise RuntimeError("this context cannot read groups (no client was given)")
        return self._group(group_id)


def for_job(job: Any, version: int, timeout_s: float, logger: logging.Logger, *,
            _save: Callable[[str], bool] | None = None, _extend: Callable[[], bool] | None = None,
            _flags: Flags | None = None, _progress: Callable[[Any], None] | None = None,
            _enqueue: Callable[..., Any] | None = None, _group: Callable[[str], list[Any]] | None = None,
            _max_bytes: int = MAX_RESULT_BYTES) -> Context:
    """The Context of one claimed job (a worker.execute.Claimed), in a worker thread or in
    an isolated child alike; the hooks are the ones that differ there."""
    # Positional, in the field order: one per job, and keywords cost twice the rest.
    return Context(
        job.id, job.type, version, job.queue, job.attempt, job.max_attempts, job.token, time.time() + timeout_s,
        job.idem_key or None, job.resource_key or None,
        logging.LoggerAdapter(logger, {"job_id": job.id, "type": job.type, "attempt": job.attempt}),
        job.traceparent or None, codec.loads(job.checkpoint_raw) if job.checkpoint_raw else None,
        _save, _extend, _flags if _flags is not None else Flags(), _progress, _enqueue, _group, _max_bytes,
    )
