"""The fetcher: claims batches of ready jobs while the queue's runner has room, and
blocks on the queue's notify list when there is nothing to claim (no polling)."""

from __future__ import annotations

import logging
import queue as stdqueue
import random
import threading

from runner.config import QueueConfig
from runner.runtime import Runtime
from runner.store import records
from runner.store.connection import UNAVAILABLE
from runner.store.outage import Outage
from runner.worker.execute import Claimed
from runner.worker.faults import fault
from runner.worker.ledger import Ledger, Owned

log = logging.getLogger("runner.worker")

CLAIM_FIELDS = 12


def _int_or(value: object, default: int) -> int:
    if not value:  # a field at its default comes back empty: no exception for the common case
        return default
    try:
        return int(value)  # type: ignore[call-overload, no-any-return]
    except (TypeError, ValueError):
        return default


class Fetcher:
    def __init__(self, runtime: Runtime, queue: QueueConfig, ledger: Ledger,
                 inbox: stdqueue.SimpleQueue[Owned | None], worker_id: str) -> None:
        self.rt = runtime
        self.q = queue
        self.keys = runtime.keys[queue.name]
        self.ledger = ledger
        self.inbox = inbox
        self.worker_id = worker_id
        ret = runtime.config.retention
        self.done_ttl_ms = int(ret.done_s * 1000)
        self.dead_ttl_ms = int(ret.dead_s * 1000)
        self.lease_ms = int(queue.visibility_timeout_s * 1000)
        self.stopping = threading.Event()
        self._seq = 0
        self._thread = threading.Thread(target=self._loop, name=f"{queue.name}-fetch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop claiming; returns once no claim is in flight (or after 5 s)."""
        self.stopping.set()
        self.ledger.wake()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        outage = Outage(f"{self.q.name} fetcher", log)
        r = self.rt.redis
        while not self.stopping.is_set():
            free = self.ledger.room(self.stopping)
            if self.stopping.is_set():
                break
            try:
                fault("before_claim")
                got = self.claim(min(free, self.q.batch))
                outage.ok()
                if got == 0:
                    r.blpop([self.keys.notify], timeout=1)
            except UNAVAILABLE as exc:
                outage.failed(exc, self.stopping)
            except Exception:
                log.exception("%s fetcher: unexpected error; continuing", self.q.name)
                self.stopping.wait(0.5)

    def claim(self, n: int) -> int:
        self._seq += 1
        now = records.now_ms()
        reply = self.rt.scripts.claim(
            self.keys, now_ms=now, n=n, lease_ms=self.lease_ms,
            token_base=f"{self.worker_id}.{self._seq}", defer_base_ms=50, defer_cap_ms=5000,
            rnd=random.random(), dead_ttl_ms=self.dead_ttl_ms, done_ttl_ms=self.done_ttl_ms,
        )
        count = len(reply) // CLAIM_FIELDS
        if not count:
            return 0
        fault("after_claim")
        qname = self.q.name
        batch: list[Owned] = []
        for i in range(0, len(reply), CLAIM_FIELDS):
            f = reply[i:i + CLAIM_FIELDS]
            # claim.lua vouches for attempt and max_attempts; the timestamps are only
            # figures, so a damaged one must not cost the batch.
            created = _int_or(f[10], now)
            job = Claimed(
                id=f[0], token=f[1], attempt=int(f[2]), type=f[3], version_raw=f[4],
                payload_raw=f[5], max_attempts=int(f[6] or 1), idem_key=f[7],
                resource_key=f[8], ready_ms=_int_or(f[9], created), created_ms=created,
                checkpoint_raw=f[11], queue=qname, claimed_ms=now,
            )
            batch.append(Owned(job))
        self.ledger.claimed(batch)
        for o in batch:
            self.inbox.put(o)
        return count
