"""One claimed job -> one Outcome: decode, check the type and version, validate and
upgrade the payload, run the handler, and classify what happened.

Nothing here talks to Redis or enforces a timeout: the executor that calls ``run`` does
(a thread's timer, or the parent of a child process); the worker settles the Outcome in
batches. The same code runs in a worker's thread and in an isolated child process.
"""

from __future__ import annotations

import asyncio
import operator
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from runner.catalog import keywords
from runner.catalog.registry import Function, Registry
from runner.catalog.schemas import UpgradeFailed
from runner.errors import (
    Cancelled,
    JobTimeout,
    PermanentFailure,
    RateLimited,
    Retry,
    Suspend,
    UnknownVersion,
    ValidationFailed,
    describe,
    seconds,
)
from runner.store import codec, records
from runner.worker import backoff
from runner.worker.context import Context


@dataclass(slots=True)
class Claimed:
    id: str
    token: str
    attempt: int
    type: str
    version_raw: str
    payload_raw: str
    max_attempts: int
    idem_key: str
    resource_key: str
    ready_ms: int
    created_ms: int
    checkpoint_raw: str
    queue: str
    claimed_ms: int  # the server's clock at the claim
    started: bool = True  # its attempt was spent at the claim (not prefetched)
    meta_raw: str = ""  # extra fields a producer attached (JSON object), kept with the outcome
    traceparent: str = ""  # the producer's W3C trace context (in meta), read only by a worker that traces
    partition: int = 0  # of its queue (docs/partitions.md): where it settles
    # The entries of its durable step log at the claim (-1 unknown): a run of a job with
    # none reads no log (nothing else writes it while this claim holds); a durable
    # function's run replays that many calls, its log and stream quiet until past them
    # (journal.py).
    steps: int = -1
    received: float = field(default_factory=time.monotonic)  # this host's monotonic clock then

    def as_row(self) -> tuple[Any, ...]:
        """The job as a child process receives it (``Claimed.from_row``): its fields in
        order, ``received`` last as the seconds since then (its age: a clock reading means
        nothing to another process)."""
        return (*_wire(self), time.monotonic() - self.received)

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Claimed:
        """A job ``as_row`` sent, received when its age says. Its lease runs from the claim,
        not from when the child got it: a job claimed while its child was still starting
        came to it a second or so later, and a child that counted from then held a lease
        the worker had lost (a run frozen past it went on to the next step's function
        after another run had recorded that step)."""
        *fields, age = row
        return cls(**dict(zip(_WIRED, fields, strict=True)), received=time.monotonic() - float(age))


_WIRED = tuple(f for f in Claimed.__slots__ if f != "received")
_wire = operator.attrgetter(*_WIRED)


@dataclass(frozen=True, slots=True)
class Done:
    result: str


NO_RESULT = Done("")  # a success whose handler returned None (most): one for every such run


@dataclass(frozen=True, slots=True)
class RetryLater:
    delay_s: float
    error: dict[str, Any]
    refund: bool = False  # handed back without spending the attempt (a deferral)
    rate_limited: bool = False  # a handler's RateLimited: refunded up to a bound (retry.lua)


@dataclass(frozen=True, slots=True)
class Dead:
    reason: str
    error: dict[str, Any] | None
    refund: bool  # the payload never reached a handler: give the attempt back


@dataclass(frozen=True, slots=True)
class Suspended:
    """A durable function's run ended at a sleep: the job waits, holding no slot, and is
    due again at ``due_ms`` (or ``delay_ms`` from the server's now); no attempt is spent."""

    name: str
    kind: str
    position: int  # of its entry in the step log
    entry: str  # the entry's JSON ('' when the log holds it already)
    delay_ms: int | None
    due_ms: int
    signal: str = ""  # the signal a wait is for
    ends_ms: int | None = None  # ms from now to the wait's end, when the job is due before it


Outcome = Done | RetryLater | Dead | Suspended
CANCELLED = "cancelled"  # the Dead reason of a run that stopped on a cancel request
EXPIRED = "expired"  # the Dead reason of a job not started within its MAX_AGE (claim.lua)
T = TypeVar("T")  # an outcome, or whatever else a settlement carries (as_asked)

# A job whose type or version this worker does not know goes back for a newer worker
# (a rolling deploy) after these many seconds, doubling up to the cap.
DEFER_BASE_S, DEFER_CAP_S = 1.0, 30.0


