"""The lease renewer: renews every held run's lease (and limit slots) every third of the
visibility timeout (at least every CANCEL_S, so a cancel request rides along and reaches
the handler within 2 s), tells a handler when its resource slot went to another job or
that it was asked to stop (ctx.cancelled), and
enforces TIMEOUT on handlers that run in threads: JobTimeout raised in the thread at
TIMEOUT, the run given up TIMEOUT plus the grace later.

It is a thread of the worker process: a handler that holds the GIL in one long C call
stops it too. It notices when it comes back late and says so, naming the fix
(``ISOLATION = "process"``: the worker then never runs handler code).
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable

from runner.config import QueueConfig
from runner.errors import JobTimeout
from runner.runtime import Runtime
from runner.store.connection import UNAVAILABLE
from runner.store.keys import QueueKeys
from runner.store.outage import Outage
from runner.worker.execute import Claimed
from runner.worker.faults import fault
from runner.worker.ledger import Ledger, Run
from runner.worker.lifeline import vital

log = logging.getLogger("runner.worker")

CHUNK = 500
TICK_S = 0.1
CANCEL_S = 1.0  # the longest between renewals: a cancel request is read with them


class Renewer:
    def __init__(self, runtime: Runtime, queue: QueueConfig, ledger: Ledger) -> None:
        self.rt = runtime
        self.q = queue
        self.parts = runtime.parts[queue.name]
        self.ledger = ledger
        self.lease_ms = int(queue.visibility_timeout_s * 1000)
        self.grace_s = runtime.config.worker.timeout_grace_s
        self.abandon: Callable[[Run], None] = lambda run: None
        self.cancelled: Callable[[Run], None] = lambda run: None  # a cancel reached this run
        self.stopping = threading.Event()
        self._thread = threading.Thread(target=vital(self._loop), name=f"{queue.name}-renew", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self._thread.join(timeout=2)

    def renew_one(self, job: Claimed) -> bool:
        codes = self.rt.scripts.renew(self.parts[job.partition], [(job.id, job.token)], self.lease_ms)
        return int(codes[0]) > 0

    def _loop(self) -> None:
        outage = Outage(f"{self.q.name} renewer", log)
        every = max(0.2, min(self.q.visibility_timeout_s / 3, CANCEL_S))
        late_after = max(1.0, every)
        next_renew = time.monotonic() + every
        last = time.monotonic()
        ran = False  # a handler was running at the last tick
        while not self.stopping.wait(TICK_S):
            now = time.monotonic()
            running = bool(self.ledger.running())
            # The handler that held the GIL may have finished by the time this thread
            # runs again (on one core it usually has): it was running before the gap, or
            # it started just after the last tick and returned within the gap.
            if now - last > late_after and (ran or running or self.ledger.last_return > last):
                log.warning(
                    "%s: lease renewal ran %.1f s late: a handler held the GIL (a long C call), so this "
                    "worker could not renew its leases; set ISOLATION = \"process\" on such a function so "
                    "its handler runs in a child process", self.q.name, now - last - TICK_S,
                    extra={"queue": self.q.name, "late_s": round(now - last - TICK_S, 3)})
            last, ran = now, running
            fault("renew_loop")
            self._enforce_timeouts(now)
            if now < next_renew:
                continue
            try:
                self.renew(self.ledger.renewable())
                outage.ok()
                next_renew = time.monotonic() + every
            except UNAVAILABLE as exc:
                outage.failed(exc, self.stopping)
            except Exception as exc:  # never let renewal die silently: leases would lapse
                log.exception("%s renewer: renewing failed (%s); retrying", self.q.name, exc)
                outage.failed(exc, self.stopping)

    def renew(self, runs: list[Run]) -> None:
        if len(self.parts) == 1:
            self._renew(self.parts[0], runs)
            return
        by_part: dict[int, list[Run]] = {}
        for r in runs:  # a lease lives in the partition its job was claimed from
            by_part.setdefault(r.job.partition, []).append(r)
        for p, some in by_part.items():
            self._renew(self.parts[p], some)

    def _renew(self, k: QueueKeys, runs: list[Run]) -> None:
        for i in range(0, len(runs), CHUNK):
            chunk = runs[i:i + CHUNK]
            # The latest progress of each run rides along (ctx.progress is batched here).
            sent = [r.progress for r in chunk]
            for r in chunk:
                r.progress = ""
            try:
                codes = self.rt.scripts.renew(k, [(*r.key, p) for r, p in zip(chunk, sent, strict=True)],
                                              self.lease_ms)
            except BaseException:
                for r, p in zip(chunk, sent, strict=True):
                    r.progress = r.progress or p  # not sent: the next renewal takes it
                raise
            for r, code in zip(chunk, codes, strict=True):
                c = int(code)
                # A run settled while this renewal was in flight is refused too: that is
                # not a lost lease. The settler marks a run before it sends the outcome, so
                # one whose ack landed first is known here even before it leaves the ledger;
                # if its lease was lost after all, the settler's refused ack says so.
                if c == -1 and not r.lost and not r.settling and self.ledger.holds(r):
                    r.lost = True
                    log.warning("job %s: lease lost (reclaimed elsewhere); its result will be refused "
                                "unless nobody ran it since", r.job.id, extra={"job_id": r.job.id})
                elif c == 3 and not r.flags.cancelled and not r.doomed:
                    self.cancelled(r)
                elif c == -2 and not r.flags.lock_lost:
                    r.flags.lock_lost = True
                    log.warning("job %s: its resource slot went to another job (its lease had lapsed); "
                                "the handler sees ctx.lock_lost", r.job.id, extra={"job_id": r.job.id})

    def _enforce_timeouts(self, now: float) -> None:
        late: list[Run] = []
        with self.ledger.lock:
            for r in self.ledger.runs.values():
                if r.thread_id is None or r.deadline is None or r.abandoned:
                    continue
                if now > r.deadline and not r.timed_out:
                    r.timed_out = True
                    exc = ctypes.py_object(JobTimeout)
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(r.thread_id), exc)
                    log.warning("job %s: past its TIMEOUT; interrupting the handler", r.job.id)
                elif r.timed_out and now > r.deadline + self.grace_s:
                    late.append(r)
        for r in late:
            self.abandon(r)
