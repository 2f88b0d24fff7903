"""CPU affinity: a worker process keeps its threads on one core.

One interpreter runs Python on one thread at a time (the GIL). When its threads may run
on every core, each hand-off of the GIL between threads that block on I/O wakes a thread
on another core, and the two cores pass the lock back and forth: measured on 2 cores, 16
threads each making Redis round trips spent 64 us of CPU per round trip, 4.3 context
switches, against 15 us and 1.0 on one core. A worker whose handlers block on I/O drains
more on fewer cycles when its threads share one core; the cores left over go to the other
worker processes and to Redis.

Which core: at start, before any other thread exists (so every later thread inherits the
mask), a core of the process's mask (so `taskset` and cgroup cpusets are obeyed) that no
sibling holds. A sibling is another worker sharing this host's network namespace and
temporary directory; each holds a core by binding an abstract unix socket named for the
directory and the core, which needs no file and goes with the process, even a killed
one. With every core held, or no socket to be had, a random core. While running, when
other work takes a good share of this process's core and another core, held by no
sibling, is clearly less loaded, it moves there; a move is followed by a pause, so two
processes do not chase each other.

Handlers that run in child processes (ISOLATION = "process") get the process's original
mask back (child.py reads it from RUNNER_CPUS_ORIGINAL), and so does a child forked with
os.fork() (multiprocessing's fork start method). A program a thread handler starts with
subprocess keeps to the worker's core: give it ``preexec_fn=affinity.restore_original``
or run such a handler in a child process. Linux only; elsewhere, with one usable core, or
with ``[worker] cpu_affinity = "off"``, nothing changes.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import random
import socket
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("runner.worker")

ORIGINAL_ENV = "RUNNER_CPUS_ORIGINAL"
CHECK_EVERY_S = 2.0
PAUSE_AFTER_MOVE_S = 20.0
# Move when other work took this share of this process's core...
CROWDED = 0.3
# ...to a core whose load is lower by at least this share.
BETTER_BY = 0.25


@dataclass(frozen=True, slots=True)
class CpuTimes:
    busy: int  # jiffies
    total: int


def read_cpus(text: str) -> dict[int, CpuTimes]:
    """Per-core busy and total jiffies from /proc/stat's text."""
    out: dict[int, CpuTimes] = {}
    for line in text.splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        name, *fields = line.split()
        try:
            values = [int(v) for v in fields]
            cpu = int(name[3:])
        except ValueError:
            continue
        idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
        total = sum(values[:8])  # user..steal; guest time is counted in user already
        out[cpu] = CpuTimes(total - idle, total)
    return out


def busy_shares(before: Mapping[int, CpuTimes], after: Mapping[int, CpuTimes]) -> dict[int, float]:
    """Each core's busy share between two readings (0.0: idle throughout)."""
    out: dict[int, float] = {}
    for cpu, a in after.items():
        b = before.get(cpu)
        if b is None or a.total <= b.total:
            continue
        out[cpu] = (a.busy - b.busy) / (a.total - b.total)
    return out


def pick(allowed: Iterable[int], taken: Iterable[int] = (), rng: random.Random | None = None) -> int:
    """The core to start on: one no sibling holds, at random (siblings that cannot see
    each other's holds then spread instead of piling onto one); any core when every one
    is held."""
    pool = sorted(allowed)
    held = set(taken)
    return (rng or random).choice([c for c in pool if c not in held] or pool)


def move_to(current: int, candidates: Iterable[int], busy: Mapping[int, float], own: float) -> int | None:
    """Where to move from ``current``, on which this process used the share ``own``:
    the least loaded candidate, when other work took at least CROWDED of this core and
    that candidate's load is lower by BETTER_BY; else nowhere."""
    others_here = busy.get(current, 0.0) - own
    if others_here < CROWDED:
        return None
    best = min((c for c in candidates if c != current and c in busy), key=lambda c: (busy[c], c), default=None)
    if best is None or busy[best] > others_here - BETTER_BY:
        return None
    return best