def to_message(o: Outcome) -> dict[str, Any]:
    if isinstance(o, Done):
        return {"kind": "done", "result": o.result}
    if isinstance(o, Suspended):
        return {"kind": "suspend", "name": o.name, "suspend": o.kind, "position": o.position, "entry": o.entry,
                "delay_ms": o.delay_ms, "due_ms": o.due_ms, "signal": o.signal, "ends_ms": o.ends_ms}
    if isinstance(o, RetryLater):
        return {"kind": "retry", "delay_s": o.delay_s, "error": o.error, "refund": o.refund,
                "rate_limited": o.rate_limited}
    return {"kind": "dead", "reason": o.reason, "error": o.error, "refund": o.refund}


def from_message(m: dict[str, Any]) -> Outcome:
    kind = m.get("kind")
    if kind == "done":
        return Done(result=str(m.get("result") or ""))
    if kind == "suspend":
        delay = m.get("delay_ms")
        return Suspended(str(m["name"]), str(m["suspend"]), int(m["position"]), str(m.get("entry") or ""),
                         None if delay is None else int(delay), int(m.get("due_ms") or 0), str(m.get("signal") or ""),
                         None if m.get("ends_ms") is None else int(m["ends_ms"]))
    if kind == "retry":
        return RetryLater(delay_s=float(m["delay_s"]), error=m["error"], refund=bool(m.get("refund")),
                          rate_limited=bool(m.get("rate_limited")))
    return Dead(reason=str(m["reason"]), error=m.get("error"), refund=bool(m.get("refund")))


def expired(job: Claimed, max_age_s: float | None, now_ms: int | None = None) -> Dead:
    """The end of a job found past its MAX_AGE (by claim.lua, or by its executor when it
    was claimed ahead, at ``now_ms``): dead, not run this time, no attempt spent. Its
    handler may have run before (a retry due past the age, or a run stopped at the end of
    a stop's grace period and handed back): the message fits both."""
    age_s = max(0.0, ((job.claimed_ms if now_ms is None else now_ms) - job.created_ms) / 1000)
    limit = f"MAX_AGE {max_age_s:g} s" if max_age_s else "its MAX_AGE"
    return Dead(reason=EXPIRED, error={"type": "Expired", "message": f"{limit} passed before it could run (again, "
                                       f"for a job whose run was retried or stopped): {age_s:.1f} s since its "
                                       "enqueue"}, refund=True)


def _dead_input(reason: str, message: str, **extra: Any) -> Dead:
    return Dead(reason=reason, error={"type": "InvalidJob", "message": message, **extra}, refund=True)


def _unknown(job: Claimed, reason: str, message: str, grace_s: float, now_ms: int) -> RetryLater | Dead:
    """A worker that does not know a job's type or version (yet) hands it back for a newer
    one, spending no attempt, until ``grace_s`` after the enqueue; then it goes dead."""
    age_s = (now_ms - job.created_ms) / 1000
    if age_s >= grace_s:
        return _dead_input(reason, f"{message} (waited {age_s:.0f} s for a worker that knows it)")
    # Jittered: at a fixed delay the job came due just as this worker's own idle wait
    # (a one-second BLPOP) ended, so the worker that could not run it claimed it again
    # every time, ahead of a newer worker that could.
    base = DEFER_BASE_S * 2 ** min(max(job.attempt - 1, 0), 5) * random.uniform(0.5, 1.5)
    delay = min(DEFER_CAP_S, base, max(0.05, grace_s - age_s))
    err = {"type": "InvalidJob", "message": f"{message}; handed back for a newer worker", "traceback": ""}
    return RetryLater(delay_s=delay, error=err, refund=True)


def resolve(job: Claimed, registry: Registry, unknown_grace_s: float = 0.0,
            now_ms: int = 0) -> tuple[Function, dict[str, Any], int] | Done | RetryLater | Dead:
    """Turn a claimed record into (function, payload at the newest version, version), or an
    outcome that never reaches a handler and spends no attempt: dead for a record that
    cannot run, handed back for a type or version this worker does not know yet."""
    fn = registry.functions.get(job.type)
    if fn is None:
        return _unknown(job, "unknown type", f"no function {job.type!r} is loaded", unknown_grace_s, now_ms)
    try:
        version = int(job.version_raw)
    except ValueError:
        return _dead_input("malformed record", f"version {job.version_raw!r} is not an integer")
    try:
        payload = codec.loads(job.payload_raw)
    except codec.DecodeError as exc:
        return _dead_input("malformed record", f"payload is not JSON: {exc}")
    if version == fn.versions.newest:
        # The common case, without the budget's context or the error listing: a payload at
        # the newest version that a schema without backtracking regexes takes as it is.
        schema = fn.versions.schemas.get(version)
        if schema is not None and schema.compiled is not None and not schema.backtracks \
                and schema.compiled.check.is_valid(payload):
            return fn, payload, version
    try:
        with keywords.one_budget(keywords.CLAIM_BUDGET_S):
            lifted = fn.versions.lift(payload, version)
    except UnknownVersion as exc:
        if version > fn.versions.newest:
            return _unknown(job, "unknown version", str(exc), unknown_grace_s, now_ms)
        return _dead_input("unknown version", str(exc))
    except ValidationFailed as exc:
        return _dead_input(
            "invalid payload", str(exc), errors=[e.as_dict() for e in exc.errors],
            version=exc.version,
        )
    except UpgradeFailed as exc:
        return _dead_input("upgrade failed", str(exc))
    return fn, lifted, fn.versions.newest


