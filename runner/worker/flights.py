"""Claims still out on a slow Redis Cluster master, so one slow master delays only its
own partitions' jobs.

A fetcher of a partitioned queue on Redis Cluster sends each claim on a thread of the
transport's pool and waits PATIENCE_S for it. A claim answered by then is the fetcher's
as before; one that is not stays out, "in flight", and the fetcher goes on with the
other partitions meanwhile (before, every claim on a master answering in 0.4 s held up
the claims of every other partition: their jobs started 0.6 to 1 s late). A partition
has one claim in flight at most; the room its jobs may take is held in the ledger until
it lands (so the worker never holds more than its capacity, ``prefetch = 0`` included),
and a partition whose master is known slow asks for its share of the room only, so the
others keep room to claim. A claim that lands hands its jobs to the executors at once
(on the pool's thread) and rings the fetcher's bell when more may wait there. One not
answered within the node wait is given up as a blocking one was: its master is stalled,
its partition backs off, its room is freed, and jobs it brings later are handed back.
"""

from __future__ import annotations

import functools
import logging
import queue as stdqueue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from concurrent.futures import TimeoutError as WaitedOut
from dataclasses import dataclass
from typing import Any

from runner.store.connection import Unconfirmed
from runner.store.outage import OUTAGE
from runner.store.transport import SLOW_FACTOR, Transport
from runner.worker.ledger import Ledger

log = logging.getLogger("runner.worker")

# How long a fetcher waits for one claim before it goes on with the other partitions: a
# master on the same network answers within a few ms, and a claim not answered by then
# keeps going in the background (a loaded host's occasional late answer costs nothing).
PATIENCE_S = 0.05
# How long a claim out on a master not known slow holds its room when that is all of the
# worker's room (one executor, or the last free one, with ``prefetch = 0``): held for the
# whole node wait, a master that just stalled stopped every live partition's starts for
# 2 s. Past this (or SLOW_FACTOR times the master's recent round trip) its room is freed
# for a claim elsewhere; the claim stays out (its partition claims nothing more, and its
# master is not taken for stalled before the node wait), and its jobs, when they come,
# are handed back unspent: the worker never holds more than its capacity.
ALONE_WAIT_S = 0.3


@dataclass(slots=True)
class Flight:
    partition: int
    node: str
    future: Future[Any]
    n: int  # jobs asked for (held in the ledger until it lands)
    start: int  # of which to start at once
    deadline: float  # monotonic: given up past it
    wait_s: float
    free_at: float = float("inf")  # monotonic: its room freed past it (ALONE_WAIT_S)
    given_up: bool = False
    freed: bool = False  # its room given to other claims: its jobs are handed back
    landed: bool = False


@dataclass(slots=True)
class Look:
    """A master's read of its partitions' best priorities not answered within the patience."""

    future: Future[Any]
    deadline: float  # monotonic: given up past it
    wait_s: float


@dataclass(frozen=True, slots=True)
class Landing:
    """What a claim in flight came back with, for the fetcher's own bookkeeping."""

    partition: int
    error: BaseException | None  # the claim's failure (an outage: the partition backs off)
    given_up: bool


