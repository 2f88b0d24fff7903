"""The scheduler: promote due jobs (delayed, retrying, deferred) to ready, reclaim jobs
whose lease lapsed, and trim expired dead-letter entries and done jobs past their
retention (a success does not set a TTL on its record: see keys.py), relay
follow-ups that acks left in an outbox for another queue (relay.py), and tell the waiters
of events whose emitter did not (relay.py, client/waking.py).

It runs inside every worker process. Each move is one atomic script that re-checks the
state it moves from, so any number of schedulers can run at once without moving a job
twice. It sleeps until the next due job (at most scheduler_interval), so a delay of
100 ms is honoured to within a few ms.

A pass looks at every partition in one round trip (on one server: promote, reclaim and
the outbox's length of each, pipelined), and goes on to a partition's own calls only
where that look found more to do; an idle worker's pass is that one round trip. The
reclaim's check of the queue's keys for damage (a TYPE per key) runs at the start, every
TRIM_EVERY_S, and after this process saw an error reply (a damaged key causes them).
The first passes also walk each partition's scheduled set once, BATCH ids a pass, into
the scheduled list's index (jobs a release before the index delayed are in the set only).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from runner.client import Client
from runner.runtime import Runtime
from runner.store import roster, tagset
from runner.store.connection import UNAVAILABLE
from runner.store.keys import QueueKeys, partition_set
from runner.store.outage import OUTAGE, Away, Outage
from runner.worker import relay
from runner.worker.lifeline import vital

log = logging.getLogger("runner.scheduler")

BATCH = 1000
TRIM_EVERY_S = 60.0
# The longest a pass waits for one Redis Cluster master (at most the worker's node wait):
# every call of a pass re-checks what it moves and may be made again, and the other
# masters' due jobs must not wait behind a stalled one (a delayed job is due to the ms).
PASS_WAIT_S = 0.3
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
        self._checked: tuple[int, float] = (-1, 0.0)  # error replies seen, and when, at the last damage check
        self._client: Client | None = None  # builds ON_FAILURE jobs for reclaimed deaths, tells waiters
        self._wakes_seen: dict[tuple[str, int], float] = {}  # events with waiters to tell -> first seen
        self._next_beat = 0.0
        # Partitions whose scheduled set is still to walk for the scheduled list's index,
        # and the rank to go on from (_index).
        self._walked: dict[tuple[str, str], int] = {}
        self._pulse = roster.Pulse()  # this worker's start on the roster, where its pruning stopped
        # The partition tags' read and the roster's heartbeat, each on a thread of its own:
        # on Redis Cluster either may wait for a stalled master, and a pass never waits
        # for them (_discover, _heartbeat).
        self._aside = ThreadPoolExecutor(2, thread_name_prefix="scheduler-aside")
        self._finding: Future[list[QueueKeys]] | None = None  # a discover under way (_discover)
        self._beating: Future[None] | None = None  # a heartbeat under way (_heartbeat)
        # Partitions (queue, tag) whose shard is away; ("", "") is the roster's slot.
        self._away: Away[tuple[str, str]] = Away("scheduler", lambda w: f"queue {w[0]}, partition {{{w[1]}}}"
                                                 if w[0] else "roster", log)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        beating = self._beating
        if beating is not None:  # (ended before the worker leaves the roster: no entry written after)
            with contextlib.suppress(Exception):
                beating.result(timeout=5)
        self._aside.shutdown(wait=False)

    def tick(self) -> float:
        """One pass over every queue (every partition of each); returns seconds until the
        next due job (capped)."""
        # A shard away fails the calls in its slots only: each partition (and the roster,
        # ("", ""), in a slot of its own) is served on its own, and one that fails waits out
        # a backoff of its own while the others go on. When nothing answers at all, Redis
        # is away: the loop's own backoff, with its one warning.
        failures: list[tuple[tuple[str, str], BaseException]] = []
        answered = self._heartbeat(failures)
        new = self._discover()
        if new and self.found is not None:
            self.found(new)
        wait = self.rt.config.worker.scheduler_interval_s
        ret = self.rt.config.retention
        # A short retention (dev, tests) is honoured to within a quarter of itself.
        every = min(TRIM_EVERY_S, max(0.1, min(ret.done_s, ret.dead_s) / 4))
        trim = time.monotonic() - self._last_trim > every
        check = self._check_due()
        more = False
        live = [k for parts in self.rt.parts.values() for k in parts  # every partition of every queue
                if not self._away.away((k.queue, k.tag))]
        try:
            looks = self._look(live, check)
        except OUTAGE as exc:  # the one server is away: every partition with it
            failures += [((k.queue, k.tag), exc) for k in live]
            live, looks = [], {}
        # Each call given up on a stalled master past PASS_WAIT_S: the pass goes on with the
        # others' partitions, and the stalled one's wait out a backoff of their own.
        with self.rt.scripts.waiting(PASS_WAIT_S):
            for k in live:
                where = (k.queue, k.tag)
                try:
                    wait, more = self._pass(k, wait, trim, more, check, looks.get(id(k)))
                    self._index(k, where)
                except OUTAGE as exc:
                    failures.append((where, exc))
                    continue
                self._away.ok(where)
                answered = True
        answered = self._heartbeat(failures) or answered  # (one that ended meanwhile)
        if failures and not answered:
            raise failures[-1][1]
        for where, why in failures:
            self._away.failed(where, why)
        if trim:
            self._last_trim = time.monotonic() - (every if more else 0.0)
        return wait

    def _heartbeat(self, failures: list[tuple[tuple[str, str], BaseException]]) -> bool:
        """The roster's heartbeat, every HEARTBEAT_S, on a thread of its own: a pass starts
        one when due and takes its outcome at a later look, never waiting for it (on Redis
        Cluster the roster's master may be stalled, and the other masters' due jobs must
        not wait for it). True when one answered since the last look; a failure joins
        ``failures`` (the roster's slot, ("", ""), backs off as a partition does)."""
        f = self._beating
        if f is not None:
            if not f.done():
                return False
            self._beating = None
            exc = f.exception()
            if exc is None:
                self._away.ok(("", ""))
                self._next_beat = time.monotonic() + roster.HEARTBEAT_S
                return True
            if not isinstance(exc, OUTAGE):
                raise exc
            failures.append((("", ""), exc))
            return False
        if self.member is not None and time.monotonic() >= self._next_beat and not self._away.away(("", "")):
            self._beating = self._aside.submit(self._beat)
        return False

    def _beat(self) -> None:
        """One heartbeat: the server's clock, then this worker's entry. The beat writes two
        keys of two slots (the roster, the pruner's bid), maybe on two masters: it is
        bounded as a read of its own (Transport.bounded), so a stall of either is given
        up in the node wait and named."""
        assert self.member is not None
        sc = self.rt.scripts
        prefix = self.rt.config.redis.prefix
        sec, usec = sc.keyless("TIME")
        now_ms = int(sec) * 1000 + int(usec) // 1000
        member = self.member()
        sc.bounded("the roster's heartbeat", lambda: roster.beat(self.rt.redis, prefix, member, self._pulse, now_ms),
                   [roster.key(prefix), roster.pruner_key(prefix)])

    def _discover(self) -> list[QueueKeys]:
        """Runtime.discover_due, on a thread of its own when due, never waited for: the
        partition tags are read from every master in one round trip, and one master
        stalled must not hold up the others' timers. What a read found is told at the
        first pass after it answered (its partitions are served from then on)."""
        f = self._finding
        if f is None:
            if not self.rt.record_due():
                return []
            f = self._finding = self._aside.submit(self.rt.discover_due, record=True)
        if not f.done():
            return []
        self._finding = None
        return f.result()

    def _index(self, k: QueueKeys, where: tuple[str, str]) -> None:
        """Walk a partition's scheduled set once, BATCH ids a pass, putting the jobs that a
        release before the scheduled list's index delayed in it (index_delayed.lua); one
        call on an empty set, none once walked."""
        at = self._walked.get(where, 0)
        if at < 0:
            return
        self._walked[where], _ = self.rt.scripts.index_delayed(k, at, BATCH)

    def _check_due(self) -> bool:
        """Whether this pass's reclaims check the queues' keys for damage: at the start,
        every TRIM_EVERY_S, and once after this process saw an error reply."""
        seen, at = self._checked
        errors = self.rt.scripts.error_replies
        if errors == seen and time.monotonic() - at < TRIM_EVERY_S:
            return False
        self._checked = (errors, time.monotonic())
        return True

    def _look(self, ks: list[QueueKeys], check: bool) -> dict[int, tuple[Any, Any, int, int]]:
        """The first promote and reclaim of every partition and its outbox's length, in one
        round trip, by id of its keys; a partition whose replies hold an error is left out
        (its own calls in _pass raise it where it belongs). Nothing on Redis Cluster, where
        each partition's calls go on their own."""
        if not ks:
            return {}
        sc = self.rt.scripts
        dead_ms = int(self.rt.config.retention.dead_s * 1000)
        calls: list[Any] = []
        for k in ks:
            calls += [sc.promote_call(k, BATCH), sc.reclaim_call(k, BATCH, dead_ms, check=check), ("LLEN", k.outbox),
                      ("LLEN", k.wakes)]
        replies = sc.gather(calls)
        if replies is None:
            return {}
        out: dict[int, tuple[Any, Any, int, int]] = {}
        for i, k in enumerate(ks):
            promoted, reclaimed, outbox, wakes = replies[4 * i:4 * i + 4]
            if not any(isinstance(r, BaseException) for r in (promoted, reclaimed, outbox, wakes)):
                out[id(k)] = (promoted, reclaimed, int(outbox), int(wakes))
        return out

    def _pass(self, k: QueueKeys, wait: float, trim: bool, more: bool, check: bool,
              look: tuple[Any, Any, int, int] | None = None) -> tuple[float, bool]:
        """The passes over one partition, starting from ``look`` (the first promote and
        reclaim replies and the outbox's length) when the pass looked already; returns
        (wait, more) brought up to date."""
        sc = self.rt.scripts
        ret = self.rt.config.retention
        dead_ms, done_ms = int(ret.dead_s * 1000), int(ret.done_s * 1000)
        promoted, reclaimed, outbox, wakes = look if look is not None else (None, None, 1, 1)
        while True:
            moved, due_in = promoted if promoted is not None else sc.promote(k, BATCH)
            promoted = None
            if int(moved) < BATCH:
                break
        if int(due_in) >= 0:
            wait = min(wait, max(0.002, int(due_in) / 1000))
        if outbox and relay.drain(self.rt, k) >= relay.BATCH:
            wait = 0.002  # more waiting: come back at once
        if wakes:
            if self._client is None:
                self._client = Client(self.rt)
            if relay.tell_waiters(self._client, k, self._wakes_seen):
                wait = min(wait, relay.WAKE_AFTER_S / 4)  # (an emitter's own, told by it within that)
        lost = trim  # now and then, for a list a dead scheduler left
        while True:
            requeued, buried = reclaimed if reclaimed is not None else sc.reclaim(k, BATCH, dead_ms, check=check)
            reclaimed = None
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
                # (a drained partition's keys outlive its jobs: done records, idempotency keys)
                self._retire(k, max(ret.done_s, ret.idempotency_s))
        return wait, more

    def _retire(self, k: QueueKeys, done_s: float) -> None:
        """Stop recording a draining partition once it held nothing for ``done_s``, the
        longest of the done and idempotency retentions (by then its done jobs' outcomes and
        its idempotency keys have gone too, so no look-up needs it): processes started
        later leave it out. This one keeps looking at it, which costs a claim now and then."""
        on = self.rt.scripts.on_node  # (given up on a stalled master, as every call of a pass)
        if not on(k.outbox, lambda: tagset.drained(self.rt.redis, k)):
            self._empty_since.pop((k.queue, k.tag), None)
            return
        since = self._empty_since.setdefault((k.queue, k.tag), time.monotonic())
        if time.monotonic() - since >= done_s:
            on(partition_set(k.prefix, k.queue), lambda: tagset.retire(self.rt.redis, k))
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
