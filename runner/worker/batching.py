"""BATCH functions: many claimed jobs of one function in one ``handle_batch(payloads, ctx)``
call, each job still settled on its own (docs/events.md, "Batches").

What a batch is made of is the executor's (executors.py gathers it, slot.py and child.py
carry it to a child process); this module holds what every place that runs a batch
shares, the worker's thread, a child process and ``run_inline`` alike:

- ``key_of``: the batch a job belongs to (its function and rendered ``key``). Payloads
  are upgraded to the newest schema version before they are grouped, so a batch never
  mixes versions;
- ``BatchContext``: the handler's ``ctx``, with ``ctx.jobs`` (each item's id, attempt,
  idempotency key and ``logger``, whose lines go to that item's job log; ``ctx.logger``'s
  go to every item's). A batch has no single job, so ``ctx.job_id`` and the calls made for
  one job (checkpoints, durable steps, follow-ups, progress) are refused with a message
  that says what to do instead;
- ``run``: call the handler and turn what it did into one Outcome per item: its results,
  a ``BatchFailures`` (only those items fail, each classified as a handler's exception),
  or an exception (every item fails, and is retried or buried on its own attempts).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from runner.catalog import templates
from runner.catalog.registry import Function
from runner.errors import BatchFailures, Cancelled, JobTimeout, PermanentFailure, Suspend
from runner.worker.context import Flags
from runner.worker.execute import NO_RESULT, Claimed, Outcome, failure, outcome_of


class BatchResultMismatch(PermanentFailure, TypeError):
    """handle_batch returned something other than one result per payload (or None), or a
    BatchFailures naming an index outside the batch: every item goes to the dead letters,
    as a retry would run the same code over the same items."""


def key_of(fn: Function, payload: Any) -> str:
    """The rendered BATCH key of a payload (upgraded to the newest version): jobs with
    different keys never share a call. A payload that cannot render it (an optional field
    left out) is batched with the others that cannot: under the key ""."""
    batch = fn.batch
    if batch is None or batch.key is None or not isinstance(payload, dict):
        return ""
    try:
        return batch.key.render(payload)
    except templates.TemplateError:
        return ""


class NotInBatch(PermanentFailure, RuntimeError):
    """A ctx call made for one job (ctx.job_id, a durable step, a follow-up, a checkpoint)
    inside handle_batch: every item goes to the dead letters with what to do instead, as
    a retry would make the same call."""


@dataclass(frozen=True, slots=True)
class BatchJob:
    """One item of a batch, as ``ctx.jobs[i]`` shows it (``i``: its index in ``payloads``)."""

    id: str
    attempt: int
    max_attempts: int
    idempotency_key: str | None
    _flags: Flags = field(default_factory=Flags, repr=False, compare=False)
    # The batch's members' loggers and this item's index there: its own logger is made at
    # its first use (see joblog.MemberLoggers).
    _loggers: Sequence[Any] | None = field(default=None, repr=False, compare=False)
    _at: int = field(default=0, repr=False, compare=False)

    @property
    def logger(self) -> Any:
        """This item's own log (``ctx.jobs[i].logger``); ctx.logger's lines go to every item's."""
        if self._loggers is None:
            return logging.LoggerAdapter(logging.getLogger("runner.job"), {"job_id": self.id})
        return self._loggers[self._at]

    @property
    def cancelled(self) -> bool:
        """Someone asked this item's job to stop (its failure then ends it cancelled)."""
        return self._flags.cancelled

    @property
    def lock_lost(self) -> bool:
        """This item's lease was taken back with its CONCURRENCY slot (a worker stopped past
        its lease): another job of that limit, or this item's own retry, may run now."""
        return self._flags.lock_lost