def format_cpus(cpus: Iterable[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def parse_cpus(text: str) -> set[int]:
    return {int(c) for c in text.split(",") if c.strip().isdigit()}


def _process_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


class Affinity:
    """Keeps this process on one core (see the module docstring). start() pins at once,
    from the calling thread, and starts the thread that may move it; stop()."""

    def __init__(self) -> None:
        self.cpu: int | None = None
        self.moves = 0
        self._allowed: Sequence[int] = ()
        self._hold: socket.socket | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._space = tempfile.gettempdir()

    @staticmethod
    def supported() -> bool:
        return hasattr(os, "sched_setaffinity") and Path("/proc/stat").exists()

    def start(self) -> None:
        if not self.supported():
            forget()
            return
        self._allowed = sorted(os.sched_getaffinity(0))
        if len(self._allowed) < 2:
            forget()
            return
        os.environ[ORIGINAL_ENV] = format_cpus(self._allowed)
        taken: set[int] = set()
        cpu = pick(self._allowed)
        # Siblings starting together may pick the same core: the one whose hold lands
        # keeps it, the other picks again. Every core held: share one.
        while cpu not in taken and not self._take(cpu):
            taken.add(cpu)
            cpu = pick(self._allowed, taken)
        if not self._pin(cpu):
            forget()
            return
        os.register_at_fork(after_in_child=restore_original)
        self._thread = threading.Thread(target=self._loop, name="cpu-affinity", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self._release()

    def _stat(self) -> dict[int, CpuTimes]:
        try:
            return read_cpus(Path("/proc/stat").read_text())
        except OSError:
            return {}

    def _loop(self) -> None:
        pause_until = 0.0
        stat, cpu_s, at = self._stat(), _process_cpu_s(), time.monotonic()
        while not self._stop.wait(CHECK_EVERY_S):
            now_stat, now_cpu_s, now = self._stat(), _process_cpu_s(), time.monotonic()
            busy = busy_shares(stat, now_stat)
            own = (now_cpu_s - cpu_s) / max(1e-3, now - at)
            stat, cpu_s, at = now_stat, now_cpu_s, now
            if now < pause_until or self.cpu is None:
                continue
            here = self.cpu
            target = move_to(here, self._allowed, busy, own)
            if target is None or not self._take(target):
                continue  # nowhere better, or a sibling holds it
            if self._pin(target):
                self.moves += 1
                log.info("cpu affinity: moved from core %d to core %d (other work took %.0f%% of core %d)",
                         here, target, 100 * (busy.get(here, 0.0) - own), here)
            # Randomised, so two crowded processes that moved at once do not move back together.
            pause_until = time.monotonic() + PAUSE_AFTER_MOVE_S * random.uniform(1.0, 1.5)

    def _pin(self, cpu: int) -> bool:
        """Every thread of the process on ``cpu``: a thread's mask is its own, and one
        started while the others are being moved inherits its creator's, so the pass
        repeats until it finds no thread it has not moved."""
        done: set[int] = set()
        try:
            os.sched_setaffinity(0, {cpu})
            for _ in range(10):
                tids = {int(t) for t in os.listdir("/proc/self/task")} - done
                if not tids:
                    break
                for tid in tids:
                    with contextlib.suppress(ProcessLookupError):
                        os.sched_setaffinity(tid, {cpu})
                done |= tids
        except OSError as exc:
            log.info("cpu affinity: could not keep to core %d (%s); the threads run on any core", cpu, exc)
            return False
        self.cpu = cpu
        return True

    def _take(self, cpu: int) -> bool:
        """Hold core ``cpu`` against siblings (releasing the core held before); False when
        a sibling holds it. Without a socket to bind, nobody can hold one: True."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(f"\0runner-cpu:{self._space}:{cpu}")
        except OSError as exc:
            sock.close()
            return exc.errno != errno.EADDRINUSE
        self._release()
        self._hold = sock
        return True

    def _release(self) -> None:
        if self._hold is not None:
            self._hold.close()
            self._hold = None


def forget() -> None:
    """This process does not keep to a core: its children have nothing to restore (an
    inherited mask from a worker above it would widen one narrowed since)."""
    os.environ.pop(ORIGINAL_ENV, None)


def restore_original() -> None:
    """In a child process: the mask the worker had before it kept to one core."""
    original = parse_cpus(os.environ.get(ORIGINAL_ENV, ""))
    if original and hasattr(os, "sched_setaffinity"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, original)
