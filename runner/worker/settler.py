"""The settler: sends finished runs' outcomes (ack, retry, bury, release) and the start
marks of prefetched runs in batches, one pipeline of fenced scripts per batch (on Redis
Cluster one per master, and a master slow to answer is left to answer on its own while
the others' partitions go on settling), retries or parks what did not land, and logs and
counts what it settled. A start mark whose run
settles in the same batch is dropped: the settlement says the run started. What each
outcome writes is built in entries.py."""

from __future__ import annotations

import logging
import queue as stdqueue
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass
from typing import Any

from runner.client import Client
from runner.config import QueueConfig
from runner.observe import logs as logs_mod
from runner.observe import metrics, tracing
from runner.runtime import Runtime
from runner.store import records, stats
from runner.store.connection import Unconfirmed
from runner.store.outage import OUTAGE, Away, Outage
from runner.store.transport import Batch
from runner.worker import durable, journal
from runner.worker.entries import AckFigures, Entries
from runner.worker.execute import CANCELLED, Dead, Done, RetryLater, Suspended, as_asked
from runner.worker.faults import fault
from runner.worker.joblog import STREAM_BYTES, STREAM_CHUNKS, marker
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
# Redis Cluster: how long a round trip's masters are waited for together. One that has not
# answered by then (stalled, or slow) is left to answer on its own (a _Flight): the others'
# replies are read and the next batches go out at once, its partitions' settlements held
# until it ends. Before, the settler waited for every master, up to the node wait (2 s) on
# one that had just stalled, and the live partitions' jobs were recorded done that late.
HANDOFF_S = 0.02
# While a round trip is out on its own: how often the loop looks whether it ended (and an
# add of the figures, FIGURES_POLL_S).
FLIGHT_POLL_S = 0.002
FIGURES_POLL_S = 0.05


@dataclass
class _Trip:
    """One round trip's settlements, its calls, and what to read their replies by."""

    batch: list[Settlement]
    pipe: Batch
    groups: list[list[Settlement]]  # each call's settlements
    figures: list[AckFigures | None]  # beside each call: what its landed acks count
    where: list[int]  # each call's partition
    logged: int  # the log writes ahead of the calls


@dataclass
class _Flight:
    """A round trip to one master not answered within HANDOFF_S, answering on its own:
    read once it ends, given up past its node wait (``deadline``)."""

    node: str
    parts: set[int]  # its settlements' partitions (of that master)
    trip: _Trip
    future: Future[list[Any]]
    wait_s: float
    deadline: float


