"""A durable function's step log as one run sees it: the entries recorded by the runs
before (read once, on the first durable call), the position this run has reached, and
the replay rule. ``ctx.step`` and ``ctx.sleep`` (context.py) call it; what it reads and
writes goes through two hooks, Redis in a worker thread (store/steps.py, the step and
suspend scripts), messages to the parent in an isolated child, a list in run_inline.

The replay rule: every run of a job calls the handler from the top. The n-th durable call
of this run meets the n-th recorded entry: a step whose entry is there returns its value
(or raises its recorded permanent error) without calling its function; a call that meets
an entry of another name (or kind) means the handler took another path than the run that
recorded the log, and the job fails for good ("non-deterministic replay"), naming both.

A step that fails without a record (its function raised a transient error, or its record
was refused) ends the recorded log for the rest of this run: the next attempt calls that
step again at that very position, so nothing this run reaches after it may take the
position. That step called again (a retry loop around it) is the same step at the same
position, as the next attempt would call it: it runs there and is recorded, under the
same name and ``step_key``. Another later step (a ``finally:`` cleanup, an ``except:``
branch) runs its function unrecorded, as plain code would; a later sleep, wait or child
call raises ``AfterUnrecordedStep``, a transient error, so the attempt ends and is retried.

Output is not replayed: until the run is past the entries recorded before it (``replay_to``,
counted by the claim), what ``ctx.logger`` and ``ctx.stream`` are given is dropped, as the run
that recorded those entries wrote it to the job's log and stream already. A chunk dropped so
still takes its number, so the chunks after the replay follow the ones written before.

Names are numbered as the log would number them (``name#2`` for the second recorded use):
a call that takes no position (the failed step, the unrecorded runs after it) does not
count towards the names recorded after it, so a name, and ``step_key``, is the same at the
same position on every attempt and replay. The unrecorded runs after a failed step are
numbered among themselves, after the names recorded before them.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from runner.errors import (
    JobFailed,
    JobTimeout,
    NonDeterministicReplay,
    PermanentFailure,
    SignalTimeout,
    StaleLease,
    StepTooLarge,
    StillRunning,
    Suspend,
)
from runner.store import codec, records
from runner.store.steps import MAX_LOG_BYTES, MAX_STEP_BYTES, MAX_STEPS, VALUE_DEPTH, YEAR_MS, check_signal_name

__all__ = ["MAX_LOG_BYTES", "MAX_STEPS", "MAX_STEP_BYTES", "AfterUnrecordedStep", "Journal", "StepFailed"]


# A parent waiting for its child is due this often, to look for the child's end itself
# should the signal its end sends have been lost (a crash between the two).
POLL_MS = 30_000

# What the record hook answers, from step.lua's codes.
RECORDED, LOST, MOVED, FULL, TOO_BIG = 1, -1, -2, -3, -4


class AfterUnrecordedStep(RuntimeError):
    """A sleep, wait or child call reached after a step of this run failed without a record:
    it cannot be recorded at the position the next attempt gives that step, so the attempt
    ends here (a transient error: retried as the step's own error would have been)."""


class StepFailed(PermanentFailure):
    """A step's recorded permanent error, raised again on a replay (the step is not run
    again: it failed for good the first time)."""


def _numbered(name: str, count: int) -> str:
    return name if count == 1 else f"{name}#{count}"


def _too_large(code: int, n: int, label: str) -> StepTooLarge:
    if code == FULL:
        return StepTooLarge(f"step {label!r}: the job's step log holds {n:,} entries, its bound is {MAX_STEPS:,}: "
                            "group small steps into one, or split the work over several jobs (ctx.invoke)")
    return StepTooLarge(f"step {label!r}: the job's step log holds {n:,} bytes and would pass its bound of "
                        f"{MAX_LOG_BYTES:,}: keep large results elsewhere and return a reference to them")


@dataclass(slots=True)
class Journal:
    """One run's replay state. ``load`` reads the recorded entries; ``record(position,
    entry JSON)`` writes one, fenced, and answers (code, n) as step.lua does."""

    job_id: str
    load: Callable[[], list[dict[str, Any]]]
    record: Callable[[int, str], tuple[int, int]]
    max_step_bytes: int = MAX_STEP_BYTES
    inline: bool = False  # run_inline: sleeps end at once, a wait reads ``signals``
    clock0: tuple[int, float] = (0, 0.0)  # the server's ms at the claim, and this host's monotonic then
    take: Callable[[int, str, str, int | None], tuple[int, str]] | None = None  # wait.lua
    signals: dict[str, Any] = field(default_factory=dict)  # run_inline's signals
    events: dict[str, Any] = field(default_factory=dict)  # run_inline's events: name -> data
    # ctx.wait_for_event: put (True) or take (False) this job's waiter for (name, match) at
    # a position on the name's registry; answers listen.lua's code (-1: refused).
    listen: Callable[[str, dict[str, Any], int, bool], int] | None = None
    # ctx.invoke: validate and hold the child (id, type, payload, options) -> its id; and
    # look for a child's end, sending it to this job as its signal when it has one.
    start_child: Callable[[str, str, Any, dict[str, Any]], str] | None = None
    collect: Callable[[str, str], bool] | None = None
    # Whether this run still holds the job's lease as far as this host knows (Flags.
    # lease_held): asked before a step's fn runs and before a child is started.
    held: Callable[[], bool] | None = None
    # Whether this run's TIMEOUT fired (its handler may have caught JobTimeout): its attempt
    # has failed, so no durable call of it may run a step or write the log any more.
    timed_out: Callable[[], bool] | None = None
    entries: list[dict[str, Any]] | None = None
    # The entries the runs before recorded, as the claim counted them: until this run is
    # past them it replays what they did, and its log and stream stay quiet (replaying).
    replay_to: int = 0
    # The thread that runs the handler (the one that builds the journal): the only one that
    # may make durable calls, as only its calls come in the same order on every run.
    owner: int = field(default_factory=threading.get_ident)
    position: int = 0
    # Each name's uses that took a position in this run (recorded or replayed): the next
    # one is name#(n + 1).
    seen: dict[str, int] = field(default_factory=dict)
    # Each name's uses since a step failed unrecorded (runs that take no position).
    stretch: dict[str, int] = field(default_factory=dict)
    step_key: str | None = None  # set while a step's function runs
    replayed: int = 0  # steps returned from the log in this run
    ran: int = 0  # steps run and recorded in this run
    # The step of this run that failed without a record (a transient error, a refused
    # record): the log ends before it for the rest of the run (see the module docstring).
    unrecorded: str | None = None
    # Entered around the recording of a step's value (its encoding): runner's own work,
    # which a process-isolated handler's MEMORY_MB does not cap (child.MemoryCap).
    own_work: AbstractContextManager[Any] = field(default_factory=contextlib.nullcontext)

    def replaying(self) -> bool:
        """Whether this run is still in the part of the handler an earlier run went through
        (its next durable call meets an entry that run recorded): ctx.logger lines and
        ctx.stream chunks here were written then, and are not written again."""
        return self.position < self.replay_to

    def server_ms(self) -> int:
        """The server's clock now (a sleep's end is the server's), from the claim's time."""
        ms, mono = self.clock0
        if not ms:
            return int(time.time() * 1000)
        return ms + int((time.monotonic() - mono) * 1000)

    def label(self, name: str, kind: str = "step") -> str:
        """The name as recorded: a name used again in this run gets #2, #3... (counting
        the uses that took a position; see the module docstring)."""
        self._fence(name)
        if threading.get_ident() != self.owner:
            # Threads reach their calls in any order, a replay in another: the log would
            # not match it (non-deterministic replay) and steps would run twice.
            raise PermanentFailure(f"durable call {name!r} from a thread the handler started: call ctx.step, "
                                   "ctx.sleep, ctx.wait_for_signal, ctx.wait_for_event and ctx.invoke from the "
                                   "handler's own thread, one after another; to run work in parallel, do it "
                                   "inside one step's function, or in child jobs (ctx.invoke)")
        if self.step_key is not None:
            # Inside a step's fn: its record would land between the step's start and its
            # end, at a position the replay (which never calls fn) does not reach.
            raise PermanentFailure(f"durable call {name!r} inside step {self.step_key!r}: call ctx.step, ctx.sleep, "
                                   "ctx.wait_for_signal, ctx.wait_for_event and ctx.invoke from the handler, not "
                                   "from a step's function")
        if not isinstance(name, str) or not name or len(name) > 200:
            raise ValueError(f"a step's name is a non-empty string of at most 200 characters, not {name!r}")
        count = self.seen.get(name, 0) + 1
        if self.unrecorded is None or (kind == "step" and _numbered(name, count) == self.unrecorded):
            # (the second: the step that failed unrecorded, called again at its position)
            self.unrecorded = None
            self.stretch.clear()
            self.seen[name] = count
            return _numbered(name, count)
        more = self.stretch.get(name, 0)
        self.stretch[name] = more + 1
        return _numbered(name, count + more)

    def recorded(self, label: str, kind: str) -> dict[str, Any] | None:
        """The entry at this run's position (None: this run is past the log), checked
        against the call that reached it."""
        if self.entries is None:
            self.entries = self.load()
        if self.position >= len(self.entries):
            return None
        entry = self.entries[self.position]
        if entry.get("damaged"):
            raise PermanentFailure(
                f"position {self.position + 1} of the step log cannot be read (its entry is not JSON runner can "
                f"read back), so this run cannot replay past it to {kind} {label!r}; the job's recorded steps "
                "are in GET /jobs/{id}")
        if entry.get("name") != label or entry.get("kind", "step") != kind:
            raise NonDeterministicReplay(
                f"non-deterministic replay: position {self.position + 1} of the step log holds "
                f"{entry.get('kind', 'step')} {entry.get('name')!r}, and this run reached {kind} {label!r}; "
                "a durable function must reach its steps in the same order on every run (keep "
                "decisions that may change, such as the time or a random number, inside a step)")
        return entry

    def step(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        label = self.label(name)
        if self.unrecorded is not None:
            # Past a step that failed unrecorded: this step's function runs, unrecorded (the
            # next attempt gives the failed step this position, and reaches this one again).
            self._hold(label)
            self.step_key = f"{self.job_id}:{label}"
            try:
                return fn(*args, **kwargs)
            finally:
                self.step_key = None
        entry = self.recorded(label, "step")
        if entry is not None:
            self.position += 1
            self.replayed += 1
            if entry.get("status") == "error":
                err = entry.get("error") or {}
                raise StepFailed(f"step {label!r} failed: {err.get('type')}: {err.get('message')}")
            return entry.get("value")
        self._hold(label)
        at = self.position
        try:
            return self._run(label, fn, args, kwargs)
        finally:
            if self.position == at:  # no record landed: the log ends before this step
                self.unrecorded = label
                self.seen[name] -= 1  # (it took no position: called again, it is this one)

    def _past_unrecorded(self, kind: str, label: str) -> None:
        if self.unrecorded is not None:
            raise AfterUnrecordedStep(
                f"{kind} {label!r} reached after step {self.unrecorded!r} failed in this run without a record: "
                f"the next attempt runs {self.unrecorded!r} again at this position, so this {kind} cannot be "
                "recorded; the attempt ends here and is retried. To go on after a failed step, catch its "
                "error inside the step's function and return it as the step's value")

    def _run(self, label: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Call a step's function and record its outcome."""
        self.step_key = f"{self.job_id}:{label}"
        started = time.perf_counter()
        try:
            value = fn(*args, **kwargs)
        except PermanentFailure as exc:  # failed for good: recorded, so a replay fails the same way
            with self.own_work:
                body = codec.dumps({"name": label, "kind": "step", "status": "error",
                                    "ms": round((time.perf_counter() - started) * 1000, 3),
                                    "error": {"type": type(exc).__name__, "message": str(exc)[:2000]}})
                self._write(label, body, codec.loads(body))
            raise
        finally:
            self.step_key = None
        ms = round((time.perf_counter() - started) * 1000, 3)
        with self.own_work:
            try:
                raw = codec.dumpb_checked(value, VALUE_DEPTH) if value is not None else b"null"
            except (TypeError, codec.TooDeep) as exc:
                raise StepTooLarge(f"step {label!r} returned a value that cannot be recorded as JSON: {exc}") \
                    from None
            if len(raw) > self.max_step_bytes:
                raise StepTooLarge(
                    f"step {label!r} returned {len(raw):,} bytes of JSON, over [worker] max_step_bytes = "
                    f"{self.max_step_bytes:,}: store a large result elsewhere and return a reference to it")
            entry = {"name": label, "kind": "step", "status": "ok", "ms": ms}
            # What a replay returns, from the first run too (a tuple comes back a list).
            entry["value"] = shown = codec.loads(raw) if value is not None else None
            self._write(label, records.step_ok_entry(label, raw.decode(), ms), entry)
        self.ran += 1
        return shown

    def _fence(self, label: str) -> None:
        """Refuse every durable call of a run whose TIMEOUT fired: its attempt failed as a
        timeout, and a handler that caught JobTimeout must not run or record steps the
        next attempt would meet in the wrong place."""
        if self.timed_out is not None and self.timed_out():
            raise JobTimeout(f"job {self.job_id}: this run went past its TIMEOUT, so durable call {label!r} is "
                             "refused (its attempt failed as a timeout; the next attempt runs it)")

    def _hold(self, label: str) -> None:
        """Refuse to go on without the lease: a run frozen past it (SIGSTOP, a VM pause)
        may come back after another run recorded this very step, and its fn would run
        twice. The record stays fenced by the claim token: this check only narrows the
        window to a freeze between here and fn's side effect."""
        if self.held is not None and not self.held():
            raise StaleLease(f"job {self.job_id}: lease lost (this worker was away past it), "
                             f"{label!r} not run")

    def _write(self, label: str, body: str, entry: dict[str, Any]) -> None:
        assert self.entries is not None
        self._fence(label)  # (a TIMEOUT that fired while the step's function ran)
        code, n = self.record(self.position, body)
        if code == LOST:
            raise StaleLease(f"job {self.job_id}: lease lost, step {label!r} not recorded")
        if code in (FULL, TOO_BIG):
            raise _too_large(code, n, label)
        if code != RECORDED:
            raise StaleLease(f"job {self.job_id}: the step log moved under this run (it holds {n} entries, "
                             f"this run is at {self.position}); step {label!r} not recorded")
        self.entries.append(entry)
        self.position += 1

    def sleep(self, name: str, delay_ms: int | None, due_ms: int) -> None:
        """End the run here until the sleep is over (Suspend), or return at once when the
        log says this sleep is over already (a replay past it)."""
        label = self.label(name, "sleep")
        self._past_unrecorded("sleep", label)
        entry = self.recorded(label, "sleep")
        if entry is not None:
            self.position += 1
            until = entry.get("until_ms")
            if self.inline or not isinstance(until, int) or until <= self.server_ms():
                return
            # Resumed before its end (run now, a clock step): asleep again until then.
            raise Suspend(label, "sleep", at_ms=until, index=self.position - 1, recorded=True)
        if self.inline:  # run_inline: recorded as it would be, and over at once
            now = self.server_ms()
            until = now + delay_ms if delay_ms is not None else due_ms
            entry = {"name": label, "kind": "sleep", "status": "ok", "started_ms": now, "until_ms": until}
            self._write(label, records.sleep_entry(label, now, until), entry)
            return
        raise Suspend(label, "sleep", delay_ms=delay_ms, at_ms=due_ms, index=self.position)

    def wait(self, name: str, timeout_ms: int | None) -> Any:
        """The body of the signal ``name``: recorded, kept for the job already, or else the
        run ends here (Suspend) until it comes or the timeout passes (SignalTimeout)."""
        check_signal_name(name)
        label = self.label(name, "signal")
        self._past_unrecorded("wait", label)
        entry = self.recorded(label, "signal")
        head = codec.dumps({"name": label, "kind": "signal", "signal": name})[:-1]
        if entry is not None:
            status = entry.get("status")
            if status == "ok":
                self.position += 1
                self.replayed += 1
                return entry.get("value")
            if status == "timeout":
                self.position += 1
                raise SignalTimeout(f"no signal {name!r} came within the wait's timeout")
            until = entry.get("until_ms")
            return self._took(label, name, head, until if isinstance(until, int) else 0)
        if self.inline:
            if name in self.signals:
                body = codec.dumps(self.signals[name])
                value = codec.loads(body)
                self._write(label, f'{head},"status":"ok","value":{body}}}',
                            {"name": label, "kind": "signal", "signal": name, "status": "ok", "value": value})
                return value
            self._write(label, f'{head},"status":"timeout"}}',
                        {"name": label, "kind": "signal", "signal": name, "status": "timeout"})
            raise SignalTimeout(f"no signal {name!r} was given to run_inline (signals={{...}})")
        return self._took(label, name, head, None, timeout_ms)

    def _took(self, label: str, name: str, head: str, until: int | None, timeout_ms: int | None = None) -> Any:
        """Ask Redis for the signal (wait.lua) and act on its answer."""
        if self.entries is None:
            self.entries = self.load()
        assert self.take is not None, "no signal reader"
        code, body = self.take(self.position, name, head, until)
        if code in (LOST, MOVED):
            raise StaleLease(f"job {self.job_id}: lease lost, wait {label!r} not recorded")
        if code in (FULL, TOO_BIG):
            raise _too_large(code, len(self.entries), label)
        if code == 1:
            value = codec.loads(body)
            self._put({"name": label, "kind": "signal", "signal": name, "status": "ok", "value": value})
            return value
        if code == 2:
            self._put({"name": label, "kind": "signal", "signal": name, "status": "timeout"})
            raise SignalTimeout(f"no signal {name!r} came within the wait's timeout")
        if until is None:  # a first wait: the run ends here, the job waits
            raise Suspend(label, "signal", delay_ms=YEAR_MS if timeout_ms is None else timeout_ms,
                          index=self.position, signal=name)
        raise Suspend(label, "signal", at_ms=until, index=self.position, recorded=True, signal=name)

    def _put(self, entry: dict[str, Any]) -> None:
        """This run's copy of the log after wait.lua wrote the entry at its position."""
        assert self.entries is not None
        if self.position < len(self.entries):
            self.entries[self.position] = entry
        else:
            self.entries.append(entry)
        self.position += 1

    def wait_event(self, name: str, match: dict[str, Any], timeout_ms: int | None) -> dict[str, Any] | None:
        """The first event ``name`` whose data matches, emitted after this wait began:
        recorded, kept for the job already, or else the run ends here (Suspend) until one
        comes (None past the timeout). The wait is a signal wait for ``event.<position>``,
        which the event's delivery sends (client/waking.py)."""
        label = self.label(name, "event")
        self._past_unrecorded("wait", label)
        entry = self.recorded(label, "event")
        signal = f"event.{self.position}"
        head = codec.dumps({"name": label, "kind": "event", "event": name, "match": match, "signal": signal})[:-1]
        if entry is not None:
            status = entry.get("status")
            if status in ("ok", "timeout"):
                self.position += 1
                self.replayed += 1
                return entry.get("value") if status == "ok" else None
            until = entry.get("until_ms")
            return self._event(label, name, match, signal, head, until if isinstance(until, int) else 0)
        if self.inline:
            data = self.events.get(name, _NONE)
            found = data is not _NONE and _matches(match, data)
            value = {"id": f"inline-{self.position}", "name": name, "data": data, "ts": self.server_ms()} \
                if found else None
            body = codec.dumps(value)
            status = "ok" if found else "timeout"
            tail = f',"value":{body}}}' if found else "}"
            self._write(label, f'{head},"status":"{status}"{tail}',
                        {"name": label, "kind": "event", "event": name, "match": match, "status": status,
                         **({"value": value} if found else {})})
            return value
        assert self.listen is not None, "no event registry"
        code = self.listen(name, match, self.position, True)
        if code < -1:
            raise RuntimeError(f"ctx.wait_for_event({name!r}): the waiter could not be put on record; the attempt "
                               "is retried")
        if code < 0:
            raise PermanentFailure(
                f"ctx.wait_for_event({name!r}): the waiters of this event use 64 different sets of match fields "
                "already; match on the same fields (say, always on an order id) so an emit reads few buckets")
        return self._event(label, name, match, signal, head, None, timeout_ms)

    def _event(self, label: str, name: str, match: dict[str, Any], signal: str, head: str, until: int | None,
               timeout_ms: int | None = None) -> dict[str, Any] | None:
        code, body = self._ask(signal, head, int(until or 0) if until is not None else None, label)
        if code in (1, 2):
            if self.listen is not None:  # its delivery took it off already, unless it timed out
                with contextlib.suppress(Exception):
                    self.listen(name, match, self.position, False)
            value = _event_of(body) if code == 1 else None
            self._put({"name": label, "kind": "event", "event": name, "match": match,
                       "status": "ok" if code == 1 else "timeout", **({"value": value} if code == 1 else {})})
            return value
        if until is None:
            raise Suspend(label, "event", delay_ms=YEAR_MS if timeout_ms is None else timeout_ms,
                          index=self.position, signal=signal, event=name, match=match)
        raise Suspend(label, "event", at_ms=until, index=self.position, recorded=True, signal=signal)

    def invoke(self, type_: str, payload: Any, timeout_ms: int | None, options: dict[str, Any]) -> Any:
        """A child job's result: recorded, or else the child is written with this run's
        suspension and the job resumes when it ends (JobFailed when it ends dead or
        cancelled, StillRunning past ``timeout_ms``)."""
        label = self.label(type_, "invoke")
        self._past_unrecorded("child call", label)
        entry = self.recorded(label, "invoke")
        child = f"{self.job_id}.c{self.position}"
        signal = f"child.{self.position}"
        head = codec.dumps({"name": label, "kind": "invoke", "signal": signal, "child": child})[:-1]
        if entry is not None and entry.get("status") == "ok":
            self.position += 1
            self.replayed += 1
            return _child_result(child, entry.get("value"))
        if entry is not None and entry.get("status") == "timeout":
            self.position += 1
            raise StillRunning(child, None)
        if self.inline:
            raise RuntimeError("ctx.invoke needs a worker: run_inline cannot run a child job")
        if entry is None:
            assert self.start_child is not None, "no child starter"
            self._hold(label)
            self.start_child(child, type_, payload, options)  # validated now: a bad one raises here
            ends = YEAR_MS if timeout_ms is None else timeout_ms
            raise Suspend(label, "invoke", delay_ms=min(ends, POLL_MS), index=self.position, signal=signal,
                          ends_ms=ends, child=child)
        until = entry.get("until_ms") if isinstance(entry.get("until_ms"), int) else 0
        for look in (False, True):
            code, body = self._ask(signal, head, int(until or 0), label)
            if code == 1:
                value = codec.loads(body)
                self._put({"name": label, "kind": "invoke", "signal": signal, "child": child, "status": "ok",
                           "value": value})
                return _child_result(child, value)
            if code == 2:
                self._put({"name": label, "kind": "invoke", "signal": signal, "child": child,
                           "status": "timeout"})
                raise StillRunning(child, None)
            if look or self.collect is None or not self.collect(child, signal):
                break
        due = min(int(until or 0), self.server_ms() + POLL_MS)
        raise Suspend(label, "invoke", at_ms=due, index=self.position, recorded=True, signal=signal, child=child)

    def _ask(self, signal: str, head: str, until: int | None, label: str) -> tuple[int, str]:
        if self.entries is None:
            self.entries = self.load()
        assert self.take is not None, "no signal reader"
        code, body = self.take(self.position, signal, head, until)
        if code in (LOST, MOVED):
            raise StaleLease(f"job {self.job_id}: lease lost, {label!r} not recorded")
        if code in (FULL, TOO_BIG):
            raise _too_large(code, len(self.entries), label)
        return code, body


_NONE = object()


def _event_of(body: str) -> Any:
    """A delivered event: its data may be nested as deep as any payload (codec.MAX_DEPTH),
    one level under the event's own fields; read as the step log's reader reads it."""
    try:
        return codec.loads(body)
    except codec.TooDeep:
        import orjson

        return orjson.loads(body)


def _matches(match: dict[str, Any], data: Any) -> bool:
    """Every field of ``match`` at the top of ``data``, with an equal JSON value."""
    from runner.store.listeners import canonical

    if not match:
        return True
    return isinstance(data, dict) and all(f in data and canonical(data[f]) == canonical(v) for f, v in match.items())


def _child_result(child: str, value: Any) -> Any:
    """A child's end as its signal carries it: its result, or JobFailed."""
    if isinstance(value, dict) and value.get("status") == "done":
        return value.get("result")
    err = value.get("error") if isinstance(value, dict) else None
    reason = value.get("reason") if isinstance(value, dict) else None
    raise JobFailed(child, err, reason or (value.get("status") if isinstance(value, dict) else None))