class Flights:
    """The claims of one fetcher still out, at most one per partition."""

    def __init__(self, scripts: Transport, ledger: Ledger,
                 take: Callable[[Any, int, bool], tuple[int, int]], ring: Callable[[int], None]) -> None:
        self.scripts = scripts
        self.ledger = ledger
        self.take = take  # the fetcher's hand-over of a claim's reply (Fetcher._take)
        self.ring = ring  # wakes the fetcher to claim that partition again
        self.out: dict[int, Flight] = {}  # partition -> its claim in flight (the fetcher's thread only)
        self.looks: dict[str, Look] = {}  # master -> its look at priorities still out (likewise)
        self.landings: stdqueue.SimpleQueue[Landing] = stdqueue.SimpleQueue()
        self._lock = threading.Lock()
        self._pending = 0  # claims not yet landed, given up ones included (join waits for them)

    def slow(self, node: str) -> bool:
        """Whether ``node`` answers slower than the patience, of late."""
        return self.scripts.nodes.rtt(node) > PATIENCE_S

    def aside(self, partition: int, key: str) -> bool:
        """Whether ``partition`` (``key``: one of its keys) has a claim in flight, or a
        master that is slow or has a look still out: a read over every partition waits for
        none of them."""
        if partition in self.out:
            return True
        node = self.scripts.nodes.node([key])
        return node in self.looks or self.slow(node)

    def look(self, groups: dict[str, list[int]], read: Callable[[list[int]], list[int | None]]
             ) -> dict[int, int | None]:
        """``read`` of each master's partitions (``groups``: master -> partitions), sent at
        once and waited for PATIENCE_S: the best priority of every partition whose master
        answered by then (None: none waits there). A master not answered keeps its read
        out (``aside`` until it lands; given up past its node wait by ``overdue``); one
        stalled or failing is left out (a claim there finds out and backs off)."""
        sent: dict[str, tuple[list[int], Future[list[int | None]]]] = {}
        for node, parts in groups.items():
            try:
                sent[node] = (parts, self.scripts.nodes.launch(node, functools.partial(read, parts)))
            except OUTAGE:
                continue
        if sent:
            wait([f for _, f in sent.values()], timeout=PATIENCE_S)
        got: dict[int, int | None] = {}
        for node, (parts, f) in sent.items():
            if not f.done():
                wait_s = self.scripts.node_wait(node) or 0.0
                self.looks[node] = Look(f, time.monotonic() + wait_s, wait_s)
                f.add_done_callback(functools.partial(self._looked, node))
                continue
            exc = f.exception()
            if isinstance(exc, OUTAGE):
                continue
            if exc is not None:
                raise exc
            got.update(zip(parts, f.result(), strict=True))
        return got

    def _looked(self, node: str, f: Future[Any]) -> None:
        """A look out landed (on the pool's thread): its master is looked at again."""
        with self._lock:
            if (out := self.looks.get(node)) is not None and out.future is f:
                del self.looks[node]

    def node(self, keys: Sequence[str]) -> str:
        return self.scripts.nodes.node(keys)

    def send(self, partition: int, call: tuple[str, Sequence[str], Sequence[Any]], n: int,
             start: int) -> tuple[int, int] | None:
        """Send a claim of ``n`` jobs (``start`` to start at once) to ``partition``: what
        Fetcher.claim returns when it is answered within the patience, None when it is in
        flight. Raises the outage of a master known stalled, or of a claim that failed
        within the patience. Without bounded calls (one server, no node wait), the call
        is made here."""
        launched = self.scripts.launch(*call)
        if launched is None:
            return self.take(self.scripts.call(*call), partition, False)
        node, f = launched
        try:
            reply = f.result(timeout=PATIENCE_S)
        except WaitedOut:
            pass
        else:
            return self.take(reply, partition, False)
        # (a claim's WAIT may take its own timeout on a master short of replicas: slow, not stalled)
        wait_s = (self.scripts.node_wait(node) or 0.0) + self.scripts.wait_s([(call[0], call[1], call[2], True)])
        now = time.monotonic()
        flight = Flight(partition, node, f, n, start, now + wait_s, wait_s)
        self.ledger.reserve(n, start)
        if self.ledger.partitions > 1 and self.ledger.spare() <= 0 and not self.slow(node):
            # It holds the only room left: the other partitions' jobs wait on it.
            flight.free_at = now + max(ALONE_WAIT_S, SLOW_FACTOR * self.scripts.nodes.rtt(node))
        self.out[partition] = flight
        with self._lock:
            self._pending += 1
        f.add_done_callback(lambda done: self._landed(flight))
        return None

    def _landed(self, flight: Flight) -> None:
        """A claim in flight came back (on the pool's thread): its jobs to the executors,
        or handed back when it was given up; its room freed; the fetcher told."""
        with self._lock:
            flight.landed = True
            given_up, freed = flight.given_up, flight.freed
        error = flight.future.exception()
        got, held = 0, 0
        try:
            if error is None:
                got, held = self.take(flight.future.result(), flight.partition, given_up or freed)
            elif isinstance(error, Unconfirmed) and error.reply is not None:
                self.take(error.reply, flight.partition, True)  # (not run: handed back, see Fetcher.claim)
        except Exception as exc:  # (the fetcher logs it, as a claim of its own thread's)
            error = exc
        finally:
            if not (given_up or freed):
                self.ledger.unreserve(flight.n, flight.start)
            with self._lock:
                self._pending -= 1
            self.landings.put(Landing(flight.partition, error, given_up))
        if not given_up and error is None and (got >= flight.n or held):
            self.ring(flight.partition)  # more may wait there (or a limit held it): claim it again

    def landed(self) -> list[Landing]:
        """The landings since the last call (the fetcher's thread)."""
        out: list[Landing] = []
        while True:
            try:
                got = self.landings.get_nowait()
            except stdqueue.Empty:
                return out
            if not got.given_up and (f := self.out.get(got.partition)) is not None and f.landed:
                del self.out[got.partition]
            out.append(got)

    def overdue(self) -> list[tuple[int, BaseException]]:
        """Give up the claims out past their node wait (the fetcher's thread): each
        partition and the error that says its master stalled. Their room is freed now;
        their jobs, if they come, are handed back. A claim holding the only room past its
        ``free_at`` has its room freed (and its jobs handed back) but stays out."""
        now = time.monotonic()
        out: list[tuple[int, BaseException]] = []
        for p, flight in list(self.out.items()):
            if flight.free_at <= now and not flight.freed:
                with self._lock:
                    free = not flight.landed
                    flight.freed = free
                if free:  # (its room to a claim elsewhere; its jobs, if they come, handed back)
                    self.ledger.unreserve(flight.n, flight.start)
            if flight.deadline > now:
                continue
            with self._lock:
                if flight.landed:
                    continue  # (its landing is on its way)
                flight.given_up = True
                freed = flight.freed
            del self.out[p]
            if not freed:
                self.ledger.unreserve(flight.n, flight.start)
            out.append((p, self.scripts.nodes.give_up(flight.node, flight.future, flight.wait_s, "a claim")))
        with self._lock:
            late = [(node, look) for node, look in self.looks.items() if look.deadline <= now]
            for node, _ in late:
                del self.looks[node]
        for node, look in late:  # (its partitions' claims fail at once now, and back off)
            self.scripts.nodes.give_up(node, look.future, look.wait_s, "a look at priorities")
        return out

    def next_deadline_s(self) -> float | None:
        """How long until the first claim or look out is due to be given up (None: none is
        out)."""
        due = [f.deadline if f.freed else min(f.deadline, f.free_at) for f in self.out.values()]
        due += [look.deadline for look in list(self.looks.values())]
        if not due:
            return None
        return max(0.0, min(due) - time.monotonic())

    def pending(self) -> bool:
        """Whether a claim sent is yet to land (given up ones included)."""
        with self._lock:
            return self._pending > 0
