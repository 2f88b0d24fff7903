"""The runs one queue's worker holds, and the room it has for more.

Every part of a queue's runner reads or writes it: the fetcher adds what it claimed and
waits here for room, the executors mark a run started and finished, the renewer walks it
to renew leases and enforce timeouts, the settler takes a run out once Redis has its
outcome. Nothing here talks to Redis.

A run is one claim: (job id, claim token). The same job claimed twice by this worker
(its first lease lapsed while the handler still ran, and it came back) is two runs, each
renewed, timed and settled on its own; the refused settlement of the first can never
touch the second.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from runner.store.scripts import Followup
from runner.worker.context import Flags
from runner.worker.execute import Claimed, Outcome
from runner.worker.joblog import JobLogger

_NOTHING, _ROOM, _EXECUTOR = 0, 1, 2  # what the fetcher waits for (Ledger._want)


@dataclass(slots=True)
class Run:
    job: Claimed
    thread_id: int | None = None  # the executor thread running the handler (thread isolation)
    child_pid: int | None = None  # the child process running it (process isolation)
    deadline: float | None = None  # monotonic: TIMEOUT ends here
    began: tuple[float, int] | None = None  # the handler's start: monotonic, and the server's ms
    lost: bool = False  # the lease went to another claim
    timed_out: bool = False  # the timeout was raised in its thread
    abandoned: bool = False  # still running TIMEOUT plus the grace later: given up
    # An abandoned run's settlement, sent by whichever comes first: its handler's real end
    # or the worker's stop. Until then its lease and limit slots are renewed: the handler
    # still runs, so nobody else may hold its resource, nor its own retry start.
    verdict: Any = None
    settling: bool = False  # its outcome is on its way to Redis: a refused renewal is no loss
    slot: int | None = None  # the executor slot running it
    flags: Flags = field(default_factory=Flags)
    cancelled_at: float | None = None  # time.monotonic() of the cancel request seen
    progress: str = ""  # the latest ctx.progress() not yet sent (JSON), sent with the renewal
    picked: bool = False  # an executor took it: from here a cancel is a request to the handler
    doomed: bool = False  # a cancel or a pause took it while claimed ahead: handed back, never started
    # The worker's stop killed its child and hands it back (this Release): any other
    # settlement of the run (its child's death seen as a crash) is dropped by the settler.
    handed_back: Any = None
    held: bool = False  # its claim waits for an executor (hold.lua), unspent however often it is lost
    # A child's job lost unstarted before: its claim stays held in its child too, until the
    # child asks for its start before its handler runs (claim.lua, _ChildRun.rpc "start").
    confirm: bool = False
    # It joined a BATCH call that another run's executor gathers: it takes no executor of
    # its own (see Ledger.rode).
    rider: bool = False
    resumed: bool = False  # a durable job resumed after a sleep or a wait: its MAX_AGE is behind it
    trace: Any = None  # the run span's context, for the settle span (tracing on only)
    # ctx.enqueue's jobs, held until the ack, which writes them (a failed run drops them)
    followups: list[Followup] = field(default_factory=list)
    invoked: Followup | None = None  # ctx.invoke's child, written with the run's suspension
    logs: JobLogger | None = None  # ctx.logger, when it keeps the job's log: sent with the settlement

    @property
    def key(self) -> tuple[str, str]:
        return (self.job.id, self.job.token)


@dataclass(frozen=True, slots=True)
class Release:
    """Hand the job back without spending an attempt: ``now`` when its handler never
    started or is known to have stopped, ``later`` (at the end of its lease) when it may
    still be running."""

    mode: str = "now"
    note: str = ""  # a history entry's outcome ("interrupted"), or none


@dataclass(frozen=True, slots=True)
class Start:
    """A prefetched run's handler started: its attempt counts from now on."""


START = Start()  # the one an executor sends (it carries nothing)


