"""What each outcome writes: one builder per outcome (done, retry, rate-limited, deferred,
dead, cancelled, expired, released) turns a settlement into the entry its script takes
(ack.lua's Ack, retry.lua's RetryAt, bury.lua's Burial, release.lua's Hand), with its
history entry, stats fields, follow-ups and group count; ``Calls`` gathers one
partition's entries into one script call per transition. When a batch goes, and what
its replies mean, is the settler's (settler.py)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, TypeVar

from runner.catalog.registry import Function
from runner.client import Client
from runner.observe import metrics, tracing
from runner.runtime import Runtime
from runner.store import codec, records
from runner.store.keys import QueueKeys
from runner.store.scripts import Ack, Batch, Burial, Followup, Hand, Member, RetryAt, Suspension
from runner.worker import journal, relay
from runner.worker.execute import CANCELLED, EXPIRED, Claimed, Dead, Done, RetryLater, Suspended, group_of
from runner.worker.ledger import Release, Settlement, Start

_Ends = TypeVar("_Ends", RetryAt, Burial, Suspension)  # an ending's entry that carries its start

# A NamedTuple's own __new__ is a Python function: an ack built with tuple.__new__ costs
# about 1,600 fewer instructions per done job (bench/hotpath.py, settle).
_new = tuple.__new__


def _server_now(job: Claimed, host_now: int) -> int:
    """The server's clock now, from the claim's server time and this host's monotonic
    clock since (the host's wall clock may be off by hours); ``host_now`` for a job
    without a claim time."""
    if not job.claimed_ms:
        return host_now
    return job.claimed_ms + int((time.monotonic() - job.received) * 1000)


def _history(attempt: int, outcome: str, started_ms: int, now_ms: int, error: Any = None) -> str:
    entry: dict[str, Any] = {"attempt": attempt, "outcome": outcome, "started_ms": started_ms,
                             "at_ms": now_ms}
    if error is not None:
        entry["error"] = {"type": error.get("type"), "message": error.get("message")}
    return codec.dumps(entry)


def _member_done(job: Claimed, result: str, trace: Any = None) -> Member | None:
    where = group_of(job)
    if where is None:
        return None
    return Member(*where, "done", f'{{"id":{codec.dumps(job.id)},"status":"done","result":{result or "null"}}}',
                  tracing.traceparent_of(trace))


def _member_dead(job: Claimed, o: Dead, trace: Any = None) -> Member | None:
    where = group_of(job)
    if where is None:
        return None
    status = "cancelled" if o.reason == CANCELLED else "dead"
    # Type and message only: the then-job gets every member's outcome, the traceback
    # stays on the member's own record.
    err = {"type": o.error.get("type"), "message": o.error.get("message")} if o.error else None
    return Member(*where, status, codec.dumps({"id": job.id, "status": status, "reason": o.reason, "error": err}),
                  tracing.traceparent_of(trace))


def _abandoned(s: Settlement) -> str:
    """The stats field of a run given up at TIMEOUT plus the grace, '' for any other."""
    return f" abandoned|{metrics.counted(s.run.job.type)}" if s.extra and s.extra.get("abandoned") else ""


class Calls:
    """One partition's script calls as a batch builds them: each transition's entries
    and, in the same order, their settlements (what each reply code answers)."""

    __slots__ = ("ack_fields", "ack_s", "acks", "burials", "bury_s", "release_s", "releases", "retries", "retry_s",
                 "start_s", "starts", "suspend_s", "suspends", "totals")

    def __init__(self) -> None:
        self.starts: list[tuple[str, str]] = []
        self.start_s: list[Settlement] = []
        self.acks: list[Ack] = []
        self.ack_s: list[Settlement] = []
        self.retries: list[RetryAt] = []
        self.retry_s: list[Settlement] = []
        self.burials: list[Burial] = []
        self.bury_s: list[Settlement] = []
        self.releases: list[Hand] = []
        self.release_s: list[Settlement] = []
        self.suspends: list[Suspension] = []
        self.suspend_s: list[Settlement] = []
        self.totals = metrics.Totals()  # the acks' stats fields, summed
        self.ack_fields: list[str] = []  # each ack's own, in order (a batch only part landed)


class AckFigures:
    """What an ack call's successes add to the stats hash once it lands: not sent with the
    call but summed in the worker (metrics.Pending), the sum when every ack landed, else
    the landed ones' own fields, as ack.lua counted them; and each landed ack's "done" in
    the throughput hash of the minute it landed in, by the server's clock (_server_now)."""

    __slots__ = ("fields", "job", "stats_key", "totals", "tput_prefix")

    def __init__(self, stats_key: str, totals: metrics.Totals, fields: list[str], tput_prefix: str = "",
                 job: Claimed | None = None) -> None:
        self.stats_key, self.totals, self.fields = stats_key, totals, fields
        self.tput_prefix, self.job = tput_prefix, job  # (a job of the call: its claim dates the landing)

    def minute_key(self, host_ms: int) -> str:
        """The throughput hash of the minute now, by the server's clock (the claim's server
        time and this host's monotonic clock since; ``host_ms`` without a claim time)."""
        now = _server_now(self.job, host_ms) if self.job is not None else host_ms
        return f"{self.tput_prefix}{now // 60_000}"


class Entries:
    """The builders, with what they read: the functions loaded now (their KEEP_RESULT,
    ON_SUCCESS, ON_FAILURE) and the retention."""

    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime
        ret = runtime.config.retention
        self.dead_ttl_ms = int(ret.dead_s * 1000)
        self.idem_ttl_ms = int(ret.idempotency_s * 1000)
        self.done_ttl_ms = int(ret.done_s * 1000)
        self.done_max = ret.done_max
        self.keep_payload = ret.done_payload
        self._client: Client | None = None  # builds destinations' jobs (ON_SUCCESS, ON_FAILURE)

    def add_calls(self, k: QueueKeys, batch: Sequence[Settlement], now: int, pipe: Batch,
                  groups: list[list[Settlement]], figures: list[AckFigures | None]) -> None:
        """Queue one partition's settlements on ``pipe``: a script call per transition,
        and each call's settlements, in order, on ``groups``; beside each, on ``figures``,
        the figures its landed acks add (None for the other calls)."""
        calls = Calls()
        final, unmarked = _mark_settling(batch)
        functions = self.rt.registry.functions
        done, acks, ack_s, totals = self.done, calls.acks, calls.ack_s, calls.totals  # (per job: locals)
        ack_fields = calls.ack_fields
        for s in batch:
            o = s.outcome
            if isinstance(o, Done):  # most settlements: first, and with no more work than it needs
                acks.append(done(s, o, now, functions.get(s.run.job.type), totals, ack_fields,
                                 s.started_ms if unmarked and id(s.run) in unmarked else 0))
                ack_s.append(s)
                continue
            # The history's times are the server's, as every time shown.
            now = _server_now(s.run.job, now)
            if isinstance(o, Start):
                if id(s.run) not in final:
                    calls.starts.append((s.run.job.id, s.run.job.token))
                    calls.start_s.append(s)
            elif isinstance(o, RetryLater):
                calls.retries.append(_began(self.retry_at(s, o, now), s))
                calls.retry_s.append(s)
            elif isinstance(o, Dead):
                calls.burials.append(_began(self.burial(s, o, now), s))
                calls.bury_s.append(s)
            elif isinstance(o, Suspended):
                calls.suspends.append(_began(self.suspension(s, o), s))
                calls.suspend_s.append(s)
            else:
                calls.releases.append(self.released(s, o, now))
                calls.release_s.append(s)
        ack_at = len(groups) + (1 if calls.starts else 0)  # the ack call's place: after the start marks'
        self._queue(calls, k, pipe, groups)
        figures += [None] * (len(groups) - len(figures))
        if calls.acks:
            figures[ack_at] = AckFigures(k.stats, calls.totals, calls.ack_fields, k.tput_prefix,
                                         calls.ack_s[-1].run.job)

    def _queue(self, calls: Calls, k: QueueKeys, pipe: Batch, groups: list[list[Settlement]]) -> None:
        sc = self.rt.scripts
        if calls.starts:
            sc.start(k, calls.starts, pipe=pipe)
            groups.append(calls.start_s)
        if calls.acks:
            # Each ack's stats fields stay '' and no totals go: the settler counts what
            # landed (AckFigures), so the script runs no HINCRBY for a plain success.
            sc.ack(k, calls.acks, self.idem_ttl_ms, self.done_ttl_ms, self.done_max, pipe=pipe)
            groups.append(calls.ack_s)
        if calls.retries:
            ret = self.rt.config.retention
            sc.retry(k, calls.retries, pipe=pipe, log_keep_ms=max(1, int(max(ret.done_s, ret.dead_s) * 1000)))
            groups.append(calls.retry_s)
        if calls.burials:
            sc.bury(k, calls.burials, self.dead_ttl_ms, pipe=pipe)
            groups.append(calls.bury_s)
        for one, settled in zip(calls.suspends, calls.suspend_s, strict=True):
            # One call per suspension (each answers one code): a sleep ends a run of minutes
            # or days, not one of thousands a second.
            sc.suspend(k, one, pipe=pipe)
            groups.append([settled])
        if calls.releases:
            sc.release(k, calls.releases, pipe=pipe, done_ttl_ms=self.done_ttl_ms)
            groups.append(calls.release_s)

    # --- one builder per outcome -------------------------------------------------------

    def done(self, s: Settlement, o: Done, now: int, fn: Function | None, totals: metrics.Totals,
             ack_fields: list[str], started_ms: int = 0) -> Ack:
        """A success: its result (and meta, and payload if kept), its follow-ups and
        ON_SUCCESS job, and its group's count; its stats fields go on ``ack_fields``
        (summed in ``totals`` too), not in the ack (see AckFigures). ``started_ms``: its
        handler's start, for a run whose start mark is not sent (0: the claim has it)."""
        job = s.run.job
        t = job.type
        fields = metrics.succeeded(t, (s.started_ms or now) - job.ready_ms, s.run_s * 1000, totals)
        keep = int(fn.keep_result_s * 1000) if fn is not None and fn.keep_result_s else 0
        # A producer's extra fields (a schedule's tick...) stay with the outcome, on a line
        # of their own (JSON texts hold no raw newline).
        # A null result is left out (read back as null): most handlers return None.
        result = "" if o.result == "null" else o.result
        follow = tuple(s.run.followups) if s.run.followups else ()
        if fn is not None and fn.on_success:
            body = codec.loads(o.result) if o.result else None
            follow += self._destination(fn.on_success, "s", job, {"result": body}, s.run.trace)
        meta = job.meta_raw
        if follow:  # the outcome names its children (GET /jobs/{id})
            meta = codec.dumps({**(codec.loads(meta) if meta else {}),
                                **records.children_meta([f.job.id for f in follow])})
        if self.keep_payload:
            result = f"{result}\n{meta}\n{job.payload_raw}"
        elif meta:
            result = f"{result}\n{meta}"
        if follow:  # counted once the ack lands, so only for an ack that lands
            fields += f" followups|{t}={len(follow)}"
            totals.add(f"followups|{t}", len(follow))
        ack_fields.append(fields)
        return _new(Ack, (job.id, job.token, result, f"{t}|{job.version_raw}", "", keep, follow,
                          _member_done(job, o.result, s.run.trace) if job.meta_raw else None, job.created_ms,
                          started_ms))

    def retry_at(self, s: Settlement, o: RetryLater, now: int) -> RetryAt:
        if o.rate_limited:
            return self.rate_limited(s, o, now)
        if o.refund:
            return self.deferred(s, o)
        return self.retry(s, o, now)

    def retry(self, s: Settlement, o: RetryLater, now: int) -> RetryAt:
        """A failed attempt with attempts left: again after its backoff."""
        job = s.run.job
        t = metrics.counted(job.type)
        return RetryAt(job.id, job.token, int(o.delay_s * 1000), codec.dumps(o.error),
                       _history(job.attempt, "retry", s.started_ms, now, o.error),
                       f"retried|{t}" + _abandoned(s))

    def rate_limited(self, s: Settlement, o: RetryLater, now: int) -> RetryAt:
        """A handler's RateLimited: handed back for later, its attempt refunded up to a bound
        (retry.lua); on the last attempt, past the bound, it goes dead (the settler's reply)."""
        job = s.run.job
        return RetryAt(job.id, job.token, int(o.delay_s * 1000), codec.dumps(o.error),
                       _history(job.attempt, "rate limited", s.started_ms, now, o.error),
                       f"ratelimited|{metrics.counted(job.type)}", refund=True, rate_limited=True,
                       last=job.attempt >= job.max_attempts)

    def deferred(self, s: Settlement, o: RetryLater) -> RetryAt:
        """Held back for later without spending an attempt (a type or version this worker
        does not know yet): no history entry."""
        job = s.run.job
        return RetryAt(job.id, job.token, int(o.delay_s * 1000), codec.dumps(o.error), "",
                       f"deferred|{metrics.counted(job.type)}", refund=True)

    def suspension(self, s: Settlement, o: Suspended) -> Suspension:
        """A durable function's run ended at a sleep: no attempt spent, no history entry
        (the step log says where it stands)."""
        job = s.run.job
        t = metrics.counted(job.type)
        stats = f"sleeps|{t}" if o.kind == "sleep" else f"waits|{t}"
        child = s.run.invoked if o.kind == "invoke" and o.entry else None
        if child is not None:
            stats += f" invokes|{t}"
        fn = self.rt.registry.functions.get(job.type)
        ret = self.rt.config.retention
        return Suspension(job.id, job.token, o.position, o.entry, o.delay_ms, o.due_ms, journal.MAX_STEPS,
                          journal.MAX_LOG_BYTES, stats, o.kind, o.signal, o.ends_ms, child,
                          fn is not None and fn.hold_locks, max(1, int(max(ret.done_s, ret.dead_s) * 1000)))

    def burial(self, s: Settlement, o: Dead, now: int) -> Burial:
        if o.reason == CANCELLED:
            return self.cancelled(s, o, now)
        if o.reason == EXPIRED:
            return self.expired(s, o, now)
        return self.dead(s, o, now)

    def dead(self, s: Settlement, o: Dead, now: int) -> Burial:
        """Failed for good, or never fit to run (``refund``: no attempt spent, no history
        entry); its ON_FAILURE job goes with it. Like every failed attempt, it adds nothing
        to the latency and run-time histograms: they are of attempts that succeeded."""
        job = s.run.job
        t = metrics.counted(job.type)
        entry = "" if o.refund else _history(job.attempt, o.reason, s.started_ms, now, o.error)
        stats = f"dead|{t}" + ("" if o.refund else _abandoned(s))
        return self._buried(s, o, entry, stats, self._on_failure(job, o.error, s.run.trace))

    def cancelled(self, s: Settlement, o: Dead, now: int) -> Burial:
        """Ended on a cancel request: cancelled, never counted dead, nothing for ON_FAILURE."""
        job = s.run.job
        t = metrics.counted(job.type)
        entry = "" if o.refund else _history(job.attempt, o.reason, s.started_ms, now, o.error)
        stats = f"cancelled|{t}" + ("" if o.refund else _abandoned(s))
        return self._buried(s, o, entry, stats, ())

    def expired(self, s: Settlement, o: Dead, now: int) -> Burial:
        """Not started within its MAX_AGE: dead, and though it spent no attempt, the history
        says why it never ran; its ON_FAILURE job goes with it."""
        job = s.run.job
        t = metrics.counted(job.type)
        entry = _history(job.attempt, o.reason, s.started_ms, now, o.error)
        return self._buried(s, o, entry, f"dead|{t} expired|{t}", self._on_failure(job, o.error, s.run.trace))

    def _buried(self, s: Settlement, o: Dead, entry: str, stats: str, follow: tuple[Followup, ...]) -> Burial:
        job = s.run.job
        if follow:
            stats += f" followups|{metrics.counted(job.type)}={len(follow)}"
        return Burial(job.id, job.token, o.reason, codec.dumps(o.error) if o.error else "", entry, o.refund, stats,
                      follow, _member_dead(job, o, s.run.trace))

    def released(self, s: Settlement, o: Release, now: int) -> Hand:
        """Handed back without spending an attempt (a stop, a pause, a cancel before the
        start), with a history entry when it says why."""
        job = s.run.job
        note = codec.dumps({"attempt": job.attempt, "outcome": o.note, "at_ms": now}) if o.note else ""
        return Hand(job.id, job.token, o.mode, note)

    # --- destinations --------------------------------------------------------------------

    def _on_failure(self, job: Claimed, error: Any, trace: Any = None) -> tuple[Followup, ...]:
        fn = self.rt.registry.functions.get(job.type)
        if fn is None or not fn.on_failure:
            return ()
        return self._destination(fn.on_failure, "f", job, {"error": error}, trace)

    def _destination(self, dest: str, tag: str, job: Claimed, body: dict[str, Any],
                     trace: Any = None) -> tuple[Followup, ...]:
        """The destination's job, written in the settling script's own step (ack.lua,
        bury.lua) under an id that step writes once (see relay.destination); traced, in
        the trace of the run (``trace``, its span context)."""
        if self._client is None:
            self._client = Client(self.rt)
        with tracing.enqueue_under(trace, dest) as traceparent:
            f = relay.destination(self._client, dest, tag, job.id, job.type, int(job.version_raw or 0),
                                  job.attempt, job.queue, body, traceparent)
        return () if f is None else (f,)


def _began(entry: _Ends, s: Settlement) -> _Ends:
    """``entry`` carrying its run's handler start, which the script writes as the
    attempt's start rather than the claim's time: a run whose start mark was not sent (it
    ends in the same batch, or in a later one the settler sends again, settler.py
    ``spent``) has only its claim's there, and a fresh child's first job was claimed
    seconds before its handler began (the child's imports). As its history entry says;
    a success's ack carries it only when it must (done: the hot path)."""
    return entry._replace(started_ms=s.started_ms) if s.started_ms else entry


def _mark_settling(batch: Sequence[Settlement]) -> tuple[set[int], set[int]]:
    """Mark each run whose outcome goes in this batch as settling, and return them (by id)
    when the batch also holds start marks: a start mark of a run that ends in the same
    batch is dropped (its settlement says it started); and those runs (by id), whose
    outcome must carry the handler's start that the mark would have written."""
    started = False
    for s in batch:
        if type(s.outcome) is Start:
            started = True
        else:
            # Before the send: a renewal answered after this ack landed is refused,
            # and the renewer must not take that for a lease lost elsewhere.
            s.run.settling = True
    if not started:  # (most batches of a deep queue have no start marks: no sets)
        return set(), set()
    final = {id(s.run) for s in batch if type(s.outcome) is not Start}
    return final, {id(s.run) for s in batch if type(s.outcome) is Start and id(s.run) in final}