# What ctx offers a single job and not a batch: each refused with what to do instead.
_ONE_JOB = {
    "job_id": "a batch has no single job id: ctx.jobs[i].id is the id of payloads[i]'s job",
    "attempt": "each item has its own attempt: ctx.jobs[i].attempt",
    "max_attempts": "each item has its own: ctx.jobs[i].max_attempts",
    "idempotency_key": "each item has its own: ctx.jobs[i].idempotency_key",
    "token": "each item has its own claim; a batch has no single token",
    "resource_key": "BATCH functions take no RESOURCE_KEY",
    "checkpoint": "checkpoints are one job's; a batch keeps none",
    "save_checkpoint": "checkpoints are one job's; a batch keeps none (make each item's work idempotent, "
                       "keyed by ctx.jobs[i].id)",
    "step": "durable calls are one job's: a batch cannot sleep or replay; enqueue a durable function per "
            "item (from your producer) for work that needs steps",
    "step_key": "durable calls are one job's",
    "sleep": "durable calls are one job's: a batch cannot sleep; raise runner.Retry(delay=...) to run the "
             "items later",
    "sleep_until": "durable calls are one job's: a batch cannot sleep",
    "wait_for_signal": "durable calls are one job's: a batch cannot wait for a signal",
    "wait_for_event": "durable calls are one job's: a batch cannot wait for an event",
    "invoke": "durable calls are one job's: a batch cannot invoke a child and wait for it",
    "enqueue": "follow-up jobs are held on one job's run until its ack; a batch has none: enqueue with a "
               "runner.Client from the handler, or use ON_SUCCESS, which runs for each item",
    "group_outcomes": "groups' outcomes are read by one job; read them with a runner.Client",
    "iter_group_outcomes": "groups' outcomes are read by one job; read them with a runner.Client",
    "progress": "progress is one job's; a batch reports none (log it with ctx.logger)",
    "stream": "a stream is one job's; a batch has none (log it with ctx.logger)",
    "traceparent": "a batch has no single producer's trace context",
}


class BatchContext:
    """The ``ctx`` of ``handle_batch``: the function, its deadline, a logger, ``jobs`` (one
    BatchJob per payload, in order) and lease extension for every item."""

    __slots__ = ("_extend", "_jobs", "deadline", "logger", "queue", "type", "version")

    def __init__(self, type_: str, version: int, queue: str,
                 jobs: Sequence[BatchJob] | Callable[[], Sequence[BatchJob]], timeout_s: float,
                 logger: logging.Logger | logging.LoggerAdapter[logging.Logger],
                 extend: Callable[[], bool] | None = None) -> None:
        self.type = type_
        self.version = version  # every payload's: upgraded to the newest before the call
        self.queue = queue
        # ``jobs`` may come as a maker, called at the first read of ctx.jobs: a handler that
        # never reads it pays nothing per item for it.
        self._jobs: list[BatchJob] | Callable[[], Sequence[BatchJob]] = jobs if callable(jobs) else list(jobs)
        self.deadline = time.time() + timeout_s  # epoch seconds: TIMEOUT bounds the whole call
        self.logger = logger
        self._extend = extend

    @property
    def jobs(self) -> list[BatchJob]:
        """One BatchJob per payload, in order."""
        got = self._jobs
        if callable(got):
            got = self._jobs = list(got())
        return got

    @property
    def remaining_s(self) -> float:
        return max(0.0, self.deadline - time.time())

    @property
    def cancelled(self) -> bool:
        """True once every item was asked to stop (ctx.jobs[i].cancelled says it per item)."""
        return bool(self.jobs) and all(j.cancelled for j in self.jobs)

    def raise_if_cancelled(self) -> None:
        """Raise Cancelled once every item was asked to stop (each then ends cancelled)."""
        if self.cancelled:
            raise Cancelled("every job of the batch was cancelled")

    @property
    def lock_lost(self) -> bool:
        """True once any item's lease was taken back with its CONCURRENCY slot (as
        ctx.lock_lost of one job; ctx.jobs[i].lock_lost says which): the call runs beside
        what may hold those slots now, and should stop."""
        return any(j.lock_lost for j in self.jobs)

    def extend_lease(self) -> None:
        """Renew every item's lease now (they are also renewed in the background)."""
        from runner.errors import StaleLease

        if self._extend is not None and not self._extend():
            raise StaleLease("a lease of the batch was lost")

    def __getattr__(self, name: str) -> Any:
        why = _ONE_JOB.get(name)
        if why is None:
            raise AttributeError(f"handle_batch's ctx has no {name!r}; it has type, version, queue, jobs, deadline, "
                                 "remaining_s, logger, cancelled, raise_if_cancelled, lock_lost, extend_lease")
        raise NotInBatch(f"ctx.{name} in handle_batch: {why}")


