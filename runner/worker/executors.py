"""The executors: ``concurrency`` slots, each a thread that takes claimed runs off the
inbox and hands the outcome to the settler. A function's ISOLATION says where its handler
runs: in the slot's thread (with an event loop of the slot's own for async handlers, so
one that blocks its loop stalls only its own slot), or in the slot's warm child process
(isolation.py), which the thread only feeds and watches.

Thread isolation cannot stop a handler stuck in a C call: the renewer raises JobTimeout
in it at TIMEOUT, and TIMEOUT plus the grace later gives the run up (``abandon``): a new
thread takes its slot, but the run keeps its lease and limit slots until the stuck call
returns (it still runs: nothing of its resource, nor its own retry, may start beside it);
then its attempt fails as a timeout, and its result is dropped.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import functools
import logging
import queue as stdqueue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from runner.catalog.registry import Function, Registry
from runner.client import Client, Enqueued, Request, inspecting, waking
from runner.config import QueueConfig
from runner.errors import (
    IdempotencyConflict,
    JobNotFound,
    JobTimeout,
    RunnerError,
    SignalPending,
    StaleLease,
    describe,
    refusal_record,
)
from runner.observe import tracing
from runner.runtime import Runtime
from runner.store import codec, listeners, listing, steps, tracecontext
from runner.store.keys import QueueKeys
from runner.store.scripts import Followup, NewJob, followup_id
from runner.worker import batching, durable, faults, journal
from runner.worker.context import Context, Hooks, for_job, progress_view
from runner.worker.execute import (
    CANCELLED,
    Claimed,
    Dead,
    Done,
    Outcome,
    RetryLater,
    as_asked,
    expired,
    failure,
    from_message,
    resolve,
)
from runner.worker.execute import run as run_handler
from runner.worker.faults import fault
from runner.worker.isolation import EXITED, ExecutorCrashed, Generations, Superseded, describe_exit
from runner.worker.joblog import JobLogger, batch_loggers, skew_ms
from runner.worker.journal import Journal
from runner.worker.ledger import START, Ledger, Release, Run, Settlement
from runner.worker.lifeline import vital
from runner.worker.renewer import send_logs
from runner.worker.slot import Feed, Slot

log = logging.getLogger("runner.worker")
# How long the stop waits, once it killed the children still running jobs, for their
# slots to hand back the jobs waiting behind those (each slot sees its child die at once).
HAND_BACK_S = 5.0
LEFT_BEHIND_S = 0.05  # how long tasks a handler left behind get to end once cancelled
GATHER_LOOK_S = 0.005  # how often a gathering batch looks whether other executors filled it
# A job claimed ahead whose lease has this little left by this host's clock is confirmed in
# Redis before its handler starts (Executors._lapsed): the claim's lease is counted from its
# answer, which came a trip after the server set it.
LAPSE_MARGIN_S = 0.1
joblog = logging.getLogger("runner.job")


class Executors:
    def __init__(self, runtime: Runtime, queue: QueueConfig, ledger: Ledger,
                 inbox: stdqueue.SimpleQueue[Run | None], outcomes: stdqueue.SimpleQueue[Settlement | None],
                 renew_one: Callable[[Claimed], bool]) -> None:
        self.rt = runtime
        self.q = queue
        self.parts = runtime.parts[queue.name]
        self.ledger = ledger
        self.inbox = inbox
        self.outcomes = outcomes
        self.renew_one = renew_one
        # Told of each thread handler's TIMEOUT deadline (monotonic): the renewer's expect.
        self.expect: Callable[[float], None] = lambda deadline: None
        self.grace_s = runtime.config.worker.timeout_grace_s
        self.releasing = threading.Event()
        self.abandoned = 0
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._generations = Generations()
        self._slots = [Slot(queue, runtime.config, self.grace_s, self._generations.code)
                       for _ in range(queue.concurrency)]
        for i, slot in enumerate(self._slots):
            slot.backlog = functools.partial(ledger.backlog, i)
        self._free_slots: list[int] = list(range(queue.concurrency))
        # Slots running a job, by index (startable reads it unlocked: a hint); a flag each, as
        # a store costs no call per job where a set's add and discard cost two.
        self._busy: list[bool] = [False] * queue.concurrency
        self._only: tuple[object, bool] = (None, False)  # (registry, every function in a child)
        self._later: tuple[object, str] = (None, "")  # (registry, its functions that run in a child)
        self._gathered: tuple[object, str] = (None, "")  # (registry, its BATCH functions)
        self._enqueuer: Client | None = None
        # BATCH batches being gathered, by (function, rendered key): see _gather_members.
        self._gathering: dict[tuple[int, str], _Gathering] = {}
        self._idle = 0  # executors waiting on the inbox now (a hint, updated unlocked)
        # Start marks of runs claimed ahead that executors start now (_start_one): one
        # sends, for every run waiting when its call goes (a group commit); the others wait.
        self._marks = threading.Condition()
        self._marking: list[_Mark] = []
        self._mark_sent = False  # a thread is sending marks now

    def start(self) -> None:
        for i in range(self.q.concurrency):
            self._spawn(i)
        if any(f.isolation == "process" for f in self.rt.registry.for_queue(self.q.name)):
            # Warm children in the background: the first process job should not wait for
            # an interpreter to start and import the functions.
            threading.Thread(target=self._warm, name=f"{self.q.name}-warm", daemon=True).start()

    def startable(self, idle: int) -> int:
        """How many of ``idle`` free executors can hand a job to its handler at once: all
        of them, unless every function of the queue runs in a child process: then those
        whose child is ready. A job claimed for one whose child is still starting would
        spend its attempt before its claim is held (a worker killed in between charged
        "worker lost" to a job that never ran): it is claimed ahead instead. (Not on a
        queue with thread-mode functions: a thread job claimed ahead spends its attempt
        only with the settler's next batch, and one that kills its worker at once would
        never be charged.)"""
        fns = self.rt.registry.for_queue(self.q.name)
        if not fns or any(f.isolation != "process" for f in fns):
            return idle
        gen = self._generations.of(self.rt.registry)
        ready = sum(1 for i, slot in enumerate(self._slots) if not self._busy[i] and slot.ready(gen))
        return min(idle, ready)

    def _warm(self) -> None:
        gen = self._generations.of(self.rt.registry)
        for slot in self._slots:
            if self.releasing.is_set():
                return
            try:
                slot.warm(gen)
            except OSError as exc:
                log.warning("%s: could not start a child process: %s", self.q.name, exc)
            except Superseded:  # (reloaded meanwhile: the next job starts the child)
                return

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
        for r in self.ledger.snapshot():
            if r.abandoned and self.ledger.verdict(r) is not None:
                # Still in its C call: back once its lease lapses, when this process is gone.
                self.outcomes.put(Settlement(r, Release("later", "interrupted")))
        killed: list[Slot] = []
        for r in still:
            if r.child_pid is not None:
                # Marked before the kill: the slot watching the child sees it die and
                # settles the run "executor crashed" (an attempt spent); the settler keeps
                # only this hand-back for a run so marked. A run that ended first (its
                # child_pid cleared under the lock) keeps its own outcome.
                back = Release("now", "interrupted")
                with self.ledger.lock:
                    if r.child_pid is None:
                        continue
                    r.handed_back = back
                    slot = self._slot_of(r)
                    slot.stopped = True
                killed.append(slot)
                try:
                    slot.kill()
                except Exception:  # (a bug: the other runs still go back)
                    log.exception("%s: the child running job %s could not be stopped; the job goes back "
                                  "once its lease lapses", self.q.name, r.job.id)
                    back = Release("later", "interrupted")
                    with self.ledger.lock:
                        r.handed_back = back
                self.outcomes.put(Settlement(r, back))
            else:
                self.outcomes.put(Settlement(r, Release("later", "interrupted")))
        # The jobs waiting behind a killed child's job are handed back by its slot, which
        # sees the child die: queued before the settler's last batch, not left to their
        # lease (it would bring them back "lost unstarted", their one unspent loss gone).
        deadline = time.monotonic() + HAND_BACK_S
        for slot in killed:
            if not slot.settled(max(0.0, deadline - time.monotonic())):
                log.warning("%s: the jobs waiting in a stopped child process were not handed back within %g s; "
                            "they come back when their lease lapses", self.q.name, HAND_BACK_S)
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
                    self.outcomes.put(Settlement(left, Release()))
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
        # Traced, the follow-up's enqueue span is the run's child (the handler's thread,
        # or for a child process the one relaying its call, is inside the run span).
        with tracing.enqueue_span(type_) as span:
            prep = self._client().prepare(Request(type_, payload, version=version, delay_s=delay,
                                                  idempotency_key=idempotency_key, priority=priority,
                                                  traceparent=tracing.current_traceparent()))
            self._check_key(prep.fn.queue, prep.job)
            with self.ledger.lock:
                job = prep.job._replace(id=followup_id(run.job.id, len(run.followups)))
                run.followups.append(Followup(prep.fn.queue, job))
            tracing.annotate(span, id=job.id, queue=prep.fn.queue)
        return Enqueued(id=job.id, type=prep.fn.name, version=job.version, queue=prep.fn.queue, status="pending")

    def _invoke(self, run: Run, child: str, type_: str, payload: Any, options: dict[str, Any]) -> str:
        """``ctx.invoke``: validate the child now and hold it on the run; the suspension
        writes it in its own step (suspend.lua). Its meta names its parent and the signal
        its end sends there (``invoked_by``): the lineage, both ways, with the parent's step."""
        with tracing.enqueue_span(type_) as span:
            prep = self._client().prepare(Request(
                type_, payload, version=options.get("version"), delay_s=options.get("delay"),
                idempotency_key=options.get("idempotency_key"), priority=options.get("priority"),
                traceparent=tracing.current_traceparent()))
            self._check_key(prep.fn.queue, prep.job)
            meta = codec.loads(prep.job.meta) if prep.job.meta else {}
            meta[durable.INVOKED_BY] = {"id": run.job.id, "signal": "child." + child.rsplit(".c", 1)[1]}
            job = prep.job._replace(id=child, meta=codec.dumps(meta))
            with self.ledger.lock:
                run.invoked = Followup(prep.fn.queue, job)
            tracing.annotate(span, id=child, queue=prep.fn.queue)
        return child

    def _still_held(self, run: Run) -> bool:
        """The lease looks lapsed here (no renewal landed for a lease's length: this worker
        was frozen, or its renewer late): renew it now, fenced by the claim token, which
        succeeds only while no other run took the job."""
        asked = time.monotonic()
        if not self.renew_one(run.job):
            return False
        run.flags.lease_until = asked + self.q.visibility_timeout_s
        return True

    def _collect(self, job: Claimed, child: str, signal: str) -> bool:
        """A parent due before its child's signal came looks for the child's end: when it
        has one, it is sent to the parent as the signal would have been (True)."""
        client = self._client()
        try:
            view = client.get(child).as_dict()
        except JobNotFound:
            return False
        body = durable.end_of(view)
        if body is None:
            return False
        with contextlib.suppress(SignalPending):  # (sent already: the wait reads it)
            client.deliver_signal(job.id, signal, body)
        return True

    def _listen(self, part: QueueKeys, job: Claimed, name: str, match: dict[str, Any], position: int,
                on: bool) -> int:
        """ctx.wait_for_event puts its waiter on the event's registry before the run
        suspends (on), and takes it off when the wait is over (client/waking.py)."""
        member = listeners.member(part.queue, part.tag, job.id, position)
        if on:
            return waking.listen(self._client(), name, match, member)
        waking.unlisten(self._client(), name, match, member)
        return 1

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
        return Slot(self.q, self.rt.config, self.grace_s)  # already gone: a no-op kill

    def abandon(self, run: Run) -> None:
        """Give up a thread run stuck TIMEOUT plus the grace past its deadline (see the
        module docstring): a new thread takes its slot, and its attempt fails as a
        timeout once the handler really returns (or at the stop), not before: until
        then its lease and limit slots stay held. Called by the renewer."""
        with self.ledger.lock:
            if run.abandoned or run.thread_id is None:  # (it returned just now)
                return
            run.abandoned = True
            index, began = run.slot, run.began
        fn = self.rt.registry.functions.get(run.job.type)
        exc = JobTimeout(f"abandoned: still running {self.grace_s:g} s past its TIMEOUT (in a C call, or "
                         'catching the timeout itself); ISOLATION = "process" kills such a handler')
        outcome = failure(fn, run.job, exc) if fn is not None else Dead("max attempts reached", describe(exc), False)
        self.abandoned += 1
        log.warning("job %s: abandoned %g s past its TIMEOUT (stuck in a C call, or catching the timeout); its "
                    "slot goes to a new thread, its resource stays held until the handler returns",
                    run.job.id, self.grace_s, extra={"job_id": run.job.id, "type": run.job.type})
        started_ms = began[1] if began is not None else 0
        with self.ledger.lock:
            run.verdict = Settlement(run, outcome, started_ms=started_ms, extra={"abandoned": True})
        self.ledger.returned(1, run.rider)
        if index is not None and not self.releasing.is_set():
            self._spawn(index)

    def _settle_abandoned(self, run: Run) -> None:
        """The abandoned run's handler returned: its verdict goes now, on record as run
        from its start to its real end."""
        verdict = self.ledger.verdict(run)
        if verdict is not None:
            began = run.began
            verdict.run_s = time.monotonic() - began[0] if began is not None else 0.0
            self.outcomes.put(verdict)

    def _admit(self, run: Run, index: int, registry: Registry | None = None) -> bool:
        """Take a run off the inbox for slot ``index``: False when it is not to run (taken
        by a cancel, the stop, a lost lease or its MAX_AGE), and has been seen to.
        ``registry``: the functions loaded now, when the caller has just read them."""
        if not self.ledger.take(run):
            self.ledger.returned()  # a cancel took it; its hand-back is on its way
            return False
        if self.releasing.is_set():
            self.outcomes.put(Settlement(run, Release()))
            self.ledger.returned()
            return False
        if not run.job.started and run.lost:
            # Claimed ahead and lost before it started (a cancel takes a prefetched
            # job's claim; the renewal said so): it is no longer this worker's to run.
            self.ledger.forget([run])
            self.ledger.returned()
            return False
        if faults.ARMED:
            faults.fault("exec_loop")
        run.slot = index
        if not run.job.started:
            late = self._expired_ahead(run, registry)
            if late is not None:  # claimed ahead in time, but not started in time
                self.outcomes.put(late)
                self.ledger.returned()
                return False
        return True

    def _loop(self, index: int) -> None:
        loop: asyncio.AbstractEventLoop | None = None
        carry: Run | None = None  # taken off the inbox while a batch was gathered: run next
        # Runs taken off the inbox while a BATCH function's batch gathered that could not
        # join it (another key, or another function's): run before the inbox's next.
        pending: collections.deque[Run] = collections.deque()
        known: dict[int, _Placed] = {}  # the pending runs' payloads, resolved once (by id of the run)
        try:
            while True:
                # The functions loaded now, read once per run (after the inbox's wait: a
                # reload meanwhile is the one the run sees), for every look-up below.
                if carry is not None:
                    run, carry = carry, None
                    registry = self.rt.registry
                elif pending:
                    run = pending.popleft()
                    registry = self.rt.registry
                else:
                    self._idle += 1  # (a hint for a gathering batch: someone takes what it puts back)
                    try:
                        got = self.inbox.get()
                    finally:
                        self._idle -= 1
                    if got is None:
                        return
                    registry = self.rt.registry
                    if not self._admit(got, index, registry):
                        continue
                    run = got
                bfn = registry.functions.get(run.job.type)
                if bfn is not None and bfn.batch is not None:
                    if loop is None and bfn.isolation != "process":
                        loop = asyncio.new_event_loop()
                    if not self._batch(run, index, pending, known, loop):
                        return  # the stop's sentinel came, or a new thread has this slot
                    # SystemExit or KeyboardInterrupt out of an async handle_batch escapes
                    # the loop and leaves the call's outer task pending on it: the next call
                    # on this loop would raise it again
                    if loop is not None and asyncio.all_tasks(loop):
                        _left_behind(loop, run.job.id)
                        loop = None
                    continue
                # (a thread function's run, most runs: no look for a child's batch)
                gathered = self._gather(run, index) if bfn is None or bfn.isolation == "process" else None
                if gathered is not None:
                    batch, carry, stop = gathered
                    carry = self._run_batch(batch, carry, index)
                    if stop:  # (the stop's sentinel came while gathering: this thread's)
                        if carry is not None:
                            self.outcomes.put(Settlement(carry, Release()))
                            self.ledger.returned()
                        return
                    continue
                self._busy[index] = True
                try:
                    if loop is None:
                        loop = asyncio.new_event_loop()
                    settlement = self._execute(run, index, loop, registry)
                except BaseException as exc:  # a late timeout, or a bug: never strand a claim
                    settlement = Settlement(run, _unexpected(run.job, exc))
                finally:
                    self._busy[index] = False
                if run.abandoned:
                    self._settle_abandoned(run)
                    return  # a new thread has this slot
                # Only after an async handler: asyncio.all_tasks walks a WeakSet, 15,000
                # instructions a job on this path (18 % more for a no-op job). (``bfn`` is
                # the function that ran: _execute_one looks it up in the same registry.)
                if loop is not None and bfn is not None and bfn.is_async and asyncio.all_tasks(loop):
                    _left_behind(loop, run.job.id)
                    loop = None  # the next async job gets a fresh loop
                self.outcomes.put(settlement)
                self.ledger.returned()
        finally:
            if loop is not None:
                loop.close()
            for left in pending:  # (this thread ends: runs it held for a later batch go back)
                self._settle_unrun(left, Release())

    # --- BATCH functions (batching.py) -------------------------------------------------

    def _settle_unrun(self, run: Run, outcome: Outcome | Release) -> None:
        """A run taken for a batch that ends without the call (its record cannot run, or it
        was cancelled before the call): settled on its own, as a single run would be."""
        if not isinstance(outcome, Release) and not run.job.started:
            self.outcomes.put(Settlement(run, START))
        self.outcomes.put(Settlement(run, outcome))
        self.ledger.returned(1, run.rider)

    def _gather_members(self, first: Run, index: int, pending: collections.deque[Run],
                        known: dict[int, _Placed]) -> tuple[Function | None, list[tuple[Run, dict[str, Any]]], bool]:
        """The batch ``first`` belongs to: runs of the same function (the same loaded file),
        their payloads upgraded to its newest version, with the same rendered key.

        While one executor gathers a batch, an executor that takes a run of that batch
        adds it there and goes on (one gathering per function and key, ``_gathering``): the
        batch fills from every executor's take, not one batch of a few per executor. The
        executor that opened it takes those it left over from its earlier batches, then
        runs from the inbox until the batch holds BATCH size or BATCH wait passed since
        ``first`` was taken. A run it takes that belongs elsewhere joins its own batch when
        one gathers, or goes back to the inbox for an idle executor; with none idle it is
        kept for later (``pending``, its payload resolved once: ``known``), and a run of
        another function then closes the batch early (it comes next, never waiting behind
        a batch). A run whose record cannot run is settled here. -> (the function, as
        loaded when ``first`` was taken; the members, none when ``first`` joined another
        executor's batch or was settled; whether the stop's sentinel came)."""
        registry, grace = self.rt.registry, self.rt.config.worker.unknown_grace_s

        def placed_of(run: Run) -> _Placed | None:
            """Its function, payload, key and when it was taken; None when settled here."""
            seen = known.pop(id(run), None)
            if seen is not None and registry.functions.get(run.job.type) is seen.fn:
                return seen
            got = resolve(run.job, registry, grace, self._server_now(run.job))
            if not isinstance(got, tuple):
                self._settle_unrun(run, got)
                return None
            return _Placed(got[0], got[1], batching.key_of(got[0], got[1]),
                           seen.taken if seen is not None else time.monotonic())

        first_at = placed_of(first)
        if first_at is None:
            return None, [], False
        fn, key = first_at.fn, first_at.key
        if fn.batch is None:  # reloaded without BATCH between the look and here: it runs alone next
            pending.appendleft(first)
            return None, [], False
        size, at = fn.batch.size, (id(fn), key)
        with self._lock:
            g = self._gathering.get(at)
            if g is not None and g.fn is fn and len(g.members) < size:
                g.members.append((first, first_at.payload))
                self.ledger.rode(first)  # (this executor goes back to the inbox: free for a claim)
                return None, [], False
            g = self._gathering[at] = _Gathering(fn, [(first, first_at.payload)])

        # Runs this gathering put back for an idle executor. One that comes back to it is
        # kept: an idle executor's wake-up can lose the race for the inbox to this thread,
        # which would otherwise take and put back the same run until its deadline, and
        # past it for ever (its reads at the deadline do not wait).
        bounced: set[int] = set()

        def elsewhere(run: Run, placed: _Placed | None) -> bool:
            """A run not of this batch: into its own batch gathering now, or back to the
            inbox for an idle executor (True); False: none takes it now."""
            if placed is not None and placed.fn.batch is not None:
                with self._lock:
                    other = self._gathering.get((id(placed.fn), placed.key))
                    if other is not None and other.fn is placed.fn and len(other.members) < placed.fn.batch.size:
                        other.members.append((run, placed.payload))
                        self.ledger.rode(run)
                        return True
            if self._idle > 0 and not self.releasing.is_set() and id(run) not in bounced:
                bounced.add(id(run))
                self.ledger.put_back(run)
                self.inbox.put(run)
                return True
            if placed is not None:
                known[id(run)] = placed
            return False

        stop = False
        try:
            for run in list(pending):
                if len(g.members) >= size:
                    break
                if run.job.type != fn.name:
                    continue
                placed = placed_of(run)
                if placed is None:
                    pending.remove(run)
                elif placed.fn is fn and placed.key == key:
                    with self._lock:
                        g.members.append((run, placed.payload))
                        self.ledger.rode(run)
                    pending.remove(run)
                else:
                    known[id(run)] = placed
            deadline = first_at.taken + fn.batch.wait_s
            while len(g.members) < size:  # (read unlocked: a hint; members join under the lock)
                remaining = deadline - time.monotonic()
                try:
                    # In slices: other executors may fill the batch meanwhile.
                    nxt = self.inbox.get(timeout=min(remaining, GATHER_LOOK_S)) if remaining > 0 \
                        else self.inbox.get_nowait()
                except stdqueue.Empty:
                    if remaining <= 0:
                        break
                    continue
                if nxt is None:
                    stop = True
                    break
                if not self._admit(nxt, index):
                    continue
                if nxt.job.type != fn.name:
                    if not elsewhere(nxt, None):
                        pending.append(nxt)
                        break
                    continue
                placed = placed_of(nxt)
                if placed is None:
                    continue
                if placed.fn is fn and placed.key == key:
                    with self._lock:
                        if len(g.members) < size:
                            g.members.append((nxt, placed.payload))
                            self.ledger.rode(nxt)
                            continue
                if not elsewhere(nxt, placed):
                    pending.append(nxt)
        finally:
            with self._lock:
                if self._gathering.get(at) is g:
                    del self._gathering[at]
                members = list(g.members)
        return fn, members, stop

    def _batch(self, first: Run, index: int, pending: collections.deque[Run], known: dict[int, _Placed],
               loop: asyncio.AbstractEventLoop | None) -> bool:
        """Gather and run one batch in slot ``index``; False when this thread is to end
        (the stop's sentinel came, or its handler was abandoned past TIMEOUT)."""
        fn, members, stop = self._gather_members(first, index, pending, known)
        if stop or self.releasing.is_set():
            for run in [m[0] for m in members] + list(pending):
                self._settle_unrun(run, Release())
            pending.clear()
            known.clear()
            return False
        live: list[tuple[Run, dict[str, Any]]] = []
        for run, payload in members:
            if run.flags.cancelled:  # asked to stop before the call: left out, never run
                self._settle_unrun(run, Dead(reason=CANCELLED, error={
                    "type": "Cancelled", "message": "cancelled before its batch's call started"}, refund=False))
            else:
                live.append((run, payload))
        if not live or fn is None:
            return True
        self._busy[index] = True
        traced = tracing.batch_span(fn.name, self.q.name, [(r.job.id, r.job.traceparent) for r, _ in live])
        try:
            with traced as span:
                if span is not None:  # each member's settle span hangs under the batch's
                    for r, _ in live:
                        r.trace = tracing.context_of(span)
                return self._batch_in_span(fn, live, index, pending, known, loop)
        finally:
            self._busy[index] = False

    def _batch_in_span(self, fn: Function, live: list[tuple[Run, dict[str, Any]]], index: int,
                       pending: collections.deque[Run], known: dict[int, _Placed],
                       loop: asyncio.AbstractEventLoop | None) -> bool:
        """The batch's call, in this thread or in the slot's child (see _batch)."""
        if fn.isolation == "process":
            self._batch_in_child(fn, live, index)
            return True
        if self._batch_in_thread(fn, live, loop):
            for run in pending:
                self._settle_unrun(run, Release())
            pending.clear()
            known.clear()
            return False
        return True

    def _holds_executor(self, runs: list[Run]) -> None:
        """A batch's call takes one executor: held by its first member when every member
        rides (the run that held it left before the call: cancelled, or its lease lost in
        the wait), or the fetcher would count this executor free while the call runs."""
        if all(r.rider for r in runs):
            self.ledger.rode(runs[0], rides=False)

    def _batch_context(self, fn: Function, runs: list[Run]) -> batching.BatchContext:
        """Each member's lines go to its own job's log (its run's, sent as a single job's
        are: with the renewal while it runs and with its settlement), the batch's to all."""
        claimed = [r.job for r in runs]

        def made(i: int, logger: JobLogger) -> None:
            runs[i].logs = logger  # (the renewal and the settlement send its lines from here on)

        # A member's logger is made at its first line; one with lines kept already (its
        # run's) goes on, and the batch's lines go to it.
        members, shared = batch_loggers(joblog, fn.name, [(j.id, j.attempt) for j in claimed], self._log_bounds,
                                        kept=[r.logs for r in runs], on_made=made)
        return batching.BatchContext(fn.name, fn.versions.newest, self.q.name,
                                     lambda: batching.jobs_of(claimed, [r.flags for r in runs], members),
                                     fn.timeout_s, shared, extend=lambda: all([self.renew_one(j) for j in claimed]))

    def _started_now(self, live: list[tuple[Run, dict[str, Any]]]) -> list[tuple[Run, dict[str, Any]]]:
        """A thread batch's members start now, in this thread: each held claim's wait ends
        and its attempt counts from here, in one start.lua call per partition (a call per
        batch, where a hand-off and then a start mark per member cost two, and a settlement
        each). The members whose leases were lost in the wait go back unrun, and the call
        goes on without them; a cancel that came in the wait reaches the handler. Redis
        away: they go all the same, and their start marks go with the settler's next batch,
        as a single run's do."""
        todo = [r for r, _ in live if not r.job.started]
        if not todo:
            return live
        refused: set[int] = set()
        for r, code in zip(todo, self._start_members(todo), strict=True):
            if code is None:
                continue
            if code < 0:
                refused.add(id(r))
                continue
            if code == 2 and not r.flags.cancelled:  # a cancel in the wait: the handler hears it
                r.flags.cancelled = True
                r.cancelled_at = time.monotonic()
        for r, _ in live:
            if id(r) in refused:
                self._settle_unrun(r, Release())
        return [m for m in live if id(m[0]) not in refused]

    def _batch_in_thread(self, fn: Function, live: list[tuple[Run, dict[str, Any]]],
                         loop: asyncio.AbstractEventLoop | None) -> bool:
        """One handle_batch call in this thread, each member settled with its own outcome.
        TIMEOUT bounds the call: the renewer times the first member (every member's
        thread is this one), and raises JobTimeout here past it. True when the call was
        abandoned (stuck past TIMEOUT plus the grace: a new thread has the slot)."""
        live = self._started_now(live)
        if not live:
            return False
        runs = [r for r, _ in live]
        self._holds_executor(runs)
        leader = runs[0]
        started_ms = self._server_now(leader.job)
        ctx = self._batch_context(fn, runs)

        def guard(body: Callable[[], Any]) -> Any:
            with self.ledger.lock:
                now, tid = time.monotonic(), threading.get_ident()
                for r in runs:
                    r.thread_id = tid
                    r.began = (now, started_ms)
                leader.deadline = deadline = now + fn.timeout_s
            self.expect(deadline)
            try:
                fault("mid_handler")
                return body()
            finally:
                with self.ledger.lock:
                    for r in runs:
                        r.thread_id = None
                        r.deadline = None
                    raised = leader.timed_out
                    self.ledger.thread_return = time.monotonic()
                if raised:  # (as _execute_one: a late timeout must not land in this loop)
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(threading.get_ident()), None)

        outcomes, run_s = batching.run(fn, [p for _, p in live], [r.job for r in runs], ctx, loop, guard,
                                       self.rt.config.worker.max_result_bytes)
        fault("after_handler")
        if leader.abandoned:
            self._settle_abandoned(leader)
            exc = JobTimeout(f"abandoned: its batch ran {self.grace_s:g} s past its TIMEOUT")
            for r in runs[1:]:
                self.outcomes.put(Settlement(r, failure(fn, r.job, exc), run_s, started_ms))
                self.ledger.returned(1, r.rider)
            return True
        for r, o in zip(runs, outcomes, strict=True):
            self.outcomes.put(Settlement(r, o, run_s, started_ms))
        self.ledger.returned(len(runs), sum(r.rider for r in runs))
        return False

    def _batch_in_child(self, fn: Function, live: list[tuple[Run, dict[str, Any]]], index: int) -> None:
        """One handle_batch call in slot ``index``'s child: the batch goes in one message,
        the items' outcomes come back in one (child.py). Past TIMEOUT plus the grace the
        child is killed and every member fails as a timeout; a child that dies fails every
        member as an executor crash. The members' flags reach the call's ctx as they change
        (a cancel: ctx.jobs[i].cancelled; a lease lost with its CONCURRENCY slot:
        ctx.lock_lost), and a call whose members' slots went with their leases is killed
        the grace later, as a single job's (slot._Watch)."""
        runs = [r for r, _ in live]
        self._holds_executor(runs)
        slot, generation = self._slots[index], self._generations.of(self.rt.registry)
        try:
            child = slot.child
            if child is None or child.generation != generation or not child.alive() or not child.poll_ready():
                # Seconds of imports: every member's claim is held in the wait (those
                # claimed ahead are already), so a worker killed there charges none.
                self._hold_all(runs)
                try:
                    slot.warm(generation)
                except Superseded:  # reloaded twice since the batch was taken: back, for the code of now
                    for r in runs:
                        self._settle_unrun(r, Release())
                    return
                child = slot.child
                assert child is not None
                if not child.wait_ready(stop=self.releasing.is_set):
                    for r in runs:
                        self._settle_unrun(r, Release())
                    return
        except (ExecutorCrashed, OSError) as exc:
            slot.kill()
            log.warning("%s: a child process was lost before its batch started (%s); the batch goes back "
                        "unspent", self.q.name, exc)
            for r in runs:
                self._settle_unrun(r, Release())
            return
        # The members stay held (no attempt spent should this worker die) until the child
        # says handle_batch starts ("began"), as a single job's claim waits for its start.
        leader = runs[0]
        started_ms = self._server_now(leader.job)
        t0 = time.monotonic()
        with self.ledger.lock:
            for r in runs:
                r.child_pid = child.pid
                r.began = (t0, started_ms)
        deadline = t0 + fn.timeout_s + self.grace_s
        outcomes: list[Outcome] | None = None
        run_s = 0.0
        began = False
        told: dict[str, tuple[bool, bool, float]] = {}  # the flags each member's child was told last
        lost_seen = 0.0  # when a member's lease was first seen lost with its slot (0: not yet)
        try:
            child.send({"op": "batch", "jobs": [r.job.as_row() for r in runs], **self._extra(leader.job)})
            fault("mid_handler")
            while outcomes is None:
                while (msg := child.channel.next()) is not None:
                    op = msg.get("op")
                    if op == "batch_outcomes":
                        outcomes = [from_message(m) for m in msg["outcomes"]]
                        run_s = float(msg.get("run_s") or 0.0)
                        if len(outcomes) != len(runs):
                            raise ValueError(f"{len(outcomes)} outcomes for a batch of {len(runs)}")
                        self._keep_batch_logs(runs, msg.get("logs") or [], msg.get("logs_dropped") or [])
                        child.jobs += len(runs)
                        if msg.get("reuse") is False:
                            log.info("replacing the child process %d: %s", child.pid, msg.get("why") or "")
                            slot.kill()
                        else:
                            slot.recycle(child, generation)
                        break
                    if op == "began":
                        began = True
                        self._child_batch_began(runs)
                        continue
                    if op == "rpc":  # ctx.extend_lease renews every member's; no other call is a batch's
                        ok = msg.get("call") == "extend" and msg.get("token") == leader.job.token \
                            and all([self.renew_one(r.job) for r in runs])
                        child.send({"op": "reply", "rid": msg.get("rid"), "ok": ok, "value": None})
                if outcomes is not None:
                    break
                now = time.monotonic()
                if now >= deadline:
                    slot.kill()
                    late = JobTimeout(f"ran past TIMEOUT {fn.timeout_s:g} s; its child process was killed "
                                      f"{self.grace_s:g} s later")
                    outcomes, run_s = [failure(fn, r.job, late) for r in runs], now - t0
                    break
                if any(r.lost and r.flags.lock_lost for r in runs):
                    # A member's lease was reclaimed and its CONCURRENCY slot released with
                    # it: another job of the limit, or the member's own retry, may run now.
                    # The call sees ctx.lock_lost (told below); one that does not stop
                    # within the grace is killed rather than run on beside them.
                    lost_seen = lost_seen or now
                    if now - lost_seen > self.grace_s:
                        log.warning("a batch of %d job(s) of %s: their leases and concurrency slots were lost; its "
                                    "child process %d is killed", len(runs), fn.name, child.pid)
                        slot.kill()
                        lost = StaleLease(f"lease lost (reclaimed elsewhere) while its batch's call ran; its child "
                                          f"process was killed {self.grace_s:g} s later")
                        outcomes, run_s = [failure(fn, r.job, lost) for r in runs], now - t0
                        break
                for r in runs:
                    flags = (r.flags.lock_lost, r.flags.cancelled, r.flags.lease_until)
                    if flags != told.get(r.job.token, (False, False, 0.0)):
                        told[r.job.token] = flags
                        child.send({"op": "flag", "token": r.job.token, "lock_lost": flags[0],
                                    "cancelled": flags[1], "lease_until": flags[2]})
                seen = child.wait(min(0.1, deadline - now))
                if seen == EXITED:
                    raise EOFError
                if seen:
                    child.channel.fill()
        except (EOFError, OSError, ValueError, KeyError) as exc:
            slot.child = None
            if isinstance(exc, ValueError | KeyError):
                log.error("the child process %d sent a batch answer runner cannot read (%s); it is killed",
                          child.pid, exc)
                child.kill()
                code = child.proc.wait()
            else:
                code = child.end()
            crash = ExecutorCrashed(f"executor crashed: the child process running the batch {describe_exit(code)}")
            outcomes, run_s = [failure(fn, r.job, crash) for r in runs], time.monotonic() - t0
        finally:
            with self.ledger.lock:
                for r in runs:
                    r.child_pid = None
        fault("after_handler")
        if not began:  # (outcomes with no call: a child that died or timed out first, none runnable)
            for r in runs:
                if not r.job.started:
                    self.outcomes.put(Settlement(r, START))
        for r, o in zip(runs, outcomes, strict=True):
            self.outcomes.put(Settlement(r, o, run_s, started_ms))
            self.ledger.returned(1, r.rider)

    def _child_batch_began(self, runs: list[Run]) -> None:
        """The child says handle_batch starts: its members' held claims end and their
        attempts count from here, in one start.lua call per partition (as a thread batch's
        do). A worker lost between the send and the call charges none. A member whose
        lease was lost in the wait is refused here and at its settlement alike; Redis away,
        the start marks go with the settler's next batch."""
        todo = [r for r in runs if not r.job.started]
        if todo:
            self._start_members(todo)

    def _start_members(self, todo: list[Run]) -> list[int | None]:
        """Mark a batch's members started, one start.lua call per partition: each one's
        code (started when not below 0: its held claim ended, its attempt counts), or None
        when Redis did not answer (its start mark then goes with the settler's next batch)."""
        sc = self.rt.scripts
        try:
            codes = self._per_partition(todo, lambda k, owned, into: sc.start(k, owned, pipe=into))
        except Exception as exc:
            log.warning("%d job(s): could not mark the start of their batch's call: %s", len(todo), exc)
            codes = [exc] * len(todo)
        out: list[int | None] = []
        for r, code in zip(todo, codes, strict=True):
            if isinstance(code, BaseException):
                self.outcomes.put(Settlement(r, START))  # (marked later: the settler retries it)
                out.append(None)
                continue
            r.held = False
            if code >= 0:
                r.job.started = True
            out.append(int(code))
        return out

    def _expired_ahead(self, run: Run, registry: Registry | None = None) -> Settlement | None:
        """A job claimed ahead whose MAX_AGE passed while it waited for an executor: dead
        as "expired", unrun and spending no attempt, as claim.lua buries one claimed late."""
        job = run.job
        fn = (self.rt.registry if registry is None else registry).functions.get(job.type)
        if fn is None or not fn.max_age_s or run.resumed:  # (MAX_AGE bounds the first start only)
            return None
        now = self._server_now(job)
        if now - job.created_ms <= fn.max_age_s * 1000:
            return None
        return Settlement(run, expired(job, fn.max_age_s, now), started_ms=now)

    def _execute(self, run: Run, index: int, loop: asyncio.AbstractEventLoop, registry: Registry) -> Settlement:
        if not tracing.enabled():
            return self._execute_one(run, index, loop, registry)
        job = run.job
        with tracing.run_span(job.traceparent, job.id, job.type, job.attempt, job.queue, job.ready_ms,
                              tracecontext.links(job.meta_raw)) as span:
            settlement = self._execute_one(run, index, loop, registry)
            o = as_asked(settlement.outcome, run.flags.cancelled)  # as the settler will record it
            name = "done" if isinstance(o, Done) else "retry" if isinstance(o, RetryLater) else \
                "cancelled" if isinstance(o, Dead) and o.reason == CANCELLED else "dead"  # asked for: no failure
            tracing.outcome(span, name, getattr(o, "error", None))
            run.trace = tracing.context_of(span)
            return settlement

    def _record_step(self, part: QueueKeys, run: Run, position: int, body: str) -> tuple[int, int]:
        """A durable step's entry, recorded fenced by the job's claim (step.lua). The lines
        and chunks the run wrote before it are written first: a replay past this step
        writes none again (journal.py), so they must be in Redis before it is recorded (a
        kill between the two writes shows them twice, never lost). The run's progress
        goes with its lines, or with none pending, in the step's own call: whoever sees
        the step sees the progress reported before it (no round trip of its own)."""
        job = run.job
        send_logs(self.rt, part, [run], wait=True, log_label=self.q.name)
        progress, run.progress = run.progress, ""  # (most steps: none)
        try:
            code, n = self.rt.scripts.step(part, job.id, job.token, position, body, journal.MAX_STEPS,
                                           journal.MAX_LOG_BYTES, stats=f"steps|{job.type}", progress=progress)
        except BaseException:
            run.progress = run.progress or progress  # not written: the next renewal takes it
            raise
        return int(code), int(n)

    def _take_signal(self, part: QueueKeys, job: Claimed, position: int, name: str, head: str,
                     until: int | None) -> tuple[int, str]:
        """A wait reads its signal, fenced by the job's claim (wait.lua)."""
        code, body = self.rt.scripts.take_signal(part, job.id, job.token, position, name, head, until,
                                                 journal.MAX_STEPS, journal.MAX_LOG_BYTES)
        return int(code), str(body or "")

    def _execute_one(self, run: Run, index: int, loop: asyncio.AbstractEventLoop, registry: Registry) -> Settlement:
        """Run ``run`` with the functions of ``registry``, the loop's one snapshot for the
        run: a reload never changes it mid-run."""
        job = run.job
        config = self.rt.config
        grace = config.worker.unknown_grace_s
        fn = registry.functions.get(job.type)
        if fn is not None and fn.isolation == "process":
            return self._in_child(run, fn, index, self._generations.of(registry), grace)
        if not job.started:  # claimed ahead: its attempt counts from here (a child's: _in_child)
            refused = self._start_one(run)
            if refused is not None:
                return refused
        started_ms = self._server_now(job)  # (resolving takes microseconds: the same clock)
        resolved = resolve(job, registry, grace, started_ms)
        if not isinstance(resolved, tuple):  # an outcome: Done, RetryLater or Dead
            return Settlement(run, resolved)
        fn, payload, version = resolved
        max_result = config.worker.max_result_bytes
        hooks = _ThreadHooks(self, run, self.parts[job.partition], threading.get_ident(), fn.timeout_s, started_ms)
        ctx = for_job(job, version, fn.timeout_s, hooks, run.flags, max_result)
        if job.steps > 0:  # a replay: ctx.logger, whenever made, stays quiet through it
            ctx._durable()
        outcome, run_s = run_handler(fn, payload, job, ctx, loop, hooks.guard, max_result)
        fault("after_handler")
        return Settlement(run, outcome, run_s, started_ms)

    def _start_one(self, run: Run) -> Settlement | None:
        """A job claimed ahead starts in this thread. A first claim ahead is not held: its
        start mark goes with the settler's next batch (with its ack, often, for nothing),
        and a loss before it lands gives the job back once (reclaim.lua). A job lost
        unstarted before is held from its claim (claim.lua): its hold ends and its attempt
        counts in a start.lua call that lands before its handler runs, so a worker lost
        while it waited in its inbox charges it nothing however often (no handler of it
        ran), and one lost from here on charges it (a handler that kills its worker cannot
        loop). Returns the settlement of a run not to start: its lease was lost in the
        wait (it goes back unrun). Redis away: it starts all the same, its mark going with
        the settler's next batch (as a thread batch's do); unless its lease looks lapsed."""
        if self._lapsed(run):
            refused = self._confirmed(run)
            if refused is not None:
                return refused
        if not run.held:
            self.outcomes.put(Settlement(run, START))
            return None
        code = self._marked(run)
        if code is not None and code < 0:
            return Settlement(run, Release())
        if code == 2 and not run.flags.cancelled:  # a cancel in the wait: the handler hears it
            run.flags.cancelled = True
            run.cancelled_at = time.monotonic()
        return None

    def _lapsed(self, run: Run) -> bool:
        """Whether ``run``'s lease has lapsed, or is about to, by this host's clock: the
        last renewal's (counted from before its call), or else the claim's. A worker frozen
        (SIGSTOP, a paused VM) or starved past the lease takes a job claimed ahead off its
        inbox as it wakes, before the renewal that says the lease was lost has landed."""
        until = run.flags.lease_until or run.job.received + self.q.visibility_timeout_s
        return until - LAPSE_MARGIN_S <= time.monotonic()

    def _confirmed(self, run: Run) -> Settlement | None:
        """A job claimed ahead whose lease lapsed in its wait starts only once Redis renews
        it, fenced by its claim token and taking its RESOURCE_KEY or CONCURRENCY slots
        again (renew.lua): after a freeze past the lease another worker may have reclaimed
        and run it, and another job may hold its key. Otherwise (or Redis away, when
        nothing says it is still this worker's) it goes back unrun: the settlement returned.
        It started at the thaw, before the renewal marked it lost: a second run of a job
        finished elsewhere, with ctx.lock_lost False, or a run beside its key's holder."""
        job = run.job
        try:
            if self._still_held(run):
                return None
            why = "it was reclaimed, or its resource or concurrency slot went to another job"
        except Exception as exc:
            why = f"Redis did not answer to renew it ({exc})"
        log.warning("job %s: claimed ahead, and its lease lapsed before it started (this worker was stopped or "
                    "starved past it); %s: handed back, not started here", job.id, why, extra={"job_id": job.id})
        return Settlement(run, Release())

    def _marked(self, run: Run) -> int | None:
        """``run``'s start mark, landed (start.lua's code; None: Redis did not answer, and
        the mark goes with the settler's next batch). Executors that start jobs claimed
        ahead at the same time share one call (per partition): the first to come sends
        the marks of every run waiting then, and the next waiting one sends those that
        came meanwhile, so a drain costs a call per group of starts, not one per job."""
        mark = _Mark(run)
        with self._marks:
            self._marking.append(mark)
            while not mark.done and self._mark_sent:
                self._marks.wait()
            if mark.done:
                return mark.code
            self._mark_sent = True
            batch, self._marking = self._marking, []
        codes: list[int | None] = [None] * len(batch)
        try:
            codes = self._start_members([m.run for m in batch])
        finally:
            with self._marks:
                for m, code in zip(batch, codes, strict=True):
                    m.code, m.done = code, True
                self._mark_sent = False
                self._marks.notify_all()
        return mark.code

    @staticmethod
    def _logger_made(run: Run, ctx: Context, logger: JobLogger) -> None:
        """A thread run's ctx.logger, made at its first use: the renewal and the
        settlement send its lines from here on."""
        if ctx._journal is not None and ctx._journal.replay_to > 0:
            logger.replaying = ctx._journal.replaying
        run.logs = logger

    def _hold_all(self, runs: Sequence[Run]) -> None:
        """Hold the claims of these runs while they wait for a child to start (hold.lua),
        one script call per partition, in one round trip; one whose attempt was spent at
        its claim is left as it is. Redis away: they wait as they were claimed."""
        todo = [r for r in runs if not r.held and not r.job.started]
        if not todo:
            return
        try:
            codes = self._hold_calls(todo, off=False)
        except Exception as exc:
            log.warning("%d job(s): could not mark their claims as waiting for a child process: %s", len(todo), exc)
            return
        for r, code in zip(todo, codes, strict=True):
            r.held = not isinstance(code, BaseException) and code == 1

    def _hold_calls(self, runs: Sequence[Run], off: bool) -> list[int | BaseException]:
        """hold.lua over ``runs`` (see _per_partition)."""
        sc = self.rt.scripts
        return self._per_partition(runs, lambda k, owned, into: sc.hold(k, owned, off=off, pipe=into))

    def _per_partition(self, runs: Sequence[Run], call: Callable[[Any, list[tuple[str, str]], Any], Any]
                       ) -> list[int | BaseException]:
        """A script over many claims (hold.lua, start.lua): one call per partition (a
        batch's members go in one), all in one round trip -> each run's code, in order (an
        exception for the runs of a call that failed)."""
        by_part: dict[int, list[int]] = {}
        for i, r in enumerate(runs):
            by_part.setdefault(r.job.partition, []).append(i)
        sc = self.rt.scripts
        pipe = sc.batch()
        for p, idx in by_part.items():
            call(self.parts[p], [(runs[i].job.id, runs[i].job.token) for i in idx], pipe)
        replies = pipe.execute(raise_on_error=False)
        out: list[int | BaseException] = [0] * len(runs)
        for idx, reply in zip(by_part.values(), replies, strict=True):
            for j, i in enumerate(idx):
                out[i] = reply if isinstance(reply, BaseException) else int(reply[j])
        return out

    def hand_off(self, runs: Sequence[Run]) -> list[bool]:
        """These runs go to a child now: each held claim's wait ends in Redis first (one
        script call per partition, in one round trip for them all, hold.lua), so from here
        a lapse before its start mark gives it back unspent once only, and a handler that
        kills its worker cannot loop for ever. A run lost unstarted before (``confirm``)
        stays held: its child asks for its start before its handler runs (rpc "start"),
        so it is never charged while it waits in the child's queue behind another job,
        whatever kills the worker, however often. Per run, False: its lease was lost in the
        wait, it goes back instead. Redis away: they go all the same, still held, and
        their start marks end that."""
        waiting = [r for r in runs if r.held and not r.confirm]
        if not waiting:
            return [True] * len(runs)
        try:
            codes = self._hold_calls(waiting, off=True)
        except Exception as exc:
            log.warning("%d job(s): could not mark the end of their wait for a child process: %s", len(waiting), exc)
            return [True] * len(runs)
        refused: set[int] = set()
        for r, code in zip(waiting, codes, strict=True):
            if isinstance(code, BaseException):
                log.warning("job %s: could not mark the end of its wait for its child process: %s", r.job.id, code)
                continue
            r.held = False
            if code < 0:
                refused.add(id(r))
            elif code == 2 and not r.flags.cancelled:  # a cancel just now: the handler hears it
                r.flags.cancelled = True
                r.cancelled_at = time.monotonic()
        return [id(r) not in refused for r in runs]

    def charge_later(self) -> str:
        """The queue's functions whose claims spend no attempt, not even for a job that
        starts at once, "<type> ...": those that run in a child process, whose child says
        when its handler starts (slot.py), which is when the attempt counts, whatever else
        the queue runs. (A child's first job waited after its claim for the child to
        validate the payload and build its context: a second on a fresh child, where a
        worker killed in between charged "worker lost" to a job whose handler never ran.)
        A thread function's job spends its attempt at the claim."""
        reg = self.rt.registry
        if self._later[0] is not reg:
            self._later = (reg, " ".join(sorted(f.name for f in reg.for_queue(self.q.name)
                                                if f.isolation == "process")))
        return self._later[1]

    def hold_claimed(self) -> str:
        """The queue's BATCH functions, "<type> ...": their jobs are held from their claim
        (claim.lua, hold.lua) until their batch's call, which they wait for while the batch
        fills, so a worker lost before it charges them nothing, however often. One without
        a key comes as "<type>=<size>": that many of its jobs run in one free executor's
        call, so a claim takes up to that many under a limit per free executor (one each
        otherwise: a job under limits is claimed only for a free executor)."""
        reg = self.rt.registry
        if self._gathered[0] is not reg:
            self._gathered = (reg, " ".join(sorted(
                f.name if f.batch.key is not None else f"{f.name}={f.batch.size}"
                for f in reg.for_queue(self.q.name) if f.batch is not None)))
        return self._gathered[1]

    def _process_only(self) -> bool:
        """Every function of the queue runs in a child process (see startable)."""
        reg = self.rt.registry
        if self._only[0] is not reg:
            fns = reg.for_queue(self.q.name)
            self._only = (reg, bool(fns) and all(f.isolation == "process" for f in fns))
        return self._only[1]

    def _gather(self, run: Run, index: int) -> tuple[list[_ChildRun], Run | None, bool] | None:
        """A run of a process-isolated function, with the runs claimed ahead that go to its
        child in the same message (slot.py): (the batch, a run taken off the inbox that
        cannot join it and runs next, whether the stop's sentinel came). None for a run
        that is not a child's, and under tracing (a run span is one job's)."""
        registry = self.rt.registry
        fn = registry.functions.get(run.job.type)
        if fn is None or fn.isolation != "process" or tracing.enabled():
            return None
        batch = [_ChildRun(self, run, fn)]
        room = 1
        waiting = self.ledger.waiting
        if waiting > 0 and self._process_only():
            # At most a fair share of what waits among this slot and those idle now (a busy
            # one gathers its own when its batch ends, by when the fetcher has claimed more).
            idle = max(0, self.q.concurrency - self._busy.count(True) - 1)
            room = min(self._slots[index].room(fn, self._generations.of(registry)), 1 + -(-waiting // (1 + idle)))
        while len(batch) < room:
            try:
                nxt = self.inbox.get_nowait()
            except stdqueue.Empty:
                break
            if nxt is None:
                return batch, None, True
            if not self._admit(nxt, index):
                continue
            nfn = registry.functions.get(nxt.job.type)
            if nfn is None or nfn.isolation != "process" or nfn.batch is not None \
                    or (nxt.job.started and batch[0].run.job.started):
                # Not a child's, or a second run whose attempt was spent at its claim: only a
                # batch's first job may have spent it (one waiting in a child must not).
                return batch, nxt, False
            if nxt.job.started:  # claimed to start at once: it goes first
                batch.insert(0, _ChildRun(self, nxt, nfn))
            else:
                batch.append(_ChildRun(self, nxt, nfn))
        return batch, None, False

    def _starving(self) -> bool:
        """Another executor has nothing to run (none waits for one): jobs waiting behind a
        slow one in a child would run sooner handed back (a hint, read unlocked)."""
        return self.ledger.waiting == 0 and self._busy.count(True) < self.q.concurrency

    def _keep_batch_logs(self, runs: list[Run], logs: list[Any], dropped: list[Any]) -> None:
        """Each member's lines from its child (already bounded there; ``dropped``: how many
        each lost there, which its marker counts), for its settlement."""
        for i, (r, lines) in enumerate(zip(runs, logs, strict=False)):
            lost = _count(dropped[i]) if i < len(dropped) else 0
            if lines or lost:
                if r.logs is None:
                    r.logs = JobLogger(joblog, {}, *self._log_bounds)
                r.logs.keep((str(x) for x in lines or ()), lost)

    def _extra(self, job: Claimed) -> dict[str, Any]:
        """What a child needs besides a batch's jobs."""
        return {"unknown_grace_s": self.rt.config.worker.unknown_grace_s, "now_ms": self._server_now(job),
                "max_result_bytes": self.rt.config.worker.max_result_bytes,
                "max_step_bytes": self.rt.config.worker.max_step_bytes, "lease_s": self.q.visibility_timeout_s,
                "log_bounds": self._log_bounds, "skew_ms": skew_ms()}

    @property
    def _log_bounds(self) -> tuple[int, int]:
        r = self.rt.config.retention
        return r.log_lines, r.log_bytes

    def _run_batch(self, batch: list[_ChildRun], carry: Run | None, index: int) -> Run | None:
        """Run a batch in slot ``index``'s child, each run settled as it ends; the carried
        run, unless the batch handed it back (a recall: it would wait behind a slow job)."""

        generation = self._generations.of(self.rt.registry)

        def recalled() -> None:
            nonlocal carry
            if carry is not None:
                self.outcomes.put(Settlement(carry, Release()))
                self.ledger.returned()
                carry = None

        def more(n: int) -> list[_ChildRun]:
            """Up to ``n`` more runs claimed ahead for the child's queue (a fair share of
            what waits, as _gather takes); none once a run that cannot join is carried, or
            the functions were reloaded."""
            nonlocal carry
            waiting = self.ledger.waiting
            if carry is not None or waiting <= 0 or self.releasing.is_set() \
                    or self._generations.of(self.rt.registry) != generation:
                return []
            n = min(n, -(-waiting // (1 + max(0, self.q.concurrency - self._busy.count(True)))))
            registry = self.rt.registry
            out: list[_ChildRun] = []
            while len(out) < n:
                try:
                    nxt = self.inbox.get_nowait()
                except stdqueue.Empty:
                    break
                if nxt is None:  # the stop's sentinel: back for this thread's loop to find
                    self.inbox.put(None)
                    break
                if not self._admit(nxt, index):
                    continue
                fn = registry.functions.get(nxt.job.type)
                if fn is None or fn.isolation != "process" or fn.batch is not None or nxt.job.started:
                    carry = nxt  # (only a batch's first may have spent its attempt at the claim)
                    break
                out.append(_ChildRun(self, nxt, fn))
            batch.extend(out)  # (settled with the batch should anything go wrong)
            return out

        self._busy[index] = True
        try:
            self._slots[index].run(batch, generation, self._extra(batch[0].job), self.releasing.is_set,
                                   self._starving, recalled, more)
        except BaseException as exc:  # a bug: never strand a claim, nor leave a child running it
            with contextlib.suppress(Exception):
                self._slots[index].kill()
            for cr in batch:
                if cr.settlement is None:
                    cr.finish(_unexpected(cr.job, exc) if cr.began else Release(), 0.0)
        finally:
            self._busy[index] = False
        return carry

    def _in_child(self, run: Run, fn: Function, index: int, generation: int, grace: float) -> Settlement:
        """One run in slot ``index``'s child, its settlement returned (a traced run: the
        child makes the run's span current around the handler, tracing.within)."""
        cr = _ChildRun(self, run, fn, direct=False)
        extra = {**self._extra(run.job), "traceparent": tracing.current_traceparent()}
        self._slots[index].run([cr], generation, extra, self.releasing.is_set)
        assert cr.settlement is not None
        return cr.settlement

    @staticmethod
    def _server_now(job: Claimed) -> int:
        """The server's clock now, from the claim's server time and the time since (this
        host's clock may be off; its monotonic clock measures the interval well)."""
        return job.claimed_ms + int((time.monotonic() - job.received) * 1000)


class _ThreadHooks(Hooks):
    """A thread run's ctx calls (context.Hooks), and the guard around its handler: one
    object per run, where closures were one function and its cells per call per job."""

    __slots__ = ("ex", "owner", "part", "run", "started_ms", "timeout_s")

    def __init__(self, ex: Executors, run: Run, part: QueueKeys, owner: int, timeout_s: float,
                 started_ms: int) -> None:
        self.ex, self.run, self.part, self.owner = ex, run, part, owner  # (owner: the thread running the handler)
        self.timeout_s, self.started_ms = timeout_s, started_ms

    def save(self, body: str) -> bool:
        job = self.run.job
        return int(self.ex.rt.scripts.checkpoint(self.part, job.id, job.token, body)) > 0

    def extend(self) -> bool:
        return self.ex.renew_one(self.run.job)

    def progress(self, ctx: Context, value: Any) -> None:
        self.run.progress = codec.dumps(progress_view(value))  # (it rides on the next renewal)

    def enqueue(self, type_: str, payload: Any, **options: Any) -> Enqueued:
        return self.ex._hold(self.run, type_, payload, **options)

    def group(self, group_id: str) -> Iterator[Any]:
        return self.ex._client().iter_group_outcomes(group_id)

    def logger(self, ctx: Context) -> JobLogger:
        job, ret = self.run.job, self.ex.rt.config.retention
        made = JobLogger(joblog, {"job_id": job.id, "type": job.type, "attempt": job.attempt},
                         ret.log_lines, ret.log_bytes)
        self.ex._logger_made(self.run, ctx, made)
        return made

    def journal(self, ctx: Context) -> Journal:
        ex, run, part = self.ex, self.run, self.part
        job = run.job
        return Journal(
            job.id, lambda: [] if job.steps == 0 else steps.read(ex.rt.scripts, part, job.id, job.type, durable=True),
            lambda pos, body: ex._record_step(part, run, pos, body),
            ex.rt.config.worker.max_step_bytes, clock0=(job.claimed_ms, job.received),
            take=lambda pos, name, head, until: ex._take_signal(part, job, pos, name, head, until),
            start_child=lambda child, type_, payload, options: ex._invoke(run, child, type_, payload, options),
            collect=lambda child, signal: ex._collect(job, child, signal),
            listen=lambda name, match, pos, on: ex._listen(part, job, name, match, pos, on),
            held=lambda: not run.lost and (run.flags.lease_held(job.received, ex.q.visibility_timeout_s)
                                           or ex._still_held(run)),
            timed_out=lambda: run.flags.timed_out, replay_to=job.steps, owner=self.owner)

    def guard(self, body: Callable[[], Any]) -> Any:
        """The handler's call: its TIMEOUT deadline set for the renewer to enforce, and a
        timeout raised as it returned kept from landing in the executor's loop."""
        run, ledger = self.run, self.ex.ledger
        with ledger.lock:
            run.thread_id = threading.get_ident()
            now = time.monotonic()
            run.deadline = deadline = now + self.timeout_s
            run.began = (now, self.started_ms)  # as the attempt's settlement reports it
        self.ex.expect(deadline)  # the renewer raises the timeout: it must be awake by then
        try:
            fault("mid_handler")
            return body()
        finally:
            with ledger.lock:
                run.thread_id = None
                run.deadline = None
                raised = run.timed_out
                ledger.thread_return = time.monotonic()
            if raised:
                # A timeout raised just as the handler returned must not land in this
                # loop instead. The renewer raises one only while thread_id is set and
                # marks timed_out first, under the lock: no mark, nothing to clear.
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(threading.get_ident()), None)


@dataclass(frozen=True, slots=True)
class _Placed:
    """A BATCH run's function, payload (at the newest version), rendered key, and when an
    executor first took it (its batch's wait counts from there)."""

    fn: Function
    payload: dict[str, Any]
    key: str
    taken: float


@dataclass(slots=True)
class _Mark:
    """A run waiting for its start mark (Executors._marked)."""

    run: Run
    code: int | None = None
    done: bool = False


@dataclass(slots=True)
class _Gathering:
    """A BATCH batch one executor gathers, which the others' takes of it join."""

    fn: Function
    members: list[tuple[Run, dict[str, Any]]]


class _ChildRun:
    """One run fed to a child process (slot.Feed): its start mark, its handler's ctx calls
    and its settlement. Its attempt counts when its handler starts, as its child says
    (child.py: "began" for a batch's first, "next" or "started" for the others): nothing
    is spent at the claim (charge_later), and the start mark goes with the settler's next
    batch. Its claim is held while the job waits in this worker (no attempt counts should
    this worker die in the wait, however often; hold.lua): from the claim for a job
    claimed ahead, from the slot's wait for its child to start for one claimed to start at
    once. The hold ends just before the child gets the job (start), leaving it claimed
    ahead until the start: lost after that, it goes back unspent once only."""

    __slots__ = ("began", "charged", "direct", "ex", "flags", "fn", "job", "run", "settlement",
                 "started_ms")

    def __init__(self, executors: Executors, run: Run, fn: Function, direct: bool = True) -> None:
        self.ex = executors
        self.run = run
        self.job = run.job
        self.fn = fn
        self.flags = run.flags
        self.began = False  # its child has it
        self.charged = False  # its attempt counts (see charge)
        self.started_ms = 0
        self.settlement: Settlement | None = None
        self.direct = direct  # settled into the outcomes queue as it ends (else kept for the caller)

    def hold(self) -> bool:
        run, job = self.run, self.job
        if run.held:  # claimed ahead: held from its claim
            return True
        try:
            run.held = self.ex.rt.scripts.hold(self.ex.parts[job.partition], [(job.id, job.token)]) == [1]
        except Exception as exc:  # Redis away: the claim stays as it was (spent, or claimed ahead)
            log.warning("job %s: could not mark its claim as waiting for its child process: %s", job.id, exc)
        return run.held

    def stop(self, held: bool) -> bool:
        # A cancel hands back only a held claim: release.lua ends that one cancelled.
        return self.ex.releasing.is_set() or (held and self.run.flags.cancelled)

    def start(self, ahead: Sequence[Feed] = ()) -> list[bool]:
        """This job, and those sent to its child with it (``ahead``), may go to the child;
        per job (this one first), False: its lease was lost in the wait, it goes back. A
        held claim's wait ends in Redis first (Executors.hand_off): it stays claimed ahead
        until its handler starts (charge)."""
        return self.ex.hand_off([self.run, *(f.run for f in ahead)])

    def started(self, pid: int, charge: bool = True) -> None:
        """Its child has the job (a batch's first, sent to it: ``charge`` False, the child
        says when its handler starts, see charge; one it took after the previous job's
        end: that is its start)."""
        self.began = True
        with self.ex.ledger.lock:
            self.run.child_pid = pid
        if charge:
            self.charge()
        else:
            self._began_now()  # for now (the roster shows it running): charge says when
        fault("mid_handler")

    def _began_now(self) -> None:
        self.started_ms = Executors._server_now(self.job)  # after any wait for the child to start
        with self.ex.ledger.lock:
            self.run.began = (time.monotonic(), self.started_ms)

    def charge(self) -> None:
        """Its handler starts: its attempt counts from now on, with the settler's next
        batch (a lapse before that lands gives the job back spending nothing once only,
        reclaim.lua). One claimed started, never held, spent it at the claim."""
        if not self.charged:
            self.charged = True
            # Its start is now, also for a fresh child's first job, which the child got
            # before it imported the function and checked the payload (seconds for heavy
            # imports): the outcome shows it (entries.py: a start mark not sent).
            self._began_now()
            if self.run.confirm:  # its child asks for its start (rpc "start"), which marks it
                return
            if self.run.held or not self.job.started:
                self.ex.outcomes.put(Settlement(self.run, START))

    def rpc(self, msg: dict[str, Any]) -> Any:
        """A ctx call of the handler, relayed by its child."""
        ex, run, job = self.ex, self.run, self.job
        call = msg.get("call")
        if call == "checkpoint":
            return int(ex.rt.scripts.checkpoint(ex.parts[job.partition], job.id, job.token,
                                                str(msg.get("data")))) > 0
        if call == "steps":
            return {"entries": steps.read(ex.rt.scripts, ex.parts[job.partition], job.id, job.type, durable=True)}
        if call == "step":
            code, n = ex._record_step(ex.parts[job.partition], run, int(msg.get("position") or 0),
                                      str(msg.get("data")))
            return {"code": code, "n": n}
        if call == "wait":
            until = msg.get("until")
            code, body = ex._take_signal(ex.parts[job.partition], job, int(msg.get("position") or 0),
                                         str(msg.get("name")), str(msg.get("head")),
                                         None if until is None else int(until))
            return {"code": code, "body": body}
        if call == "invoke":
            try:
                return {"id": ex._invoke(run, str(msg.get("child")), str(msg.get("type")), msg.get("payload"),
                                         dict(msg.get("options") or {}))}
            except RunnerError as exc:
                return refusal_record(exc)
        if call == "collect":
            return {"found": ex._collect(job, str(msg.get("child")), str(msg.get("signal")))}
        if call == "listen":
            match = msg.get("match")
            return {"code": ex._listen(ex.parts[job.partition], job, str(msg.get("name")),
                                       match if isinstance(match, dict) else {}, int(msg.get("position") or 0),
                                       bool(msg.get("on")))}
        if call == "start":  # a job lost unstarted before: its start mark lands before its handler runs
            mark = ex._marked(run)
            if mark is not None and mark < 0:  # its lease was lost in the wait: no handler runs
                return False
            if mark == 2 and not run.flags.cancelled:  # a cancel in the wait: the handler hears it
                run.flags.cancelled = True
                run.cancelled_at = time.monotonic()
            return {"cancelled": run.flags.cancelled}
        if call == "extend":
            return ex.renew_one(job)
        if call == "progress":
            run.progress = codec.dumps(progress_view(msg.get("value")))
            return True
        if call == "log":  # a child's log lines, with its outcome (already bounded there)
            lines = [str(x) for x in msg.get("lines") or ()]
            chunks = [str(x) for x in msg.get("chunks") or ()]
            dropped = _count(msg.get("dropped"))  # lost in the child before these: the marker counts them
            if lines or chunks or dropped:
                if run.logs is None:
                    run.logs = JobLogger(joblog, {}, *ex._log_bounds)
                run.logs.keep(lines, dropped)
                if chunks:
                    run.logs.keep_chunks(chunks)
            return True
        if call == "enqueue":
            try:
                return ex._hold(run, str(msg.get("type")), msg.get("payload"), **(msg.get("options") or {})).as_dict()
            except RunnerError as exc:  # raised again in the child with its class (child.py)
                return refusal_record(exc)
        if call == "group_page":  # one page a message: a group's outcomes may be gigabytes
            try:
                got, after = inspecting.outcome_page(ex._client(), str(msg.get("group")), _count(msg.get("start")))
                return {"outcomes": got, "next": after}
            except RunnerError as exc:
                return {"error": str(exc)}
        return False

    def finish(self, outcome: Outcome | Release, run_s: float) -> None:
        """Its end: settled at once (the outcomes queue), or kept for the caller."""
        run = self.run
        if run.child_pid is not None:
            with self.ex.ledger.lock:
                run.child_pid = None
        if isinstance(outcome, Release):
            settlement = Settlement(run, outcome)
        else:
            fault("after_handler")
            settlement = Settlement(run, outcome, run_s=run_s,
                                    started_ms=self.started_ms or Executors._server_now(self.job))
        self.settlement = settlement
        if self.direct:
            self.ex.outcomes.put(settlement)
            self.ex.ledger.returned()


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
    stuck = [t for t in tasks if not t.done()]
    log.warning("job %s: its handler left %d task(s) running after its end; cancelled%s", job_id, len(tasks),
                f", and {len(stuck)} that did not stop (catching BaseException or CancelledError) never run again"
                if stuck else "", extra={"job_id": job_id})
    loop.close()
    # Kept for the process's life: a coroutine collected as garbage is closed, which runs
    # it once more, in whichever thread the collector ran; one that catches GeneratorExit
    # too looped there for ever (it took the settler's thread, and no job settled again).
    _stranded.extend(stuck)


_stranded: list[asyncio.Task[Any]] = []  # tasks that would not stop (see _left_behind)


def _unexpected(job: Claimed, exc: BaseException) -> Outcome:
    log.exception("job %s: unexpected error outside the handler", job.id, exc_info=exc)
    err = describe(exc)
    if job.attempt >= job.max_attempts:
        return Dead(reason="max attempts reached", error=err, refund=False)
    return RetryLater(delay_s=1.0, error=err)


def _count(v: Any) -> int:
    """A count a child sent (a non-negative int; anything else counts none)."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0
