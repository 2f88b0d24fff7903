"""One queue's runner: four parts around two in-process queues, started and stopped
in an order that keeps every claim settled or leased.

    fetcher ──claim batch──> inbox ──> executors (concurrency) ──> outbox ──> settler
       ^  idle: BLPOP on the queue's notify list              ack/retry/bury/release,
       └──────────────── room freed when a handler returns        one pipeline per batch
    renewer: renews every owned lease (and resource lock) every visibility_timeout/3,
             and interrupts handlers that pass their TIMEOUT

The ledger (ledger.py) is what they share: the runs held and the room left. Claims and
settlements are batched, so a deep queue costs a few round trips per batch, not per
job. Every state change is one fenced script: a worker whose lease was lost is refused
and changes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import queue as stdqueue

from runner.config import QueueConfig
from runner.runtime import Runtime
from runner.worker.executors import Executors
from runner.worker.fetcher import Fetcher
from runner.worker.ledger import Ledger, Owned, Release, Settlement
from runner.worker.renewer import Renewer
from runner.worker.settler import Settler

log = logging.getLogger("runner.worker")


class QueueRunner:
    def __init__(self, runtime: Runtime, queue: QueueConfig, loop: asyncio.AbstractEventLoop | None,
                 worker_id: str) -> None:
        self.q = queue
        capacity = queue.concurrency + queue.prefetch
        self.ledger = Ledger(capacity, low_water=max(1, min(queue.batch, capacity // 2)))
        inbox: stdqueue.SimpleQueue[Owned | None] = stdqueue.SimpleQueue()
        outbox: stdqueue.SimpleQueue[Settlement | None] = stdqueue.SimpleQueue()
        self.renewer = Renewer(runtime, queue, self.ledger)
        self.settler = Settler(runtime, queue, self.ledger, outbox)
        self.executors = Executors(runtime, queue, self.ledger, inbox, outbox, loop, self.renewer.renew_one)
        self.fetcher = Fetcher(runtime, queue, self.ledger, inbox, worker_id)

    @property
    def processed(self) -> int:
        return self.settler.processed

    def start(self) -> None:
        # What settles and renews first, so anything claimed is looked after from the
        # start; the fetcher last, once there is somewhere for its claims to go.
        self.settler.start()
        self.renewer.start()
        self.executors.start()
        self.fetcher.start()

    def stop(self, grace_s: float) -> None:
        """Stop claiming, release what has not started, let running handlers finish
        within ``grace_s``, release the rest, then flush every settlement. The renewer
        stops last: leases stay alive until their jobs are settled."""
        self.fetcher.stop()
        still = self.executors.stop(grace_s)
        if still:
            log.warning("%s: %d job(s) still running after the grace period; releasing them",
                        self.q.name, len(still))
            self.settler.settle([Settlement(o, Release()) for o in still])
        self.settler.stop()
        self.renewer.stop()
