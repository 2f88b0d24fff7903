"""The fetcher: claims batches of ready jobs while the queue's runner has room, and
blocks on the queue's notify list when there is nothing to claim (no polling).

A partitioned queue (docs/partitions.md) is claimed from partition by partition in turn,
so none starves; only after a whole round of empty answers does the fetcher block, on
every partition at once (see Bell).

A claim tells Redis how many of its jobs go to executors that are free now: those spend
their attempt at once, the rest are prefetched and spend it when they start. A claim
that lands after the stop began (Redis was slow) is handed straight back."""

from __future__ import annotations

import logging
import queue as stdqueue
import threading
from collections.abc import Sequence
from typing import Any

from redis.cluster import RedisCluster

from runner.config import QueueConfig
from runner.observe import tracing
from runner.runtime import Runtime
from runner.store import tracecontext
from runner.store.connection import UNAVAILABLE
from runner.store.keys import QueueKeys
from runner.store.outage import Outage
from runner.worker.execute import Claimed, expired
from runner.worker.faults import fault
from runner.worker.ledger import Ledger, Release, Run, Settlement
from runner.worker.lifeline import vital

log = logging.getLogger("runner.worker")

CLAIM_FIELDS = 14
HELD, BOUNDED = 1, 2  # why a claim stopped short (see claim.lua)
EXPIRED = 2  # a claimed job's "started" value when it is past its MAX_AGE (claim.lua)


def _int_or(value: object, default: int) -> int:
    if not value:  # a field at its default comes back empty: no exception for the common case
        return default
    try:
        return int(value)  # type: ignore[call-overload, no-any-return]
    except (TypeError, ValueError):
        return default


class Bell:
    """Waits until any partition of a queue has news (a token on its notify list).

    One partition, or all partitions on one server (a single Redis, Sentinel): one BLPOP
    over every notify list. Redis Cluster refuses a BLPOP over several slots, so there each
    partition gets a thread of its own blocked on its list, and ``wait`` hears whichever
    rings first. ``wait`` returns the partition that rang, or None at the timeout."""

    def __init__(self, client: Any, parts: Sequence[QueueKeys], name: str) -> None:
        self.client = client
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
            got = self.client.blpop(list(self.by_key), timeout=timeout_s)
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

    def _listen(self, i: int) -> None:
        outage = Outage(f"{self.name} bell {i}", log)
        notify = self.parts[i].notify
        while not self.stopping.is_set():
            try:
                if self.client.blpop([notify], timeout=1):
                    self.rung.put(i)
                outage.ok()
            except UNAVAILABLE as exc:
                outage.failed(exc, self.stopping)
            except Exception:
                log.exception("%s bell %d: unexpected error; continuing", self.name, i)
                self.stopping.wait(0.5)

    def stop(self) -> None:
        self.stopping.set()


