"""The fetcher: claims batches of ready jobs while the queue's runner has room, and
blocks on the queue's notify list when there is nothing to claim (no polling). A queue of
one partition sends its next claim behind that BLPOP, in the same write: Redis runs it
the moment the wake-up comes, so at light load, where each job comes alone, a job costs
the fetcher one round trip and one wake-up.

A partitioned queue (docs/partitions.md) is claimed from partition by partition in turn,
so none starves; only after a whole round of empty answers does the fetcher block, on
every partition at once (store/bell.py). On Redis Cluster a claim that a slow master does
not answer at once stays in flight while the fetcher claims from the other partitions
(worker/flights.py).

A claim tells Redis how many of its jobs go to executors that are free now: those spend
their attempt at once (unless their function runs in a child process: its child says
when the handler starts, and the attempt counts from there), the rest are prefetched and
spend it when they start. A claim that lands after the stop began (Redis was slow) is
handed straight back."""

from __future__ import annotations

import logging
import queue as stdqueue
import threading
import time
from collections.abc import Callable
from typing import Any

from runner.config import QueueConfig
from runner.observe import tracing
from runner.runtime import Runtime
from runner.store import stats, tracecontext
from runner.store.bell import BELL_S, Bell
from runner.store.connection import Unconfirmed
from runner.store.outage import OUTAGE, Away
from runner.worker import joblog
from runner.worker.execute import Claimed, expired
from runner.worker.faults import fault
from runner.worker.flights import Flights
from runner.worker.ledger import Ledger, Release, Run, Settlement
from runner.worker.lifeline import vital

log = logging.getLogger("runner.worker")

CLAIM_FIELDS = 15
UNBLOCK_AGAIN_S = 0.05  # a stop wakes the claim's wait again this often until the fetcher ends
# Why a claim stopped short (see claim.lua): HELD at a job under limits that needs a free
# executor; BOUNDED at its bound of ids popped or of bytes sent (CLAIM_BYTES), with jobs
# perhaps left in ready that no wake-up will announce: the fetcher claims again at once.
HELD, BOUNDED = 1, 2
EXPIRED = 2  # a claimed job's "started" value when it is past its MAX_AGE (claim.lua)
# A claimed job's "started" value when it was claimed ahead (or is a BATCH function's): its
# claim is held until its executor marks it started before its handler runs (start.lua),
# or hands it to its child (claim.lua, hold.lua).
FOR_CHILD = 3
# A claimed job's "started" value when it is not started at its claim and is a durable job
# resumed after a sleep or a wait: MAX_AGE bounded its first start only (claim.lua).
RESUMED = 4
# Both: claimed ahead and held, and a durable job resumed (claim.lua).
HELD_RESUMED = 5
# A child's job lost unstarted before: held until its child asks for its start, which
# lands before its handler runs (claim.lua); and the same for a durable job resumed.
CONFIRMED, CONFIRMED_RESUMED = 6, 7


def _count_or_unknown(value: object) -> int:
    """A count from a claim reply (0 included); -1 when it cannot be read."""
    try:
        return int(value)  # type: ignore[call-overload, no-any-return]
    except (TypeError, ValueError):
        return -1


def _int_or(value: object, default: int) -> int:
    if not value:  # a field at its default comes back empty: no exception for the common case
        return default
    try:
        return int(value)  # type: ignore[call-overload, no-any-return]
    except (TypeError, ValueError):
        return default


