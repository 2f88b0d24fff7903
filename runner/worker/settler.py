"""The settler: sends finished runs' outcomes (ack, retry, bury, release) and the start
marks of prefetched runs in batches, one pipeline of fenced scripts per batch, and logs
and counts what it settled. A start mark whose run settles in the same batch is dropped:
the settlement says the run started."""

from __future__ import annotations

import logging
import queue as stdqueue
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from runner.client import Client
from runner.config import QueueConfig
from runner.observe import metrics, tracing
from runner.runtime import Runtime
from runner.store import codec, records
from runner.store.connection import UNAVAILABLE
from runner.store.keys import QueueKeys
from runner.store.outage import Outage
from runner.store.scripts import Ack, Batch, Burial, Followup, Hand, Member, RetryAt
from runner.worker import relay
from runner.worker.execute import CANCELLED, EXPIRED, Claimed, Dead, Done, RetryLater
from runner.worker.faults import fault
from runner.worker.ledger import Ledger, Release, Run, Settlement, Start
from runner.worker.lifeline import vital

log = logging.getLogger("runner.worker")
joblog = logging.getLogger("runner.job")

SUMMARY_EVERY_S = 60.0
MAX_BATCH = 500
# A batch smaller than this may wait LINGER_S for more (see Settler._linger).
LINGER_BELOW = 32
# 1 ms: 0.18 script calls per job with a handler making one Redis round trip; 3 ms: 0.135
# and about 10 % more jobs/s (5 interleaved pairs). A worker killed in a backlog re-runs,
# at least once as always, the jobs that finished in its last few milliseconds.
LINGER_S = 0.003


def _history(attempt: int, outcome: str, started_ms: int, now_ms: int, error: Any = None) -> str:
    entry: dict[str, Any] = {"attempt": attempt, "outcome": outcome, "started_ms": started_ms,
                             "at_ms": now_ms}
    if error is not None:
        entry["error"] = {"type": error.get("type"), "message": error.get("message")}
    return codec.dumps(entry)


def _group_of(job: Claimed) -> tuple[str, int] | None:
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


def _member_done(job: Claimed, result: str) -> Member | None:
    where = _group_of(job)
    if where is None:
        return None
    return Member(*where, "done", f'{{"id":{codec.dumps(job.id)},"status":"done","result":{result or "null"}}}')


def _member_dead(job: Claimed, o: Dead) -> Member | None:
    where = _group_of(job)
    if where is None:
        return None
    status = "cancelled" if o.reason == CANCELLED else "dead"
    # Type and message only: the then-job gets every member's outcome, the traceback
    # stays on the member's own record.
    err = {"type": o.error.get("type"), "message": o.error.get("message")} if o.error else None
    return Member(*where, status, codec.dumps({"id": job.id, "status": status, "reason": o.reason, "error": err}))


