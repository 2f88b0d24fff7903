"""The lease renewer: renews every held run's lease (and limit slots) every third of the
visibility timeout (at least every CANCEL_S, so a cancel request rides along and reaches
the handler within 2 s), tells a handler when its resource slot went to another job or
that it was asked to stop (ctx.cancelled), and
enforces TIMEOUT on handlers that run in threads: JobTimeout raised in the thread at
TIMEOUT, the run given up TIMEOUT plus the grace later.

It sleeps until its next renewal or timeout is due, not on a fixed tick: with nothing
held it sleeps until a claim wakes it (an idle worker's renewer costs nothing), and a
handler starting with a TIMEOUT sooner than its planned wake-up wakes it (``expect``).

It is a thread of the worker process: a handler that holds the GIL in one long C call
stops it too. It notices when it comes back late and says so, naming the fix
(``ISOLATION = "process"``: the worker then never runs handler code) when a handler ran
in a thread; a stopped worker (SIGSTOP, a paused VM) looks the same from here, and is
named too.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from runner.config import QueueConfig
from runner.errors import JobTimeout
from runner.runtime import Runtime
from runner.store.keys import QueueKeys
from runner.store.outage import OUTAGE, Away, Outage
from runner.worker.execute import Claimed
from runner.worker.faults import fault
from runner.worker.joblog import STREAM_BYTES, STREAM_CHUNKS, JobLog, marker
from runner.worker.ledger import Ledger, Run
from runner.worker.lifeline import vital

log = logging.getLogger("runner.worker")

CHUNK = 500
CANCEL_S = 1.0  # the longest between renewals: a cancel request is read with them
LATE_S = 0.9  # back this much later than it meant to: a handler held the GIL
# With nothing held it waits for a claim to wake it; this is only the longest it sleeps.
PARK_S = 5.0


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
        # Set to wake the thread before its planned time (a claim, a handler's TIMEOUT
        # sooner than that time, the stop); _wake_at is that time (inf while it plans, or
        # parks with nothing held, so a claim or a start then always wakes it).
        self._poke = threading.Event()
        self._wake_at = math.inf
        # When the first poke since the last wake-up came: a wake-up that follows it late
        # (a handler took the GIL right after its claim woke this thread) is late too.
        self._poked_at = math.inf
        self._down: Away[int] = Away(f"{queue.name} renewer", lambda p: f"partition {{{self.parts[p].tag}}}")
        self._thread = threading.Thread(target=vital(self._loop), name=f"{queue.name}-renew", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self._wake()
        self._thread.join(timeout=2)

    def held(self) -> None:
        """Runs were claimed (the ledger's on_hold): a renewer parked with nothing to renew
        wakes to look after them."""
        if self._wake_at == math.inf:
            self._wake()

    def expect(self, deadline: float) -> None:
        """A handler started in a thread with this TIMEOUT (monotonic): wake the renewer
        for it if it planned to sleep past it."""
        if deadline < self._wake_at:
            self._wake()

    def _wake(self) -> None:
        self._poked_at = min(self._poked_at, time.monotonic())
        self._poke.set()

    def renew_one(self, job: Claimed) -> bool:
        codes = self.rt.scripts.renew(self.parts[job.partition], [(job.id, job.token)], self.lease_ms)
        return int(codes[0]) > 0

    def _loop(self) -> None:
        outage = Outage(f"{self.q.name} renewer", log)
        every = max(0.2, min(self.q.visibility_timeout_s / 3, CANCEL_S))
        next_renew = time.monotonic() + every
        last = planned = time.monotonic()  # when it last ran, and when it meant to run again
        ran = False  # a handler was running in a thread of this process when it last ran
        while not self.stopping.is_set():
            now = time.monotonic()
            running = any(r.thread_id is not None for r in self.ledger.running())
            # The handler that held the GIL may have finished by the time this thread
            # runs again (on one core it usually has): it was running before the gap, or
            # it started just after this thread last ran and returned within the gap.
            # Only a handler in a thread of this process can hold its GIL: with none, the
            # whole worker was stopped or starved, which nothing here tells apart from a
            # held GIL either, so both are named.
            late = now - planned
            if late > LATE_S:
                extra = {"queue": self.q.name, "late_s": round(late, 3)}
                if ran or running or self.ledger.thread_return > last:
                    log.warning(
                        "%s: lease renewal ran %.1f s late: a handler running in a thread held the GIL (a long "
                        "C call), or the whole worker was stopped (SIGSTOP, a paused VM), so this worker could "
                        "not renew its leases; if a handler holds the GIL, set ISOLATION = \"process\" on its "
                        "function so it runs in a child process", self.q.name, late, extra=extra)
                elif self.ledger.runs:
                    log.warning(
                        "%s: lease renewal ran %.1f s late: the worker was stopped or starved of CPU (SIGSTOP, "
                        "a paused VM, an overloaded host), so it could not renew its leases (no handler runs "
                        "in this process)", self.q.name, late, extra=extra)
            ran = running
            fault("renew_loop")
            self._enforce_timeouts(now)
            if now >= next_renew:
                try:
                    self.renew(self.ledger.renewable())
                    outage.ok()
                    next_renew = time.monotonic() + every
                except OUTAGE as exc:
                    outage.failed(exc, self.stopping)
                except Exception as exc:  # never let renewal die silently: leases would lapse
                    log.exception("%s renewer: renewing failed (%s); retrying", self.q.name, exc)
                    outage.failed(exc, self.stopping)
            # The time spent waiting on Redis (a stalled master, a script past the busy
            # threshold, an outage's backoff) is this thread's own, not a handler's
            # holding the GIL.
            last = time.monotonic()
            planned, next_renew = self._sleep(last, next_renew, every)

    def _sleep(self, now: float, next_renew: float, every: float) -> tuple[float, float]:
        """Sleep until the next renewal or timeout is due, or a poke; with nothing held,
        until a claim pokes (at most PARK_S). Returns (when it meant to wake: a poke's
        wake-up is on time, the next renewal)."""
        self._poke.clear()
        self._poked_at = math.inf
        self._wake_at = math.inf  # planning: a claim or a start meanwhile pokes
        due = self._due(next_renew)
        if due is None:  # nothing held: parked until a claim
            poked = self._poke.wait(PARK_S)
            woke = time.monotonic()
            # A claim's first renewal comes a period after it, as a lease's always did.
            return (min(woke, self._poked_at), woke + every) if poked else (woke, next_renew)
        self._wake_at = due
        poked = self._poke.wait(max(0.0, due - now))
        self._wake_at = math.inf
        return (min(time.monotonic(), self._poked_at) if poked else max(due, now)), next_renew

    def _due(self, next_renew: float) -> float | None:
        """When the next renewal or timeout falls due (monotonic); None with nothing held."""
        with self.ledger.lock:
            if not self.ledger.runs:
                return None
            due = next_renew
            for r in self.ledger.runs.values():
                if r.thread_id is not None and r.deadline is not None and not r.abandoned:
                    due = min(due, r.deadline + (self.grace_s if r.timed_out else 0.0))
            return due

    def renew(self, runs: list[Run]) -> None:
        """Renew ``runs``' leases, partition by partition: a partition whose node is away
        is skipped for a backoff of its own (its leases are lost to the outage anyway)
        while the others' are renewed on time, or their leases would lapse too and their
        jobs run twice."""
        if len(self.parts) == 1:
            self._renew(self.parts[0], runs)
            return
        by_part: dict[int, list[Run]] = {}
        for r in runs:  # a lease lives in the partition its job was claimed from
            by_part.setdefault(r.job.partition, []).append(r)
        for p, some in by_part.items():
            if self._down.away(p):
                continue
            try:
                self._renew(self.parts[p], some)
            except OUTAGE as exc:
                self._down.failed(p, exc)
                continue
            self._down.ok(p)

    def _renew(self, k: QueueKeys, runs: list[Run]) -> None:
        # The lines are taken before the progress and written after it: a follower who
        # sees a line sees the progress reported before it.
        with taken_logs(self.rt, k, runs, log_label=f"{self.q.name} renewer"):
            self._renew_leases(k, runs)

    def _renew_leases(self, k: QueueKeys, runs: list[Run]) -> None:
        for i in range(0, len(runs), CHUNK):
            chunk = runs[i:i + CHUNK]
            # The latest progress of each run rides along (ctx.progress is batched here).
            sent = [r.progress for r in chunk]
            for r in chunk:
                r.progress = ""
            # Counted from before the call: the lease may only end sooner than this says.
            asked = time.monotonic()
            try:
                codes = self.rt.scripts.renew(k, [(*r.key, p) for r, p in zip(chunk, sent, strict=True)],
                                              self.lease_ms)
            except BaseException:
                for r, p in zip(chunk, sent, strict=True):
                    r.progress = r.progress or p  # not sent: the next renewal takes it
                raise
            for r, code in zip(chunk, codes, strict=True):
                c = int(code)
                if c > 0 or c == -2:
                    r.flags.lease_until = asked + self.lease_ms / 1000
                # A run settled while this renewal was in flight is refused too: that is
                # not a lost lease. The settler marks a run before it sends the outcome, so
                # one whose ack landed first is known here even before it leaves the ledger;
                # if its lease was lost after all, the settler's refused ack says so.
                if c == -1 and not r.lost and not r.settling and self.ledger.holds(r):
                    # A reclaimed lease released the run's resource or concurrency slot with
                    # it: another job may hold it now, as may the job's own retry. The
                    # handler is told (a process-isolated one is stopped: slot.py).
                    limited = self._limited(r)
                    if limited:
                        r.flags.lock_lost = True
                    r.flags.lease_until = -1.0
                    r.lost = True
                    log.warning("job %s: lease lost (reclaimed elsewhere); its result will be refused "
                                "unless nobody ran it since%s", r.job.id,
                                "; its resource or concurrency slot is gone: the handler sees ctx.lock_lost"
                                if limited else "", extra={"job_id": r.job.id})
                elif c == 3 and not r.flags.cancelled and not r.doomed:
                    self.cancelled(r)
                elif c == -2 and not r.flags.lock_lost:
                    r.flags.lock_lost = True
                    log.warning("job %s: its resource slot went to another job (its lease had lapsed); "
                                "the handler sees ctx.lock_lost", r.job.id, extra={"job_id": r.job.id})

    def _limited(self, r: Run) -> bool:
        """The run holds a RESOURCE_KEY or CONCURRENCY slot (released with its lease)."""
        if r.job.resource_key:
            return True
        fn = self.rt.registry.functions.get(r.job.type)
        return fn is not None and fn.concurrency is not None

    def _enforce_timeouts(self, now: float) -> None:
        late: list[Run] = []
        with self.ledger.lock:
            for r in self.ledger.runs.values():
                if r.thread_id is None or r.deadline is None or r.abandoned:
                    continue
                if now > r.deadline and not r.timed_out:
                    r.timed_out = True
                    r.flags.timed_out = True  # fences its durable calls (journal.py)
                    exc = ctypes.py_object(JobTimeout)
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(r.thread_id), exc)
                    log.warning("job %s: past its TIMEOUT; interrupting the handler", r.job.id)
                elif r.timed_out and now > r.deadline + self.grace_s:
                    late.append(r)
        for r in late:
            self.abandon(r)


def send_logs(rt: Runtime, k: QueueKeys, runs: list[Run], *, wait: bool = False, log_label: str = "") -> None:
    """The lines and stream chunks running handlers wrote and have not sent, in one round
    trip for all of them, each run's latest progress ahead of its lines; ``wait``: wait
    for a settlement taking a run's lines (else that run is left to it). Lines not
    written are kept for the next write, never dropped."""
    with taken_logs(rt, k, runs, wait=wait, log_label=log_label, progress=True):
        pass


@contextlib.contextmanager
def taken_logs(rt: Runtime, k: QueueKeys, runs: list[Run], *, wait: bool = False,
               log_label: str = "", progress: bool = False) -> Iterator[None]:
    """send_logs in two halves: the lines are taken on entry and written on exit, so what
    the body writes meanwhile (a renewal's progress) lands first. A reader who sees a line
    then sees every progress report made before it. ``progress``: each run's progress goes
    in its first call, which writes it ahead of the lines (joblog.lua); without it, the
    body sends it."""
    # A run whose lease was lost writes nothing (its writes are fenced): its lines wait for
    # its settlement, which writes them only if it lands after all (a late success).
    logging_runs = [r for r in runs if r.logs is not None and not r.settling and not r.lost and r.logs.pending()]
    if not logging_runs:
        yield
        return
    ret = rt.config.retention
    keep_ms = max(1, int(max(ret.done_s, ret.dead_s) * 1000))
    calls = rt.scripts.batch()
    held = []
    sent: list[JobLog] = []  # in the order of the batch's calls
    reported: list[tuple[Run, str, int]] = []  # (a run, its progress, its call's place in sent)
    try:
        for r in logging_runs:
            logs = r.logs
            assert logs is not None
            if not logs.sending.acquire(blocking=wait):
                continue  # its settlement is taking its lines now
            held.append(logs.sending)
            # The run's latest progress rides in its first call (none reported: nothing).
            p = r.progress if progress else ""
            if p:
                r.progress = ""
                reported.append((r, p, len(sent)))
            if logs.buf is not None and logs.buf.pending():
                lines, dropped = logs.buf.take_counted()
                rt.scripts.append_log(k, r.job.id, lines, ret.log_lines, ret.log_bytes, keep_ms,
                                      calls, marker=marker(ret.log_lines, ret.log_bytes), dropped=dropped,
                                      token=r.job.token, progress=p)
                sent.append(logs.buf)
                p = ""
            if logs.chunks is not None and logs.chunks.pending():
                rt.scripts.append_log(k, r.job.id, logs.chunks.take(), STREAM_CHUNKS, STREAM_BYTES, keep_ms,
                                      calls, key=k.stream(r.job.id), token=r.job.token, progress=p)
                sent.append(logs.chunks)
        replies: list[Any] = []
        try:
            yield
            # (A body that raised, a renewal in an outage, writes nothing: kept for the next.)
            with contextlib.suppress(Exception):
                replies = calls.execute(raise_on_error=False) if sent else []
        finally:
            # Not written (failed, or refused: the lease was lost since the last renewal):
            # kept for the next write (the renewal's, or the settlement's), never dropped,
            # nor the lease lost to it. A settlement refused in turn drops them with the run.
            failed = [buf for i, buf in enumerate(sent)
                      if i >= len(replies) or isinstance(replies[i], BaseException) or replies[i] == -1]
            for buf in failed:
                buf.put_back()
            for r, p, at in reported:
                if at >= len(replies) or isinstance(replies[at], BaseException):
                    r.progress = r.progress or p  # not written: the next write takes it
            if failed:
                log.debug("%s: %d running job log write(s) failed or refused; kept for the next write",
                          log_label, len(failed))
    finally:
        for lock in held:
            lock.release()
