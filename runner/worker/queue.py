"""One queue's runner: four parts around two in-process queues (the inbox of claimed
runs and the outcomes queue of settlements), started and stopped in an order that keeps
every claim settled or leased. (Not to be confused with a queue's outbox, the Redis list
of follow-ups for other queues that the relay moves: relay.py.)

    fetcher ──claim batch──> inbox ──> executors (concurrency slots) ──> outcomes ──> settler
       ^  idle: BLPOP on the queue's notify list                 ack/retry/bury/release,
       └──────────────── room freed when a handler returns          one pipeline per batch
    renewer: renews every held run's lease (and limit slots) every visibility_timeout/3,
             and enforces TIMEOUT on handlers in threads; asleep while nothing is held

The ledger (ledger.py) is what they share: the runs held and the room left. Claims and
settlements are batched, so a deep queue costs a few round trips per batch, not per
job. Every state change is one fenced script: a worker whose lease was lost is refused
and changes nothing.
"""

from __future__ import annotations

import logging
import queue as stdqueue
import time

from runner.config import QueueConfig
from runner.runtime import Runtime
from runner.worker.executors import Executors
from runner.worker.fetcher import Fetcher
from runner.worker.ledger import Ledger, Release, Run, Settlement
from runner.worker.renewer import Renewer
from runner.worker.settler import Settler

log = logging.getLogger("runner.worker")

# How long the stop waits for a claim still in flight (bounded by the socket timeout).
CLAIM_LANDING_S = 16.0


# The most runs a queue's worker holds for its BATCH functions' batches (see capacity_for).
BATCH_HOLD_MAX = 10_000


def capacity_for(runtime: Runtime, queue: QueueConfig) -> int:
    """How many runs the queue's worker holds at once: one per executor plus ``prefetch``
    claimed ahead, and for a BATCH function room for every executor's batch and the next
    one gathering (a batch can only hold what was claimed)."""
    base = queue.concurrency + queue.prefetch
    sizes = [f.batch.size for f in runtime.registry.for_queue(queue.name) if f.batch is not None]
    if not sizes:
        return base
    return max(base, min(BATCH_HOLD_MAX, (queue.concurrency + 1) * max(sizes)))


def claim_size_for(runtime: Runtime, queue: QueueConfig) -> int:
    """Jobs asked of one claim: the queue's ``batch``, or for a queue with BATCH functions
    their largest ``size`` when that is more, so one claim round trip can fill a batch
    (a batch of 100 took two claims of 64, each a round trip the fetcher waits for)."""
    sizes = [f.batch.size for f in runtime.registry.for_queue(queue.name) if f.batch is not None]
    return max([queue.batch, *sizes])


class QueueRunner:
    def __init__(self, runtime: Runtime, queue: QueueConfig, worker_id: str) -> None:
        self.q = queue
        capacity = capacity_for(runtime, queue)
        self.ledger = Ledger(queue.concurrency, capacity, low_water=max(1, min(queue.batch, capacity // 2)))
        inbox: stdqueue.SimpleQueue[Run | None] = stdqueue.SimpleQueue()
        outcomes: stdqueue.SimpleQueue[Settlement | None] = stdqueue.SimpleQueue()
        self.renewer = Renewer(runtime, queue, self.ledger)
        self.settler = Settler(runtime, queue, self.ledger, outcomes)
        self.executors = Executors(runtime, queue, self.ledger, inbox, outcomes, self.renewer.renew_one)
        self.renewer.abandon = self.executors.abandon
        self.executors.expect = self.renewer.expect
        self.ledger.on_hold = self.renewer.held
        self.renewer.cancelled = self.cancelled
        self.settler.cancelled = self.cancelled
        self.fetcher = Fetcher(runtime, queue, self.ledger, inbox, outcomes, worker_id)
        self.fetcher.startable = self.executors.startable
        self.fetcher.capacity_for = capacity_for
        self.fetcher.claim_size_for = claim_size_for
        self.fetcher.charge_later = self.executors.charge_later
        self.fetcher.hold_claimed = self.executors.hold_claimed
        self.outcomes = outcomes

    def cancel_ahead(self, job_id: str, token: str) -> None:
        """A cancel took a claim (the cancels channel): drop it if it is ours and has not
        started."""
        run = self.ledger.find(job_id, token)
        if run is not None:
            self.cancelled(run)

    def paused_ahead(self, function: str | None) -> None:
        """The queue (``function`` None) or one function was paused: the runs claimed
        ahead of it that no executor has taken go back, spending nothing; the next claim
        holds them (a function's) or leaves them (a queue's) until the resume."""
        n = 0
        for r in self.ledger.snapshot():
            if (function is None or r.job.type == function) and self.ledger.doom(r):
                self.outcomes.put(Settlement(r, Release()))
                n += 1
        if n:
            log.info("%s: %d job(s) claimed ahead handed back for a pause of %s", self.q.name, n,
                     f"function {function}" if function else "the queue")

    def cancelled(self, run: Run) -> None:
        """A cancel reached a run, by the cancels channel, a renewal or a start mark: one
        no executor has taken is handed back, never started (release.lua ends it
        cancelled); a running one's handler is told (ctx.cancelled)."""
        if self.ledger.doom(run):
            self.outcomes.put(Settlement(run, Release()))
            log.info("job %s: cancelled before it started", run.job.id, extra={"job_id": run.job.id})
        elif not run.flags.cancelled and self.ledger.holds(run):
            run.flags.cancelled = True
            run.cancelled_at = time.monotonic()
            log.info("job %s: cancelled; the handler sees ctx.cancelled", run.job.id, extra={"job_id": run.job.id})

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
        """Stop claiming; hand back what has not started; let running handlers finish
        within ``grace_s`` and stop the rest (executors.stop says how); wait for a claim
        still in flight to land and hand it back; then flush every settlement. The
        renewer stops last: leases stay alive until their jobs are settled."""
        self.fetcher.stop()
        self.executors.stop(grace_s)
        t0 = time.monotonic()
        if not self.fetcher.join(CLAIM_LANDING_S):
            log.warning("%s: a claim is still in flight after %.0f s; its jobs come back when their "
                        "lease lapses, without spending an attempt", self.q.name, time.monotonic() - t0)
        self.settler.stop()
        self.renewer.stop()
