"""A wait for calls to Redis masters that counts the time this process ran, not the time
that passed.

A call to a Redis Cluster master is given a bound (a reader's 2 s, a worker's node wait)
and its master is called stalled past it (transport.py: NodeLanes, Transport.each_master).
Measured on the wall clock, a process that could not run meanwhile (a host starved of
CPU, the process stopped, a thread holding the GIL in one long C call) took its own
stall for its masters': their answers sat unread in its sockets while the bound ran out.
A /metrics scrape on a loaded host, one master BUSY, gave every other master up as well
and said Redis was down (runner_redis_up 0). A wait here sleeps in steps of STEP_S at
most and counts each step for what it asked plus LATE_S at most: the rest of a step that
overslept is time this process did not run, and is not held against the calls. On time,
a step counts what it took, so a master that does not answer is given up when it was
(at the bound on the wall clock); a process starved meanwhile gives it that long of its
own running time.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from concurrent.futures import Future, wait
from typing import Any

STEP_S = 0.1  # the longest sleep of one step
LATE_S = 0.05  # how late a step may wake and still count whole (the scheduler's noise)


class RunClock:
    """The time this process ran since the clock was made, as its waits saw it."""

    __slots__ = ("spent",)

    def __init__(self) -> None:
        self.spent = 0.0

    def wait(self, futures: Collection[Future[Any]], until_s: float) -> bool:
        """Wait until every one of ``futures`` is done, or this clock reads ``until_s``;
        whether every one is done."""
        pending = [f for f in futures if not f.done()]
        while pending:
            left = until_s - self.spent
            if left <= 0:
                return False
            step = min(STEP_S, left)
            started = time.monotonic()
            pending = list(wait(pending, timeout=step).not_done)
            self.spent += min(time.monotonic() - started, step + LATE_S)
        return True