class Fetcher:
    PEEK_S = 0.02  # the longest a drain of plain jobs goes without looking for priorities

    def __init__(self, runtime: Runtime, queue: QueueConfig, ledger: Ledger,
                 inbox: stdqueue.SimpleQueue[Run | None], outcomes: stdqueue.SimpleQueue[Settlement | None],
                 worker_id: str) -> None:
        self.rt = runtime
        self.q = queue
        self.parts = runtime.parts[queue.name]
        self.ledger = ledger
        self.inbox = inbox
        self.outcomes = outcomes
        self.worker_id = worker_id
        ret = runtime.config.retention
        self.done_ttl_ms = int(ret.done_s * 1000)
        self.done_max = ret.done_max
        self.dead_ttl_ms = int(ret.dead_s * 1000)
        self.lease_ms = int(queue.visibility_timeout_s * 1000)
        # A worker that traces reads each claimed job's trace context (one more round trip
        # per claimed batch); one that does not never pays for it.
        self.trace_context = tracing.installed()
        self.stopping = threading.Event()
        self._seq = 0
        self._ages: tuple[object, str] = (None, "")  # (registry, its MAX_AGE argument)
        self._next = 0  # the partition claimed from next
        self._peek_at = 0.0  # when _best looks at the partitions' priorities again
        self._ranked = False  # whether its last look found a prioritised job waiting
        self._down = Away(f"{queue.name} fetcher", self._label)
        self._bell: Bell | None = None
        self._flights: Flights | None = None  # a partitioned queue on Redis Cluster (see start)
        self._woken = False  # the next claim waits for a wake-up first (see claim)
        # The registry the ledger's capacity and the claim size were sized for (none yet: the
        # first pass sizes them, as the queue's runner has set its sizing functions by then).
        self._held_for: object = None
        self.capacity_for: Callable[[Runtime, QueueConfig], int] = lambda rt, q: self.ledger.capacity
        # Jobs asked of one claim (a queue with BATCH functions: up to their size), sized
        # with the capacity. Set by the queue's runner.
        self.claim_size_for: Callable[[Runtime, QueueConfig], int] = lambda rt, q: q.batch
        self._claim_size = queue.batch
        self._thread = threading.Thread(target=vital(self._loop), name=f"{queue.name}-fetch", daemon=True)
        # How many of the free executors can start a job at once (process isolation: only
        # those whose child is ready; the rest claim ahead, spending nothing until their
        # handler has the job). Set by the queue's runner.
        self.startable: Callable[[int], int] = lambda idle: idle
        # The functions whose jobs, claimed to start at once, spend their attempt only when
        # their executor says the handler started ("<type> ...": those that run in child
        # processes, whose child reports it; see claim.lua). Set by the queue's runner.
        self.charge_later: Callable[[], str] = lambda: ""
        # The functions whose jobs are held from their claim until their handler starts
        # (BATCH functions: their jobs wait for the batch to fill; see claim.lua).
        self.hold_claimed: Callable[[], str] = lambda: ""

    def _label(self, p: int) -> str:
        """A partition as the log names it (a queue of one: nothing more to say)."""
        return f"partition {{{self.parts[p].tag}}}" if len(self.parts) > 1 else ""

    def start(self) -> None:
        self._bell = Bell(self.rt.redis, self.parts, self.q.name, self.rt.scripts)
        if self._bell.cluster and self.rt.scripts.node_wait_s is not None:
            # (its partitions may be on several masters, and a queue of one may grow: a
            # draining partition found later)
            self._flights = Flights(self.rt.scripts, self.ledger, self._take, self._bell.ring)
        self._thread.start()

    def stop(self) -> None:
        """Stop claiming (a claim in flight may still land: see join)."""
        self.stopping.set()
        if self._bell is not None:
            self._bell.stop()
        self.ledger.wake()
        self._unblock()

    def _unblock(self) -> None:
        """End the claim's wait for a wake-up now (up to BELL_S otherwise: every stop, a
        test's drained worker included, took a second); its claim lands and is handed back."""
        self.rt.scripts.unblock(*(k.notify for k in self.parts))

    def join(self, timeout_s: float) -> bool:
        """Wait for a claim in flight to land (it hands its jobs back); True when none is.
        A wait that began just as the stop did is woken again meanwhile."""
        deadline = time.monotonic() + timeout_s
        while self._thread.is_alive() and (left := deadline - time.monotonic()) > 0:
            self._thread.join(timeout=min(left, UNBLOCK_AGAIN_S))
            if self._thread.is_alive():
                self._unblock()
        flights = self._flights
        while flights is not None and flights.pending() and deadline > time.monotonic():
            time.sleep(0.01)  # (a claim in flight hands its jobs back as it lands)
        return not self._thread.is_alive() and not (flights is not None and flights.pending())

    def _loop(self) -> None:
        assert self._bell is not None
        empty = 0  # partitions in a row that had nothing to claim
        skipped = 0  # partitions in a row passed over: their node refuses this worker's outcomes
        while not self.stopping.is_set():
            n = len(self.parts)  # grows when a draining partition is found (Runtime.discover)
            self.ledger.partitions = n
            if self._held_for is not self.rt.registry:  # a reload may add or drop a BATCH function
                self._held_for = self.rt.registry
                self.ledger.capacity = self.capacity_for(self.rt, self.q)
                self._claim_size = self.claim_size_for(self.rt, self.q)
            flights = self._flights
            if flights is not None:
                self._tend(flights)
            free, idle = self.ledger.room(self.stopping, None if flights is None else flights.next_deadline_s())
            if self.stopping.is_set():
                break
            if free <= 0:  # (a claim in flight is due to be given up)
                continue
            p = self._down.pick(self._next, n, self.stopping)
            if p is None:  # stopping while every partition was down
                break
            flying = flights is not None and p in flights.out
            if p in self.ledger.refused or flying:
                # The settler cannot record outcomes there now: claim from the others (a
                # job run here could not be acked, and would run again). Or its last claim
                # is still out (a slow master): the others go on meanwhile.
                self._next = (p + 1) % n
                skipped += 1
                if skipped >= n:  # every partition not in a backoff refuses or is in flight
                    skipped = 0
                    if flights is not None and flights.out:
                        self._wait_bell(flights, 0.05)  # (a claim that lands full rings it)
                    else:
                        self.stopping.wait(0.05)
                continue
            skipped = 0
            self._next = p
            try:
                fault("before_claim")
                p, floor = self._best(p, n)
                start = self.startable(idle)
                asked = min(free, self._claim_size)
                if flights is not None and n > 1 and flights.slow(flights.node([self.parts[p].ready])):
                    # Its claims stay out a while: a share of the room, so the others can claim.
                    asked = min(asked, max(1, -(-free // n)))
                elif flights is not None and n > 1 and free > 1:
                    # Any claim may stay out (a master that just stalled holds its room until
                    # it is given up, the node wait): one executor's room is left to the
                    # others, or an idle worker with prefetch = 0 started nothing meanwhile.
                    asked = min(asked, free - 1)
                answer = self.claim(asked, start, p, floor)
                if answer is not None and answer[1] == HELD and start < idle and answer[0] == 0:
                    # The next job is under limits and must start at once (never claimed
                    # ahead): it goes to a free executor whose child may still be starting.
                    answer = self.claim(asked, idle, p, floor)
                if answer is None:  # in flight: the next partition meanwhile
                    self._next = (p + 1) % n
                    continue
                got, held = answer
                self._down.ok(p)
                if held == BOUNDED:
                    # The claim parked a run of jobs under full limits, or sent its bound of
                    # bytes (big payloads): what follows in ready must not wait for a wake-up.
                    continue
                self._next = (p + 1) % n  # the next claim goes to the next partition
                # A claim short of what it asked for found the partition empty: claim.lua
                # pops until it has them all or nothing is left, and says so (HELD,
                # BOUNDED) when a limit or its bound stopped it sooner; only a claim above a
                # priority floor leaves the rest behind. Claiming there again before a
                # wake-up would find nothing: at light load, where each job comes alone,
                # that empty claim was a round trip per job.
                drained = got == 0 or (got < asked and floor == 0)
                empty = empty + 1 if drained and held != HELD else 0
                if held == HELD:
                    # The next job is under limits and may only be claimed to start at once:
                    # wait for an executor to free up, not for new jobs.
                    self.ledger.executor_free(self.stopping)
                elif empty >= self._down.live(n) - (0 if flights is None else len(flights.out)):
                    empty = 0
                    if n == 1:
                        # The wait goes out with the next claim, in one round trip (claim).
                        self._woken = True
                        continue
                    self._wait_bell(flights, BELL_S)
            except OUTAGE as exc:
                # This partition's node is away: the others go on, it is tried again after a
                # backoff of its own (one dead shard must not stop the worker everywhere).
                self._down.failed(p, exc)
                self._next = (p + 1) % n
            except Exception:
                log.exception("%s fetcher: unexpected error; continuing", self.q.name)
                self.stopping.wait(0.5)

    def _wait_bell(self, flights: Flights | None, wait_s: float) -> None:
        """Wait for news from any partition, at most ``wait_s`` (and no later than a claim
        in flight is due to be given up)."""
        assert self._bell is not None
        due = None if flights is None else flights.next_deadline_s()
        rang = self._bell.wait(wait_s if due is None else min(wait_s, due))
        self._peek_at = 0.0  # what woke it may be a prioritised job anywhere
        if rang is not None:
            self._next = rang

    def _tend(self, flights: Flights) -> None:
        """The claims in flight that landed, and those given up (past their node wait):
        each partition's outage or recovery, as for a claim of this thread."""
        for landing in flights.landed():
            if landing.given_up:
                continue  # (its partition's backoff began when it was given up)
            if landing.error is None:
                self._down.ok(landing.partition)
            elif isinstance(landing.error, OUTAGE):
                self._down.failed(landing.partition, landing.error)
            else:
                log.error("%s fetcher: unexpected error; continuing", self.q.name, exc_info=landing.error)
        for p, exc in flights.overdue():
            self._down.failed(p, exc)

    def _best(self, p: int, n: int) -> tuple[int, int]:
        """Where to claim next, and the priority floor of that claim, so that PRIORITY is
        strict across partitions: the best waiting priority of every partition not away is
        read in one pipelined round trip (each prio set's first entry); the partition
        holding the best (``p`` itself on a tie) is claimed from, down to the best priority
        any other partition holds. With no prioritised job waiting anywhere: ``p``, no
        floor. A queue of one partition needs none of it (its claim is strict alone).

        While no partition held a prioritised job at the last look, the next look waits
        until PEEK_S after it (or a wake-up), so a drain of plain jobs pays one look per
        PEEK_S, not one per claim.

        On Redis Cluster, each master is read on its own, all at once, and the partitions
        of a slow master (those with a claim in flight, and those of a master whose read
        did not come back at once) are left out of the look, which would wait for it every
        time: ``p`` among them is claimed from down to the best priority the others hold."""
        if n == 1:
            return p, 0
        now = time.monotonic()
        if not self._ranked and now < self._peek_at:
            return p, 0
        self._peek_at = now + self.PEEK_S
        self._ranked = False
        refused = self.ledger.refused  # (outcomes refused there: nothing claimed there now)
        flights = self._flights
        look = [q for q in range(n) if (q == p or not (self._down.away(q) or q in refused))
                and not (flights is not None and flights.aside(q, self.parts[q].prio))]
        if not look:
            return p, 0
        if flights is not None:
            # One read per master, at once: a master that does not answer at once is left
            # out (flights.look), never waited for while the others' jobs wait.
            groups: dict[str, list[int]] = {}
            for q in look:
                groups.setdefault(flights.node([self.parts[q].prio]), []).append(q)
            tops = flights.look(groups, lambda qs: stats.best_priorities(self.rt.redis, [self.parts[q] for q in qs]))
            best = {q: top for q, top in tops.items() if top is not None}
            looked = p in tops
        else:
            try:
                # Bounded: a look over every master must not wait out a stalled one's socket.
                read = self.rt.scripts.bounded(
                    f"queue {self.q.name}'s priorities",
                    lambda: stats.best_priorities(self.rt.redis, [self.parts[q] for q in look]),
                    [self.parts[q].prio for q in look])
            except OUTAGE:
                return p, 0  # a node away: the claim below finds out which, as without priorities
            best = {q: top for q, top in zip(look, read, strict=True) if top is not None}
            looked = p in look
        if not best:
            return p, 0
        self._ranked = True
        if not looked:  # (a slow master's, or one not answering: its own priorities unread)
            return p, max(best.values())
        at = max(best, key=lambda q: (best[q], q == p))
        return at, max((v for q, v in best.items() if q != at), default=0)

    def claim(self, n: int, start: int, partition: int = 0, floor: int = 0) -> tuple[int, int] | None:
        """Claim up to ``n`` jobs, ``start`` of them to start at once, from one partition,
        only of priority ``floor`` or more when it is above 0; returns (how many, why it
        stopped: HELD at a job that needs a free executor, BOUNDED at its bound of ids
        popped or of bytes sent, 0 otherwise), or None while the claim is in flight (a slow Cluster master:
        flights.py)."""
        try:
            return self._claim(n, start, partition, floor)
        except Unconfirmed as exc:
            # Its WAIT did not confirm it (a master being replaced answered it, and its
            # resync may wipe it, the jobs still ready on the new master): not run, handed
            # back (a release fenced by the claim's token). The partition backs off.
            if exc.reply is not None:
                self._take(exc.reply, partition, given_up=True, why="unconfirmed")
            raise

    def _claim(self, n: int, start: int, partition: int, floor: int) -> tuple[int, int] | None:
        self._seq += 1
        k, base = self.parts[partition], f"{self.worker_id}.{self._seq}"
        later, gathered = self.charge_later(), self.hold_claimed()
        if self._flights is not None and len(self.parts) > 1:
            call = self.rt.scripts.claim_call(
                k, n=n, start=start, lease_ms=self.lease_ms, token_base=base, dead_ttl_ms=self.dead_ttl_ms,
                done_ttl_ms=self.done_ttl_ms, done_max=self.done_max, max_ages=self._max_ages(), floor=floor,
                later=later, gathered=gathered)
            return self._flights.send(partition, call, n, min(start, n))
        if not self._woken:
            return self._take(self.rt.scripts.claim(
                k, n=n, start=start, lease_ms=self.lease_ms, token_base=base, dead_ttl_ms=self.dead_ttl_ms,
                done_ttl_ms=self.done_ttl_ms, done_max=self.done_max, max_ages=self._max_ages(), floor=floor,
                later=later, gathered=gathered, late=lambda reply: self._take(reply, partition, given_up=True),
            ), partition)
        # Waiting for work (a queue of one partition): the claim goes behind the wait, and
        # Redis runs it the moment a wake-up comes (or BELL_S passes), so at light load a
        # job costs the fetcher one round trip and one wake-up, not a BLPOP and a claim.
        self._woken = False
        rang, reply = self.rt.scripts.claim_woken(
            k, BELL_S, n=n, start=start, lease_ms=self.lease_ms, token_base=base, dead_ttl_ms=self.dead_ttl_ms,
            done_ttl_ms=self.done_ttl_ms, done_max=self.done_max, max_ages=self._max_ages(), floor=floor,
            later=later, gathered=gathered,
        )
        got = self._take(reply, partition)
        if isinstance(rang, BaseException):
            raise rang  # the wait failed (a damaged notify list): the claim's jobs are taken
        return got

    def _take(self, reply: Any, partition: int, given_up: bool = False, why: str = "") -> tuple[int, int]:
        """Hand a claim's jobs to the executors (or back, during the stop, or when the claim
        was given up on a stalled master and answered later, ``given_up``: the fetcher has claimed
        for that room elsewhere meanwhile; ``why`` "unconfirmed": its WAIT did not confirm it);
        returns what claim returns."""
        now, held = int(reply[0]), int(reply[1])  # the server's clock; see claim.lua
        count = (len(reply) - 2) // CLAIM_FIELDS
        if not count:
            return 0, held
        joblog.set_server_now(now)  # (job log lines carry the server's time)
        fault("after_claim")
        qname = self.q.name
        batch: list[Run] = []
        late: list[Run] = []  # past their MAX_AGE: buried, never run
        for i in range(2, len(reply), CLAIM_FIELDS):
            (job_id, token, attempt, type_, version, payload, max_attempts, idem_key, resource_key, ready,
             created_raw, checkpoint, started, meta, logged) = reply[i:i + CLAIM_FIELDS]
            # claim.lua vouches for attempt and max_attempts; the timestamps are only
            # figures, so a damaged one must not cost the batch.
            created = _int_or(created_raw, now)
            # Positional, in Claimed's field order: keywords cost a third of a claimed
            # job's time here (2.7 against 0.9 us each).
            run = Run(Claimed(job_id, token, int(attempt), type_, version, payload, int(max_attempts or 1),
                              idem_key, resource_key, _int_or(ready, created), created, checkpoint, qname, now,
                              started not in (0, FOR_CHILD, RESUMED, HELD_RESUMED, CONFIRMED, CONFIRMED_RESUMED),
                              meta, "", partition,
                              logged if type(logged) is int else _count_or_unknown(logged)))
            batch.append(run)
            if started == 0 or started == 1:  # (most claims: one comparison a job)
                continue
            if started == EXPIRED:
                late.append(run)
            elif started == FOR_CHILD:
                run.held = True
            elif started == RESUMED:
                run.resumed = True
            elif started == HELD_RESUMED:
                run.held = run.resumed = True
            elif started == CONFIRMED:
                run.held = run.confirm = True
            elif started == CONFIRMED_RESUMED:
                run.held = run.confirm = run.resumed = True
        if self.trace_context and tracing.enabled():
            for r in batch:
                if r.job.meta_raw:
                    r.job.traceparent = tracecontext.parse(r.job.meta_raw)
        self.ledger.claimed(batch)
        if self.stopping.is_set() or given_up:
            # The stop began while this claim was in flight, or it was given up: nothing
            # will run these.
            for r in batch:
                self.ledger.picked()
                self.ledger.returned()
                if self.ledger.pick(r):
                    self.outcomes.put(Settlement(r, Release()))
            log.info("%s fetcher: %d job(s) claimed %s; handed back", qname, count,
                     "unconfirmed by the replicas (a master being replaced?)" if why else
                     "after the claim was given up (a stalled node)" if given_up else "during the stop")
            return count, held
        for r in late:
            fn = self.rt.registry.functions.get(r.job.type)
            self.ledger.picked()
            self.ledger.returned()
            if self.ledger.pick(r):  # (a cancel that took it first hands it back itself)
                self.outcomes.put(Settlement(r, expired(r.job, fn.max_age_s if fn else None), started_ms=now))
        buried = {id(r) for r in late}
        for r in batch:
            if id(r) not in buried:
                self.inbox.put(r)
        return count, held

    def _max_ages(self) -> str:
        """The claim's MAX_AGE argument for the functions loaded now (rebuilt on a reload)."""
        reg = self.rt.registry
        if self._ages[0] is not reg:
            self._ages = (reg, " ".join(f"{fn.name}={int(fn.max_age_s * 1000)}"
                                        for fn in reg.for_queue(self.q.name) if fn.max_age_s))
        return self._ages[1]
