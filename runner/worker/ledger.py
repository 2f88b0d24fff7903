"""The runs one queue's worker holds, and the room it has for more.

Every part of a queue's runner reads or writes it: the fetcher adds what it claimed and
waits here for room, the executors mark a run started and finished, the renewer walks it
to renew leases and enforce timeouts, the settler takes a run out once Redis has its
outcome. Nothing here talks to Redis.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from runner.worker.execute import Claimed, Outcome


@dataclass(frozen=True, slots=True)
class Release:
    """Hand the job back without spending an attempt (shutdown)."""


@dataclass(slots=True)
class Owned:
    job: Claimed
    thread_id: int | None = None
    deadline: float | None = None  # monotonic
    lost: bool = False
    timed_out: bool = False


@dataclass(slots=True)
class Settlement:
    owned: Owned
    outcome: Outcome | Release
    run_s: float = 0.0
    started_ms: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class Ledger:
    """Owned runs by job id, and the count of claimed runs not yet returned by a handler
    (``busy``) and not yet picked up by an executor (``waiting``)."""

    def __init__(self, capacity: int, low_water: int) -> None:
        # Owned at once: one job per executor plus up to `prefetch` claimed ahead, so a
        # deep queue is claimed in batches instead of one job per freed thread.
        self.capacity = capacity
        # Claim again once this much room opened up, or at once when no job is waiting
        # for an executor (then a thread is idle and latency matters more than batching).
        self.low_water = low_water
        self.busy = 0
        self.waiting = 0
        self.cond = threading.Condition()
        self.owned: dict[str, Owned] = {}
        self.lock = threading.Lock()

    def room(self, stop: threading.Event) -> int:
        """Block until there is room worth a claim (or ``stop`` is set: then 0)."""
        with self.cond:
            while not stop.is_set():
                room = self.capacity - self.busy
                if room >= self.low_water or (room > 0 and self.waiting == 0):
                    return room
                self.cond.wait(0.5)
            return 0

    def wake(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def claimed(self, batch: list[Owned]) -> None:
        with self.lock:
            for o in batch:
                self.owned[o.job.id] = o
        with self.cond:
            self.busy += len(batch)
            self.waiting += len(batch)

    def picked(self) -> None:
        """An executor took a claimed run off the inbox."""
        with self.cond:
            self.waiting -= 1
            if self.waiting == 0:
                self.cond.notify()

    def returned(self) -> None:
        """A run left its executor (finished, released or failed outside the handler)."""
        with self.cond:
            self.busy = max(0, self.busy - 1)
            self.cond.notify()

    def forget(self, runs: Iterable[Owned]) -> None:
        with self.lock:
            for o in runs:
                self.owned.pop(o.job.id, None)

    def running(self) -> list[Owned]:
        with self.lock:
            return [o for o in self.owned.values() if o.thread_id is not None]

    def renewable(self) -> list[tuple[str, str]]:
        with self.lock:
            return [(o.job.id, o.job.token) for o in self.owned.values() if not o.lost]

    def mark_lost(self, job_id: str) -> bool:
        with self.lock:
            o = self.owned.get(job_id)
            if o is None:
                return False
            o.lost = True
            return True