def jobs_of(claimed: Sequence[Claimed], flags: Sequence[Flags], loggers: Sequence[Any] | None = None
            ) -> list[BatchJob]:
    """Each item as ctx.jobs shows it; ``loggers``: each one's own, by index (made at its
    first use; by default one that logs to runner.job, naming the job)."""
    if loggers is not None and len(loggers) != len(claimed):
        raise ValueError(f"{len(loggers)} loggers for {len(claimed)} jobs")
    return [BatchJob(j.id, j.attempt, j.max_attempts, j.idem_key or None, f, loggers, i)
            for i, (j, f) in enumerate(zip(claimed, flags, strict=True))]


def call(fn: Function, payloads: list[dict[str, Any]], ctx: BatchContext,
         loop: asyncio.AbstractEventLoop | None) -> Any:
    """Call handle_batch; an async one runs on ``loop`` (or its own) under TIMEOUT."""
    hb = fn.handle_batch
    assert hb is not None
    if inspect.iscoroutinefunction(hb):
        coro = asyncio.wait_for(hb(payloads, ctx), max(0.001, ctx.remaining_s))
        try:
            return asyncio.run(coro) if loop is None else loop.run_until_complete(coro)
        except TimeoutError:
            raise JobTimeout(f"ran past TIMEOUT {fn.timeout_s:g} s") from None
    return hb(payloads, ctx)


def run(fn: Function, payloads: list[dict[str, Any]], claimed: Sequence[Claimed], ctx: BatchContext,
        loop: asyncio.AbstractEventLoop | None, guard: Callable[[Callable[[], Any]], Any],
        max_result_bytes: int) -> tuple[list[Outcome], float]:
    """Run handle_batch inside ``guard`` (which arms TIMEOUT for the whole call) -> (one
    outcome per item, in order; the call's seconds)."""
    started = time.perf_counter()
    n = len(payloads)
    try:
        got = guard(lambda: call(fn, payloads, ctx, loop))
    except BatchFailures as exc:
        got = exc
    except (Exception, JobTimeout) as exc:
        return [failure(fn, job, exc) for job in claimed], time.perf_counter() - started
    except Suspend:  # (refused before it could be raised: BatchContext has no durable calls)
        stop = RuntimeError("handle_batch cannot suspend: durable calls are one job's")
        return [failure(fn, job, stop) for job in claimed], time.perf_counter() - started
    except BaseException as exc:  # SystemExit, KeyboardInterrupt, an async CancelledError: the
        # batch's failure, as a single handler's is, never its worker thread's end
        return [failure(fn, job, exc) for job in claimed], time.perf_counter() - started
    elapsed = time.perf_counter() - started
    failed: dict[int, BaseException] = {}
    results: Any = got
    if isinstance(got, BatchFailures):
        failed, results = got.failures, got.results
        outside = sorted(i for i in failed if not 0 <= i < n)
        if outside:
            bad = BatchResultMismatch(f"BatchFailures names index(es) {outside}, outside this batch of {n} "
                                      f"(indexes 0 to {n - 1}, as in payloads)")
            return [failure(fn, job, bad) for job in claimed], elapsed
    if results is None:
        results = [None] * n
    if not isinstance(results, list | tuple) or len(results) != n:
        what = f"a list of {len(results)}" if isinstance(results, list | tuple) else type(results).__name__
        bad = BatchResultMismatch(f"handle_batch returned {what} for a batch of {n} payloads: return one result "
                                  "per payload, in order (or None: every result None), or runner.BatchFailures")
        return [failure(fn, job, bad) for job in claimed], elapsed
    # A None result is the same success for every item (no JSON to check): one outcome
    # shared by them all (bulk writes return None; one each cost a sixteenth of a no-op
    # batch's worker CPU per job).
    return [failure(fn, job, failed[i]) if i in failed else NO_RESULT if results[i] is None
            else outcome_of(fn, job, results[i], max_result_bytes)
            for i, job in enumerate(claimed)], elapsed
