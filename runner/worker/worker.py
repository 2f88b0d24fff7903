"""The worker process: a QueueRunner per queue it serves (queue.py) and one scheduler,
under one orchestrator; SIGTERM or SIGINT stops it gracefully, a second SIGINT or a SIGQUIT
at once (stops.py: a repeated SIGTERM stays graceful)."""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import socket
import threading
from collections.abc import Sequence
from typing import Any

from runner import __version__
from runner.runtime import Runtime
from runner.store import roster, session
from runner.store.connection import UNAVAILABLE
from runner.store.keys import QueueKeys
from runner.store.waiter import Waiter
from runner.worker import affinity, isolation
from runner.worker.queue import QueueRunner
from runner.worker.scheduler import Scheduler
from runner.worker.stops import CAUGHT, Stops
from runner.worker.ticker import Ticker

log = logging.getLogger("runner.worker")

# The longest the main thread sleeps between looks at stop_event (a signal wakes it at once).
SIGNAL_LOOK_S = 5.0
# How long the start waits for the cancels subscription (Redis away: it goes on, and the
# renewals carry cancels until the subscription is up).
CANCELS_READY_S = 2.0
# The longest a call to one Redis Cluster master waits for its reply before its partitions
# count as away (a quarter of the shortest lease when that is less): a healthy master
# answers a bounded script in milliseconds.
NODE_WAIT_S = 2.0


def _announce(found: Sequence[QueueKeys]) -> None:
    for k in found:
        log.info("queue %s: serving partition {%s} of another partitions count until it drains "
                 "(partitions = %d here)", k.queue, k.tag, k.partitions)


