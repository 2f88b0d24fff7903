"""The executors: ``concurrency`` slots, each a thread that takes claimed runs off the
inbox and hands the outcome to the settler. A function's ISOLATION says where its handler
runs: in the slot's thread (with an event loop of the slot's own for async handlers, so
one that blocks its loop stalls only its own slot), or in the slot's warm child process
(isolation.py), which the thread only feeds and watches.

Thread isolation cannot stop a handler stuck in a C call: the renewer raises JobTimeout
in it at TIMEOUT, and TIMEOUT plus the grace later gives the run up (``abandon``): its
attempt fails as a timeout, its lease is let go, and a new thread takes its slot. The
stuck thread's eventual result is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import queue as stdqueue
import threading
import time
from collections.abc import Callable
from typing import Any

from runner.catalog.registry import Function
from runner.client import Client, Enqueued, Request
from runner.config import QueueConfig
from runner.errors import IdempotencyConflict, JobTimeout, RunnerError, describe, refusal_record
from runner.observe import tracing
from runner.runtime import Runtime
from runner.store import codec, listing
from runner.store.scripts import Followup, NewJob, followup_id
from runner.worker import faults
from runner.worker.context import for_job, progress_view
from runner.worker.execute import Claimed, Dead, Done, Outcome, RetryLater, expired, failure, resolve
from runner.worker.execute import run as run_handler
from runner.worker.faults import fault
from runner.worker.isolation import Slot
from runner.worker.ledger import START, Ledger, Release, Run, Settlement
from runner.worker.lifeline import vital

log = logging.getLogger("runner.worker")
LEFT_BEHIND_S = 0.05  # how long tasks a handler left behind get to end once cancelled
joblog = logging.getLogger("runner.job")


class Executors:
    def __init__(self, runtime: Runtime, queue: QueueConfig, ledger: Ledger,
                 inbox: stdqueue.SimpleQueue[Run | None], outbox: stdqueue.SimpleQueue[Settlement | None],
                 renew_one: Callable[[Claimed], bool]) -> None:
        self.rt = runtime
        self.q = queue
        self.parts = runtime.parts[queue.name]
        self.ledger = ledger
        self.inbox = inbox
        self.outbox = outbox
        self.renew_one = renew_one
        self.grace_s = runtime.config.worker.timeout_grace_s
        self.releasing = threading.Event()
        self.abandoned = 0
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._slots = [Slot(queue, runtime.config.source, self.grace_s) for _ in range(queue.concurrency)]
        self._free_slots: list[int] = list(range(queue.concurrency))
        self._enqueuer: Client | None = None

    def start(self) -> None:
        for i in range(self.q.concurrency):
            self._spawn(i)
        if any(f.isolation == "process" for f in self.rt.registry.for_queue(self.q.name)):
            # Warm children in the background: the first process job should not wait for
            # an interpreter to start and import the functions.
            threading.Thread(target=self._warm, name=f"{self.q.name}-warm", daemon=True).start()

    def _warm(self) -> None:
        gen = id(self.rt.registry)
        for slot in self._slots:
            if self.releasing.is_set():
                return
            try:
                slot.warm(gen)
            except OSError as exc:
                log.warning("%s: could not start a child process: %s", self.q.name, exc)

    def _spawn(self, index: int) -> None:
        t = threading.Thread(target=vital(lambda: self._loop(index)), name=f"{self.q.name}-exec-{index}",
                             daemon=True)
        with self._lock:
            self._threads.append(t)
        t.start()

    def stop(self, grace_s: float) -> None:
        """Hand back what has not started, let running handlers finish within ``grace_s``,
        then stop the rest: a child is killed and its job handed back at once; a thread
        cannot be stopped, so its job is handed back once its lease lapses (this process
        will be gone by then), never while the handler may still run."""
        self.releasing.set()
        with self._lock:
            threads = list(self._threads)
        for _ in threads:
            self.inbox.put(None)
        deadline = time.monotonic() + grace_s
        for t in threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        still = self.ledger.running()
        if still:
            log.warning("%s: %d job(s) still running after the grace period of %g s; stopping them",
                        self.q.name, len(still), grace_s)
        for r in still:
            if r.child_pid is not None:
                self._slot_of(r).kill()
                self.outbox.put(Settlement(r, Release("now", "interrupted")))
            else:
                self.outbox.put(Settlement(r, Release("later", "interrupted")))
        # Claims that reached the inbox after the stop sentinels.
        while True:
            try:
                left = self.inbox.get_nowait()
            except stdqueue.Empty:
                break
            if left is not None:
                self.ledger.picked()
                self.ledger.returned()
                if self.ledger.pick(left):
                    self.outbox.put(Settlement(left, Release()))
        for slot in self._slots:
            slot.close()

    def _client(self) -> Client:
        """The client a handler's ``ctx.enqueue`` uses: one per queue's executors, on the
        worker's own connection, made at the first follow-up."""
        with self._lock:
            if self._enqueuer is None:
                self._enqueuer = Client(self.rt)
            return self._enqueuer

    def _hold(self, run: Run, type_: str, payload: Any, *, version: int | None = None,
              delay: float | None = None, idempotency_key: str | None = None,
              priority: int | None = None) -> Enqueued:
        """``ctx.enqueue``: validate the follow-up now (the handler sees a bad one at once)
        and hold it on the run; the ack writes it in its own step (see ack.lua), so a
        failed or crashed run leaves none. Its id is the parent's and its index: the
        same on every attempt."""
        prep = self._client().prepare(Request(type_, payload, version=version, delay_s=delay,
                                              idempotency_key=idempotency_key, priority=priority))
        self._check_key(prep.fn.queue, prep.job)
        with self.ledger.lock:
            job = prep.job._replace(id=followup_id(run.job.id, len(run.followups)))
            run.followups.append(Followup(prep.fn.queue, job))
        return Enqueued(id=job.id, type=prep.fn.name, version=job.version, queue=prep.fn.queue, status="pending")

    def _check_key(self, queue: str, job: NewJob) -> None:
        """A follow-up whose idempotency key another job holds with another payload raises
        IdempotencyConflict here, in the handler, as an enqueue answers 409: the ack would
        not write it (a key taken between here and the ack is counted there instead, as
        followups_refused). On a partitioned queue the key's partition is chosen when the
        follow-up is placed, and only the ack's count tells."""
        if not job.idem_key or len(self.rt.parts[queue]) > 1:
            return
        holder = listing.conflicting_holder(self.rt.redis, self.rt.parts[queue][0], job.type, job.idem_key,
                                            job.payload_hash)
        if holder is not None:
            raise IdempotencyConflict(job.idem_key, holder)

    def _slot_of(self, run: Run) -> Slot:
        for slot in self._slots:
            if slot.child is not None and slot.child.pid == run.child_pid:
                return slot
        return Slot(self.q, self.rt.config.source, self.grace_s)  # already gone: a no-op kill

    def abandon(self, run: Run) -> None:
        """Give up a thread run stuck TIMEOUT plus the grace past its deadline (see the
        module docstring). Called by the renewer."""
        with self.ledger.lock:
            if run.abandoned:
                return
            run.abandoned = True
            index, began = run.slot, run.began
        fn = self.rt.registry.functions.get(run.job.type)
        exc = JobTimeout(f"abandoned: still running {self.grace_s:g} s past its TIMEOUT (in a C call, or "
                         'catching the timeout itself); ISOLATION = "process" kills such a handler')
        outcome = failure(fn, run.job, exc) if fn is not None else Dead("max attempts reached", describe(exc), False)
        self.abandoned += 1
        log.warning("job %s: abandoned %g s past its TIMEOUT (stuck in a C call, or catching the timeout); its "
                    "slot goes to a new thread", run.job.id, self.grace_s,
                    extra={"job_id": run.job.id, "type": run.job.type})
        # On record as run from its start to now, as a finished attempt is.
        run_s, started_ms = (time.monotonic() - began[0], began[1]) if began is not None else (0.0, 0)
        self.outbox.put(Settlement(run, outcome, run_s=run_s, started_ms=started_ms, extra={"abandoned": True}))
        self.ledger.returned()
        if index is not None and not self.releasing.is_set():
            self._spawn(index)

    def _loop(self, index: int) -> None:
        loop: asyncio.AbstractEventLoop | None = None
        try:
            while True:
                run = self.inbox.get()
                if run is None:
                    return
                if not self.ledger.take(run):
                    self.ledger.returned()  # a cancel took it; its hand-back is on its way
                    continue
                if self.releasing.is_set():
                    self.outbox.put(Settlement(run, Release()))
                    self.ledger.returned()
                    continue
                if not run.job.started and run.lost:
                    # Claimed ahead and lost before it started (a cancel takes a prefetched
                    # job's claim; the renewal said so): it is no longer this worker's to run.
                    self.ledger.forget([run])
                    self.ledger.returned()
                    continue
                if faults.ARMED:
                    faults.fault("exec_loop")
                run.slot = index
                if not run.job.started:
                    late = self._expired_ahead(run)
                    if late is not None:  # claimed ahead in time, but not started in time
                        self.outbox.put(late)
                        self.ledger.returned()
                        continue
                    self.outbox.put(Settlement(run, START))
                try:
                    if loop is None:
                        loop = asyncio.new_event_loop()
                    settlement = self._execute(run, index, loop)
                except BaseException as exc:  # a late timeout, or a bug: never strand a claim
                    settlement = Settlement(run, _unexpected(run.job, exc))
                if run.abandoned:
                    return  # settled by abandon(); a new thread has this slot
                # Only after an async handler: asyncio.all_tasks walks a WeakSet, 15,000
                # instructions a job on this path (18 % more for a no-op job).
                fn = self.rt.registry.functions.get(run.job.type)
                if loop is not None and fn is not None and fn.is_async and asyncio.all_tasks(loop):
                    _left_behind(loop, run.job.id)
                    loop = None  # the next async job gets a fresh loop
                self.outbox.put(settlement)
                self.ledger.returned()
        finally:
            if loop is not None:
                loop.close()

    def _expired_ahead(self, run: Run) -> Settlement | None:
        """A job claimed ahead whose MAX_AGE passed while it waited for an executor: dead
        as "expired", unrun and spending no attempt, as claim.lua buries one claimed late."""
        job = run.job
        fn = self.rt.registry.functions.get(job.type)
        if fn is None or not fn.max_age_s:
            return None
        now = self._server_now(job)
        if now - job.created_ms <= fn.max_age_s * 1000:
            return None
        return Settlement(run, expired(job, fn.max_age_s, now), started_ms=now)

    def _execute(self, run: Run, index: int, loop: asyncio.AbstractEventLoop) -> Settlement:
        if not tracing.enabled():
            return self._execute_one(run, index, loop)
        job = run.job
        with tracing.run_span(job.traceparent, job.id, job.type, job.attempt, job.queue, job.ready_ms) as span:
            settlement = self._execute_one(run, index, loop)
            o = settlement.outcome
            name = "done" if isinstance(o, Done) else "retry" if isinstance(o, RetryLater) else "dead"
            tracing.outcome(span, name, getattr(o, "error", None))
            run.trace = tracing.context_of(span)
            return settlement

    def _execute_one(self, run: Run, index: int, loop: asyncio.AbstractEventLoop) -> Settlement:
        job = run.job
        registry = self.rt.registry  # one snapshot per job: a reload never changes it mid-run
        grace = self.rt.config.worker.unknown_grace_s
        fn = registry.functions.get(job.type)
        if fn is not None and fn.isolation == "process":
            return self._in_child(run, fn, index, id(registry), grace)
        started_ms = self._server_now(job)  # (resolving takes microseconds: the same clock)
        resolved = resolve(job, registry, grace, started_ms)
        if not isinstance(resolved, tuple):  # an outcome: Done, RetryLater or Dead
            return Settlement(run, resolved)
        fn, payload, version = resolved
        max_result = self.rt.config.worker.max_result_bytes
        ctx = for_job(
            job, version, fn.timeout_s, joblog,
            _save=lambda body: int(self.rt.scripts.checkpoint(self.parts[job.partition], job.id, job.token,
                                                              body)) > 0,
            _extend=lambda: self.renew_one(job),
            _flags=run.flags,
            _progress=lambda value: setattr(run, "progress", codec.dumps(progress_view(value))),
            _enqueue=lambda type_, payload, **options: self._hold(run, type_, payload, **options),
            _group=lambda group_id: self._client().group_outcomes(group_id),
            _max_bytes=max_result,
        )

        def guard(body: Callable[[], Any]) -> Any:
            with self.ledger.lock:
                run.thread_id = threading.get_ident()
                now = time.monotonic()
                run.deadline = now + fn.timeout_s
                run.began = (now, started_ms)  # as the attempt's settlement reports it
            try:
                fault("mid_handler")
                return body()
            finally:
                with self.ledger.lock:
                    run.thread_id = None
                    run.deadline = None
                    raised = run.timed_out
                if raised:
                    # A timeout raised just as the handler returned must not land in this
                    # loop instead. The renewer raises one only while thread_id is set and
                    # marks timed_out first, under the lock: no mark, nothing to clear.
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(threading.get_ident()), None)

        outcome, run_s = run_handler(fn, payload, job, ctx, loop, guard, max_result)
        fault("after_handler")
        return Settlement(run, outcome, run_s, started_ms)

    def _in_child(self, run: Run, fn: Function, index: int, generation: int, grace: float) -> Settlement:
        job = run.job
        started_ms = self._server_now(job)

        def on_started(pid: int) -> None:
            with self.ledger.lock:
                run.child_pid = pid
            fault("mid_handler")

        def on_rpc(msg: dict[str, Any]) -> Any:
            if msg.get("call") == "checkpoint":
                return int(self.rt.scripts.checkpoint(self.parts[job.partition], job.id, job.token,
                                                      str(msg.get("data")))) > 0
            if msg.get("call") == "extend":
                return self.renew_one(job)
            if msg.get("call") == "progress":
                run.progress = codec.dumps(progress_view(msg.get("value")))
                return True
            if msg.get("call") == "enqueue":
                try:
                    return self._hold(run, str(msg.get("type")), msg.get("payload"),
                                      **(msg.get("options") or {})).as_dict()
                except RunnerError as exc:  # raised again in the child with its class (child.py)
                    return refusal_record(exc)
            if msg.get("call") == "group_outcomes":
                try:
                    return {"outcomes": self._client().group_outcomes(str(msg.get("group")))}
                except RunnerError as exc:
                    return {"error": str(exc)}
            return False

        extra = {"unknown_grace_s": grace, "now_ms": self._server_now(job),
                 "max_result_bytes": self.rt.config.worker.max_result_bytes}
        try:
            outcome, run_s = self._slots[index].run(job, fn, generation, extra, on_started, on_rpc,
                                                     lambda: {"lock_lost": run.flags.lock_lost,
                                                              "cancelled": run.flags.cancelled})
        finally:
            with self.ledger.lock:
                run.child_pid = None
        fault("after_handler")
        return Settlement(run, outcome, run_s=run_s, started_ms=started_ms)

    @staticmethod
    def _server_now(job: Claimed) -> int:
        """The server's clock now, from the claim's server time and the time since (this
        host's clock may be off; its monotonic clock measures the interval well)."""
        return job.claimed_ms + int((time.monotonic() - job.received) * 1000)


def _left_behind(loop: asyncio.AbstractEventLoop, job_id: str) -> None:
    """An async handler that outlived its job (it swallowed the cancel of its TIMEOUT, or
    left tasks of its own running) would wake up inside the next job run on this loop.
    Its tasks are cancelled and given a moment to end, and the loop is closed: whatever
    still runs on it never runs again (the slot makes a new loop at its next job)."""
    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel()
    with contextlib.suppress(BaseException):
        loop.run_until_complete(asyncio.wait(tasks, timeout=LEFT_BEHIND_S))
    stuck = sum(1 for t in tasks if not t.done())
    log.warning("job %s: its handler left %d task(s) running after its end; cancelled%s", job_id, len(tasks),
                f", and {stuck} that did not stop (catching BaseException or CancelledError) never run again"
                if stuck else "", extra={"job_id": job_id})
    loop.close()


def _unexpected(job: Claimed, exc: BaseException) -> Outcome:
    log.exception("job %s: unexpected error outside the handler", job.id, exc_info=exc)
    err = describe(exc)
    if job.attempt >= job.max_attempts:
        return Dead(reason="max attempts reached", error=err, refund=False)
    return RetryLater(delay_s=1.0, error=err)

