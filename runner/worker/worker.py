"""The worker: one QueueRunner per queue, plus the scheduler, under one orchestrator.

A QueueRunner is four kinds of threads around two in-process queues:

    fetcher ──claim batch──> inbox ──> executors (concurrency) ──> outbox ──> settler
       ^  idle: BLPOP on the queue's notify list              ack/retry/bury/release,
       └──────────────── capacity freed when a handler returns    one pipeline per batch
    renewer: renews every owned lease (and resource lock) every visibility_timeout/3,
             and interrupts handlers that pass their TIMEOUT

Claims and settlements are batched, so a deep queue costs a few round trips per batch,
not per job. Every state change is one fenced script: a worker whose lease was lost is
refused and changes nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import queue as stdqueue
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from runner.config import QueueConfig
from runner.errors import describe
from runner.observe import metrics
from runner.runtime import Runtime
from runner.store import codec, records
from runner.store.connection import UNAVAILABLE
from runner.store.outage import Outage
from runner.store.scripts import Ack, Burial, RetryAt
from runner.worker.context import Context
from runner.worker.execute import Claimed, Dead, Done, JobTimeout, Outcome, RetryLater, resolve, run
from runner.worker.faults import fault
from runner.worker.scheduler import Scheduler

log = logging.getLogger("runner.worker")
joblog = logging.getLogger("runner.job")

CLAIM_FIELDS = 12
SUMMARY_EVERY_S = 60.0


@dataclass(frozen=True, slots=True)
class Release:
    """Hand the job back without spending an attempt (shutdown)."""


@dataclass(slots=True)
class Owned:
    job: Claimed
    thread_id: int | None = None
    deadline: float | None = None  # monotonic
    lost: bool = False
    timed_out: bool = False


@dataclass(slots=True)
class Settlement:
    owned: Owned
    outcome: Outcome | Release
    run_s: float = 0.0
    started_ms: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def _int_or(value: Any, default: int) -> int:
    if not value:  # a field at its default comes back empty: no exception for the common case
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _history(attempt: int, outcome: str, started_ms: int, now_ms: int, error: Any = None) -> str:
    entry: dict[str, Any] = {"attempt": attempt, "outcome": outcome, "started_ms": started_ms,
                             "at_ms": now_ms}
    if error is not None:
        entry["error"] = {"type": error.get("type"), "message": error.get("message")}
    return codec.dumps(entry)


class QueueRunner:
    def __init__(
        self, runtime: Runtime, queue: QueueConfig, loop: asyncio.AbstractEventLoop | None,
        worker_id: str,
    ) -> None:
        self.rt = runtime
        self.q = queue
        self.keys = runtime.keys[queue.name]
        self.loop = loop
        self.worker_id = worker_id
        # Owned at once: one job per executor plus up to `prefetch` claimed ahead, so a
        # deep queue is claimed in batches instead of one job per freed thread.
        self.capacity = queue.concurrency + queue.prefetch
        # Claim again once this much room opened up, or at once when no job is waiting
        # for an executor (then a thread is idle and latency matters more than batching).
        self.low_water = max(1, min(queue.batch, self.capacity // 2))
        self.busy = 0  # claimed and not yet returned by a handler
        self.waiting = 0  # claimed and not yet picked up by an executor
        self.cond = threading.Condition()
        self.owned: dict[str, Owned] = {}
        self.owned_lock = threading.Lock()
        self.inbox: stdqueue.SimpleQueue[Owned | None] = stdqueue.SimpleQueue()
        self.outbox: stdqueue.SimpleQueue[Settlement | None] = stdqueue.SimpleQueue()
        self.stop_claiming = threading.Event()
        self.stopped = threading.Event()
        self._seq = 0
        self._threads: list[threading.Thread] = []
        self._executors: list[threading.Thread] = []
        ret = runtime.config.retention
        self.done_ttl_ms = int(ret.done_s * 1000)
        self.dead_ttl_ms = int(ret.dead_s * 1000)
        self.idem_ttl_ms = int(ret.idempotency_s * 1000)
        self.lease_ms = int(queue.visibility_timeout_s * 1000)
        self.processed = 0
        self._tally: Counter[str] = Counter()
        self._next_summary = time.monotonic() + SUMMARY_EVERY_S

    # --- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        name = self.q.name
        self._threads = [
            threading.Thread(target=self._fetch_loop, name=f"{name}-fetch", daemon=True),
            threading.Thread(target=self._settle_loop, name=f"{name}-settle", daemon=True),
            threading.Thread(target=self._renew_loop, name=f"{name}-renew", daemon=True),
        ]
        self._executors = [
            threading.Thread(target=self._exec_loop, name=f"{name}-exec-{i}", daemon=True)
            for i in range(self.q.concurrency)
        ]
        for t in self._threads + self._executors:
            t.start()

    def stop(self, grace_s: float) -> None:
        """Stop claiming, release what has not started, let running handlers finish
        within ``grace_s``, release the rest, then flush every settlement."""
        self.stop_claiming.set()
        with self.cond:
            self.cond.notify_all()
        self._threads[0].join(timeout=5)
        for _ in self._executors:
            self.inbox.put(None)
        deadline = time.monotonic() + grace_s
        for t in self._executors:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        with self.owned_lock:
            still = [o for o in self.owned.values() if o.thread_id is not None]
        if still:
            log.warning("%s: %d job(s) still running after the grace period; releasing them",
                        self.q.name, len(still))
            self._settle_now([Settlement(o, Release()) for o in still])
        self.outbox.put(None)
        self._threads[1].join(timeout=10)
        self.stopped.set()
        self._threads[2].join(timeout=2)

    # --- fetcher ---------------------------------------------------------------------

    def _free(self) -> int:
        with self.cond:
            while not self.stop_claiming.is_set():
                room = self.capacity - self.busy
                if room >= self.low_water or (room > 0 and self.waiting == 0):
                    return room
                self.cond.wait(0.5)
            return 0

    def _fetch_loop(self) -> None:
        outage = Outage(f"{self.q.name} fetcher", log)
        r = self.rt.redis
        while not self.stop_claiming.is_set():
            free = self._free()
            if self.stop_claiming.is_set():
                break
            try:
                fault("before_claim")
                got = self._claim(min(free, self.q.batch))
                outage.ok()
                if got == 0:
                    r.blpop([self.keys.notify], timeout=1)
            except UNAVAILABLE as exc:
                outage.failed(exc, self.stop_claiming)
            except Exception:
                log.exception("%s fetcher: unexpected error; continuing", self.q.name)
                self.stop_claiming.wait(0.5)

    def _claim(self, n: int) -> int:
        self._seq += 1
        now = records.now_ms()
        reply = self.rt.scripts.claim(
            self.keys, now_ms=now, n=n, lease_ms=self.lease_ms,
            token_base=f"{self.worker_id}.{self._seq}", defer_base_ms=50, defer_cap_ms=5000,
            rnd=random.random(), dead_ttl_ms=self.dead_ttl_ms, done_ttl_ms=self.done_ttl_ms,
        )
        count = len(reply) // CLAIM_FIELDS
        if not count:
            return 0
        fault("after_claim")
        qname = self.q.name
        batch: list[Owned] = []
        for i in range(0, len(reply), CLAIM_FIELDS):
            f = reply[i:i + CLAIM_FIELDS]
            # claim.lua vouches for attempt and max_attempts; the timestamps are only
            # figures, so a damaged one must not cost the batch.
            created = _int_or(f[10], now)
            job = Claimed(
                id=f[0], token=f[1], attempt=int(f[2]), type=f[3], version_raw=f[4],
                payload_raw=f[5], max_attempts=int(f[6] or 1), idem_key=f[7],
                resource_key=f[8], ready_ms=_int_or(f[9], created), created_ms=created,
                checkpoint_raw=f[11], queue=qname, claimed_ms=now,
            )
            batch.append(Owned(job))
        with self.owned_lock:
            for o in batch:
                self.owned[o.job.id] = o
        with self.cond:
            self.busy += count
            self.waiting += count
        for o in batch:
            self.inbox.put(o)
        return count

    # --- executors -------------------------------------------------------------------

    def _exec_loop(self) -> None:
        while True:
            try:
                owned = self.inbox.get()
                if owned is None:
                    return
                with self.cond:
                    self.waiting -= 1
                    if self.waiting == 0:
                        self.cond.notify()
                if self.stop_claiming.is_set():
                    self.outbox.put(Settlement(owned, Release()))
                    continue
                try:
                    settlement = self._execute(owned)
                except BaseException as exc:  # a late timeout, or a bug: never strand a claim
                    settlement = Settlement(owned, self._unexpected(owned.job, exc))
                self.outbox.put(settlement)
            except JobTimeout:
                continue  # a timeout that landed between two jobs
            finally:
                with self.cond:
                    self.busy = max(0, self.busy - 1)
                    self.cond.notify()

    @staticmethod
    def _unexpected(job: Claimed, exc: BaseException) -> Outcome:
        log.exception("job %s: unexpected error outside the handler", job.id, exc_info=exc)
        err = describe(exc)
        if job.attempt >= job.max_attempts:
            return Dead(reason="max attempts reached", error=err, refund=False)
        return RetryLater(delay_s=1.0, error=err)

    def _execute(self, owned: Owned) -> Settlement:
        job = owned.job
        registry = self.rt.registry  # one snapshot per job: a reload never changes it mid-run
        resolved = resolve(job, registry)
        if isinstance(resolved, Dead):
            return Settlement(owned, resolved)
        fn, payload, version = resolved
        started_ms = records.now_ms()
        ctx = Context(
            job_id=job.id, type=job.type, version=version, queue=job.queue,
            attempt=job.attempt, max_attempts=job.max_attempts, token=job.token,
            deadline=time.time() + fn.timeout_s,
            idempotency_key=job.idem_key or None, resource_key=job.resource_key or None,
            logger=logging.LoggerAdapter(joblog, {"job_id": job.id, "type": job.type,
                                                   "attempt": job.attempt}),
            _checkpoint=codec.loads(job.checkpoint_raw) if job.checkpoint_raw else None,
            _save=lambda body: int(self.rt.scripts.checkpoint(self.keys, job.id, job.token, body)) > 0,
            _extend=lambda: self._renew_one(job),
        )

        def guard(body: Callable[[], Any]) -> Any:
            with self.owned_lock:
                owned.thread_id = threading.get_ident()
                owned.deadline = time.monotonic() + fn.timeout_s
            try:
                fault("mid_handler")
                return body()
            finally:
                with self.owned_lock:
                    owned.thread_id = None
                    owned.deadline = None

        outcome, run_s = run(fn, payload, job, ctx, self.loop, guard)
        fault("after_handler")
        return Settlement(owned, outcome, run_s=run_s, started_ms=started_ms)

    # --- settler ---------------------------------------------------------------------

    def _settle_loop(self) -> None:
        done = False
        while not done:
            first = self.outbox.get()
            if first is None:
                break
            batch = [first]
            while len(batch) < 500:
                try:
                    nxt = self.outbox.get_nowait()
                except stdqueue.Empty:
                    break
                if nxt is None:
                    done = True
                    break
                batch.append(nxt)
            self._settle_now(batch)

    def _settle_now(self, batch: Sequence[Settlement]) -> None:
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
                self._send(batch)
                outage.ok()
                return
            except UNAVAILABLE as exc:
                if self.stopped.is_set():
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
                        self._settle_now([one])
                    return
                if errors >= 8 or self.stopped.is_set():
                    with self.owned_lock:
                        for one in batch:
                            self.owned.pop(one.owned.job.id, None)
                    log.error("%s settler: giving up on job(s) %s; they are reclaimed when their "
                              "lease lapses", self.q.name, ", ".join(b.owned.job.id for b in batch))
                    return
                outage.failed(exc, give_up)

    def _send(self, batch: Sequence[Settlement]) -> None:
        now = records.now_ms()
        acks: list[Ack] = []
        retries: list[RetryAt] = []
        burials: list[Burial] = []
        releases: list[tuple[str, str]] = []
        ack_s: list[Settlement] = []
        retry_s: list[Settlement] = []
        bury_s: list[Settlement] = []
        release_s: list[Settlement] = []
        for s in batch:
            job = s.owned.job
            o = s.outcome
            t = job.type
            if isinstance(o, Done):
                lat = (s.started_ms or now) - job.ready_ms
                fields = f"succeeded|{t} " + metrics.timing_fields(t, lat, s.run_s * 1000)
                acks.append(Ack(job.id, job.token, o.result,
                                _history(job.attempt, "done", s.started_ms, now), fields))
                ack_s.append(s)
            elif isinstance(o, RetryLater):
                retries.append(RetryAt(
                    job.id, job.token, now + int(o.delay_s * 1000), codec.dumps(o.error),
                    _history(job.attempt, "retry", s.started_ms, now, o.error),
                    f"retried|{t} " + metrics.timing_fields(t, s.started_ms - job.ready_ms, s.run_s * 1000),
                ))
                retry_s.append(s)
            elif isinstance(o, Dead):
                entry = "" if o.refund else _history(job.attempt, o.reason, s.started_ms, now, o.error)
                burials.append(Burial(
                    job.id, job.token, o.reason, codec.dumps(o.error) if o.error else "",
                    entry, o.refund,
                    f"dead|{t}" if o.refund else
                    f"dead|{t} " + metrics.timing_fields(t, s.started_ms - job.ready_ms, s.run_s * 1000),
                ))
                bury_s.append(s)
            else:
                releases.append((job.id, job.token))
                release_s.append(s)
        sc = self.rt.scripts
        pipe = sc.batch()
        groups: list[list[Settlement]] = []
        if acks:
            sc.ack(self.keys, acks, now, self.idem_ttl_ms, pipe=pipe)
            groups.append(ack_s)
        if retries:
            sc.retry(self.keys, retries, now, pipe=pipe)
            groups.append(retry_s)
        if burials:
            sc.bury(self.keys, burials, now, self.dead_ttl_ms, pipe=pipe)
            groups.append(bury_s)
        if releases:
            sc.release(self.keys, releases, now, pipe=pipe)
            groups.append(release_s)
        replies = pipe.execute()
        fault("after_ack")
        with self.owned_lock:
            for group, codes in zip(groups, replies, strict=True):
                for s, code in zip(group, codes, strict=True):
                    self.owned.pop(s.owned.job.id, None)
                    if int(code) < 0:
                        log.warning("job %s: lease lost before it settled (%s); another worker "
                                    "owns it now", s.owned.job.id, type(s.outcome).__name__)
        self.processed += len(batch)
        # Successes log at DEBUG (a line per job at INFO would cost more than the job);
        # retries and dead letters always log, and a summary line goes out every minute.
        verbose = joblog.isEnabledFor(logging.DEBUG)
        for s in batch:
            self._tally[type(s.outcome).__name__] += 1
            if verbose or not isinstance(s.outcome, Done | Release):
                self._log(s)
        if time.monotonic() >= self._next_summary:
            self._summarise()

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
        job = s.owned.job
        o = s.outcome
        outcome = {Done: "done", RetryLater: "retry", Dead: "dead", Release: "released"}[type(o)]
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

    # --- renewer ---------------------------------------------------------------------

    def _renew_one(self, job: Claimed) -> bool:
        codes = self.rt.scripts.renew(self.keys, [(job.id, job.token)], records.now_ms(), self.lease_ms)
        return int(codes[0]) > 0

    def _renew_loop(self) -> None:
        outage = Outage(f"{self.q.name} renewer", log)
        every = max(0.2, self.q.visibility_timeout_s / 3)
        next_renew = time.monotonic() + every
        while not self.stopped.wait(0.1):
            self._enforce_timeouts()
            if time.monotonic() < next_renew:
                continue
            with self.owned_lock:
                owned = [(o.job.id, o.job.token) for o in self.owned.values() if not o.lost]
            try:
                for i in range(0, len(owned), 500):
                    chunk = owned[i:i + 500]
                    codes = self.rt.scripts.renew(self.keys, chunk, records.now_ms(), self.lease_ms)
                    with self.owned_lock:
                        for (job_id, _), code in zip(chunk, codes, strict=True):
                            if int(code) == -1 and job_id in self.owned:
                                self.owned[job_id].lost = True
                                log.warning("job %s: lease lost (reclaimed elsewhere)", job_id)
                outage.ok()
                next_renew = time.monotonic() + every
            except UNAVAILABLE as exc:
                outage.failed(exc, self.stopped)
            except Exception as exc:  # never let renewal die silently: leases would lapse
                log.exception("%s renewer: renewing failed (%s); retrying", self.q.name, exc)
                outage.failed(exc, self.stopped)

    def _enforce_timeouts(self) -> None:
        now = time.monotonic()
        with self.owned_lock:
            for o in self.owned.values():
                if o.thread_id is not None and o.deadline is not None and now > o.deadline \
                        and not o.timed_out:
                    o.timed_out = True
                    exc = ctypes.py_object(JobTimeout)
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(o.thread_id), exc)
                    log.warning("job %s: past its TIMEOUT; interrupting the handler", o.job.id)


class Worker:
    """Runs QueueRunners for the given queues and one scheduler; SIGTERM/SIGINT stop it
    gracefully, a second signal exits at once."""

    def __init__(self, runtime: Runtime, queues: Sequence[str]) -> None:
        self.rt = runtime
        self.queues = list(queues)
        self.worker_id = f"{os.uname().nodename.replace(' ', '_')}:{os.getpid()}:{os.urandom(3).hex()}"
        self.loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self.loop.run_forever, name="asyncio", daemon=True)
        self.runners = [QueueRunner(runtime, runtime.config.queue(q), self.loop, self.worker_id)
                        for q in self.queues]
        self.scheduler = Scheduler(runtime)
        self.stop_event = threading.Event()
        self._signals = 0

    def start(self) -> None:
        # The scheduler first, so due and lapsed jobs move before the first claim;
        # the runners last, once everything they rely on is up.
        self._loop_thread.start()
        self.scheduler.start()
        for r in self.runners:
            r.start()
        log.info("worker %s serving %s", self.worker_id, ", ".join(self.queues))

    def stop(self, grace_s: float | None = None) -> None:
        grace = self.rt.config.worker.grace_period_s if grace_s is None else grace_s
        # Runners stop in parallel (each within the same grace), then the scheduler.
        threads = [threading.Thread(target=r.stop, args=(grace,)) for r in self.runners]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.scheduler.stop()
        self.loop.call_soon_threadsafe(self.loop.stop)
        log.info("worker %s stopped", self.worker_id)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._signals += 1
        if self._signals > 1:
            log.warning("second signal: exiting now; running jobs are reclaimed when their lease lapses")
            os._exit(1)
        log.info("signal %s: stopping gracefully", signal.Signals(signum).name)
        self.stop_event.set()

    def run(self) -> None:
        """Run until SIGTERM/SIGINT (main thread only)."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        self.start()
        while not self.stop_event.wait(1.0):
            pass
        self.stop()
