"""The scheduler: promote due jobs (delayed, retrying, deferred) to ready, reclaim jobs
whose lease lapsed, and trim expired dead-letter entries and done jobs past their
retention (a success does not set a TTL on its record: see keys.py), and relay
follow-ups that acks left in an outbox for another queue (relay.py).

It runs inside every worker process. Each move is one atomic script that re-checks the
state it moves from, so any number of schedulers can run at once without moving a job
twice. It sleeps until the next due job (at most scheduler_interval), so a delay of
100 ms is honoured to within a few ms.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from runner.client import Client
from runner.runtime import Runtime
from runner.store import roster, tagset
from runner.store.connection import UNAVAILABLE
from runner.store.keys import QueueKeys
from runner.store.outage import Outage
from runner.worker import relay
from runner.worker.lifeline import vital

log = logging.getLogger("runner.scheduler")

BATCH = 1000
TRIM_EVERY_S = 60.0
TRIM_ROUNDS = 25  # trim calls per queue and pass, BATCH * 2 done jobs each


class Scheduler:
    def __init__(self, runtime: Runtime, member: Callable[[], roster.Member] | None = None,
                 found: Callable[[list[QueueKeys]], None] | None = None) -> None:
        self.rt = runtime
        self.member = member  # this worker's roster entry, written every HEARTBEAT_S
        self.found = found  # told of draining partitions found after the start
        self._empty_since: dict[tuple[str, str], float] = {}  # draining partitions seen empty
        self._stop = threading.Event()
        self._thread = threading.Thread(target=vital(self._loop), name="scheduler", daemon=True)
        self._last_trim = 0.0
        self._client: Client | None = None  # builds ON_FAILURE jobs for reclaimed deaths
        self._next_beat = 0.0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def tick(self) -> float:
        """One pass over every queue (every partition of each); returns seconds until the
        next due job (capped)."""
        if self.member is not None and time.monotonic() >= self._next_beat:
            roster.beat(self.rt.redis, self.rt.config.redis.prefix, self.member())
            self._next_beat = time.monotonic() + roster.HEARTBEAT_S
        new = self.rt.discover_due(record=True)
        if new and self.found is not None:
            self.found(new)
        sc = self.rt.scripts
        interval = self.rt.config.worker.scheduler_interval_s
        wait = interval
        ret = self.rt.config.retention
        dead_ms, done_ms = int(ret.dead_s * 1000), int(ret.done_s * 1000)
        # A short retention (dev, tests) is honoured to within a quarter of itself.
        every = min(TRIM_EVERY_S, max(0.1, min(ret.done_s, ret.dead_s) / 4))
        trim = time.monotonic() - self._last_trim > every
        more = False
        for k in (k for parts in self.rt.parts.values() for k in parts):  # every partition of every queue
            while True:
                moved, due_in = sc.promote(k, BATCH)
                if int(moved) < BATCH:
                    break
            if int(due_in) >= 0:
                wait = min(wait, max(0.002, int(due_in) / 1000))
            if relay.drain(self.rt, k) >= relay.BATCH:
                wait = 0.002  # more waiting: come back at once
            lost = trim  # now and then, for a list a dead scheduler left
            while True:
                requeued, buried = sc.reclaim(k, BATCH, dead_ms)
                if int(requeued) or int(buried):
                    log.warning("queue %s: reclaimed %s lapsed lease(s), %s buried as worker lost",
                                k.queue, requeued, buried)
                lost = lost or int(buried) > 0
                if int(requeued) + int(buried) < BATCH:
                    break
            if lost:
                if self._client is None:
                    self._client = Client(self.rt)
                while relay.lost_destinations(self.rt, self._client, k) >= relay.BATCH:
                    pass
            if trim:
                for _ in range(TRIM_ROUNDS):
                    dead, _gen = sc.trim(k, dead_ms, done_ms, BATCH * 2, ret.done_max)
                    if int(dead) < BATCH * 2:
                        break
                else:
                    more = True  # a backlog past retention: come back soon, not in a minute
                if k.draining:
                    self._retire(k, ret.done_s)
        if trim:
            self._last_trim = time.monotonic() - (every if more else 0.0)
        return wait

    def _retire(self, k: QueueKeys, done_s: float) -> None:
        """Stop recording a draining partition once it held nothing for a whole retention
        (by then its done jobs' outcomes have gone too): processes started later leave it
        out. This one keeps looking at it, which costs a claim now and then."""
        if not tagset.drained(self.rt.redis, k):
            self._empty_since.pop((k.queue, k.tag), None)
            return
        since = self._empty_since.setdefault((k.queue, k.tag), time.monotonic())
        if time.monotonic() - since >= done_s:
            tagset.retire(self.rt.redis, k)
            if since != float("-inf"):
                log.info("queue %s: partition {%s} has drained; no longer recorded", k.queue, k.tag)
            self._empty_since[(k.queue, k.tag)] = float("-inf")  # said once

    def _loop(self) -> None:
        outage = Outage("scheduler", log)
        while not self._stop.is_set():
            try:
                wait = self.tick()
                outage.ok()
            except UNAVAILABLE as exc:
                outage.failed(exc, self._stop)
                continue
            except Exception:
                log.exception("scheduler: unexpected error; continuing")
                wait = 1.0
            self._stop.wait(wait)
