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

On Redis Cluster each partition's pass runs on a thread of its own, with a timer of its
own: a pass is started when its partition is due (its next due job, at most
scheduler_interval after the last pass started) and no pass of it is under way, and the
loop never waits for one. A pass is the partition's look (_look_one: one round trip to
its master) and the promotes it calls for, nothing more: the rest a look finds to do
(the relay, the waiters, the reclaims past the first, the lost follow-ups, the trim, the
index walk) is the partition's upkeep (_tend), on a thread of its own beside its passes,
one at a time, so a job that falls due while a slow master works through the upkeep is
promoted by the next look, a round trip or two later, not after all of it. An idle
partition's pass is its look. A call waits PASS_WAIT_S for a master that answers at its
usual pace, and a few of its round trips for one that answers slowly (at most the
worker's node wait: Transport.waiting), so a slow master still gets its whole pass and
upkeep, however late, while a stalled one fails them fast and its partitions back off as
a dead node's. The other masters' partitions keep their timers meanwhile.
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

# A pass or an upkeep that ended (Redis Cluster): whether a backlog past retention is
# left, when its trim started (None: no trim), whether its reclaim checked for damage,
# and the error that ended it (None: it answered).
Ended = tuple[bool, float | None, bool, BaseException | None]

BATCH = 1000
TRIM_EVERY_S = 60.0
TRIM_ROUNDS = 25  # trim calls per queue and pass, BATCH * 2 done jobs each
# Redis Cluster: the longest a pass waits for a master that answers at its usual pace,
# stretched to a few of its round trips for one that answers slowly (Transport.waiting),
# at most the worker's node wait: a stalled master is found within it, and its
# partitions back off, while a slow one's passes go on (each on its own thread).
PASS_WAIT_S = 0.3
# Redis Cluster: threads for the partitions' passes and upkeeps (started as needed, one
# pass and one upkeep per partition at a time); more than this wait for a thread, none
# for a master.
PASS_THREADS = 64
# A pass that ends says when its partition is next due; it wakes the loop only when that
# is sooner than the loop's own wake by more than this (not for a wake a few ms apart).
WAKE_SLACK_S = 0.01


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
        # Per partition: events with waiters to tell -> first seen.
        self._wakes_seen: dict[tuple[str, str], dict[tuple[str, int], float]] = {}
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
        # Redis Cluster: each partition's pass on a thread of its own (_spread).
        self._passes = ThreadPoolExecutor(PASS_THREADS, thread_name_prefix="scheduler-pass")
        self._lock = threading.Lock()  # guards the six below, written by the passes' threads
        self._running: set[tuple[str, str]] = set()  # partitions with a pass under way
        self._tending: set[tuple[str, str]] = set()  # partitions with an upkeep under way (_tend)
        self._ended: list[tuple[tuple[str, str], Ended]] = []  # passes and upkeeps ended since the loop looked
        self._due: dict[tuple[str, str], float] = {}  # when each partition's next pass is due
        self._soon: dict[tuple[str, str], float] = {}  # an upkeep's call for a pass sooner, while one runs
        self._wake_at = float("inf")  # when the loop wakes by itself
        self._wake = threading.Event()  # set to wake the loop sooner (a pass ended, a stop)
        self._trimmed: dict[tuple[str, str], float] = {}  # when each partition's last trim started
        self._to_check: set[tuple[str, str]] = set()  # partitions whose next reclaim checks for damage
        self._ok: set[tuple[str, str]] = set()  # partitions whose last pass answered

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)
        self._passes.shutdown(wait=False)
        beating = self._beating
        if beating is not None:  # (ended before the worker leaves the roster: no entry written after)
            with contextlib.suppress(Exception):
                beating.result(timeout=5)
        self._aside.shutdown(wait=False)

    def tick(self) -> float:
        """One pass over every queue (every partition of each); returns seconds until the
        next due job (capped). On Redis Cluster, the passes of the partitions that are
        due are started, and those that ended are taken in (_spread)."""
        # A shard away fails the calls in its slots only: each partition (and the roster,
        # ("", ""), in a slot of its own) is served on its own, and one that fails waits out
        # a backoff of its own while the others go on. When nothing answers at all, Redis
        # is away: the loop's own backoff, with its one warning.
        failures: list[tuple[tuple[str, str], BaseException]] = []
        answered = self._heartbeat(failures)
        new = self._discover()
        if new and self.found is not None:
            self.found(new)
        ret = self.rt.config.retention
        # A short retention (dev, tests) is honoured to within a quarter of itself.
        every = min(TRIM_EVERY_S, max(0.1, min(ret.done_s, ret.dead_s) / 4))
        check = self._check_due()
        if self.rt.scripts.one_server:
            wait, ok = self._serial(failures, every, check)
        else:
            wait, ok = self._spread(failures, every, check)
        answered = self._heartbeat(failures) or ok or answered  # (one that ended meanwhile)
        if failures and not answered:
            raise failures[-1][1]
        for where, why in failures:
            self._away.failed(where, why)
        return wait

    def _serial(self, failures: list[tuple[tuple[str, str], BaseException]], every: float,
                check: bool) -> tuple[float, bool]:
        """One server: every partition's pass in turn, from one look at them all; (wait,
        whether any partition answered)."""
        wait = self.rt.config.worker.scheduler_interval_s
        trim = time.monotonic() - self._last_trim > every
        more = answered = False
        live = [k for parts in self.rt.parts.values() for k in parts  # every partition of every queue
                if not self._away.away((k.queue, k.tag))]
        try:
            looks = self._look(live, check)
        except OUTAGE as exc:  # the one server is away: every partition with it
            failures += [((k.queue, k.tag), exc) for k in live]
            live, looks = [], {}
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
        if trim:
            self._last_trim = time.monotonic() - (every if more else 0.0)
        return wait, answered

    def _spread(self, failures: list[tuple[tuple[str, str], BaseException]], every: float,
                check: bool) -> tuple[float, bool]:
        """Redis Cluster: take in the passes that ended, start one for each partition that
        is due (not away, none under way), and return (wait, whether a partition's last
        pass answered). A pass never waits for another: one on a slow master takes its
        time, one on a stalled master fails within the node wait."""
        interval = self.rt.config.worker.scheduler_interval_s
        parts = [k for ks in self.rt.parts.values() for k in ks]  # every partition of every queue
        if check:
            self._to_check = {(k.queue, k.tag) for k in parts}
        with self._lock:
            ended, self._ended = self._ended, []
        for where, (more, trimmed, checked, err) in ended:
            if err is None:
                self._away.ok(where)
                self._ok.add(where)
                if checked:
                    self._to_check.discard(where)
                if trimmed is not None:  # a backlog past retention: trimmed again at its next pass
                    self._trimmed[where] = float("-inf") if more else trimmed
                continue
            self._ok.discard(where)
            if isinstance(err, OUTAGE):
                failures.append((where, err))
            else:
                log.error("scheduler, queue %s, partition {%s}: unexpected error; continuing", *where,
                          exc_info=err)
                with self._lock:
                    self._due[where] = time.monotonic() + 1.0
        now = time.monotonic()
        for k in parts:
            where = (k.queue, k.tag)
            if self._away.away(where) or self._stop.is_set():
                continue
            with self._lock:
                if where in self._running or self._due.get(where, 0.0) > now:
                    continue
                self._running.add(where)
            trim = now - self._trimmed.get(where, 0.0) > every
            self._passes.submit(self._one, k, where, interval, now if trim else None, where in self._to_check)
        with self._lock:
            now = time.monotonic()
            due = [max(d, self._away.until.get(w, 0.0)) for w, d in self._due.items() if w not in self._running]
            wait = max(0.002, min([interval, *(d - now for d in due)]))
            self._wake_at = now + wait
        return wait, bool(self._ok)

    def _one(self, k: QueueKeys, where: tuple[str, str], interval: float, trim: float | None,
             check: bool) -> None:
        """One partition's pass, on a thread of its own (_spread): its look and the promotes
        it calls for, with the rest the look found to do handed to the partition's upkeep
        (_tend) unless one is under way. Its outcome, and when the partition is next due,
        are left for the loop, which is woken when that is sooner than it would wake by
        itself (or the pass failed)."""
        started = time.monotonic()
        err: BaseException | None = None
        wait, checked = interval, False
        try:
            # Each call given up on a master silent past PASS_WAIT_S (or past a few of its
            # round trips, when it answers slowly): a stall is found fast, and the node's
            # other calls (the fetcher's, the ticker's) then fail at once while it lasts.
            with self.rt.scripts.waiting(PASS_WAIT_S):
                look = self._look_one(k, check)
                promoted, reclaimed, outbox, wakes = look if look is not None else (None, None, 1, 1)
                checked = check and look is not None
                if self._upkeep_due(where, trim, look) and self._hand(where):
                    self._submit(self._tend, where, k, where, trim, check and look is None, reclaimed, outbox, wakes)
                wait = self._promote(k, interval, promoted)
        except BaseException as exc:  # (told to the loop: an outage backs off, a bug is logged)
            err = exc
        with self._lock:
            self._running.discard(where)
            due = started + (0.0 if err is not None else wait)
            due = self._due[where] = min(due, self._soon.pop(where, due))
            self._ended.append((where, (False, None, checked, err)))
            if err is not None or due < self._wake_at - WAKE_SLACK_S:
                self._wake.set()

    def _upkeep_due(self, where: tuple[str, str], trim: float | None, look: tuple[Any, Any, int, int] | None) -> bool:
        """Whether a pass's look left its partition more to do than promote: a trim due,
        the index walk unfinished, an outbox or waiters to tell, leases reclaimed (to log,
        and to go on from when the batch was full), or no look at all (its calls then go
        on their own)."""
        if look is None or trim is not None or self._walked.get(where, 0) >= 0:
            return True
        _, reclaimed, outbox, wakes = look
        requeued, buried = reclaimed[:2]
        return bool(outbox or wakes or int(requeued) or int(buried) or len(reclaimed) > 2)

    def _hand(self, where: tuple[str, str]) -> bool:
        """Take the partition's upkeep on; False when one is under way (what this pass's
        look found is then left to the next pass that finds it)."""
        with self._lock:
            if where in self._tending or self._stop.is_set():
                return False
            self._tending.add(where)
            return True

    def _submit(self, fn: Callable[..., None], where: tuple[str, str], *args: Any) -> None:
        """``fn(*args)`` on a pass thread; the partition's upkeep is let go when the pool
        is shut (a stop meanwhile)."""
        try:
            self._passes.submit(fn, *args)
        except RuntimeError:
            with self._lock:
                self._tending.discard(where)

    def _tend(self, k: QueueKeys, where: tuple[str, str], trim: float | None, check: bool,
              reclaimed: Any, outbox: int, wakes: int) -> None:
        """Redis Cluster: a partition's upkeep, on a thread of its own beside its passes
        (the relay, the waiters, the reclaims, the lost follow-ups, the trim, the index
        walk), so a slow master's due jobs never wait for it. Its outcome is left for the
        loop; when it asks for a pass sooner (more in the outbox, waiters to tell again),
        the partition is due then."""
        err: BaseException | None = None
        wait, more = float("inf"), False
        try:
            with self.rt.scripts.waiting(PASS_WAIT_S):
                wait, more = self._upkeep(k, wait, trim is not None, False, check, reclaimed, outbox, wakes)
                self._index(k, where)
        except BaseException as exc:  # (told to the loop, as a pass's)
            err = exc
        with self._lock:
            self._tending.discard(where)
            self._ended.append((where, (more, trim, check, err)))
            soon = time.monotonic() + wait  # (inf: the look's own timer stands)
            if where in self._running and soon < float("inf"):  # (its end sets when the partition is next due)
                self._soon[where] = min(soon, self._soon.get(where, soon))
            elif soon < self._due.get(where, soon):
                self._due[where] = soon
            if err is not None or soon < self._wake_at - WAKE_SLACK_S:
                self._wake.set()

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
        now_ms = sc.server_ms()
        member = self.member()
        sc.bounded("the roster's heartbeat", lambda: roster.beat(sc, prefix, member, self._pulse, now_ms),
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

    def _followups(self) -> Client:
        """The client that builds ON_FAILURE jobs and tells waiters, made once."""
        with self._lock:
            if self._client is None:
                self._client = Client(self.rt)
            return self._client

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
            calls += sc.look_calls(k, BATCH, dead_ms, check)
        replies = sc.gather(calls)
        if replies is None:
            return {}
        out: dict[int, tuple[Any, Any, int, int]] = {}
        for i, k in enumerate(ks):
            promoted, reclaimed, outbox, wakes = replies[4 * i:4 * i + 4]
            if not any(isinstance(r, BaseException) for r in (promoted, reclaimed, outbox, wakes)):
                out[id(k)] = (promoted, reclaimed, int(outbox), int(wakes))
        return out

    def _look_one(self, k: QueueKeys, check: bool) -> tuple[Any, Any, int, int] | None:
        """Redis Cluster: a partition's first promote and reclaim and its outbox's and wakes'
        lengths in one round trip to its master (all its keys are in one slot), so an idle
        partition's pass is that one round trip, on a slow master too; None when a reply
        says its calls must go on their own (Transport.gather_on_node)."""
        sc = self.rt.scripts
        dead_ms = int(self.rt.config.retention.dead_s * 1000)
        calls = sc.look_calls(k, BATCH, dead_ms, check)
        replies = sc.gather_on_node(k.ready, calls, f"the scheduler's look at queue {k.queue}, partition {{{k.tag}}}")
        if replies is None:
            return None
        promoted, reclaimed, outbox, wakes = replies
        return promoted, reclaimed, int(outbox), int(wakes)

    def _pass(self, k: QueueKeys, wait: float, trim: bool, more: bool, check: bool,
              look: tuple[Any, Any, int, int] | None = None) -> tuple[float, bool]:
        """The passes over one partition, starting from ``look`` (the first promote and
        reclaim replies and the outbox's length) when the pass looked already; returns
        (wait, more) brought up to date."""
        promoted, reclaimed, outbox, wakes = look if look is not None else (None, None, 1, 1)
        wait = self._promote(k, wait, promoted)
        return self._upkeep(k, wait, trim, more, check, reclaimed, outbox, wakes)

    def _promote(self, k: QueueKeys, wait: float, promoted: Any) -> float:
        """Move a partition's due jobs to ready, from ``promoted`` (the look's first
        promote reply, None: no look) on; returns ``wait`` brought up to its next due job."""
        sc = self.rt.scripts
        dead_ms = int(self.rt.config.retention.dead_s * 1000)
        while True:
            moved, due_in = promoted if promoted is not None else sc.promote(k, BATCH, dead_ttl_ms=dead_ms)
            promoted = None
            if int(moved) < BATCH:
                break
        if int(due_in) >= 0:
            wait = min(wait, max(0.002, int(due_in) / 1000))
        return wait

    def _upkeep(self, k: QueueKeys, wait: float, trim: bool, more: bool, check: bool, reclaimed: Any,
                outbox: int, wakes: int) -> tuple[float, bool]:
        """A partition's pass after its promote: the relay, the waiters, the reclaims (from
        ``reclaimed``, the look's first reply, None: no look), the lost follow-ups and the
        trim; returns (wait, more) brought up to date."""
        sc = self.rt.scripts
        ret = self.rt.config.retention
        dead_ms, done_ms = int(ret.dead_s * 1000), int(ret.done_s * 1000)
        if outbox and relay.drain(self.rt, k) >= relay.BATCH:
            wait = 0.002  # more waiting: come back at once
        if wakes:
            seen = self._wakes_seen.setdefault((k.queue, k.tag), {})  # (one per partition: passes run at once)
            if relay.tell_waiters(self._followups(), k, seen):
                wait = min(wait, relay.WAKE_AFTER_S / 4)  # (an emitter's own, told by it within that)
        lost = trim  # now and then, for a list a dead scheduler left
        while True:
            reply = reclaimed if reclaimed is not None else sc.reclaim(k, BATCH, dead_ms, check=check)
            requeued, buried = reply[:2]
            reclaimed = None
            if int(requeued) or int(buried):
                log.warning("queue %s: reclaimed %s lapsed lease(s), %s buried as worker lost",
                            k.queue, requeued, buried)
            lost = lost or int(buried) > 0
            if int(requeued) + int(buried) < BATCH and len(reply) < 3:  # (a third: stopped by bytes)
                break
        if lost:
            while relay.lost_destinations(self.rt, self._followups(), k) >= relay.BATCH:
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
            self._wake.wait(wait)
            self._wake.clear()  # (a pass that ends from here on is taken in by the next tick)