class Settler:
    def __init__(self, runtime: Runtime, queue: QueueConfig, ledger: Ledger,
                 outcomes: stdqueue.SimpleQueue[Settlement | None]) -> None:
        self.rt = runtime
        self.q = queue
        self.ledger = ledger
        self.outcomes = outcomes
        self.entries = Entries(runtime)  # what each outcome writes
        # Set once nothing more will come through the outcomes queue: a send that fails
        # then is not retried for ever.
        self.closing = threading.Event()
        self.processed = 0
        self._tally: Counter[str] = Counter()
        self._next_summary = time.monotonic() + SUMMARY_EVERY_S
        self.cancelled: Callable[[Run], None] = lambda run: None  # a start mark found a cancel
        # Partitions whose node is away, and the settlements parked until its backoff ends.
        self._down: Away[int] = Away(f"{queue.name} settler", self._label)
        self._parked: dict[int, list[Settlement]] = {}
        # Redis Cluster: partitions with a round trip out on their own (see HANDOFF_S), and
        # their settlements held behind it, in order, until it ends.
        self._flying: dict[int, _Flight] = {}
        self._held: dict[int, list[Settlement]] = {}
        self._stopping = False
        self.figures = metrics.Pending()  # landed successes' figures, added within FLUSH_S
        # Redis Cluster: an add of the figures out on a thread of its own (flush_figures):
        # the rows it could not add, and why.
        self._adding: Future[tuple[dict[str, dict[str, int]], BaseException | None]] | None = None
        self._adding_expiry: dict[str, int] = {}
        self._thread = threading.Thread(target=vital(self._loop), name=f"{queue.name}-settle", daemon=True)
        self._children: list[Settlement] = []  # ctx.invoke's children settled, their parents not told yet
        self._refused: list[Settlement] = []  # landed, their log writes refused by the fence (_write_refused)
        self._client: Client | None = None

    def _label(self, p: int) -> str:
        parts = self.rt.parts[self.q.name]
        return f"partition {{{parts[p].tag}}}" if len(parts) > 1 and p < len(parts) else ""

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Settle everything already on the outcomes queue, then stop."""
        self.outcomes.put(None)
        self._thread.join(timeout=10)
        self.closing.set()

    def _loop(self) -> None:
        done = False
        while not done:
            # Wake for a partition's settlements that wait out its backoff, and for the
            # figures due; else sleep until an outcome comes.
            waits = [w for w in (self._parked_wait() if self._parked else None, self._figures_wait(),
                                 FLIGHT_POLL_S if self._flying else None) if w is not None]
            try:
                first = self.outcomes.get(timeout=min(waits)) if waits else self.outcomes.get()
            except stdqueue.Empty:
                self._flown()
                if self._parked or self._held:
                    self.send([])
                self.flush_figures()
                continue
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
            batch = [s for s in batch if s.run.handed_back is None or s.outcome is s.run.handed_back]
            for s in batch:  # before the send, so the entries, the tally and the log agree
                if s.run.flags.cancelled:  # (as_asked changes nothing for a run not asked to stop)
                    s.outcome = as_asked(s.outcome, True)
            self._flown()
            self.send(batch)
            self.flush_figures()
        self._stopping = True  # (every round trip from now on is waited for)
        while self._flying or self._held:  # the round trips out end, or are given up
            self._flown()
            self.send([])
            if self._flying:
                time.sleep(FLIGHT_POLL_S)
        if self._parked:  # the stop: one more try for what a dead node refused, then give up
            self._down.until.clear()
            self.closing.set()
            self.send([])
        self.flush_figures(final=True)

    def flush_figures(self, final: bool = False) -> None:
        """Add the summed figures of landed successes to the stats hashes once FLUSH_S
        passed since the oldest (at the stop: whatever is pending). A failed add keeps
        them for the next try; at the stop they are given up, with a line that says so."""
        out = self._adding
        if out is not None:
            if not out.done() and not final:
                return  # (one add out at a time)
            self._adding = None
            self._added(*out.result(), self._adding_expiry)
        due = self.figures.due_in(time.monotonic())
        if due is None or (due > 0 and not final):
            return
        rows, expiry = self.figures.take()
        sc = self.rt.scripts
        if final or sc.one_server or sc.node_wait_s is None:
            left, exc = stats.add_counts_by_master(sc, rows, expiry)
            if left and final:
                log.warning("%s settler: the figures of the last second's successes were not added to "
                            "/metrics (%s)", self.q.name, exc)
                return
            self._added(left, exc, expiry)
            return
        # Redis Cluster: on a thread of its own, each master's add given up past the node
        # wait, so a master that has just stalled holds up no settlement (before, one
        # pipeline over every partition's hashes waited out its 15 s socket timeout here).
        self._adding_expiry = expiry
        self._adding = sc.nodes.pool().submit(stats.add_counts_by_master, sc, rows, expiry)

    def _added(self, left: dict[str, dict[str, int]], exc: BaseException | None, expiry: dict[str, int]) -> None:
        """The rows an add left (a master away, an outage) are kept for the next try."""
        if not left:
            return
        log.debug("%s settler: adding figures failed (%s); trying again", self.q.name, exc)
        for key, counts in left.items():
            self.figures.add(key, counts, time.monotonic(), expiry.get(key, 0))

    def _figures_wait(self) -> float | None:
        """Seconds until the figures are due to be added (or an add out is looked at again)."""
        if self._adding is not None:
            return 0.0 if self._adding.done() else FIGURES_POLL_S
        return self.figures.due_in(time.monotonic())

    def _parked_wait(self) -> float:
        """Seconds until the first parked partition's backoff ends."""
        until = [self._down.until.get(p, 0.0) for p in self._parked]
        return max(0.0, min(until) - time.monotonic()) + 0.001

    def _take(self, batch: list[Settlement]) -> bool:
        """Add what the outcomes queue holds now to ``batch``; True when the stop sentinel came."""
        while len(batch) < MAX_BATCH:
            try:
                nxt = self.outcomes.get_nowait()
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

    def _part(self, s: Settlement) -> int:
        return s.run.job.partition if len(self.rt.parts[self.q.name]) > 1 else 0

    def _by_part(self, batch: Sequence[Settlement]) -> dict[int, list[Settlement]]:
        """``batch`` by the partition each run settles in (the one it was claimed from), in
        order; a queue of one partition's at once (the settler's per-job path)."""
        if len(self.rt.parts[self.q.name]) == 1:
            return {0: list(batch)} if batch else {}
        by_part: dict[int, list[Settlement]] = {}
        for s in batch:
            by_part.setdefault(s.run.job.partition, []).append(s)
        return by_part

    def _due(self, batch: Sequence[Settlement]) -> list[Settlement]:
        """The settlements to send now: those parked for a partition whose backoff ended,
        those held behind a round trip that has ended, then ``batch``'s, less those of a
        partition still in its backoff (parked) or with a round trip out (held)."""
        if not (self._parked or self._held or self._flying or self._down.until):
            return list(batch)  # (the common case: every partition well, none with a trip out)
        out: list[Settlement] = []
        for p in [p for p in self._parked if not self._down.away(p) and p not in self._flying]:
            out += self._parked.pop(p)
        held = [s for p in [p for p in self._held if p not in self._flying] for s in self._held.pop(p)]
        for s in [*held, *batch]:
            p = self._part(s)
            if p in self._flying:
                self._held.setdefault(p, []).append(s)
            elif p in self._parked or self._down.away(p):
                self._parked.setdefault(p, []).append(s)
            else:
                out.append(s)
        return out

    def _park(self, p: int, sub: list[Settlement], exc: BaseException) -> None:
        """Partition ``p``'s node refused these outcomes (an outage): keep them for a try
        after its backoff, and claim nothing more there meanwhile; the other partitions
        go on settling, renewing and claiming."""
        if self.closing.is_set():
            self.ledger.forget(s.run for s in sub if not isinstance(s.outcome, Start))
            log.error("%s settler: Redis unavailable at exit; %d job(s) will be reclaimed when "
                      "their lease lapses", self.q.name, len(sub))
            return
        self.ledger.outcomes_refused(p)  # claim nothing there that this worker could not record
        self._down.failed(p, exc)
        self._parked.setdefault(p, []).extend(sub)

    def send(self, batch: Sequence[Settlement]) -> None:
        """Send a batch until it lands. Re-sending is safe: every script is fenced, so a
        settlement that already applied is refused the second time. A partition whose node
        is away (an outage) has its settlements parked and sent again after a backoff of
        its own, while the other partitions' settle at once. Any other error (an ACL
        change, MISCONF, a bug) is retried with backoff; after a few tries the batch is
        split so one bad settlement cannot hold up the others, and one that keeps failing
        is dropped from this worker: its lease lapses and it is reclaimed."""
        pending = self._due(batch)
        outage = Outage(f"{self.q.name} settler", log)
        give_up = threading.Event()
        errors = 0
        while pending:
            pending, other = self._land(pending)
            if other is None:
                return
            errors += 1
            log.error("%s settler: settling %d job(s) failed (%s); retrying", self.q.name, len(pending), other,
                      exc_info=other)
            if len(pending) > 1 and errors >= 3:
                for one in pending:
                    self.send([one])
                return
            if errors >= 8 or self.closing.is_set():
                self.ledger.forget(b.run for b in pending if not isinstance(b.outcome, Start))
                log.error("%s settler: giving up on job(s) %s; they are reclaimed when their "
                          "lease lapses", self.q.name, ", ".join(b.run.job.id for b in pending))
                return
            outage.failed(other, give_up)

    def _land(self, pending: Sequence[Settlement]) -> tuple[list[Settlement], BaseException | None]:
        """One try at ``pending``: a partition that took its outcomes is well again, one
        whose node is away has its settlements parked; returns the settlements that failed
        otherwise, and their error (None: nothing left to retry)."""
        parts = {0} if pending and len(self.rt.parts[self.q.name]) == 1 else {self._part(s) for s in pending}
        return self._sorted(parts, self._try(pending))

    def _sorted(self, parts: set[int], failures: list[tuple[int, list[Settlement], BaseException]]
                ) -> tuple[list[Settlement], BaseException | None]:
        """What a round trip to ``parts`` left (_land)."""
        refused = {p for p, _, e in failures if isinstance(e, OUTAGE)}
        for p in parts - refused - self._parked.keys() - self._flying.keys():
            self._down.ok(p)
            self.ledger.outcomes_taken(p)
        again: list[Settlement] = []
        other: BaseException | None = None
        for p, sub, e in failures:
            if isinstance(e, OUTAGE):
                self._park(p, sub, e)
            else:
                again += sub
                other = e
        return again, other

    def _try(self, pending: Sequence[Settlement]) -> list[tuple[int, list[Settlement], BaseException]]:
        """One round trip for ``pending`` (traced when tracing is on); what did not land,
        as _round_trip returns it."""
        try:
            traced = [(s.run.trace, s.run.job.id, type(s.outcome).__name__.lower())
                      for s in pending if s.run.trace is not None and type(s.outcome) is not Start] \
                if tracing.enabled() else []  # (a batch's members carry its span from their start marks)
            with tracing.settle_spans(traced):
                return self._round_trip(pending)
        except Exception as exc:
            return self._failed(pending, exc)

    def _failed(self, pending: Sequence[Settlement], exc: Exception
                ) -> list[tuple[int, list[Settlement], BaseException]]:
        """A round trip of which nothing was read back: an outage fails every partition
        of it, any other error the whole of it."""
        if not isinstance(exc, OUTAGE):
            return [(-1, list(pending), exc)]
        by_part: dict[int, list[Settlement]] = {}
        for s in pending:
            by_part.setdefault(self._part(s), []).append(s)
        return [(p, sub, exc) for p, sub in by_part.items()]

    def _round_trip(self, batch: Sequence[Settlement]) -> list[tuple[int, list[Settlement], BaseException]]:
        """Send ``batch`` in one round trip; returns what did not land: (partition, its
        settlements, the error) for each script call that failed (on Redis Cluster each
        call goes on its own, so a dead node fails its own partitions' calls only). On
        Redis Cluster each master's calls go on their own, and a master that has not
        answered within HANDOFF_S is left to answer on its own (_fly)."""
        # The runs' lines echoed to this worker's output, ahead of their ends (before their
        # lines are taken: nothing the output does may cost them).
        logs_mod.flush_held()
        sc = self.rt.scripts
        if sc.one_server or sc.node_wait_s is None or self._stopping:
            trip = self._build(batch)
            try:
                replies = trip.pipe.execute(raise_on_error=False, confirm=False)
            except BaseException as exc:
                self._logs_landed(trip.batch, [exc] * trip.logged)
                raise
            return self._finish(trip, replies)
        parts = self.rt.parts[self.q.name]
        by_node: dict[str, list[Settlement]] = {}
        for s in batch:
            by_node.setdefault(sc.nodes.node([parts[self._part(s)].ready]), []).append(s)
        failures: list[tuple[int, list[Settlement], BaseException]] = []
        out: list[tuple[str, _Trip, Future[list[Any]]]] = []
        for sub in by_node.values():
            trip = self._build(sub)
            got: list[Any] | BaseException
            try:
                launched = trip.pipe.launch()
                if launched is not None:
                    out.append((launched[0], trip, launched[1]))
                    continue
                got = trip.pipe.execute(raise_on_error=False, confirm=False)  # (not to be sent so: waited for)
            except Exception as exc:  # (a stalled master: nothing sent)
                got = exc
            failures += self._finish(trip, got)
        wait([f for _, _, f in out], timeout=HANDOFF_S)
        for node, trip, f in out:
            if f.done():
                failures += self._finish(trip, f.exception() or f.result())
            else:
                self._fly(node, trip, f)
        return failures

    def _build(self, batch: Sequence[Settlement]) -> _Trip:
        """``batch``'s calls on one pipeline: the log lines first (whoever hears of the
        job's end may read its log at once), then each partition's settlements."""
        now = records.now_ms()  # a fallback only: a history entry's time is the server's (entries.py)
        parts = self.rt.parts[self.q.name]
        by_part = self._by_part(batch)
        trip = _Trip(list(batch), self.rt.scripts.batch(), [], [], [], 0)
        self._add_logs(batch, trip.pipe)
        trip.logged = len(trip.pipe.calls)
        for p, sub in by_part.items():
            # Calls of at most SCRIPT_BYTES of results each: one ack call over 270 results
            # of 1 MB held Redis 1.3 s (of 4 MB, 6 s: BUSY to every other client).
            for run in records.by_bytes(sub, self._written):
                self.entries.add_calls(parts[p], run, now, trip.pipe, trip.groups, trip.figures)
            trip.where += [p] * (len(trip.groups) - len(trip.where))
        return trip

    def _written(self, s: Settlement) -> int:
        """The bytes of a settlement's outcome its call writes: a success's result (and
        its payload, when done jobs keep theirs); the others' are bounded small."""
        o = s.outcome
        if type(o) is not Done:
            return 0
        size = records.text_bytes(o.result)
        return size + len(s.run.job.payload_raw) if self.entries.keep_payload else size

    def _finish(self, trip: _Trip, replies: list[Any] | BaseException
                ) -> list[tuple[int, list[Settlement], BaseException]]:
        """Read a round trip's replies (or the error that ended it): the runs settled leave
        the ledger and are counted; returns what did not land, as _round_trip does."""
        if isinstance(replies, BaseException):
            if trip.logged:
                self._logs_landed(trip.batch, [replies] * trip.logged)
            if not isinstance(replies, Exception):
                raise replies
            return self._failed(trip.batch, replies)
        if trip.pipe.short:
            # Settlements their WAIT did not confirm ([redis] wait_replicas): answered by a
            # master being replaced, perhaps, whose resync wipes them. Not taken for landed:
            # sent again after their partition's backoff (fenced by the claim's token, one
            # that did land is refused the second time, one wiped lands on the new master).
            replies = list(replies)
            for i in trip.pipe.short:
                if i >= trip.logged and not isinstance(replies[i], BaseException):
                    replies[i] = Unconfirmed(f"{self.q.name} settler: the replicas did not confirm a settlement "
                                             "(a master being replaced, or short of replicas)", replies[i])
        if trip.logged:  # (most batches: no run logged a line)
            self._logs_landed(trip.batch, replies[:trip.logged])
            replies = replies[trip.logged:]
        fault("after_ack")
        failures, spent = self._read(trip.groups, replies, trip.where, trip.figures)
        self._write_refused()
        batch = trip.batch
        if spent:
            failures += self._round_trip(spent)  # logged there, as dead
            buried = {id(x.run) for x in spent}
            batch = [s for s in batch if id(s.run) not in buried]
        if failures:
            unsent = {id(s) for _, group, _ in failures for s in group}
            batch = [s for s in batch if id(s) not in unsent]
        self._account(batch)
        if self._children:
            if self._client is None:
                self._client = Client(self.rt)
            children, self._children = self._children, []
            durable.notify_parents(self._client, children)
        return failures

    def _fly(self, node: str, trip: _Trip, future: Future[list[Any]]) -> None:
        """A master has not answered within HANDOFF_S: its round trip answers on its own,
        and its partitions' next settlements are held behind it (so they keep their
        order), while the other partitions settle at once."""
        # (a WAIT behind its settlements may take its own timeout: slow, not stalled)
        wait_s = (self.rt.scripts.node_wait(node) or 0.0) + self.rt.scripts.wait_s(trip.pipe.calls)
        fl = _Flight(node, {self._part(s) for s in trip.batch}, trip, future, wait_s,
                     time.monotonic() + wait_s)
        for p in fl.parts:
            self._flying[p] = fl

    def _flown(self) -> None:
        """Read the round trips out on their own that have ended, and give up those past
        their node wait (the master is then stalled, and their settlements are parked for
        a try after its backoff: each call is fenced, so one that ran after all is refused
        the second time, never applied twice). Their partitions' held settlements go
        out next."""
        now = time.monotonic()
        for fl in {id(f): f for f in self._flying.values()}.values():
            if fl.future.done():
                got: list[Any] | BaseException = fl.future.exception() or fl.future.result()
            elif now >= fl.deadline:
                got = self.rt.scripts.nodes.give_up(fl.node, fl.future, fl.wait_s, "a settlement")
            else:
                continue
            for p in fl.parts:
                self._flying.pop(p, None)
            try:
                failures = self._finish(fl.trip, got)
            except Exception as exc:
                failures = self._failed(fl.trip.batch, exc)
            again, other = self._sorted(fl.parts, failures)
            if other is not None:  # (an error not an outage: retried in order, as send does)
                log.error("%s settler: settling %d job(s) failed (%s); retrying", self.q.name, len(again), other)
                for s in reversed(again):
                    self._held.setdefault(self._part(s), []).insert(0, s)

    def _add_logs(self, batch: Sequence[Settlement], calls: Any) -> None:
        """The runs' log lines go in the settlement's round trip (a run that logged
        nothing adds nothing), kept as long as the job's outcome: a success's as done
        jobs are, a dead letter's as dead ones, a run still to go again the longer. A run
        not done (a retry, a sleep, a wait, a dead letter) writes its latest progress with
        them, ahead of them (joblog.lua), or in a call of its own when it logged nothing:
        its job shows it while it waits. A success's state goes with its ack."""
        ret = self.rt.config.retention
        parts = self.rt.parts[self.q.name]
        for s in batch:
            logs = s.run.logs
            kind = type(s.outcome)
            if kind is Start:
                continue
            p = "" if kind is Done else s.run.progress  # (most runs: none)
            if (logs is None or (logs.buf is None and logs.chunks is None)) and not p:
                continue
            keep_s = ret.done_s if kind is Done else ret.dead_s if kind is Dead else max(ret.done_s, ret.dead_s)
            keep_ms = max(1, int(keep_s * 1000))
            k = parts[self._part(s)]
            job_id, token = s.run.job.id, s.run.job.token
            if p:
                s.run.progress = ""
                s.extra["progress"] = p  # put back should the call fail (_logs_landed)
            if logs is None or (logs.buf is None and logs.chunks is None):
                s.extra["progress_call"] = True
                self.rt.scripts.append_log(k, job_id, (), ret.log_lines, ret.log_bytes, keep_ms, calls,
                                           token=token, progress=p)
                continue
            logs.echo_end()  # (a thread's run: how many lines its flood kept from this worker's output)
            with logs.sending:  # lines the renewer took are in Redis before this job's end is
                s.extra["log_keep_ms"] = keep_ms
                if logs.buf is not None:
                    lines, dropped = logs.buf.take_counted()
                    s.extra["log_lines"] = lines  # put back should the call fail (_logs_landed)
                    s.extra["log_dropped"] = dropped
                    self.rt.scripts.append_log(k, job_id, lines, ret.log_lines, ret.log_bytes, keep_ms, calls,
                                               marker=marker(ret.log_lines, ret.log_bytes), dropped=dropped,
                                               token=token, progress=p)
                    p = ""
                if logs.chunks is not None:
                    chunks = logs.chunks.take()
                    s.extra["stream_chunks"] = chunks
                    self.rt.scripts.append_log(k, job_id, chunks, STREAM_CHUNKS, STREAM_BYTES, keep_ms, calls,
                                               key=k.stream(job_id), token=token, progress=p)

    def _logs_landed(self, batch: Sequence[Settlement], replies: Sequence[Any]) -> None:
        """A log write that failed keeps its lines (and the progress that went with them)
        for the settlement's next try; one refused by its fence keeps them should the
        settlement land (_write_refused)."""
        at = 0
        for s in batch:
            for field in ("progress_call", "log_lines", "stream_chunks"):
                if field not in s.extra:
                    continue
                lines = s.extra.pop(field)
                reply = replies[at] if at < len(replies) else None
                at += 1
                if isinstance(reply, BaseException) and "progress" in s.extra:
                    s.run.progress = s.run.progress or s.extra["progress"]  # (not written: sent again)
                if field == "progress_call":
                    continue
                if reply == -1:
                    s.extra.setdefault("refused_logs", []).append((field, lines))
                    continue
                logs = s.run.logs
                buf = None if logs is None else logs.buf if field == "log_lines" else logs.chunks
                if isinstance(reply, BaseException) and buf is not None:
                    log.warning("job %s: its log was not written (%s); trying again", s.run.job.id, reply)
                    # The lines are still in the buffer (a take only marks them sent): they
                    # count as unsent again (extend would add them a second time).
                    buf.put_back()
            s.extra.pop("progress", None)

    def _write_refused(self) -> None:
        """The lines of runs whose log write its fence refused but whose settlement then
        landed, written without the fence: the run owned the job after all (a late
        success, its claim taken back before it ended; or a write answered NOSCRIPT after
        a Redis restart and sent again once the settlement behind it had ended the claim),
        so they are the job's last lines. One round trip for the batch, and only then."""
        landed, self._refused = self._refused, []
        if not landed:
            return
        ret = self.rt.config.retention
        parts = self.rt.parts[self.q.name]
        calls = self.rt.scripts.batch()
        for s in landed:
            k, job_id, keep_ms = parts[self._part(s)], s.run.job.id, s.extra["log_keep_ms"]
            for field, lines in s.extra.pop("refused_logs"):
                if field == "log_lines":
                    self.rt.scripts.append_log(k, job_id, lines, ret.log_lines, ret.log_bytes, keep_ms, calls,
                                               marker=marker(ret.log_lines, ret.log_bytes),
                                               dropped=s.extra.get("log_dropped", 0))
                else:
                    self.rt.scripts.append_log(k, job_id, lines, STREAM_CHUNKS, STREAM_BYTES, keep_ms, calls,
                                               key=k.stream(job_id))
        try:
            for reply in calls.execute(raise_on_error=False):
                if isinstance(reply, BaseException):
                    raise reply
        except Exception as exc:
            log.warning("%d ended job(s): their last log lines were not written (%s)", len(landed), exc)

    def _read(self, groups: list[list[Settlement]], replies: list[Any], where: list[int],
              figures: list[AckFigures | None]
              ) -> tuple[list[tuple[int, list[Settlement], BaseException]], list[Settlement]]:
        """What each script call's reply codes say of its settlements: the runs settled
        leave the ledger, landed successes' figures are summed; returns the calls that
        failed (partition, settlements, error), and the rate-limited runs that turned out
        spent (to be buried)."""
        settled = []
        spent: list[Settlement] = []
        failures: list[tuple[int, list[Settlement], BaseException]] = []
        for group, codes, p, fig in zip(groups, replies, where, figures, strict=True):
            if isinstance(codes, BaseException):
                for s in group:
                    s.run.settling = False  # not sent after all: a refused renewal is a loss again
                failures.append((p, group, codes))
                continue
            if fig is not None:
                self._count(fig, codes)
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
                if type(s.outcome) is Suspended and int(code) in (-3, -4):
                    # The sleep's entry would take the step log past its bounds: still
                    # claimed, so it goes dead as a step past them does.
                    err = {"type": "StepTooLarge", "message": f"sleep {s.outcome.name!r}: the job's step log "
                           f"is full ({journal.MAX_STEPS:,} entries or {journal.MAX_LOG_BYTES:,} bytes)"}
                    spent.append(Settlement(s.run, Dead("permanent failure", err, False), s.run_s, s.started_ms,
                                            s.extra))
                    continue
                settled.append(s.run)
                if int(code) > 0 and "refused_logs" in s.extra:
                    self._refused.append(s)
                if int(code) > 0 and s.run.job.meta_raw and durable.INVOKED_BY in s.run.job.meta_raw:
                    self._children.append(s)  # a child of ctx.invoke: its parent hears of its end
                if int(code) < 0:
                    log.warning("job %s: lease lost before it settled (%s); another worker "
                                "owns it now", s.run.job.id, type(s.outcome).__name__)
                elif int(code) == 2:
                    log.info("job %s: its lease had lapsed, but the run finished: recorded as done",
                             s.run.job.id)
        self.ledger.forget(settled)
        self.processed += len(settled)
        return failures, spent

    def _count(self, fig: AckFigures, codes: Sequence[Any]) -> None:
        """An ack call's figures: the batch's sum when every ack landed (1 done, 2 done
        late), else each landed ack's own fields; and the landed ones in the minute's
        throughput count."""
        now = time.monotonic()
        landed = 0
        for c in codes:  # (a loop: a generator's resume per job cost more)
            if int(c) > 0:
                landed += 1
        if landed and fig.tput_prefix:
            self.figures.add(fig.minute_key(records.now_ms()), {"done": landed}, now, metrics.THROUGHPUT_KEEP_MS)
        if landed == len(codes):
            self.figures.add(fig.stats_key, fig.totals.counts, now)
            return
        for fields, code in zip(fig.fields, codes, strict=True):
            if int(code) > 0:
                self.figures.add_fields(fig.stats_key, fields, now)

    def _account(self, batch: Sequence[Settlement]) -> None:
        """Count and log what landed. Successes log at DEBUG (a line per job at INFO would
        cost more than the job); retries and dead letters always log, and a summary line
        goes out every minute."""
        verbose = joblog.isEnabledFor(logging.DEBUG)
        done = 0
        for s in batch:
            o = s.outcome
            if type(o) is Done:
                done += 1
                if verbose:
                    self._log(s)
            elif type(o) is not Start:
                self._tally["Cancelled" if isinstance(o, Dead) and o.reason == CANCELLED else type(o).__name__] += 1
                if verbose or not isinstance(o, Release):
                    self._log(s)
        self._tally["Done"] += done
        if time.monotonic() >= self._next_summary:
            self._summarise()

    def _summarise(self) -> None:
        t = self._tally
        if sum(t.values()):
            log.info("queue %s: %d done, %d retried, %d dead, %d cancelled, %d released in the last %.0f s",
                     self.q.name, t["Done"], t["RetryLater"], t["Dead"], t["Cancelled"], t["Release"],
                     SUMMARY_EVERY_S, extra={"queue": self.q.name, "done": t["Done"], "retried": t["RetryLater"],
                                             "dead": t["Dead"], "cancelled": t["Cancelled"],
                                             "released": t["Release"]})
        t.clear()
        self._next_summary = time.monotonic() + SUMMARY_EVERY_S

    def _log(self, s: Settlement) -> None:
        job = s.run.job
        o = s.outcome
        outcome = {Done: "done", RetryLater: "retry", Dead: "dead", Release: "released",
                   Suspended: "suspended"}[type(o)]
        if isinstance(o, RetryLater) and o.refund:
            outcome = "handed back"
        cancelled = isinstance(o, Dead) and o.reason == CANCELLED
        if cancelled:
            outcome = "cancelled"  # asked for: not a failure, no warning
        level = logging.DEBUG if isinstance(o, Done | Suspended) else \
            logging.INFO if isinstance(o, Release) or cancelled else logging.WARNING
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
