"""The one exception tree of runner.

    RunnerError                    base of everything runner raises on purpose
    ├── ConfigError                runner.toml or the environment is wrong (names file and key)
    ├── FunctionLoadError          a function file or its schemas cannot be loaded
    ├── UnknownFunction            no function of that type is loaded
    ├── UnknownVersion             the type has no schema for that payload version
    ├── ValidationFailed           a payload does not match its schema (carries every error)
    │   └── InvalidGroup           a group request that cannot run (members on several
    │                              queues, a member's payload, the then-job...): every error
    ├── IdempotencyConflict        the key is taken by a job with another payload
    ├── JobNotFound                no record for that id
    │   └── UnknownQueue           no queue of that name is configured
    ├── GroupNotFound              no group of that id (never created, or past its retention)
    ├── UnknownSchedule            no loaded function declares a schedule of that id
    ├── StaleLease                 the worker's claim token no longer owns the job
    ├── JobFailed                  a called job ended dead or cancelled (carries its error)
    ├── JobEnded                   a cancel of a job that ended already (its status)
    ├── StillRunning               a call's or result's timeout passed before the job ended
    ├── RedisUnavailable           Redis could not be reached (the call wrote nothing)
    └── NotReplicated              written to the master, but fewer replicas than
                                   [redis] wait_replicas confirmed it in time

Handler control flow, raised by user code and caught by the executor:

    Retry(delay=...)               try again after ``delay`` seconds
    RateLimited(retry_after=...)   put back for that long without spending the attempt
    PermanentFailure("why")        straight to the dead-letter queue
    Cancelled                      the job was cancelled: it ends cancelled, never retried
                                   (``ctx.raise_if_cancelled()`` raises it)

Raised into a handler by the worker (BaseException, so ``except Exception`` in a handler
cannot swallow it):

    JobTimeout                     the handler ran past its TIMEOUT
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn


class RunnerError(Exception):
    """Base of every error runner raises on purpose."""


class ConfigError(RunnerError):
    """Configuration is invalid; the message names the file, the key and what was expected.

    ``key`` is the dotted path of the offending key (or section) in the file, when there
    is one, so the loader can add its line."""

    def __init__(self, message: str, key: tuple[str, ...] | None = None) -> None:
        self.key = key
        super().__init__(message)


class FunctionLoadError(RunnerError):
    """A function file or one of its schemas cannot be loaded."""

    def __init__(self, path: str, message: str, line: int | None = None) -> None:
        self.path = path
        self.line = line
        self.message = message
        where = f"{path}:{line}" if line else path
        super().__init__(f"{where}: {message}")

    def shown(self) -> str:
        """The message with the path relative to the current folder when it lies there,
        as a user typed it (``functions/hello.py:3: ...``)."""
        try:
            path = str(Path(self.path).resolve().relative_to(Path.cwd().resolve()))
        except ValueError:
            path = self.path
        return f"{path}:{self.line}: {self.message}" if self.line else f"{path}: {self.message}"


class UnknownFunction(RunnerError):
    def __init__(self, type_: str, known: Sequence[str] = (), broken: str | None = None) -> None:
        self.type = type_
        self.known = list(known)
        self.broken = broken
        if broken:
            detail = f"its file did not load: {broken}"
        else:
            detail = f"loaded: {', '.join(self.known)}" if self.known else "no function is loaded"
        super().__init__(f"unknown function {type_!r} ({detail})")


class UnknownVersion(RunnerError):
    def __init__(self, type_: str, version: int, known: list[int]) -> None:
        self.type = type_
        self.version = version
        self.known = known
        super().__init__(f"{type_!r} has no schema version {version} (known: {', '.join(map(str, known))})")


@dataclass(frozen=True, slots=True)
class FieldError:
    """One validation error: where in the payload (JSON path) and what is wrong."""

    path: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"path": self.path, "message": self.message}


class ValidationFailed(RunnerError):
    def __init__(self, type_: str, version: int, errors: list[FieldError]) -> None:
        self.type = type_
        self.version = version
        self.errors = errors
        detail = "; ".join(f"{e.path}: {e.message}" for e in errors[:5])
        super().__init__(f"payload of {type_} v{version} is invalid: {detail}")


class InvalidGroup(ValidationFailed):
    """A group request refused before anything is written: every problem, each with its
    path into the request (``$.members[3].payload.to``, ``$.then``)."""

    def __init__(self, errors: list[FieldError]) -> None:
        super().__init__("group", 0, errors)
        detail = "; ".join(f"{e.path}: {e.message}" for e in errors[:5])
        self.args = (f"invalid group: {detail}",)


class IdempotencyConflict(RunnerError):
    def __init__(self, key: str, job_id: str) -> None:
        self.key = key
        self.job_id = job_id
        super().__init__(f"idempotency key {key!r} is taken by job {job_id} with another payload")


class JobNotFound(RunnerError):
    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        super().__init__(f"no job {job_id!r}")


class UnknownQueue(JobNotFound):
    """No queue of that name is configured: a JobNotFound (the jobs asked for are in no
    queue), with words of its own."""

    def __init__(self, queue: str, known: Sequence[str]) -> None:
        self.queue = queue
        self.known = list(known)
        RunnerError.__init__(self, f"no queue {queue!r} (queues: {', '.join(self.known)})")
        self.job_id = ""


class GroupNotFound(RunnerError):
    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        super().__init__(f"no group {group_id!r}")


class UnknownSchedule(RunnerError):
    def __init__(self, schedule_id: str, known: list[str]) -> None:
        self.schedule_id = schedule_id
        hint = f" (have: {', '.join(known[:10])}{', ...' if len(known) > 10 else ''})" if known else \
            " (no function declares a SCHEDULE)"
        super().__init__(f"no schedule {schedule_id!r}{hint}; `runner schedules` lists them")


class StaleLease(RunnerError):
    """The claim token no longer owns the job: its lease lapsed and it was reclaimed."""


class JobFailed(RunnerError):
    """A job waited for (``Client.call``, ``Client.result``) ended dead."""

    def __init__(self, job_id: str, error: Any, reason: str | None = None) -> None:
        self.job_id = job_id
        self.error = error
        self.reason = reason
        message = error.get("message") if isinstance(error, dict) else None
        super().__init__(f"job {job_id} failed: {message or reason or 'dead'}")


class JobEnded(RunnerError):
    """A cancel came too late: the job ended already (done, dead or cancelled)."""

    def __init__(self, job_id: str, status: str) -> None:
        self.job_id = job_id
        self.status = status
        super().__init__(f"job {job_id} has ended already ({status})")


class StillRunning(RunnerError):
    """The wait's timeout passed before the job ended; it may still end later."""

    def __init__(self, job_id: str, status: str | None) -> None:
        self.job_id = job_id
        self.status = status
        super().__init__(f"job {job_id} is still {status or 'pending'}")