@dataclass(slots=True)
class Settlement:
    run: Run
    outcome: Outcome | Release | Start
    run_s: float = 0.0
    started_ms: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class Ledger:
    """Held runs by (id, token), and the count of claimed runs not yet returned by a
    handler (``busy``) and not yet picked up by an executor (``waiting``)."""

    def __init__(self, concurrency: int, capacity: int, low_water: int) -> None:
        self.concurrency = concurrency
        # Held at once: one job per executor plus up to `prefetch` claimed ahead, so a
        # deep queue is claimed in batches instead of one job per freed thread.
        self.capacity = capacity
        # Claim again once this much room opened up, or at once when no job is waiting
        # for an executor (then a thread is idle and latency matters more than batching).
        self.low_water = low_water
        self.busy = 0
        self.waiting = 0
        # Of busy, the runs that ride in another run's BATCH call (Run.rider): a batch of
        # 100 takes one executor, not 100, so they count in the room for claims (capacity)
        # but not among the busy executors (a job under limits is claimed only for a free
        # executor: counted by jobs, a batch of two kept the other executor from claiming
        # while its call ran).
        self.riders = 0
        # Room held for claims still out on a slow master (worker/flights.py): jobs they may
        # bring, and of those how many may start at once. No other claim may count on it.
        self.reserved = 0
        self.reserved_start = 0
        # When a handler running in a thread of this process last returned (monotonic): the
        # renewer, back late, tells a handler that held the GIL through the gap and
        # finished in it from no handler (a child's handler never holds this GIL).
        self.thread_return = 0.0
        self.cond = threading.Condition()
        # What the fetcher waits for in cond, if anything: notified only once it holds (a
        # notify that wakes it to find too little room costs two thread switches).
        self._want = _NOTHING
        self.runs: dict[tuple[str, str], Run] = {}
        self.lock = threading.Lock()
        # The partitions whose node refuses this worker's outcomes (maxmemory, MISCONF, an
        # outage): claim nothing more there until one lands, or the worker runs jobs it
        # cannot record, and runs them again when their leases lapse. The others go on: one
        # dead shard must not stop the worker everywhere.
        self.refused: set[int] = set()
        self.partitions = 1  # how many the queue has now (the fetcher keeps it current)
        # Told after runs are claimed (the renewer, which sleeps while nothing is held).
        self.on_hold: Callable[[], None] = lambda: None
        # Executor slots whose child has jobs waiting in its queue behind its running one
        # (slot.py: a top-up takes what waits in the inbox). Those jobs wait for a start as
        # much as the inbox's do: with them, a little room is not worth a claim at once.
        # (Counted apart from ``waiting``, the inbox's, which the executors' shares read.)
        self.backlogs: set[int] = set()

    def outcomes_refused(self, partition: int = 0) -> None:
        with self.cond:
            self.refused = self.refused | {partition}

    def outcomes_taken(self, partition: int = 0) -> None:
        """An outcome landed in ``partition``: claims may go on there (the fetcher is
        woken if it waits)."""
        if partition in self.refused:
            with self.cond:
                self.refused = self.refused - {partition}
                self.cond.notify_all()

    def room(self, stop: threading.Event, timeout_s: float | None = None) -> tuple[int, int]:
        """Block until there is room worth a claim (or ``stop`` is set, or ``timeout_s``
        passes: then 0); returns (jobs to claim at most, of which this many go to executors
        free now), less what claims in flight hold."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self.cond:
            while not stop.is_set():
                if self._roomy():
                    return (self.capacity - self.busy - self.reserved,
                            max(0, self.concurrency - self._executors_busy() - self.reserved_start))
                wait_s = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
                if wait_s <= 0:
                    break
                self._want = _ROOM
                try:
                    self.cond.wait(wait_s)
                finally:
                    self._want = _NOTHING
            return 0, 0

    def _executors_busy(self) -> int:
        """Executors that have a run, or that a run waiting in the inbox will take (under
        cond): each held run but those riding in another's batch."""
        return self.busy - self.riders

    def _roomy(self) -> bool:
        """Room worth a claim (under cond); none while every partition refuses outcomes."""
        if self.refused and len(self.refused) >= self.partitions:
            return False
        room = self.capacity - self.busy - self.reserved
        return room >= self.low_water or (room > 0 and self.waiting == 0 and not self.backlogs)

    def backlog(self, slot: int, queued: bool) -> None:
        """Slot ``slot``'s child has jobs waiting in its queue (``queued``), or none any
        more: then the fetcher, if it waits for room worth a claim, claims what room there
        is (a child's queue ran dry with nothing in the inbox)."""
        if queued:
            with self.cond:
                self.backlogs.add(slot)
            return
        with self.cond:
            self.backlogs.discard(slot)
            if self._want == _ROOM and self._roomy():
                self.cond.notify()

    def reserve(self, n: int, start: int) -> None:
        """Hold room for a claim still out (``n`` jobs, ``start`` of them to start at once)."""
        with self.cond:
            self.reserved += n
            self.reserved_start += start

    def spare(self) -> int:
        """The room no run and no claim in flight holds (0 or less: none)."""
        with self.cond:
            return self.capacity - self.busy - self.reserved

    def unreserve(self, n: int, start: int) -> None:
        """The claim holding that room landed (its jobs counted in ``busy``) or was given up."""
        with self.cond:
            self.reserved = max(0, self.reserved - n)
            self.reserved_start = max(0, self.reserved_start - start)
            if self._want == _ROOM and self._roomy():
                self.cond.notify()

    def executor_free(self, stop: threading.Event, timeout_s: float = 1.0) -> None:
        """Block until an executor is free with nothing waiting for it (or ``timeout_s``)."""
        with self.cond:
            self._want = _EXECUTOR
            try:
                self.cond.wait_for(lambda: stop.is_set() or self._executors_busy() < self.concurrency, timeout_s)
            finally:
                self._want = _NOTHING

    def wake(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def claimed(self, batch: list[Run]) -> None:
        with self.lock:
            for r in batch:
                self.runs[r.key] = r
        with self.cond:
            self.busy += len(batch)
            self.waiting += len(batch)
        self.on_hold()

    def picked(self) -> None:
        """An executor took a claimed run off the inbox."""
        with self.cond:
            self.waiting -= 1
            if self.waiting == 0 and self._want == _ROOM and self._roomy():
                self.cond.notify()

    def returned(self, n: int = 1, riders: int = 0) -> None:
        """A run (``n`` runs: a batch's members, ``riders`` of them riding: Run.rider)
        left its executor (finished, released, abandoned or failed outside the handler).
        The fetcher, waiting in room() or executor_free(), is woken only when what it waits
        for holds: waking it for every finished job cost a thread switch per job with
        handlers that block."""
        with self.cond:
            busy = self.busy - n
            self.busy = busy if busy > 0 else 0  # (no max() call: once per job)
            if riders:
                self.riders = max(0, self.riders - riders)
            want = self._want
            if (want == _ROOM and self._roomy()) or (want == _EXECUTOR and self._executors_busy() < self.concurrency):
                self.cond.notify()

    def rode(self, run: Run, rides: bool = True) -> None:
        """``run`` joined a BATCH call another run's executor gathers (``rides`` False:
        it holds that executor now, the run that held it having left before the call): it
        counts among the held runs, not among the busy executors, and a fetcher waiting for
        a free executor is woken when one is."""
        with self.cond:
            if run.rider == rides:
                return
            run.rider = rides
            self.riders += 1 if rides else -1
            if self._want == _EXECUTOR and self._executors_busy() < self.concurrency:
                self.cond.notify()

    def take(self, run: Run) -> bool:
        """picked() and pick() in one: an executor took ``run`` off the inbox; False when a
        cancel took it first (see doom)."""
        with self.cond:
            self.waiting -= 1
            if self.waiting == 0 and self._want == _ROOM and self._roomy():
                self.cond.notify()
        with self.lock:
            if run.doomed:
                return False
            run.picked = True
            return True

    def put_back(self, run: Run) -> None:
        """An executor hands a run it took back to the inbox (a batch gathering found it
        belongs elsewhere): it waits for an executor again, and a cancel may take it."""
        with self.cond:
            self.waiting += 1
        with self.lock:
            run.picked = False

    def forget(self, runs: Iterable[Run]) -> None:
        held = self.runs
        with self.lock:
            for r in runs:
                key = (r.job.id, r.job.token)  # r.key, once
                if held.get(key) is r:
                    del held[key]

    def pick(self, run: Run) -> bool:
        """An executor takes the run; False when a cancel took it first (see doom)."""
        with self.lock:
            if run.doomed:
                return False
            run.picked = True
            return True

    def doom(self, run: Run) -> bool:
        """A cancel (or a pause) took this run: True when no executor has taken it yet, so
        it never starts (the caller hands it back); False when its handler may be running."""
        with self.lock:
            if run.picked or run.doomed or self.runs.get(run.key) is not run:
                return False
            run.doomed = True
            return True

    def find(self, job_id: str, token: str) -> Run | None:
        with self.lock:
            return self.runs.get((job_id, token))

    def holds(self, run: Run) -> bool:
        with self.lock:
            return self.runs.get(run.key) is run

    def running(self) -> list[Run]:
        """Runs whose handler is running now (in a thread or a child)."""
        with self.lock:
            return [r for r in self.runs.values()
                    if (r.thread_id is not None or r.child_pid is not None) and not r.abandoned]

    def renewable(self) -> list[Run]:
        with self.lock:
            return [r for r in self.runs.values() if not r.lost]

    def verdict(self, run: Run) -> Settlement | None:
        """Take an abandoned run's settlement (once: None for the second taker)."""
        with self.lock:
            got, run.verdict = run.verdict, None
            return got  # type: ignore[no-any-return]

    def snapshot(self) -> list[Run]:
        with self.lock:
            return list(self.runs.values())
