"""The one exception tree of runner.

    RunnerError                    base of everything runner raises on purpose
    ├── ConfigError                runner.toml or the environment is wrong (names file and key)
    ├── FunctionLoadError          a function file or its schemas cannot be loaded
    ├── UnknownFunction            no function of that type is loaded
    ├── UnknownVersion             the type has no schema for that payload version
    ├── ValidationFailed           a payload does not match its schema (carries every error)
    │   └── InvalidGroup           a group request that cannot run (members on several
    │                              queues, a member's payload, the then-job...): every error
    ├── EventTooLarge              an emit whose copies (data x subscribers) pass the bound
    │                              one emit may write (nothing written)
    ├── IdempotencyConflict        the key is taken by a job with another payload
    ├── JobNotFound                no record for that id
    │   └── UnknownQueue           no queue of that name is configured
    ├── GroupNotFound              no group of that id (never created, or past its retention)
    ├── UnknownSchedule            no loaded function declares a schedule of that id
    ├── StaleLease                 the worker's claim token no longer owns the job
    ├── JobFailed                  a called job ended dead or cancelled (carries its error)
    ├── JobEnded                   a cancel or signal of a job that ended already (its status)
    ├── NotWaiting                 a run now of a job that waits for no time (its status)
    ├── SignalPending              a signal of that name is kept for the job already, unread
    ├── SignalsFull                the job keeps its most signals (or bytes of them) unread
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
    PermanentFailure
    ├── StepTooLarge               a step's result past max_step_bytes, or the job's step log
    │                              past 4 MiB or 1,000 steps (docs/durable.md)
    └── NonDeterministicReplay     a replay reached a step other than the one recorded there
    SignalTimeout                  ctx.wait_for_signal's timeout passed (the handler may catch it)

Raised into a handler by the worker (BaseException, so ``except Exception`` in a handler
cannot swallow it):

    JobTimeout                     the handler ran past its TIMEOUT
    Suspend                        a durable call (ctx.sleep...) ends this run here; the job is
                                   due again later (never seen by a handler that lets it pass)
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, NoReturn


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


def likely(name: str, known: Sequence[str]) -> str | None:
    """The known name ``name`` is probably a misspelling of, or None: the nearest within
    one edit per four letters (at least one; a swap of two neighbours is one edit, so
    ``fv`` finds ``vf``), else difflib's closest above 0.6 similarity."""
    if len(name) < 2 or not known:
        return None
    if len(name) > 100:
        return None  # nobody misspells a name this long; comparing it would only cost time
    typed = name.lower()
    allowed = max(1, len(typed) // 4)
    # The length gap is a lower bound of the distance: a name farther off costs no comparison.
    near = sorted((d, k) for k in known
                  if abs(len(k) - len(typed)) <= allowed and (d := _edits(typed, k.lower())) <= allowed)
    if near:
        return near[0][1]
    import difflib  # here: only a typo pays for it

    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return close[0] if close else None


def _edits(a: str, b: str) -> int:
    """Insertions, deletions, substitutions and swaps of two neighbours that turn a into b
    (optimal string alignment distance)."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], prev2[j - 2] + 1)
        prev2, prev = prev, row
    return prev[-1]


# How a server words a refused password (redis-py's AuthenticationError and link.py's
# replies alike), and a password sent to a server that has none.
_REFUSED = ("WRONGPASS", "invalid username-password", "invalid password")
_NONE_GIVEN = ("NOAUTH", "Authentication required")
_UNWANTED = ("called without any password configured", "no password is set")


def password_problem(exc: BaseException | None) -> tuple[str, str] | None:
    """What is wrong with the password when Redis answered and turned the credentials
    down, as (what happened, what to do): not an outage, and the same words for every
    command and process whichever client met it. None for any other failure. Told by the
    messages along the exception's chain: a reading command never loads redis-py."""
    seen = 0
    while exc is not None and seen < 8:
        text = str(exc)
        if any(w in text for w in _UNWANTED):
            return ("has no password, yet the URL gives one",
                    "drop the password from the URL (redis://host:port/0), or set one on the server (requirepass)")
        given = any(w in text for w in _REFUSED) or (
            any(c.__name__ == "AuthenticationError" for c in type(exc).__mro__) and not any(
                w in text for w in _NONE_GIVEN))
        if given or any(w in text for w in _NONE_GIVEN):
            # No "password: ..." in the words: a log's scrubber (urls.scrub) would hide them.
            what = ("refused the password (it is wrong, or the user is unknown or disabled)" if given
                    else "refused the connection: it wants a password, and the URL gives none")
            return what, ("give the right password in the URL (redis://:PASSWORD@host:port/0, "
                          "or redis://USER:PASSWORD@host:port/0 for an ACL user)")
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


# How a server words a setting of the URL it refuses when a connection opens (SELECT,
# CLIENT SETNAME): (its words, the URL part, what to do).
_REFUSED_SETTINGS = (
    ("DB index is out of range", "the database number (the path, redis://host:port/N)",
     "use a database below the server's `databases` setting (16 by default), or 0"),
    ("value is not an integer or out of range", "the database number (the path, redis://host:port/N)",
     "use a database below the server's `databases` setting (16 by default), or 0"),
    ("Client names cannot contain", "the option client_name",
     "use a name of printable ASCII without spaces (letters, digits, - _ . :), or leave it out"),
)


def setting_problem(exc: BaseException | None) -> str | None:
    """What to say when Redis answered and refused a setting of the URL as a connection
    opened (a database past the server's count, a client name with a space): the URL
    part and what to do, for a command that would otherwise print redis-py's traceback.
    None for any other failure."""
    seen = 0
    while exc is not None and seen < 8:
        text = str(exc)
        for words, part, todo in _REFUSED_SETTINGS:
            if words in text:
                return f"Redis refused {part} of the Redis URL ({text}): {todo}, in REDIS_URL or [redis] url"
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def password_line(exc: BaseException | None) -> str | None:
    """A long-running process's one line for a refused password (a worker's loops and its
    start-up check, a web request's problem): what happened and what to change, in the
    words of password_problem and without the URL (no address, no password). None for
    any other failure."""
    problem = password_problem(exc)
    if problem is None:
        return None
    return f"Redis {problem[0]}; {problem[1]}, in REDIS_URL or the [redis] url of runner.toml, then restart"


class UnknownFunction(RunnerError):
    def __init__(self, type_: str, known: Sequence[str] = (), broken: str | None = None,
                 no_folder: str | None = None) -> None:
        self.type = type_
        self.known = list(known)
        self.broken = broken
        if broken:
            # Not "unknown": the function is there, its file is broken (a running `runner
            # dev` may well serve its last good version).
            super().__init__(f"function {type_!r} is broken: its file did not load: {broken}")
            self.close = None
            return
        detail = f"loaded: {', '.join(self.known)}" if self.known else "no function is loaded"
        if no_folder and not self.known:
            detail += (f": there is no functions folder at {no_folder}; run from the project's folder (the one "
                       "with runner.toml), or name it: --config, RUNNER_CONFIG, or run_inline's project=")
        # The close match of a misspelling, for every surface's message (CLI, HTTP).
        self.close = likely(type_, self.known)
        hint = f"; did you mean {self.close}?" if self.close else ""
        super().__init__(f"unknown function {type_!r}{hint} ({detail})")


class UnknownVersion(RunnerError):
    def __init__(self, type_: str, version: int, known: list[int]) -> None:
        self.type = type_
        self.version = version
        self.known = known
        super().__init__(f"{type_!r} has no schema version {version} (known: {', '.join(map(str, known))})")


@dataclass(frozen=True, slots=True)
class FieldError:
    """One validation error: where in the payload (JSON path) and what is wrong. A ``note``
    is no error of its own: it says that only the first error of the payload at ``path``
    is listed (catalog/listing.py, LIST_BYTES); on the wire it is one more error."""

    path: str
    message: str
    note: bool = False

    def as_dict(self) -> dict[str, str]:
        return {"path": self.path, "message": self.message}


class ValidationFailed(RunnerError):
    def __init__(self, type_: str, version: int, errors: list[FieldError]) -> None:
        self.type = type_
        self.version = version
        self.errors = errors
        # Every error is listed, or some payload's first only (a note says so).
        self.complete = not any(e.note for e in errors)
        detail = "; ".join(f"{e.path}: {e.message}" for e in errors[:5])
        super().__init__(f"payload of {type_} v{version} is invalid: {detail}")


class InvalidGroup(ValidationFailed):
    """A group request refused before anything is written: every problem, each with its
    path into the request (``$.members[3].payload.to``, ``$.then``)."""

    def __init__(self, errors: list[FieldError]) -> None:
        super().__init__("group", 0, errors)
        detail = "; ".join(f"{e.path}: {e.message}" for e in errors[:5])
        self.args = (f"invalid group: {detail}",)


class EventRejected(ValidationFailed):
    """An event whose data some subscriber's newest schema rejects: every error of every
    such subscriber (``rejections``: function -> its version and errors); nothing written."""

    def __init__(self, name: str, rejections: dict[str, tuple[int, list[FieldError]]]) -> None:
        self.name = name
        self.rejections = rejections
        errors = [FieldError(f"{fn}:{e.path}", e.message, e.note) for fn, (_, errs) in rejections.items()
                  for e in errs]
        super().__init__(name, 0, errors)
        detail = "; ".join(f"{fn} v{v}: " + ", ".join(f"{e.path}: {e.message}" for e in errs[:3])
                           for fn, (v, errs) in rejections.items())
        self.args = (f"event {name!r} rejected, nothing was enqueued: {detail}",)


class EventTooLarge(RunnerError):
    """An emit whose data, copied once per subscriber, would write more than ``bound``
    bytes in one script call (Redis answers nobody meanwhile); nothing written."""

    def __init__(self, name: str, data_bytes: int, subscribers: int, bound: int) -> None:
        self.name = name
        self.data_bytes = data_bytes
        self.subscribers = subscribers
        self.bound = bound
        self.bytes = data_bytes * subscribers
        super().__init__(
            f"event {name!r} is too large to emit, nothing was enqueued: its {data_bytes:,} bytes of data go to "
            f"{subscribers} subscriber(s), {self.bytes:,} bytes in one write, over the bound of {bound:,} bytes "
            f"an emit may write; send data of at most {bound // max(subscribers, 1):,} bytes (store the data "
            "elsewhere and pass a reference to it), or subscribe fewer functions to the event")


class IdempotencyConflict(RunnerError):
    def __init__(self, key: str, job_id: str) -> None:
        self.key = key
        self.job_id = job_id
        super().__init__(f"idempotency key {key!r} is taken by job {job_id} with another payload")


class EventConflict(IdempotencyConflict):
    """An emit's Idempotency-Key held by an earlier emit of the same name with other data."""

    def __init__(self, name: str, key: str, event_id: str) -> None:
        super().__init__(key, event_id)
        self.name = name
        self.event_id = event_id
        self.args = (f"idempotency key {key!r} of event {name!r} is held by event {event_id}, emitted with "
                     "other data: use another key, or send the same data",)


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
        self.close = likely(queue, self.known)
        hint = f"; did you mean {self.close}?" if self.close else ""
        RunnerError.__init__(self, f"no queue {queue!r}{hint} (queues: {', '.join(self.known)})")
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


class NotWaiting(RunnerError):
    """A run now of a job that is not waiting for a time (delayed, retrying, sleeping):
    it runs, waits for a signal, is queued already or has ended."""

    def __init__(self, job_id: str, status: str) -> None:
        self.job_id = job_id
        self.status = status
        super().__init__(f"job {job_id} is {status}: only a scheduled, retrying or sleeping job can run now"
                         + (" (send the signal it waits for instead)" if status == "waiting" else ""))


class JobEnded(RunnerError):
    """A cancel came too late: the job ended already (done, dead or cancelled)."""

    def __init__(self, job_id: str, status: str, damaged: str = "") -> None:
        self.job_id = job_id
        self.status = status
        # (what of the job's keys held another Redis type: "state", its status then read
        # from the queue's sets)
        self.damaged = damaged
        said = f"; its {damaged} key holds another Redis type (damaged)" if damaged else ""
        super().__init__(f"job {job_id} has ended already ({status}){said}")


class SignalPending(RunnerError):
    """A signal of that name was sent to the job already and no wait has read it yet."""

    def __init__(self, job_id: str, name: str) -> None:
        self.job_id = job_id
        self.name = name
        super().__init__(f"job {job_id} holds a signal {name!r} that no wait has read yet: send the next one "
                         "after its ctx.wait_for_signal took it")


class SignalsFull(RunnerError):
    """The job keeps as many signals (or bytes of them) unread as it may: none is kept
    until its waits read some."""

    def __init__(self, job_id: str, what: str) -> None:
        self.job_id = job_id
        self.what = what  # "count" or "bytes"
        super().__init__(f"job {job_id} keeps its most signals unread already ({what}): send more after its "
                         "ctx.wait_for_signal calls read the ones kept")


class StillRunning(RunnerError):
    """The wait's timeout passed before the job ended; it may still end later."""

    def __init__(self, job_id: str, status: str | None) -> None:
        self.job_id = job_id
        self.status = status
        super().__init__(f"job {job_id} is still {status or 'pending'}")


class RedisUnavailable(RunnerError):
    """Redis could not be reached or refused the write. Nothing was written, unless the
    connection was lost after a write went out: then its outcome is unknown.

    A batch (``enqueue_many``, ``enqueue_all``) that fails part-way says what became of
    each job: ``results`` has one entry per request, as the call's return value would
    (an Enqueued for a job written, the error that refused a job for itself), and None
    for a job not written; ``undetermined`` lists the indexes of jobs whose call was in
    flight when the connection went (written or not: retry them with an idempotency key).
    Redis refusing a call (maxmemory, a read-only replica) leaves none undetermined: the
    calls behind it are read too. ``written`` is the Enqueued entries.

    A read on Redis Cluster that found no job while masters were away (stalled, down):
    ``left_out`` lists the (queue, partition tag) pairs it could not read, where the job
    may be."""

    def __init__(self, *args: Any, results: Sequence[Any] | None = None,
                 undetermined: Sequence[int] = (), left_out: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(*args)
        self.results = list(results) if results is not None else []
        self.undetermined = list(undetermined)
        self.left_out = list(left_out)

    @property
    def written(self) -> list[Any]:
        return [r for r in self.results if r is not None and not isinstance(r, BaseException)]


class NotReplicated(RunnerError):
    """The enqueue ran on the master, but fewer than ``wanted`` replicas confirmed it within
    the timeout ([redis] wait_replicas, wait_timeout): the job exists now, yet a failover
    before replication catches up could lose it. Not a RedisUnavailable: something was
    written. ``advice`` says what a caller can safely do next (``write``: what was written).

    ``job_ids`` are the jobs the answer was for; ``replies`` are the scripts' own replies
    (the store layer hands them up so that each caller can be told about its own job)."""

    # What a caller can safely do next, by what was written: an enqueue or an emit is
    # deduplicated by its idempotency key; a group and a trigger take none.
    ADVICE: ClassVar[dict[str, str]] = {
        "enqueue": "Retry with the same idempotency key (safe: a duplicate returns the first job); without "
                   "one a retry may run it twice",
        "group": "A group takes no idempotency key: look the group up (GET /groups/{id}) before sending it "
                 "again, or its members run twice",
        "trigger": "A trigger takes no idempotency key: look its job up (runner job ID, GET /jobs/{id}) "
                   "before triggering again, or the schedule runs twice",
    }

    def __init__(self, acked: int, wanted: int, timeout_s: float, job_ids: Sequence[str] = (),
                 replies: Sequence[Any] = (), signal: str | None = None, write: str = "enqueue",
                 key: str = "") -> None:
        self.acked = acked
        self.wanted = wanted
        self.timeout_s = timeout_s
        self.job_ids = list(job_ids)
        self.replies = list(replies)
        self.signal = signal  # a signal's delivery (not an enqueue) that was not confirmed
        self.write = write  # what was written: a key of ADVICE
        self.key = key  # a signal's delivery key: sent again with it, it is never delivered twice
        if signal is not None:
            # The job may read it before the caller hears back: only its key tells a second
            # send from a new signal, to the job's next wait of that name.
            self.advice = (f"Send it again with its key {key!r} once the replicas are back (Client.signal(..., "
                           f"key=...), the Idempotency-Key header, runner signal --key): the answer is "
                           f"'duplicate' if the job holds it or read it already, and it is never delivered twice"
                           if key else "Look the job up (its steps) before sending it again: the job may have "
                           "read it already")
            super().__init__(
                f"signal {signal!r} to job {', '.join(self.job_ids)} was written to the Redis master but only "
                f"{acked} of {wanted} replica(s) confirmed it within {timeout_s:g} s, so a failover now could "
                f"lose it. {self.advice}; check the replicas (INFO replication)")
            return
        self.advice = self.ADVICE[write]
        which = f"job {self.job_ids[0]}" if len(self.job_ids) == 1 else \
            f"{len(self.job_ids)} jobs" if self.job_ids else "the write"
        super().__init__(
            f"{which} was written to the Redis master but only {acked} of {wanted} replica(s) confirmed "
            f"it within {timeout_s:g} s, so a failover now could lose it. {self.advice}; and check the "
            "replicas (INFO replication)"
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


# The longest delay anyone may ask for: a handler's Retry, RateLimited or ctx.enqueue, an
# enqueue's delay, HTTP ?delay=, --delay, ctx.sleep. Longer is almost surely a unit mistake
# (ms for s), and a finite 1e308 overflows where seconds become milliseconds (a settle round
# that failed on one job held every job settled with it).
MAX_DELAY_S = 366 * 86_400.0
DELAY_RANGE = f"a number of seconds from 0 to {MAX_DELAY_S:.0f} (a year and a day)"


def is_delay(value: Any) -> bool:
    """Whether ``value`` is a delay in seconds runner takes: a number from 0 to MAX_DELAY_S."""
    return (not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
            and 0 <= value <= MAX_DELAY_S)


def seconds(value: Any, call: str) -> float:
    """A delay a handler asked for, as seconds (see is_delay), else a ValueError naming the
    call (``refusal`` says it without raising)."""
    why = refusal(value, call)
    if why is not None:
        raise ValueError(why)
    return float(value)


def refusal(value: Any, call: str) -> str | None:
    """Why ``value`` is no delay a handler may ask for (None: it is one)."""
    return None if is_delay(value) else f"{call}={value!r}): it must be {DELAY_RANGE}"


class Retry(Exception):
    """Raise from a handler to try again after ``delay`` seconds (None: the backoff).

    A delay that is no number of seconds within the bound does not raise here (in a
    batch's BatchFailures that would fail every item): the attempt it ends fails saying so
    (``refused``), on the function's backoff, and only that job's."""

    def __init__(self, delay: float | None = None, reason: str = "retry requested") -> None:
        self.refused = None if delay is None else refusal(delay, "Retry(delay")
        self.delay = None if delay is None or self.refused else float(delay)
        self.reason = reason
        super().__init__(reason)


class RateLimited(Exception):
    """Raise from a handler when a downstream said "too many requests": the job goes back
    for ``retry_after`` seconds without spending its attempt, with a history entry. Free
    up to 100 times per job (see retry.lua); past that each counts as an attempt, as a Retry."""

    def __init__(self, retry_after: float = 1.0, reason: str = "rate limited") -> None:
        self.refused = refusal(retry_after, "RateLimited(retry_after")  # (as Retry's)
        self.retry_after = 1.0 if self.refused else float(retry_after)
        self.reason = reason
        super().__init__(reason)


class PermanentFailure(Exception):
    """Raise from a handler to send the job straight to the dead-letter queue."""


class Cancelled(Exception):
    """Raise from a handler (or let ``ctx.raise_if_cancelled()`` raise it) once
    ``ctx.cancelled`` is true: the job ends cancelled, not retried."""


class StepTooLarge(PermanentFailure, ValueError):
    """A step's result over ``max_step_bytes``, or a step that would take the job's step log
    past its bounds (4 MiB, 1,000 steps): not recorded, and the job goes to the dead letters,
    as a retry would reach the same step and grow the log again."""


class NonDeterministicReplay(PermanentFailure):
    """A replay reached a step whose name differs from the one recorded at that position:
    the handler took another path than the run that recorded the log, so its recorded
    results cannot be trusted to belong to the steps asking for them."""


class BatchFailures(Exception):
    """Raise from ``handle_batch`` (or return it) to fail only some items of a batch:
    ``failures`` maps an item's index in ``payloads`` to the exception it failed with, each
    classified as a handler's own (Retry, PermanentFailure, RateLimited, any other error),
    and each retried or dead-lettered on its own attempts. ``results``: the other items'
    results, one per payload (the failed items' entries are ignored); None: every item not
    failed ends with the result None."""

    def __init__(self, failures: dict[int, BaseException], results: list[Any] | None = None) -> None:
        if not isinstance(failures, dict) or not all(
                isinstance(i, int) and not isinstance(i, bool) and isinstance(e, BaseException)
                for i, e in failures.items()):
            raise TypeError("BatchFailures takes a dict of {index: exception}, e.g. "
                            "BatchFailures({2: ValueError('bad row')})")
        if results is not None and not isinstance(results, list):
            raise TypeError(f"BatchFailures(results=...) takes a list, one result per payload, not "
                            f"{type(results).__name__}")
        self.failures = failures
        self.results = results
        super().__init__(f"{len(failures)} item(s) of the batch failed: indexes {sorted(failures)}")


class SignalTimeout(Exception):
    """``ctx.wait_for_signal(name, timeout=...)`` saw no signal within its timeout."""


class Suspend(BaseException):
    """Raised by a durable call to end the run where it stands: the executor turns it into a
    suspension (the job sleeps or waits, holding no worker slot). A BaseException, so a
    handler's ``except Exception`` cannot swallow it."""

    def __init__(self, name: str, kind: str, delay_ms: int | None = None, at_ms: int = 0, index: int = 0,
                 recorded: bool = False, signal: str = "", ends_ms: int | None = None, child: str = "",
                 event: str = "", match: dict[str, Any] | None = None) -> None:
        self.name = name  # the step name as recorded (with #2... for a repeated name)
        self.kind = kind  # "sleep", "signal", "event" or "invoke"
        self.delay_ms = delay_ms  # from the server's now (ctx.sleep), None for at_ms
        self.at_ms = at_ms  # absolute epoch ms (ctx.sleep_until, or a recorded sleep's end)
        self.index = index  # its position in the step log
        self.recorded = recorded  # the log holds its entry already (resumed before its end)
        self.signal = signal  # the signal a wait is for
        self.ends_ms = ends_ms  # ms from now to the wait's end, when the job is due before it
        self.child = child  # ctx.invoke's child job id
        self.event = event  # ctx.wait_for_event's event name
        self.match = match  # and its match
        super().__init__(f"suspended at {kind} {name!r}")


class JobTimeout(BaseException):
    """The handler ran past its TIMEOUT. A BaseException, like KeyboardInterrupt: a
    handler's ``except Exception`` must not turn a timed-out attempt into a success."""


# A stored traceback's bound, in characters: a dead job's record is mostly its error, and
# 500,000 dead jobs with whole tracebacks took a gigabyte of Redis. The log has them whole.
MAX_TRACEBACK = 600
_TB_HEAD = 200  # of the bound: where it started; the rest goes to the frames nearest the raise
# Runner's own frames start with one of these (the path as imported, and resolved).
_RUNNER = tuple({str(Path(__file__).parent) + "/", str(Path(__file__).resolve().parent) + "/"})
_CARETS = re.compile(r"^ +[~^]+ *\n?$")  # Python 3.11's marks under a frame's source line


def describe(exc: BaseException) -> dict[str, Any]:
    """The error record kept on a job: type, message, trimmed traceback.

    The traceback is stored without what every job's would repeat: runner's own frames
    before the handler's first (the executor's call into it) and the lines of carets
    under each source line. Past MAX_TRACEBACK characters it keeps its first lines (the
    handler's first frame), a marker saying how many lines were left out, and its last
    lines: the frames nearest the raise and the exception itself. The worker's log has
    the traceback whole."""
    import traceback

    te = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    frames = list(te.stack)
    mine = next((i for i, f in enumerate(frames) if not f.filename.startswith(_RUNNER)), 0)
    if mine:
        te.stack = traceback.StackSummary.from_list(frames[mine:])
    tb = "".join(line for line in "".join(te.format()).splitlines(keepends=True) if not _CARETS.match(line))
    if len(tb) > MAX_TRACEBACK:
        tb = _trimmed(tb)
    return {"type": type(exc).__name__, "message": _utf8(str(exc)[:2000]), "traceback": _utf8(tb)}


def _trimmed(tb: str) -> str:
    """``tb`` in at most MAX_TRACEBACK characters: its head, what was cut, its tail, cut
    between frames (a frame's "File" line with its source line), never inside one."""
    blocks: list[str] = []
    for line in tb.splitlines(keepends=True):
        if blocks and line.startswith(("    ", "  [Previous line")):
            blocks[-1] += line  # a frame's source line, or a repeat of it
        else:
            blocks.append(line)
    head: list[str] = []
    while blocks and sum(map(len, head)) + len(blocks[0]) <= _TB_HEAD:
        head.append(blocks.pop(0))
    room = MAX_TRACEBACK - sum(map(len, head)) - 64  # the marker
    tail: list[str] = []
    while blocks and sum(map(len, tail)) + len(blocks[-1]) <= room:
        tail.insert(0, blocks.pop())
    if not tail:  # the last block longer than the bound (a huge exception message)
        rest = "".join(blocks)
        tail, blocks = [rest[-room:]], [rest[:-room]]
    cut = "".join(blocks)
    frames = sum(b.startswith("  File ") for b in blocks)
    said = f"{frames} frame(s), {len(cut):,} characters" if frames else f"{len(cut):,} characters"
    return "".join(head) + f"  ... {said} left out ...\n" + "".join(tail)


def _utf8(text: str) -> str:
    """``text`` with U+FFFD for each lone surrogate (a name read surrogate-escaped, say a
    file name that was not UTF-8): JSON takes no lone surrogate, and an error record that
    cannot be written would cost the job its outcome (its lease lapses, it runs again)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return re.sub("[\ud800-\udfff]", "\ufffd", text)
    return text