def as_asked(outcome: T, cancel_asked: bool) -> T | Dead:
    """A run asked to stop (a cancel reached it) that then fails ends cancelled, as the
    cancel asked, with its error in the history: not dead, nothing for ON_FAILURE, and not
    a retry either (its TIMEOUT when it ignored the cancel, or any error, on any attempt:
    counted as retried, it would never run again). A success stays one; an expiry or a
    refund is not the run's doing."""
    if not cancel_asked:
        return outcome
    if isinstance(outcome, Dead) and not outcome.refund and outcome.reason not in (CANCELLED, EXPIRED):
        return Dead(reason=CANCELLED, error=outcome.error, refund=False)
    if isinstance(outcome, RetryLater) and (not outcome.refund or outcome.rate_limited):
        # (a RateLimited too: the handler's doing, though it spends nothing; a deferral
        # for a type or version this worker does not know yet is not)
        return Dead(reason=CANCELLED, error=outcome.error, refund=False)
    return outcome


def failure(fn: Function, job: Claimed, exc: BaseException, err: dict[str, Any] | None = None) -> Outcome:
    """Classify a handler's exception (or an executor's verdict on it)."""
    err = err or describe(exc)
    refused = getattr(exc, "refused", None) if isinstance(exc, Retry | RateLimited) else None
    if refused:  # a delay that is no number of seconds in range: a plain failure, saying so
        return _failed(fn, job, {**err, "message": refused})
    if isinstance(exc, JobTimeout) and not str(exc):
        err["message"] = f"ran past TIMEOUT {fn.timeout_s:g} s"
    if isinstance(exc, PermanentFailure):
        return Dead(reason="permanent failure", error=err, refund=False)
    if isinstance(exc, Cancelled):  # bury.lua ends a burial of this reason cancelled
        return Dead(reason=CANCELLED, error=err, refund=False)
    asked = _asked_delay(exc)
    if isinstance(exc, RateLimited) and job.attempt <= job.max_attempts and asked is not None:
        # Not a failure of the job: back for retry_after, spending nothing (bounded in retry.lua).
        return RetryLater(delay_s=asked, error=err, refund=True, rate_limited=True)
    if isinstance(exc, Retry) and asked is not None and job.attempt < job.max_attempts:
        return RetryLater(delay_s=asked, error=err)
    return _failed(fn, job, err)


def _failed(fn: Function, job: Claimed, err: dict[str, Any]) -> Outcome:
    """A failed attempt: dead on the job's last, else again on the function's backoff."""
    if job.attempt >= job.max_attempts:
        return Dead(reason="max attempts reached", error=err, refund=False)
    return RetryLater(delay_s=backoff.delay_s(fn.backoff, job.attempt, _rnd), error=err)


_rnd = random.Random()


def _asked_delay(exc: BaseException) -> float | None:
    """The delay a Retry or RateLimited asked for, or None (the backoff, and for
    RateLimited a plain failure). The constructors check it; one set on the exception
    afterwards that is no number of seconds is not trusted either."""
    value = exc.retry_after if isinstance(exc, RateLimited) else exc.delay if isinstance(exc, Retry) else None
    if value is None:
        return None
    try:
        return seconds(value, "delay")
    except ValueError:
        return None


def call(fn: Function, payload: dict[str, Any], ctx: Context, loop: asyncio.AbstractEventLoop | None) -> Any:
    """Run the handler; an async one runs on ``loop`` (the executor's own) under its TIMEOUT."""
    if fn.is_async:
        coro = asyncio.wait_for(fn.handle(payload, ctx), max(0.001, ctx.remaining_s))
        try:
            if loop is None:
                return asyncio.run(coro)
            return loop.run_until_complete(coro)
        except TimeoutError:
            raise JobTimeout(f"ran past TIMEOUT {fn.timeout_s:g} s") from None
    return fn.handle(payload, ctx)