class Settler:
    def __init__(self, runtime: Runtime, queue: QueueConfig, ledger: Ledger,
                 outbox: stdqueue.SimpleQueue[Settlement | None]) -> None:
        self.rt = runtime
        self.q = queue
        self.ledger = ledger
        self.outbox = outbox
        ret = runtime.config.retention
        self.dead_ttl_ms = int(ret.dead_s * 1000)
        self.idem_ttl_ms = int(ret.idempotency_s * 1000)
        self.done_ttl_ms = int(ret.done_s * 1000)
        self.done_max = ret.done_max
        self.keep_payload = ret.done_payload
        # Set once nothing more will be settled through the outbox: a send that fails
        # then is not retried for ever.
        self.closing = threading.Event()
        self.processed = 0
        self._tally: Counter[str] = Counter()
        self._next_summary = time.monotonic() + SUMMARY_EVERY_S
        self._client: Client | None = None  # builds destinations' jobs (ON_SUCCESS, ON_FAILURE)
        self.cancelled: Callable[[Run], None] = lambda run: None  # a start mark found a cancel
        self._thread = threading.Thread(target=vital(self._loop), name=f"{queue.name}-settle", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Settle everything already in the outbox, then stop."""
        self.outbox.put(None)
        self._thread.join(timeout=10)
        self.closing.set()

    def _loop(self) -> None:
        done = False
        while not done:
            first = self.outbox.get()
            if first is None:
                break
            batch = [first]
            done = self._take(batch)
            if not done and len(batch) < LINGER_BELOW and self._linger(batch):
                # Handlers that block end one by one: sent at once, each batch held about
                # 3 jobs and a prefetched run's start mark went out on its own. Waiting a
                # moment gathers more settlements per script call, and most runs that
                # start and end within it need no start mark at all.
                time.sleep(LINGER_S)
                done = self._take(batch)
            fault("settle_loop")
            self.settle(batch)

    def _take(self, batch: list[Settlement]) -> bool:
        """Add what the outbox holds now to ``batch``; True when the stop sentinel came."""
        while len(batch) < MAX_BATCH:
            try:
                nxt = self.outbox.get_nowait()
            except stdqueue.Empty:
                return False
            if nxt is None:
                return True
            batch.append(nxt)
        return False

    def _linger(self, batch: Sequence[Settlement]) -> bool:
        """Worth waiting LINGER_S before the send: claimed jobs wait for a free executor
        (a backlog, where a settlement a millisecond later costs no one), or the batch
        holds a start mark whose run may end within it. An idle queue's settlement goes
        out at once: a caller may be waiting for it."""
        return self.ledger.waiting > 0 or any(isinstance(s.outcome, Start) for s in batch)

    def settle(self, batch: Sequence[Settlement]) -> None:
        """Send a batch until it lands. Re-sending is safe: every script is fenced, so a
        settlement that already applied is refused the second time. Any other error (an
        ACL change, MISCONF, a bug) is retried with backoff too; after a few tries the
        batch is split so one bad settlement cannot hold up the others, and one that
        keeps failing is dropped from this worker: its lease lapses and it is reclaimed."""
        outage = Outage(f"{self.q.name} settler", log)
        give_up = threading.Event()
        errors = 0
        while True:
            try:
                traced = [(s.run.trace, s.run.job.id, type(s.outcome).__name__.lower())
                          for s in batch if s.run.trace is not None] if tracing.enabled() else []
                with tracing.settle_spans(traced):
                    self._send(batch)
                outage.ok()
                return
            except UNAVAILABLE as exc:
                if self.closing.is_set():
                    log.error("%s settler: Redis unavailable at exit; %d job(s) will be "
                              "reclaimed when their lease lapses", self.q.name, len(batch))
                    return
                outage.failed(exc, give_up)
            except Exception as exc:
                errors += 1
                log.exception("%s settler: settling %d job(s) failed (%s); retrying",
                              self.q.name, len(batch), exc)
                if len(batch) > 1 and errors >= 3:
                    for one in batch:
                        self.settle([one])
                    return
                if errors >= 8 or self.closing.is_set():
                    self.ledger.forget(b.run for b in batch if not isinstance(b.outcome, Start))
                    log.error("%s settler: giving up on job(s) %s; they are reclaimed when their "
                              "lease lapses", self.q.name, ", ".join(b.run.job.id for b in batch))
                    return
                outage.failed(exc, give_up)

    def _send(self, batch: Sequence[Settlement]) -> None:
        now = records.now_ms()  # figures only (history entries): transitions use the server's clock
        parts = self.rt.parts[self.q.name]
        by_part: dict[int, list[Settlement]] = {}
        for s in batch:  # a run settles in the partition it was claimed from
            by_part.setdefault(s.run.job.partition if len(parts) > 1 else 0, []).append(s)
        pipe = self.rt.scripts.batch()
        groups: list[list[Settlement]] = []
        for p, sub in by_part.items():
            self._add_calls(parts[p], sub, now, pipe, groups)
        replies = pipe.execute()
        fault("after_ack")
        settled = []
        spent: list[Settlement] = []
        for group, codes in zip(groups, replies, strict=True):
            for s, code in zip(group, codes, strict=True):
                if type(s.outcome) is Start:
                    if int(code) == 2:  # cancelled while claimed ahead, as it started
                        self.cancelled(s.run)
                    continue  # a lost lease shows in the renewal and the settlement
                if type(s.outcome) is RetryLater and int(code) == 2:
                    # RateLimited past its free uses on the last attempt: still claimed,
                    # and out of attempts, so it goes dead as any failure would.
                    spent.append(Settlement(s.run, Dead("max attempts reached", s.outcome.error, False),
                                            s.run_s, s.started_ms, s.extra))
                    continue
                settled.append(s.run)
                if int(code) < 0:
                    log.warning("job %s: lease lost before it settled (%s); another worker "
                                "owns it now", s.run.job.id, type(s.outcome).__name__)
                elif int(code) == 2:
                    log.info("job %s: its lease had lapsed, but the run finished: recorded as done",
                             s.run.job.id)
        self.ledger.forget(settled)
        self.processed += len(settled)
        if spent:
            self._send(spent)  # logged there, as dead
            buried = {id(x.run) for x in spent}
            batch = [s for s in batch if id(s.run) not in buried]
        # Successes log at DEBUG (a line per job at INFO would cost more than the job);
        # retries and dead letters always log, and a summary line goes out every minute.
        verbose = joblog.isEnabledFor(logging.DEBUG)
        done = 0
        for s in batch:
            o = s.outcome
            if type(o) is Done:
                done += 1
                if verbose:
                    self._log(s)
            elif type(o) is not Start:
                self._tally[type(o).__name__] += 1
                if verbose or not isinstance(o, Release):
                    self._log(s)
        self._tally["Done"] += done
        if time.monotonic() >= self._next_summary:
            self._summarise()

    def _add_calls(self, k: QueueKeys, batch: Sequence[Settlement], now: int, pipe: Batch,
                   groups: list[list[Settlement]]) -> None:
        """Queue one partition's settlements on ``pipe``: a script call per transition,
        and each call's settlements, in order, on ``groups``."""
        acks: list[Ack] = []
        retries: list[RetryAt] = []
        burials: list[Burial] = []
        releases: list[Hand] = []
        starts: list[tuple[str, str]] = []
        start_s: list[Settlement] = []
        ack_s: list[Settlement] = []
        retry_s: list[Settlement] = []
        bury_s: list[Settlement] = []
        release_s: list[Settlement] = []
        totals = metrics.Totals()  # the acks' stats fields, summed
        started = False
        for s in batch:
            if type(s.outcome) is Start:
                started = True
            else:
                # Before the send: a renewal answered after this ack landed is refused,
                # and the renewer must not take that for a lease lost elsewhere.
                s.run.settling = True
        # Only a batch with start marks needs the set (most batches of a deep queue have none).
        final = {id(s.run) for s in batch if type(s.outcome) is not Start} if started else set()
        functions = self.rt.registry.functions
        for s in batch:
            job = s.run.job
            o = s.outcome
            t = job.type
            if isinstance(o, Done):  # most settlements: first, and with no more work than it needs
                fields = metrics.succeeded(t, (s.started_ms or now) - job.ready_ms, s.run_s * 1000, totals)
                fn = functions.get(t)
                keep = int(fn.keep_result_s * 1000) if fn is not None and fn.keep_result_s else 0
                # A producer's extra fields (a schedule's tick...) stay with the outcome, on
                # a line of their own (JSON texts hold no raw newline).
                # A null result is left out (read back as null): most handlers return None.
                result = "" if o.result == "null" else o.result
                follow = tuple(s.run.followups)
                if fn is not None and fn.on_success:
                    body = codec.loads(o.result) if o.result else None
                    follow += self._destination(fn.on_success, "s", job, {"result": body})
                meta = job.meta_raw
                if follow:  # the outcome names its children (GET /jobs/{id})
                    meta = codec.dumps({**(codec.loads(meta) if meta else {}),
                                        records.CHILDREN: [f.job.id for f in follow]})
                if self.keep_payload:
                    result = f"{result}\n{meta}\n{job.payload_raw}"
                elif meta:
                    result = f"{result}\n{meta}"
                if follow:  # counted with the ack, so only for an ack that lands
                    fields += f" followups|{t}={len(follow)}"
                    totals.add(f"followups|{t}", len(follow))
                acks.append(Ack(job.id, job.token, result, f"{t}|{job.version_raw}", fields, keep, follow,
                                _member_done(job, o.result) if job.meta_raw else None))
                ack_s.append(s)
                continue
            extra = f" abandoned|{t}" if s.extra and s.extra.get("abandoned") else ""
            if isinstance(o, Start):
                if id(s.run) not in final:
                    starts.append((job.id, job.token))
                    start_s.append(s)
            elif isinstance(o, RetryLater):
                if o.rate_limited:
                    retries.append(RetryAt(job.id, job.token, int(o.delay_s * 1000), codec.dumps(o.error),
                                           _history(job.attempt, "rate limited", s.started_ms, now, o.error),
                                           f"ratelimited|{t}", refund=True, rate_limited=True,
                                           last=job.attempt >= job.max_attempts))
                elif o.refund:
                    retries.append(RetryAt(job.id, job.token, int(o.delay_s * 1000), codec.dumps(o.error), "",
                                           f"deferred|{t}", refund=True))
                else:
                    retries.append(RetryAt(
                        job.id, job.token, int(o.delay_s * 1000), codec.dumps(o.error),
                        _history(job.attempt, "retry", s.started_ms, now, o.error),
                        f"retried|{t} " + metrics.timing_fields(t, s.started_ms - job.ready_ms, s.run_s * 1000)
                        + extra,
                    ))
                retry_s.append(s)
            elif isinstance(o, Dead):
                # An expiry spends no attempt, yet the history says why the job never ran.
                entry = "" if o.refund and o.reason != EXPIRED else \
                    _history(job.attempt, o.reason, s.started_ms, now, o.error)
                # A cancel ends the job cancelled, not dead: nothing for ON_FAILURE.
                follow = self._on_failure(job, o.error) if o.reason != CANCELLED else ()
                stats = f"dead|{t} expired|{t}" if o.reason == EXPIRED else f"dead|{t}" if o.refund else \
                    f"dead|{t} " + metrics.timing_fields(t, s.started_ms - job.ready_ms, s.run_s * 1000) + extra
                if follow:
                    stats += f" followups|{t}={len(follow)}"
                burials.append(Burial(job.id, job.token, o.reason, codec.dumps(o.error) if o.error else "", entry,
                                      o.refund, stats, follow, _member_dead(job, o)))
                bury_s.append(s)
            else:
                note = codec.dumps({"attempt": job.attempt, "outcome": o.note, "at_ms": now}) if o.note else ""
                releases.append(Hand(job.id, job.token, o.mode, note))
                release_s.append(s)
        sc = self.rt.scripts
        if starts:
            sc.start(k, starts, pipe=pipe)
            groups.append(start_s)
        if acks:
            sc.ack(k, acks, self.idem_ttl_ms, self.done_ttl_ms, self.done_max, pipe=pipe, totals=totals.text())
            groups.append(ack_s)
        if retries:
            sc.retry(k, retries, pipe=pipe)
            groups.append(retry_s)
        if burials:
            sc.bury(k, burials, self.dead_ttl_ms, pipe=pipe)
            groups.append(bury_s)
        if releases:
            sc.release(k, releases, pipe=pipe, done_ttl_ms=self.done_ttl_ms)
            groups.append(release_s)

    def _on_failure(self, job: Claimed, error: Any) -> tuple[Followup, ...]:
        fn = self.rt.registry.functions.get(job.type)
        if fn is None or not fn.on_failure:
            return ()
        return self._destination(fn.on_failure, "f", job, {"error": error})

    def _destination(self, dest: str, tag: str, job: Claimed, body: dict[str, Any]) -> tuple[Followup, ...]:
        """The destination's job, written in the settling script's own step (ack.lua,
        bury.lua) under an id that step writes once (see relay.destination)."""
        if self._client is None:
            self._client = Client(self.rt)
        f = relay.destination(self._client, dest, tag, job.id, job.type, int(job.version_raw or 0), job.attempt,
                              job.queue, body)
        return () if f is None else (f,)

    def _summarise(self) -> None:
        t = self._tally
        if sum(t.values()):
            log.info("queue %s: %d done, %d retried, %d dead, %d released in the last %.0f s",
                     self.q.name, t["Done"], t["RetryLater"], t["Dead"], t["Release"], SUMMARY_EVERY_S,
                     extra={"queue": self.q.name, "done": t["Done"], "retried": t["RetryLater"],
                            "dead": t["Dead"], "released": t["Release"]})
        t.clear()
        self._next_summary = time.monotonic() + SUMMARY_EVERY_S

    def _log(self, s: Settlement) -> None:
        job = s.run.job
        o = s.outcome
        outcome = {Done: "done", RetryLater: "retry", Dead: "dead", Release: "released"}[type(o)]
        if isinstance(o, RetryLater) and o.refund:
            outcome = "handed back"
        level = logging.DEBUG if isinstance(o, Done) else logging.INFO if isinstance(o, Release) else logging.WARNING
        extra = {
            "job_id": job.id, "type": job.type, "version": job.version_raw, "queue": job.queue,
            "attempt": job.attempt, "idempotency_key": job.idem_key or None,
            "resource_key": job.resource_key or None, "duration_ms": round(s.run_s * 1000, 3),
            "outcome": outcome,
        }
        if isinstance(o, Dead):
            extra["reason"] = o.reason
        if isinstance(o, RetryLater | Dead) and o.error:
            extra["error"] = f"{o.error.get('type')}: {o.error.get('message')}"
        joblog.log(level, "job %s %s", job.id, outcome, extra=extra)
