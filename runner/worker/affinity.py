"""CPU affinity: a worker process keeps its threads on one core.

One interpreter runs Python on one thread at a time (the GIL). When its threads may run
on every core, each hand-off of the GIL between threads that block on I/O wakes a thread
on another core, and the two cores pass the lock back and forth: measured on 2 cores, 16
threads each making Redis round trips spent 64 us of CPU per round trip, 4.3 context
switches, against 15 us and 1.0 on one core. A worker whose handlers block on I/O drains
more on fewer cycles when its threads share one core; the cores left over go to the other
worker processes and to Redis.

Which core: at start, the least busy of the cores the process may use (its affinity
mask, so `taskset` and cgroup cpusets are obeyed), skipping one that a sibling worker on
this host already holds (an advisory lock file per core in the temporary directory; a
killed process's lock goes with it). While running, when this process's threads wait for
their core (the run delay in /proc's schedstat) and another core has room, it moves there;
a move is followed by a pause, so two processes do not chase each other.

Handlers that run in child processes (ISOLATION = "process") get the process's original
mask back (child.py reads it from RUNNER_CPUS_ORIGINAL), so they spread over every core.
Linux only; elsewhere, with one usable core, or with ``[worker] cpu_affinity = "off"``,
nothing changes.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import random
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
# Move when this process's threads waited for their core this share of the interval...
CROWDED = 0.15
# ...and another core was idle at least this share of it.
ROOMY = 0.5


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


def idle_shares(before: Mapping[int, CpuTimes], after: Mapping[int, CpuTimes]) -> dict[int, float]:
    """Each core's idle share between two readings (1.0: idle throughout)."""
    out: dict[int, float] = {}
    for cpu, a in after.items():
        b = before.get(cpu)
        if b is None or a.total <= b.total:
            continue
        out[cpu] = 1.0 - (a.busy - b.busy) / (a.total - b.total)
    return out


def pick(allowed: Iterable[int], idle: Mapping[int, float], taken: Iterable[int] = ()) -> int:
    """The core to start on: the idlest allowed core no sibling holds (any allowed core
    when every one is held); ties go to the lowest number."""
    pool = sorted(allowed)
    held = set(taken)
    free = [c for c in pool if c not in held] or pool
    return max(free, key=lambda c: (idle.get(c, 0.0), -c))


def move_to(current: int, allowed: Iterable[int], idle: Mapping[int, float], waited: float) -> int | None:
    """Where to move when this process's threads waited ``waited`` (a share of the
    interval) for ``current``: the idlest other core if it had room, else nowhere."""
    if waited < CROWDED:
        return None
    others = [c for c in allowed if c != current and idle.get(c, 0.0) >= ROOMY]
    if not others:
        return None
    return max(others, key=lambda c: (idle.get(c, 0.0), -c))


def run_delay_s(pid: int) -> float:
    """Seconds this process's threads have spent runnable but waiting for a core."""
    total = 0
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[1])
    return total / 1e9


def format_cpus(cpus: Iterable[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def parse_cpus(text: str) -> set[int]:
    return {int(c) for c in text.split(",") if c.strip().isdigit()}


class Affinity:
    """Keeps this process on one core (see the module docstring); start()/stop()."""

    def __init__(self, lock_dir: str | None = None) -> None:
        self.lock_dir = Path(lock_dir or tempfile.gettempdir())
        self.cpu: int | None = None
        self.moves = 0
        self._allowed: Sequence[int] = ()
        self._lock_fd: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def supported() -> bool:
        return hasattr(os, "sched_setaffinity") and Path("/proc/stat").exists()

    def start(self) -> None:
        if not self.supported():
            return
        self._allowed = sorted(os.sched_getaffinity(0))
        if len(self._allowed) < 2:
            return
        os.environ.setdefault(ORIGINAL_ENV, format_cpus(self._allowed))
        self._thread = threading.Thread(target=self._loop, name="cpu-affinity", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self._unlock()

    def _stat(self) -> dict[int, CpuTimes]:
        try:
            return read_cpus(Path("/proc/stat").read_text())
        except OSError:
            return {}

    def _loop(self) -> None:
        before = self._stat()
        if self._stop.wait(0.1):
            return
        after = self._stat()
        idle = idle_shares(before, after)
        taken: set[int] = set()
        cpu = pick(self._allowed, idle)
        # Siblings starting together may pick the same core: the one that gets its lock
        # keeps it, the other picks again. Every core held: share the idlest.
        while cpu not in taken and not self._try_lock(cpu):
            taken.add(cpu)
            cpu = pick(self._allowed, idle, taken)
        self._pin(cpu, "start")
        pause_until = 0.0
        delay, stat = run_delay_s(os.getpid()), after
        while not self._stop.wait(CHECK_EVERY_S):
            now_delay, now_stat = run_delay_s(os.getpid()), self._stat()
            waited = (now_delay - delay) / CHECK_EVERY_S
            idle = idle_shares(stat, now_stat)
            delay, stat = now_delay, now_stat
            if time.monotonic() < pause_until or self.cpu is None:
                continue
            target = move_to(self.cpu, self._allowed, idle, waited)
            if target is not None:
                self._unlock()
                self._try_lock(target)
                self._pin(target, f"its threads waited {waited:.0%} of the time for core {self.cpu}")
                self.moves += 1
                # Randomised, so two crowded processes that moved at once do not move back together.
                pause_until = time.monotonic() + PAUSE_AFTER_MOVE_S * random.uniform(1.0, 1.5)

    def _pin(self, cpu: int, why: str) -> None:
        try:
            os.sched_setaffinity(0, {cpu})
            # Every thread of the process: the mask of a running thread is its own.
            for tid in os.listdir("/proc/self/task"):
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(int(tid), {cpu})
        except OSError as exc:
            log.info("cpu affinity: could not keep to core %d (%s); the threads run on any core", cpu, exc)
            return
        self.cpu = cpu
        log.debug("cpu affinity: on core %d (%s)", cpu, why)

    def _try_lock(self, cpu: int) -> bool:
        """Hold core ``cpu``'s advisory lock (releasing any other); False when a sibling
        holds it."""
        path = self.lock_dir / f"runner-cpu-{cpu}.lock"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
        except OSError:
            return True  # no lock to be had: do not let it steer the choice
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._unlock()
        self._lock_fd = fd
        return True

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd = None


def restore_original() -> None:
    """In a child process: the mask the worker had before it kept to one core."""
    original = parse_cpus(os.environ.get(ORIGINAL_ENV, ""))
    if original and hasattr(os, "sched_setaffinity"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, original)
