"""The ``ctx`` a handler receives: who the job is, its deadline, a bound logger, lease
extension, a checkpoint that survives a crash, progress, follow-up jobs, and what the
worker has learnt while the handler runs (a lost resource lock, a cancel request).

The worker and ``runner.testing.run_inline`` build the same Context; they differ only in
its Hooks (Redis and a client there, a recorder in inline mode)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from runner.config import MAX_RESULT_BYTES
from runner.errors import DELAY_RANGE, Cancelled, PermanentFailure, StaleLease, ValidationFailed, is_delay
from runner.store import codec
from runner.worker.joblog import JobLogger
from runner.worker.journal import Journal

# Progress rides on every lease renewal into the job's state: a message is shown cut to
# this many characters, and a report whose JSON is still longer is dropped.
PROGRESS_MESSAGE_CHARS = 1000
PROGRESS_MAX_BYTES = 4096


class CheckpointTooLarge(PermanentFailure, ValueError):
    """A checkpoint over ``[worker] max_result_bytes`` or nested past codec.MAX_DEPTH: not
    saved, and the job goes to the dead letters, as a retry would resume from the checkpoint
    before and grow it again (or could not read it back)."""


class CheckpointNotJSON(PermanentFailure, ValueError):
    """A checkpoint JSON cannot carry (an integer past 64 bits, a set): not saved, and the
    job goes to the dead letters, as every retry would build the same one."""


class FollowUpNotJSON(PermanentFailure, ValueError):
    """A ``ctx.enqueue`` or ``ctx.invoke`` payload JSON cannot carry (NaN, a set) or
    nested past the limit (codec.MAX_DEPTH): the job goes to the dead letters, as every
    retry would build the same payload."""


def _unsendable(call: str, type_: str, payload: Any) -> FollowUpNotJSON | None:
    """The permanent failure of a ctx.enqueue or ctx.invoke whose payload every retry
    would build again and see refused: a part JSON cannot carry (NaN, an integer past 64
    bits), or nesting past the limit, named with its path. None for another refusal (a
    schema's: the same ValidationFailed, so it is told apart here)."""
    where = codec.not_json(payload)
    if where is None:
        deep = codec.too_deep(payload, codec.MAX_DEPTH)
        if deep is None:
            return None
        where = (deep, str(codec.TooDeep(deep)))
    return FollowUpNotJSON(f"ctx.{call}({type_!r}): the payload cannot be sent: {where[1]}")


class FollowUpDelay(PermanentFailure, ValueError):
    """A ``ctx.enqueue`` delay that is no number of seconds from 0 to a year and a day (the
    bound of HTTP's ?delay=): the job goes to the dead letters, as every retry would ask
    for it again."""


@dataclass(slots=True)
class Flags:
    """What the worker tells a running handler, set from other threads (or, for a child
    process, from messages its parent sends)."""

    lock_lost: bool = False
    cancelled: bool = False
    # Monotonic (this host's, shared by its processes): the lease is held until then, as
    # of the last renewal that landed (0: none yet, the claim's lease holds; -1: lost).
    lease_until: float = 0.0
    # The run's TIMEOUT fired (JobTimeout raised in it, which its handler may have caught):
    # its durable calls are refused from then on (journal.py).
    timed_out: bool = False

    def lease_held(self, received: float, lease_s: float) -> bool:
        """The lease is still this run's as far as this host knows: a process frozen past it
        (SIGSTOP, a VM pause) finds the time it was away counted against it."""
        until = self.lease_until or received + lease_s
        return until > time.monotonic()


def progress_view(value: Any) -> Any:
    """A report as readers see it: a bare number is a percentage without a message."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return {"percent": value, "message": None}
    return value


_NO_OWN_WORK = contextlib.nullcontext()  # (stateless: one for every context)
_MAKING = threading.Lock()  # around a context's first ctx.logger or step log


class Hooks:
    """What a job's ctx asks of whoever runs it (an executor thread, a child process,
    run_inline), each only when the handler makes that call. One object per run, the run
    in its fields: a closure per call was a function object and its cells built for
    every job, about 1,200 instructions each, used by few. These defaults are a bare
    Context's: nothing to fence, nobody to enqueue for, no step log."""

    __slots__ = ()

    def save(self, body: str) -> bool:
        """ctx.save_checkpoint's JSON: False when the lease is lost (refused)."""
        return True

    def extend(self) -> bool:
        """ctx.extend_lease: False when the lease is lost."""
        return True

    def progress(self, ctx: Context, value: Any) -> None:
        """A progress report that fits (ctx.progress checked it)."""
        ctx.logger.debug("progress %s", value)

    def enqueue(self, type_: str, payload: Any, **options: Any) -> Any:
        """ctx.enqueue's follow-up (options: version, delay, idempotency_key, priority)."""
        raise RuntimeError("this context cannot enqueue (no client was given)")

    def group(self, group_id: str) -> Iterator[Any]:
        """ctx.iter_group_outcomes (and group_outcomes, which lists it)."""
        raise RuntimeError("this context cannot read groups (no client was given)")

    def logger(self, ctx: Context) -> logging.LoggerAdapter[logging.Logger]:
        """ctx.logger, made at its first use (never called again for the context)."""
        return logging.LoggerAdapter(logging.getLogger("runner.job"), {"job_id": ctx.job_id})

    def journal(self, ctx: Context) -> Journal:
        """The step log, made at the first durable call (never called again for the
        context); its owner is the thread that built the context, which runs the handler."""
        raise RuntimeError("this context keeps no step log (durable calls need a worker or run_inline)")