class Fetcher:
    def __init__(self, runtime: Runtime, queue: QueueConfig, ledger: Ledger,
                 inbox: stdqueue.SimpleQueue[Run | None], outbox: stdqueue.SimpleQueue[Settlement | None],
                 worker_id: str) -> None:
        self.rt = runtime
        self.q = queue
        self.parts = runtime.parts[queue.name]
        self.ledger = ledger
        self.inbox = inbox
        self.outbox = outbox
        self.worker_id = worker_id
        ret = runtime.config.retention
        self.done_ttl_ms = int(ret.done_s * 1000)
        self.done_max = ret.done_max
        self.dead_ttl_ms = int(ret.dead_s * 1000)
        self.lease_ms = int(queue.visibility_timeout_s * 1000)
        # A worker that traces reads each claimed job's trace context (one more round trip
        # per claimed batch); one that does not never pays for it.
        self.trace_context = tracing.installed()
        self.stopping = threading.Event()
        self._seq = 0
        self._ages: tuple[object, str] = (None, "")  # (registry, its MAX_AGE argument)
        self._next = 0  # the partition claimed from next
        self._bell: Bell | None = None
        self._thread = threading.Thread(target=vital(self._loop), name=f"{queue.name}-fetch", daemon=True)

    def start(self) -> None:
        self._bell = Bell(self.rt.redis, self.parts, self.q.name)
        self._thread.start()

    def stop(self) -> None:
        """Stop claiming (a claim in flight may still land: see join)."""
        self.stopping.set()
        if self._bell is not None:
            self._bell.stop()
        self.ledger.wake()

    def join(self, timeout_s: float) -> bool:
        """Wait for a claim in flight to land (it hands its jobs back); True when none is."""
        self._thread.join(timeout=timeout_s)
        return not self._thread.is_alive()

    def _loop(self) -> None:
        outage = Outage(f"{self.q.name} fetcher", log)
        assert self._bell is not None
        empty = 0  # partitions in a row that had nothing to claim
        while not self.stopping.is_set():
            n = len(self.parts)  # grows when a draining partition is found (Runtime.discover)
            free, idle = self.ledger.room(self.stopping)
            if self.stopping.is_set():
                break
            try:
                fault("before_claim")
                got, held = self.claim(min(free, self.q.batch), idle, self._next)
                outage.ok()
                if held == BOUNDED:
                    # The claim parked a run of jobs under full limits: what follows them
                    # in ready (another key's job) must not wait for a wake-up.
                    continue
                self._next = (self._next + 1) % n  # the next claim goes to the next partition
                empty = empty + 1 if got == 0 and held != HELD else 0
                if held == HELD:
                    # The next job is under limits and may only be claimed to start at once:
                    # wait for an executor to free up, not for new jobs.
                    self.ledger.executor_free(self.stopping)
                elif empty >= n:
                    empty = 0
                    rang = self._bell.wait(1)
                    if rang is not None:
                        self._next = rang
            except UNAVAILABLE as exc:
                outage.failed(exc, self.stopping)
            except Exception:
                log.exception("%s fetcher: unexpected error; continuing", self.q.name)
                self.stopping.wait(0.5)

    def claim(self, n: int, start: int, partition: int = 0) -> tuple[int, int]:
        """Claim up to ``n`` jobs, ``start`` of them to start at once, from one partition;
        returns (how many, why it stopped: HELD at a job that needs a free executor,
        BOUNDED at its bound of ids popped, 0 otherwise)."""
        self._seq += 1
        reply = self.rt.scripts.claim(
            self.parts[partition], n=n, start=start, lease_ms=self.lease_ms, token_base=f"{self.worker_id}.{self._seq}",
            dead_ttl_ms=self.dead_ttl_ms, done_ttl_ms=self.done_ttl_ms, done_max=self.done_max,
            max_ages=self._max_ages(),
        )
        now, held = int(reply[0]), int(reply[1])  # the server's clock; see claim.lua
        count = (len(reply) - 2) // CLAIM_FIELDS
        if not count:
            return 0, held
        fault("after_claim")
        qname = self.q.name
        batch: list[Run] = []
        late: list[Run] = []  # past their MAX_AGE: buried, never run
        for i in range(2, len(reply), CLAIM_FIELDS):
            (job_id, token, attempt, type_, version, payload, max_attempts, idem_key, resource_key, ready,
             created_raw, checkpoint, started, meta) = reply[i:i + CLAIM_FIELDS]
            # claim.lua vouches for attempt and max_attempts; the timestamps are only
            # figures, so a damaged one must not cost the batch.
            created = _int_or(created_raw, now)
            # Positional, in Claimed's field order: keywords cost a third of a claimed
            # job's time here (2.7 against 0.9 us each).
            run = Run(Claimed(job_id, token, int(attempt), type_, version, payload, int(max_attempts or 1),
                              idem_key, resource_key, _int_or(ready, created), created, checkpoint, qname, now,
                              started != 0, meta, "", partition))
            batch.append(run)
            if started == EXPIRED:
                late.append(run)
        if self.trace_context and tracing.enabled():
            for r in batch:
                if r.job.meta_raw:
                    r.job.traceparent = tracecontext.parse(r.job.meta_raw)
        self.ledger.claimed(batch)
        if self.stopping.is_set():
            # The stop began while this claim was in flight: nothing will run these.
            for r in batch:
                self.ledger.picked()
                self.ledger.returned()
                if self.ledger.pick(r):
                    self.outbox.put(Settlement(r, Release()))
            log.info("%s fetcher: %d job(s) claimed during the stop; handed back", qname, count)
            return count, held
        for r in late:
            fn = self.rt.registry.functions.get(r.job.type)
            self.ledger.picked()
            self.ledger.returned()
            if self.ledger.pick(r):  # (a cancel that took it first hands it back itself)
                self.outbox.put(Settlement(r, expired(r.job, fn.max_age_s if fn else None), started_ms=now))
        buried = {id(r) for r in late}
        for r in batch:
            if id(r) not in buried:
                self.inbox.put(r)
        return count, held

    def _max_ages(self) -> str:
        """The claim's MAX_AGE argument for the functions loaded now (rebuilt on a reload)."""
        reg = self.rt.registry
        if self._ages[0] is not reg:
            self._ages = (reg, " ".join(f"{fn.name}={int(fn.max_age_s * 1000)}"
                                        for fn in reg.for_queue(self.q.name) if fn.max_age_s))
        return self._ages[1]
