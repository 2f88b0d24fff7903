"""The bell: how a fetcher waits, without polling, until a partition of its queue has
news (a token on its notify list, pushed by the scripts that make a job ready).

One BLPOP over every notify list of the queue; Redis Cluster refuses a BLPOP over
several slots, so there each partition gets a thread of its own blocked on its list."""

from __future__ import annotations

import logging
import queue as stdqueue
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from redis.cluster import RedisCluster

from runner.store.keys import QueueKeys
from runner.store.outage import OUTAGE, Outage

if TYPE_CHECKING:
    from runner.store.transport import Transport

log = logging.getLogger("runner.worker")

# The longest a fetcher waits for a wake-up before it claims anyway (a wake-up lost to a
# restart of Redis costs at most this) and sees a stop.
BELL_S = 1.0


class Bell:
    """Waits until any partition of a queue has news (a token on its notify list).

    One partition, or all partitions on one server (a single Redis, Sentinel): one BLPOP
    over every notify list. Redis Cluster refuses a BLPOP over several slots, so there each
    partition gets a thread of its own blocked on its list, and ``wait`` hears whichever
    rings first. ``wait`` returns the partition that rang, or None at the timeout."""

    def __init__(self, client: Any, parts: Sequence[QueueKeys], name: str, transport: Transport | None = None) -> None:
        self.client = client
        # Sends the BLPOP on a kept connection, so a stop ends it at once (Transport.unblock).
        self.transport = transport
        self.parts = parts  # the runtime's list: a draining partition found later joins it
        self.name = name
        self.rung: stdqueue.SimpleQueue[int] = stdqueue.SimpleQueue()
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []
        self.cluster = isinstance(client, RedisCluster)
        self.by_key: dict[str, int] = {}
        self._grow()

    def _grow(self) -> None:
        """Take in partitions added to ``parts`` since the last call."""
        if len(self.by_key) == len(self.parts):
            return
        self.by_key = {k.notify: i for i, k in enumerate(self.parts)}
        if self.cluster and len(self.parts) > 1:
            for i in range(len(self.threads), len(self.parts)):
                t = threading.Thread(target=self._listen, args=(i,), name=f"{self.name}-bell-{i}", daemon=True)
                self.threads.append(t)
                t.start()

    def wait(self, timeout_s: float) -> int | None:
        self._grow()
        if not self.threads:
            keys = list(self.by_key)
            if self.transport is not None:
                got = self.transport.blocking(("BLPOP", *keys, f"{timeout_s:g}"), keys)
            else:
                got = self.client.blpop(keys, timeout=timeout_s)
            return self.by_key.get(got[0]) if got else None
        try:
            first = self.rung.get(timeout=timeout_s)
        except stdqueue.Empty:
            return None
        while True:  # rings that queued up meanwhile are the same news
            try:
                self.rung.get_nowait()
            except stdqueue.Empty:
                return first

    def ring(self, i: int) -> None:
        """Wake ``wait`` as if partition ``i`` had news (a claim in flight that landed
        full: more may wait there). Redis Cluster with several partitions only."""
        self.rung.put(i)

    def _listen(self, i: int) -> None:
        outage = Outage(f"{self.name} bell {i}", log)
        notify = self.parts[i].notify
        while not self.stopping.is_set():
            try:
                if self.client.blpop([notify], timeout=BELL_S):
                    self.rung.put(i)
                outage.ok()
            except OUTAGE as exc:
                outage.failed(exc, self.stopping)
            except Exception:
                log.exception("%s bell %d: unexpected error; continuing", self.name, i)
                self.stopping.wait(0.5)

    def stop(self) -> None:
        self.stopping.set()