class Worker:
    """Runs QueueRunners for the given queues and one scheduler; SIGTERM or SIGINT stops it
    gracefully (however many SIGTERMs come), a second SIGINT or a SIGQUIT at once."""

    def __init__(self, runtime: Runtime, queues: Sequence[str]) -> None:
        self.rt = runtime
        self.queues = list(queues)
        self.worker_id = f"{os.uname().nodename.replace(' ', '_')}:{os.getpid()}:{os.urandom(3).hex()}"
        # On Redis Cluster, a master that stops answering with its sockets open (stopped,
        # hung) would hold each call to it for the socket timeout (15 s), and with it the
        # fetcher, renewer and settler of every partition: their calls give up on it well
        # within a lease, and its partitions are backed off from as a dead node's are.
        vt = min(runtime.config.queue(q).visibility_timeout_s for q in self.queues) if self.queues else 30.0
        runtime.scripts.node_wait_s = min(NODE_WAIT_S, vt / 4)
        # This worker's partition tags recorded, and those of other counts still recorded
        # served too, until they drain (store/tagset.py); the scheduler looks again later.
        _announce(runtime.discover_bounded(record=True))
        self.runners = [QueueRunner(runtime, runtime.config.queue(q), self.worker_id) for q in self.queues]
        self.started_ms = 0  # on the roster from its first heartbeat (the server's clock)
        self.scheduler = Scheduler(runtime, self._member, self._partitions_found)
        self.ticker = Ticker(runtime)
        # Cancels of jobs claimed ahead, pushed (a renewal would tell within a second,
        # but an executor may free up sooner): one subscription for every queue.
        self.cancels = Waiter(runtime.redis, [k.cancels for r in self.runners for k in r.fetcher.parts],
                              self._cancel_ahead)
        self.stop_event = threading.Event()
        self._host: session.Host | None = None  # recorded at start (session.host)
        self.stops = Stops()

    def _partitions_found(self, found: list[QueueKeys]) -> None:
        _announce(found)
        self.cancels.extend([k.cancels for k in found])

    def _cancel_ahead(self, words: list[str]) -> None:
        if len(words) == 2:  # "<id> <token>": a cancel took a claim
            for r in self.runners:
                r.cancel_ahead(words[0], words[1])
        elif len(words) == 3 and words[0] == "pause":  # "pause <queue> <function or *>"
            for r in self.runners:
                if r.q.name == words[1]:
                    r.paused_ahead(None if words[2] == "*" else words[2])

    def start(self) -> None:
        # The scheduler first, so due and lapsed jobs move before the first claim;
        # the runners last, once everything they rely on is up.
        # A thread handler's own Client.from_config() reaches this worker's server and
        # prefix (a child process's is told at its start: isolation.ChildProcess).
        self._host = session.host(self.rt.config.source, self.rt.config.redis)
        self.scheduler.start()
        self.ticker.start()  # schedules' ticks: jobs like any other, for the runners to take
        self.cancels.ready(CANCELS_READY_S)
        for r in self.runners:
            r.start()
        log.info("worker %s serving %s", self.worker_id, ", ".join(self.queues))

    def stop(self, grace_s: float | None = None) -> None:
        grace = self.rt.config.worker.grace_period_s if grace_s is None else grace_s
        self.ticker.stop()  # first: no new ticks while the running jobs finish
        # Runners stop in parallel (each within the same grace), then the scheduler.
        threads = [threading.Thread(target=r.stop, args=(grace,)) for r in self.runners]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.scheduler.stop()
        self.cancels.stop(wait=False)
        with contextlib.suppress(*UNAVAILABLE):
            roster.leave(self.rt.redis, self.rt.config.redis.prefix, self.worker_id)
        session.leave(self._host)
        log.info("worker %s stopped", self.worker_id)

    def _member(self) -> roster.Member:
        """This worker's roster entry, built at each heartbeat: the jobs it runs now are
        read from its ledgers here, so a job costs the roster nothing."""
        reg = self.rt.registry
        fns = [f for f in reg.functions.values() if f.queue in self.queues]
        kinds = {f.isolation for f in fns}
        running = [roster.Running(r.job.id, r.job.type, r.began[1])
                   for q in self.runners for r in q.ledger.snapshot() if r.began is not None]
        return roster.Member(
            id=self.worker_id, host=os.uname().nodename, pid=os.getpid(), queues=tuple(self.queues),
            functions={f.name: f.versions.newest for f in fns},
            started_ms=self.started_ms, seen_ms=0, concurrency=sum(q.q.concurrency for q in self.runners),
            isolation=kinds.pop() if len(kinds) == 1 else ("mixed" if kinds else ""), version=__version__,
            release=roster.release(), running=sorted(running, key=lambda r: r.started_ms))

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self.stops.at_once(signum):
            log.warning("signal %s: exiting now; running jobs are reclaimed when their lease lapses",
                        signal.Signals(signum).name)
            os._exit(1)
        log.info(self.stops.words(signum, self.rt.config.worker.grace_period_s))
        # Only a counter here: Event.set() in a handler can deadlock on the lock the main
        # thread holds inside Event.wait(); the main thread's wait (_wait_for_signal)
        # wakes on the signal itself.

    def _only_children(self) -> bool:
        """Every function this worker serves runs in a child process (none in a thread here)."""
        fns = [f for q in self.queues for f in self.rt.registry.for_queue(q)]
        return bool(fns) and all(f.isolation == "process" for f in fns)

    def _wait_for_signal(self) -> None:
        """Sleep until SIGTERM or SIGINT (or stop_event). Each signal writes a byte to a
        wakeup socket (signal.set_wakeup_fd) before its handler runs, so the main thread
        blocks on that socket and wakes only for a signal, not every 0.2 s to look."""
        rx, tx = socket.socketpair()
        try:
            tx.setblocking(False)
            previous = signal.set_wakeup_fd(tx.fileno(), warn_on_full_buffer=False)
        except (ValueError, OSError):  # not the main thread: look now and then
            rx.close()
            tx.close()
            while not self.stops.count and not self.stop_event.wait(0.2):
                pass
            return
        try:
            while not self.stops.count and not self.stop_event.is_set():
                # (PEP 475: the select is resumed after the handler ran; the byte ends it.)
                if select.select([rx], [], [], SIGNAL_LOOK_S)[0]:
                    rx.recv(64)
        finally:
            signal.set_wakeup_fd(previous)
            rx.close()
            tx.close()

    def run(self) -> None:
        """Run until SIGTERM/SIGINT (main thread only). A process of its own, so it keeps
        to one core (affinity.py) unless ``[worker] cpu_affinity = "off"``."""
        for sig in CAUGHT:
            signal.signal(sig, self._on_signal)
        # A process a thread handler forks must not inherit the stop handler above (its
        # Process.terminate() would do nothing): default actions in the fork.
        isolation.default_signals_after_fork(own_group=True)
        # Nor their spawn and forkserver processes, which fork and exec past those hooks.
        isolation.spawn_apart()
        # What handlers start outside their child's group dies with that child; this
        # process is their subreaper only while it runs no handler itself (isolation.py).
        contained = isolation.contain(self._only_children)
        if warning := isolation.without_init(contained):
            log.warning(warning)
        cores = affinity.Affinity() if self.rt.config.worker.cpu_affinity == "auto" else None
        if cores is not None:
            cores.start()  # before any thread of the worker's: each inherits the core
        else:
            affinity.forget()
        self.start()
        self._wait_for_signal()
        self.stop_event.set()
        self.stop()
        if cores is not None:
            cores.stop()