def group_of(job: Claimed) -> tuple[str, int] | None:
    """The group id and member number a group's member carries in its meta (see groups.py)."""
    raw = job.meta_raw
    if not raw or '"member"' not in raw:  # most jobs: no parse
        return None
    try:
        meta = codec.loads(raw)
    except codec.DecodeError:
        return None
    group, number = meta.get("group"), meta.get("member")
    if isinstance(group, str) and isinstance(number, int) and not isinstance(number, bool):
        return group, number
    return None


def suspended(sus: Suspend) -> Suspended:
    """The outcome of a run ended by a durable call, with its step log entry."""
    if sus.recorded:
        entry = ""
    elif sus.kind == "signal":
        entry = codec.dumps({"name": sus.name, "kind": "signal", "signal": sus.signal, "status": "waiting"})
    elif sus.kind == "invoke":
        entry = codec.dumps({"name": sus.name, "kind": "invoke", "signal": sus.signal, "child": sus.child,
                             "status": "waiting"})
    elif sus.kind == "event":
        entry = codec.dumps({"name": sus.name, "kind": "event", "event": sus.event, "match": sus.match or {},
                             "signal": sus.signal, "status": "waiting"})
    else:  # a sleep (suspend.lua appends its start and end)
        entry = records.sleep_entry(sus.name)
    return Suspended(sus.name, sus.kind, sus.index, entry, sus.delay_ms, sus.at_ms, sus.signal, sus.ends_ms)


class ResultTooLarge(PermanentFailure):
    """A handler returned more JSON than ``[worker] max_result_bytes``: dead at once, as
    running it again would only redo its work (and its side effects) for the same result."""


class ResultNotJSON(PermanentFailure, TypeError):
    """A handler returned a value JSON cannot hold: dead at once, for the same reason."""


def run(
    fn: Function, payload: dict[str, Any], job: Claimed, ctx: Context,
    loop: asyncio.AbstractEventLoop | None, guard: Callable[[Callable[[], Any]], Any],
    max_result_bytes: int,
) -> tuple[Outcome, float]:
    """Run the handler (inside ``guard``, which arms the timeout) -> (outcome, run seconds).
    Its return value must encode to at most ``max_result_bytes`` of JSON: it is kept in
    Redis with the done job, so a larger one, or one JSON cannot hold, sends the job to the
    dead letters."""
    started = time.perf_counter()
    try:
        result = guard(partial(call, fn, payload, ctx, loop))  # (a partial: no closure and cells per job)
    except (Exception, JobTimeout) as exc:
        return failure(fn, job, exc), time.perf_counter() - started
    except Suspend as sus:  # a durable call ended the run here: the job sleeps or waits
        return suspended(sus), time.perf_counter() - started
    except BaseException as exc:  # sys.exit, KeyboardInterrupt, GeneratorExit raised by the handler:
        # its attempt's failure, with its traceback, under both isolations (in a child it
        # ended the child: "executor crashed", no traceback, and a child to start again)
        return failure(fn, job, exc), time.perf_counter() - started
    elapsed = time.perf_counter() - started
    if result is None:  # most handlers: nothing to encode, check, bound or pass on (outcome_of's b"")
        return NO_RESULT, elapsed
    return outcome_of(fn, job, result, max_result_bytes), elapsed


def outcome_of(fn: Function, job: Claimed, result: Any, max_result_bytes: int) -> Outcome:
    """A handler's return value as the job's outcome: Done with its JSON, or a failure when
    it is no JSON, too large, or cannot go on to ON_SUCCESS or a group's then-job."""
    try:
        raw = codec.dumpb_result(result) if result is not None else b""
    except codec.NotStorable as exc:  # stored as json would (integer keys as strings) when it can
        bad = ResultNotJSON(f"the handler's return value is not JSON: {exc}; return dicts, lists, strings, "
                            "numbers, booleans or None")
        return failure(fn, job, bad)
    passed_on = (f"ON_SUCCESS ({fn.on_success!r})" if fn.on_success
                 else "its group's then-job" if group_of(job) is not None else "")
    if passed_on:
        try:
            codec.check_payload_ints(raw)
        except ValueError as exc:  # the settle could not write that job's payload: fail this attempt instead
            bad = ResultNotJSON(f"the handler's return value cannot go to {passed_on} as its payload: {exc}")
            return failure(fn, job, bad)
    if len(raw) > max_result_bytes:
        big = ResultTooLarge(
            f"the handler's return value is {len(raw):,} bytes of JSON, over [worker] max_result_bytes = "
            f"{max_result_bytes:,}: store a large result elsewhere (a bucket, a table) and return a reference "
            "to it, or raise the limit in runner.toml")
        return failure(fn, job, big)
    return Done(raw.decode())