class RedisUnavailable(RunnerError):
    """Redis could not be reached or refused the write. Nothing was written, unless the
    connection was lost after a write went out: then its outcome is unknown."""


class NotReplicated(RunnerError):
    """The enqueue ran on the master, but fewer than ``wanted`` replicas confirmed it within
    the timeout ([redis] wait_replicas, wait_timeout): the job exists now, yet a failover
    before replication catches up could lose it. Not a RedisUnavailable: something was
    written. Retrying with the same idempotency key is safe (a duplicate answers with the
    first job); without one, a retry may run the job twice.

    ``job_ids`` are the jobs the answer was for; ``replies`` are the scripts' own replies
    (the store layer hands them up so that each caller can be told about its own job)."""

    def __init__(self, acked: int, wanted: int, timeout_s: float, job_ids: Sequence[str] = (),
                 replies: Sequence[Any] = ()) -> None:
        self.acked = acked
        self.wanted = wanted
        self.timeout_s = timeout_s
        self.job_ids = list(job_ids)
        self.replies = list(replies)
        which = f"job {self.job_ids[0]}" if len(self.job_ids) == 1 else \
            f"{len(self.job_ids)} jobs" if self.job_ids else "the write"
        super().__init__(
            f"{which} was written to the Redis master but only {acked} of {wanted} replica(s) confirmed "
            f"it within {timeout_s:g} s, so a failover now could lose it. Retry with the same idempotency "
            "key (safe: a duplicate returns the first job), and check the replicas (INFO replication)"
        )


