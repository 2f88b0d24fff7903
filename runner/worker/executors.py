"""The executors: ``concurrency`` threads that take claimed runs off the inbox, run the
handler under its timeout (execute.py) and hand the outcome to the settler."""

from __future__ import annotations

import asyncio
import logging
import queue as stdqueue
import threading
import time
from collections.abc import Callable
from typing import Any

from runner.config import QueueConfig
from runner.errors import describe
from runner.runtime import Runtime
from runner.store import codec, records
from runner.worker.context import Context
from runner.worker.execute import Claimed, Dead, JobTimeout, Outcome, RetryLater, resolve, run
from runner.worker.faults import fault
from runner.worker.ledger import Ledger, Owned, Release, Settlement

log = logging.getLogger("runner.worker")
joblog = logging.getLogger("runner.job")


class Executors:
    def __init__(self, runtime: Runtime, queue: QueueConfig, ledger: Ledger,
                 inbox: stdqueue.SimpleQueue[Owned | None], outbox: stdqueue.SimpleQueue[Settlement | None],
                 loop: asyncio.AbstractEventLoop | None, renew_one: Callable[[Claimed], bool]) -> None:
        self.rt = runtime
        self.q = queue
        self.keys = runtime.keys[queue.name]
        self.ledger = ledger
        self.inbox = inbox
        self.outbox = outbox
        self.loop = loop
        self.renew_one = renew_one
        self.releasing = threading.Event()
        self._threads = [threading.Thread(target=self._loop, name=f"{queue.name}-exec-{i}", daemon=True)
                         for i in range(queue.concurrency)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self, grace_s: float) -> list[Owned]:
        """Release what has not started, let running handlers finish within ``grace_s``;
        returns the runs still running after it."""
        self.releasing.set()
        for _ in self._threads:
            self.inbox.put(None)
        deadline = time.monotonic() + grace_s
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        return self.ledger.running()

    def _loop(self) -> None:
        while True:
            try:
                owned = self.inbox.get()
                if owned is None:
                    return
                self.ledger.picked()
                if self.releasing.is_set():
                    self.outbox.put(Settlement(owned, Release()))
                    continue
                try:
                    settlement = self._execute(owned)
                except BaseException as exc:  # a late timeout, or a bug: never strand a claim
                    settlement = Settlement(owned, _unexpected(owned.job, exc))
                self.outbox.put(settlement)
            except JobTimeout:
                continue  # a timeout that landed between two jobs
            finally:
                self.ledger.returned()

    def _execute(self, owned: Owned) -> Settlement:
        job = owned.job
        registry = self.rt.registry  # one snapshot per job: a reload never changes it mid-run
        resolved = resolve(job, registry)
        if isinstance(resolved, Dead):
            return Settlement(owned, resolved)
        fn, payload, version = resolved
        started_ms = records.now_ms()
        ctx = Context(
            job_id=job.id, type=job.type, version=version, queue=job.queue,
            attempt=job.attempt, max_attempts=job.max_attempts, token=job.token,
            deadline=time.time() + fn.timeout_s,
            idempotency_key=job.idem_key or None, resource_key=job.resource_key or None,
            logger=logging.LoggerAdapter(joblog, {"job_id": job.id, "type": job.type,
                                                   "attempt": job.attempt}),
            _checkpoint=codec.loads(job.checkpoint_raw) if job.checkpoint_raw else None,
            _save=lambda body: int(self.rt.scripts.checkpoint(self.keys, job.id, job.token, body)) > 0,
            _extend=lambda: self.renew_one(job),
        )

        def guard(body: Callable[[], Any]) -> Any:
            with self.ledger.lock:
                owned.thread_id = threading.get_ident()
                owned.deadline = time.monotonic() + fn.timeout_s
            try:
                fault("mid_handler")
                return body()
            finally:
                with self.ledger.lock:
                    owned.thread_id = None
                    owned.deadline = None

        outcome, run_s = run(fn, payload, job, ctx, self.loop, guard)
        fault("after_handler")
        return Settlement(owned, outcome, run_s=run_s, started_ms=started_ms)


def _unexpected(job: Claimed, exc: BaseException) -> Outcome:
    log.exception("job %s: unexpected error outside the handler", job.id, exc_info=exc)
    err = describe(exc)
    if job.attempt >= job.max_attempts:
        return Dead(reason="max attempts reached", error=err, refund=False)
    return RetryLater(delay_s=1.0, error=err)
