"""The lease renewer: renews every owned lease (and resource lock) every third of the
visibility timeout, and interrupts handlers that pass their TIMEOUT."""

from __future__ import annotations

import ctypes
import logging
import threading
import time

from runner.config import QueueConfig
from runner.runtime import Runtime
from runner.store import records
from runner.store.connection import UNAVAILABLE
from runner.store.outage import Outage
from runner.worker.execute import Claimed, JobTimeout
from runner.worker.ledger import Ledger

log = logging.getLogger("runner.worker")

CHUNK = 500


class Renewer:
    def __init__(self, runtime: Runtime, queue: QueueConfig, ledger: Ledger) -> None:
        self.rt = runtime
        self.q = queue
        self.keys = runtime.keys[queue.name]
        self.ledger = ledger
        self.lease_ms = int(queue.visibility_timeout_s * 1000)
        self.stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"{queue.name}-renew", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self._thread.join(timeout=2)

    def renew_one(self, job: Claimed) -> bool:
        codes = self.rt.scripts.renew(self.keys, [(job.id, job.token)], records.now_ms(), self.lease_ms)
        return int(codes[0]) > 0

    def _loop(self) -> None:
        outage = Outage(f"{self.q.name} renewer", log)
        every = max(0.2, self.q.visibility_timeout_s / 3)
        next_renew = time.monotonic() + every
        while not self.stopping.wait(0.1):
            self._enforce_timeouts()
            if time.monotonic() < next_renew:
                continue
            owned = self.ledger.renewable()
            try:
                for i in range(0, len(owned), CHUNK):
                    chunk = owned[i:i + CHUNK]
                    codes = self.rt.scripts.renew(self.keys, chunk, records.now_ms(), self.lease_ms)
                    for (job_id, _), code in zip(chunk, codes, strict=True):
                        if int(code) == -1 and self.ledger.mark_lost(job_id):
                            log.warning("job %s: lease lost (reclaimed elsewhere)", job_id)
                outage.ok()
                next_renew = time.monotonic() + every
            except UNAVAILABLE as exc:
                outage.failed(exc, self.stopping)
            except Exception as exc:  # never let renewal die silently: leases would lapse
                log.exception("%s renewer: renewing failed (%s); retrying", self.q.name, exc)
                outage.failed(exc, self.stopping)

    def _enforce_timeouts(self) -> None:
        now = time.monotonic()
        with self.ledger.lock:
            for o in self.ledger.owned.values():
                if o.thread_id is not None and o.deadline is not None and now > o.deadline \
                        and not o.timed_out:
                    o.timed_out = True
                    exc = ctypes.py_object(JobTimeout)
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(o.thread_id), exc)
                    log.warning("job %s: past its TIMEOUT; interrupting the handler", o.job.id)