def refusal_record(exc: RunnerError) -> dict[str, Any]:
    """A refusal as JSON, to cross a child process's pipe (its ``ctx.enqueue``) and be
    raised there again, by ``raise_refusal``, with its class and fields: a handler's
    ``except ValidationFailed`` must work under either isolation."""
    out: dict[str, Any] = {"error": str(exc)}
    if type(exc) is ValidationFailed:
        out.update(kind="validation", type=exc.type, version=exc.version, errors=[e.as_dict() for e in exc.errors])
    elif type(exc) is UnknownFunction:
        out.update(kind="unknown_function", type=exc.type, known=exc.known, broken=exc.broken)
    elif type(exc) is UnknownVersion:
        out.update(kind="unknown_version", type=exc.type, version=exc.version, known=exc.known)
    elif type(exc) is IdempotencyConflict:
        out.update(kind="idempotency_conflict", key=exc.key, job_id=exc.job_id)
    elif type(exc) is RedisUnavailable:
        out.update(kind="unavailable")
    return out


def raise_refusal(record: dict[str, Any]) -> NoReturn:
    """Raise what ``refusal_record`` wrote: its class when it is one of those, else a
    RunnerError with the message."""
    kind = record.get("kind")
    if kind == "validation":
        errors = [FieldError(str(e.get("path")), str(e.get("message"))) for e in record.get("errors") or ()]
        raise ValidationFailed(str(record.get("type")), int(record.get("version") or 0), errors)
    if kind == "unknown_function":
        raise UnknownFunction(str(record.get("type")), record.get("known") or (), record.get("broken"))
    if kind == "unknown_version":
        raise UnknownVersion(str(record.get("type")), int(record.get("version") or 0), record.get("known") or [])
    if kind == "idempotency_conflict":
        raise IdempotencyConflict(str(record.get("key")), str(record.get("job_id")))
    if kind == "unavailable":
        raise RedisUnavailable(str(record.get("error")))
    raise RunnerError(str(record.get("error")))


def seconds(value: Any, call: str) -> float:
    """A delay a handler asked for, as seconds: a finite number >= 0, else a ValueError
    naming the call, raised where the handler raised its exception (so the attempt fails
    saying so, rather than retrying at once or leaving the job unsettled)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{call}={value!r}): it must be a number of seconds >= 0")
    return float(value)


class Retry(Exception):
    """Raise from a handler to try again after ``delay`` seconds (None: the backoff)."""

    def __init__(self, delay: float | None = None, reason: str = "retry requested") -> None:
        self.delay = None if delay is None else seconds(delay, "Retry(delay")
        self.reason = reason
        super().__init__(reason)


class RateLimited(Exception):
    """Raise from a handler when a downstream said "too many requests": the job goes back
    for ``retry_after`` seconds without spending its attempt, with a history entry. Free
    up to 100 times per job (see retry.lua); past that each counts as an attempt, as a Retry."""

    def __init__(self, retry_after: float = 1.0, reason: str = "rate limited") -> None:
        self.retry_after = seconds(retry_after, "RateLimited(retry_after")
        self.reason = reason
        super().__init__(reason)


class PermanentFailure(Exception):
    """Raise from a handler to send the job straight to the dead-letter queue."""


class Cancelled(Exception):
    """Raise from a handler (or let ``ctx.raise_if_cancelled()`` raise it) once
    ``ctx.cancelled`` is true: the job ends cancelled, not retried."""


class JobTimeout(BaseException):
    """The handler ran past its TIMEOUT. A BaseException, like KeyboardInterrupt: a
    handler's ``except Exception`` must not turn a timed-out attempt into a success."""


def describe(exc: BaseException) -> dict[str, Any]:
    """The error record kept on a job: type, message, trimmed traceback."""
    import traceback

    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    if len(tb) > 4000:
        tb = tb[:1000] + "\n  ...\n" + tb[-2900:]
    return {"type": type(exc).__name__, "message": str(exc)[:2000], "traceback": tb}