NO_HOOKS = Hooks()  # (stateless: one for every bare context)


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
    # ctx.logger once made (see logger): most handlers never log, and a JobLogger per job
    # was a sixth of a no-op job's time in a child process.
    _logger: logging.LoggerAdapter[logging.Logger] | None
    traceparent: str | None = None  # the producer's W3C trace context, when it sent one
    _checkpoint: Any = None
    _hooks: Hooks = field(default=NO_HOOKS, repr=False)  # the calls that reach whoever runs the job
    _flags: Flags = field(default_factory=Flags, repr=False)
    # A checkpoint is kept in Redis with the job: held to [worker] max_result_bytes, as a result.
    _max_bytes: int = field(default=MAX_RESULT_BYTES, repr=False)
    _progress_warned: bool = field(default=False, repr=False)  # one warning per job, not per call
    _journal: Journal | None = field(default=None, repr=False)  # the step log (durable calls)
    # Entered around runner's own work in a ctx call (encoding what the handler hands in):
    # a process-isolated handler's MEMORY_MB does not cap it (child.MemoryCap).
    _own: AbstractContextManager[Any] = field(default=_NO_OWN_WORK, repr=False)
    # (ctx.logger and the step log are made by the hooks at their first use: a job that
    # makes none builds neither. The hooks are handed the context, never hold it: a
    # context reachable from its own fields is a reference cycle, a job's whole context
    # left to the cyclic collector, whose passes then cost a thread-mode job a tenth of
    # its instructions.)

    @property
    def logger(self) -> logging.LoggerAdapter[logging.Logger]:
        """The job's logger (a JobLogger under a worker): its lines go to the job's log."""
        got = self._logger
        if got is None:
            with _MAKING:  # (a handler's threads may all log first at once: one logger)
                got = self._logger
                if got is None:
                    got = self._logger = self._hooks.logger(self)
        return got

    @logger.setter
    def logger(self, value: logging.LoggerAdapter[logging.Logger]) -> None:
        self._logger = value

    @property
    def checkpoint(self) -> Any:
        """The last checkpoint saved by an earlier attempt of this job (or this one)."""
        return self._checkpoint

    def save_checkpoint(self, data: Any) -> None:
        """Save progress (any JSON value), fenced by the claim token.

        Raises StaleLease when this worker no longer owns the job: stop working then.
        """
        with self._own:
            try:
                raw = codec.dumpb_checked(data)  # a retry must be able to read it back
            except codec.TooDeep as exc:
                raise CheckpointTooLarge(f"checkpoint: {exc}") from None
            except codec.EncodeError:
                _, why = codec.not_json(data) or ("$", "the value at $ is not JSON")
                raise CheckpointNotJSON(f"checkpoint: {why}") from None
            if len(raw) > self._max_bytes:
                raise CheckpointTooLarge(
                    f"checkpoint of {len(raw):,} bytes of JSON is over [worker] max_result_bytes = "
                    f"{self._max_bytes:,}: keep a checkpoint to where the work stands (a cursor, an offset, the "
                    "ids done), or raise the limit in runner.toml")
            body = raw.decode()
        # (The round trip to the worker past _own: its wait lets the handler's other
        # threads run, and they would allocate past a child's MEMORY_MB meanwhile.)
        if not self._hooks.save(body):
            raise StaleLease(f"job {self.job_id}: lease lost, checkpoint refused")
        self._checkpoint = data

    def extend_lease(self) -> None:
        """Renew the lease now (it is also renewed in the background while the handler runs).

        Raises StaleLease when the lease was already lost.
        """
        if not self._hooks.extend():
            raise StaleLease(f"job {self.job_id}: lease lost")

    @property
    def lock_lost(self) -> bool:
        """True once the job's resource (or concurrency) slot went to another job, or was
        released when another worker reclaimed the job: its lease lapsed while this handler
        ran (a stall longer than the visibility timeout). The exclusion RESOURCE_KEY
        promised no longer holds; stop, or fence writes with ``token``."""
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

    def stream(self, data: Any) -> None:
        """Push partial output (text, or any JSON) to whoever follows the job's stream
        (GET /jobs/{id}/stream, client.stream): chunks go out in order, with the lease
        renewal (about once a second) and with the job's end; the newest 10,000 chunks
        and 1 MiB are kept for a late reader, as long as the job. Raises TypeError for a
        value that is not JSON, ValueError for a chunk over 64 KiB. Text holding a lone
        surrogate (a name decoded with surrogateescape) goes with U+FFFD in its place."""
        with self._own:
            if isinstance(data, str):
                data = codec.shown_text(data)
            try:
                codec.dumps(data)
            except (TypeError, ValueError) as exc:
                raise TypeError(f"ctx.stream takes text or JSON, not {type(data).__name__} ({exc})") from None
            logger = self.logger
            if isinstance(logger, JobLogger):
                logger.stream(data, send=False)
        if isinstance(logger, JobLogger):
            logger.send_due()  # (not in _own: a child's handler threads would allocate past MEMORY_MB meanwhile)

    def progress(self, percent: Any, message: str | None = None) -> None:
        """Report progress: a percentage (0 to 100) and an optional message, shown as
        ``progress`` by GET /jobs/{id} and `runner job` within 2 s. Batched: the latest
        report rides on the next lease renewal (or the run's next durable step, or its
        end, if sooner), so a call costs no round trip. Never fails
        the job: progress is advice to whoever watches, not state the job depends on. A
        message is shown cut to its first 1,000 characters; a report that is not JSON,
        nested past the limit of 120 levels, or whose JSON is over 4 KiB even so, is dropped
        (the first with a warning in the job's log), leaving the last one shown."""
        if isinstance(message, str) and len(message) > PROGRESS_MESSAGE_CHARS:
            message = message[:PROGRESS_MESSAGE_CHARS] + "\u2026"
        value = percent if message is None else {"percent": percent, "message": message}
        try:
            # JSON only, as everything a job leaves behind, and held to the one nesting
            # limit, the level of {"percent", "message"} aside: one past it was shown as it
            # was, or (past what a record reads back) as {"unparsable": ...} in its place.
            with self._own:
                size = len(codec.dumpb_checked(value, codec.MAX_DEPTH + (message is not None)))
        except codec.TooDeep as exc:
            return self._drop_progress(f"progress report dropped: nested past the limit of {codec.MAX_DEPTH} "
                                       f"levels of arrays and objects (at {exc.path})")
        except TypeError as exc:  # a Decimal, bytes, a lone surrogate, NaN: not JSON
            return self._drop_progress(f"progress report dropped: not JSON ({exc})")
        if size > PROGRESS_MAX_BYTES:
            return self._drop_progress(f"progress report of {size} bytes of JSON dropped (at most "
                                       f"{PROGRESS_MAX_BYTES})")
        self._hooks.progress(self, value)

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
        (0-9) overrides its function's PRIORITY, as an enqueue's does. A ``delay`` that
        is no number of seconds from 0 to a year and a day raises FollowUpDelay, which
        fails the job for good."""
        if delay is not None and not is_delay(delay):  # (1e308 failed converting to ms, 1e30 never came due)
            raise FollowUpDelay(f"ctx.enqueue({type!r}, delay={delay!r}): it must be {DELAY_RANGE}")
        try:
            return self._hooks.enqueue(type, payload, version=version, delay=delay,
                                       idempotency_key=idempotency_key, priority=priority)
        except (ValidationFailed, codec.EncodeError):  # (a child process's channel refuses it as it sends)
            unsendable = _unsendable("enqueue", type, payload)
            if unsendable is None:
                raise
            raise unsendable from None


    # --- durable calls (docs/durable.md) ---------------------------------------------

    def _durable(self) -> Journal:
        if self._journal is None:
            # Runner's own work (not under a child's MEMORY_MB); two threads' first calls at
            # once share one journal.
            with self._own, _MAKING:
                if self._journal is None:
                    self._journal = self._hooks.journal(self)
        return self._journal

    def step(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` once for this job and record its JSON result (or the
        permanent error it raised); every later run of the job (a retry, a reclaim, a
        resume) replays the handler from the top and gets the recorded value here without
        calling ``fn``. A transient error fails the attempt as any handler error does, and
        only steps without a record run again. A name used again in one run is recorded
        as ``name#2``, ``name#3``. Raises StepTooLarge past ``[worker] max_step_bytes`` or
        the step log's bounds, NonDeterministicReplay when a replay reaches another step
        than the one recorded at this position."""
        return self._durable().step(name, fn, args, kwargs)

    @property
    def step_key(self) -> str | None:
        """Inside a step's ``fn``: ``"<job id>:<step name>"``, the same on every run, for the
        downstream's own idempotency (a crash between ``fn`` returning and its record
        landing runs that one step again). None outside a step."""
        return self._journal.step_key if self._journal is not None else None

    def sleep(self, name: str, seconds: float) -> None:
        """End this run here and resume the job (replaying its recorded steps) ``seconds``
        from now, by the server's clock: the worker slot is free meanwhile, no attempt is
        spent, and the job's status is ``sleeping``. Up to a year."""
        s = float(seconds)
        if not 0 <= s <= 366 * 86400 or s != s:
            raise ValueError(f"ctx.sleep({name!r}, {seconds!r}): seconds from 0 to a year (31,622,400)")
        with self._own:
            self._durable().sleep(name, int(s * 1000), 0)

    def sleep_until(self, name: str, when: Any) -> None:
        """ctx.sleep until ``when`` (an aware datetime or epoch seconds)."""
        at = when.timestamp() if hasattr(when, "timestamp") else float(when)
        if at != at or at > time.time() + 366 * 86400:
            raise ValueError(f"ctx.sleep_until({name!r}, {when!r}): a time within a year")
        with self._own:
            self._durable().sleep(name, None, int(at * 1000))

    def wait_for_signal(self, name: str, timeout: float | None = None) -> Any:
        """The body of the signal ``name`` (``POST /jobs/{id}/signals/{name}``,
        ``client.signal``, ``runner signal``): one sent before this call was kept and is
        returned at once; otherwise the run ends here (status ``waiting``, no worker slot,
        no attempt spent) and the job resumes when it comes. Raises SignalTimeout once
        ``timeout`` seconds pass without one (without a timeout, a wait lasts up to a year)."""
        ms = None
        if timeout is not None:
            t = float(timeout)
            if not 0 <= t <= 366 * 86400:
                raise ValueError(f"ctx.wait_for_signal({name!r}, timeout={timeout!r}): seconds from 0 to a year")
            ms = int(t * 1000)
        with self._own:
            return self._durable().wait(name, ms)

    def wait_for_event(self, name: str, match: dict[str, Any] | None = None,
                       timeout: float | None = None) -> dict[str, Any] | None:
        """The first event ``name`` emitted after this call began to wait whose data holds
        every field of ``match`` at its top level with an equal JSON value, as a dict
        ``{"id", "name", "data", "ts"}`` (``ts``: when it was emitted, epoch ms). Until one
        comes the run ends here (status ``waiting``, no worker slot, no attempt spent) and
        the job resumes with it. Returns None once ``timeout`` seconds pass without one
        (without a timeout, a wait lasts up to a year). Recorded as a step named ``name``."""
        from runner.catalog.options import EVENT_NAME
        from runner.store.listeners import canonical, stored

        if not isinstance(name, str) or not EVENT_NAME.fullmatch(name):
            raise ValueError(f"ctx.wait_for_event: {name!r} is not an event name: 1 to 128 letters, digits and "
                             ". _ : -, starting with a letter or digit")
        if match is None:
            match = {}
        if not isinstance(match, dict) or not all(isinstance(k, str) for k in match):
            raise ValueError(f"ctx.wait_for_event({name!r}, match={match!r}): a dict of top-level field names "
                             "to the JSON values the event's data must hold")
        try:
            match = stored(match)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"ctx.wait_for_event({name!r}): the match is not JSON: {exc}") from None
        if len(canonical(match)) > 4096:
            raise ValueError(f"ctx.wait_for_event({name!r}): a match is at most 4,096 bytes of JSON")
        ms = None
        if timeout is not None:
            t = float(timeout)
            if not 0 <= t <= 366 * 86400:
                raise ValueError(f"ctx.wait_for_event({name!r}, timeout={timeout!r}): seconds from 0 to a year")
            ms = int(t * 1000)
        with self._own:
            return self._durable().wait_event(name, match, ms)

    def invoke(self, type: str, payload: Any, *, timeout: float | None = None, **options: Any) -> Any:
        """Run a child job of ``type`` and return its result: the child is validated now
        (an invalid one raises here), written in the same step as this run's suspension,
        and the job resumes when the child ends, holding no worker slot meanwhile. Raises
        JobFailed when the child ends dead or cancelled, StillRunning when it has not ended
        ``timeout`` seconds on (without one, up to a year). ``options``: version, delay,
        priority, as for ctx.enqueue. Recorded as a step named ``type``."""
        ms = None
        if timeout is not None:
            t = float(timeout)
            if not 0 < t <= 366 * 86400:
                raise ValueError(f"ctx.invoke({type!r}, timeout={timeout!r}): seconds up to a year")
            ms = int(t * 1000)
        if "idempotency_key" in options:
            # A key another job holds would deduplicate the child away, and this job
            # would wait for a child that was never written.
            raise TypeError(f"ctx.invoke({type!r}): idempotency_key is not an option of a child call; the "
                            f"child's id, {self.job_id}.c<position>, already makes it once per call on every "
                            "attempt; to share one job among callers, enqueue it with ctx.enqueue and pass "
                            "its id instead")
        unknown = set(options) - {"version", "delay", "priority"}
        if unknown:
            raise TypeError(f"ctx.invoke: unknown option(s) {sorted(unknown)}; known: delay, priority, version")
        with self._own:
            try:
                return self._durable().invoke(type, payload, ms, options)
            except (ValidationFailed, codec.EncodeError):  # (as ctx.enqueue's, under either isolation)
                unsendable = _unsendable("invoke", type, payload)
                if unsendable is None:
                    raise
                raise unsendable from None

    def group_outcomes(self, group_id: str) -> list[Any]:
        """Every member's outcome of a group, in member order: for a then-job whose payload
        carries ``"outcomes": null`` (a group too big to carry them; see runner/groups.py).
        Gathered in one list whatever the group's size: the handler's memory is its own
        choice (ctx.iter_group_outcomes holds one page at a time)."""
        return list(self.iter_group_outcomes(group_id))

    def iter_group_outcomes(self, group_id: str) -> Iterator[Any]:
        """Every member's outcome of a group, in member order, read a page at a time (at
        most 1,000 outcomes and 8 MiB a round trip): only that page is held."""
        return self._hooks.group(group_id)


def for_job(job: Any, version: int, timeout_s: float, hooks: Hooks, flags: Flags, max_bytes: int) -> Context:
    """The Context of one claimed job (a worker.execute.Claimed), in a worker thread or in
    an isolated child alike; the ``hooks`` are what differs there. ``max_bytes``: the
    bound of a checkpoint ([worker] max_result_bytes)."""
    # Positional, in the field order: one per job, and keywords cost twice the rest.
    return Context(
        job.id, job.type, version, job.queue, job.attempt, job.max_attempts, job.token, time.time() + timeout_s,
        job.idem_key or None, job.resource_key or None, None,
        job.traceparent or None, codec.loads(job.checkpoint_raw) if job.checkpoint_raw else None,
        hooks, flags, max_bytes,
    )
