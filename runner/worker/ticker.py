"""The ticker: fires the ticks of the schedules declared in function files (SCHEDULE),
inside every worker process, with no beat process and no leader.

Why each tick is enqueued exactly once, however many tickers run and whenever they die:
the decision and the enqueue are one Lua script per (schedule, tick) (store/lua/tick.lua,
sent with enqueue.lua appended, so the job is written by the enqueue script itself, as
any other job). The script fires a tick only if it is later than the last tick the
schedule's state records, and records it in the same step; the state lives under the
function's queue hash tag, beside the queue the job goes to, so the step is atomic on
Redis Cluster too. Two tickers that race for one tick: the second is refused. A ticker
killed before the script: the tick is still unhandled and the next ticker fires it. Killed
after: the tick and its job are both in Redis. There is no window between "decided" and
"enqueued" to lose or double a tick in, and no idempotency key to keep per tick (10,000
minute schedules would keep 14 million for a day's retention).

On a partitioned queue a tick's job goes where its keys route it (with the other jobs of
its lock: docs/partitions.md), and the schedule's state stays in the home partition: a job
routed to another partition (another slot) goes to the home partition's outbox in the
tick's own script, in place of the enqueue, and the ticker places it at once in its
partition by its id (runner/outbox.py), once whoever places it; killed in between, the
relay places it. So the tick and its job are still never apart. OVERLAP = "skip" then
reads the last job where it lives before sending the tick (store/schedules.py,
last_jobs), and the script refuses the tick to be read again if the state moved on since.

Alternatives weighed: the ordinary enqueue with a deterministic idempotency key per tick
plus a separate "last fired" write needs two steps (the key guards the gap) and one key
per tick; a lease-holding leader (as RQ's and asynq's schedulers, or a beat) stalls every
schedule while a dead leader's lease runs out.

Time is the server's (``TIME``, store/schedules.py): tickers on hosts with skewed clocks
agree on when a tick is due. Each pass reads it, fires the schedules whose next tick has
come (one pipelined round trip per BATCH ticks), and sleeps until the next tick or
heartbeat, at most STEADY_S (a step of the server's clock is seen within it; WAKE_S on
the schedules' test clock, which tests move at will). A hot reload's new registry wakes
it (Runtime.on_swap), so it is adopted at once; an idle worker's ticker wakes a few times
a minute.

Deploys: a registry (a worker start, or a reload in `runner dev`) is *adopted* at a
server time, its born time (store/lua/adopt.lua). Where Redis holds another definition
of a schedule (another digest) the one Redis first saw most recently wins: a later born
is no proof of a newer release, as a restarted worker of the previous release is born
later too. A ticker whose definition lost stops firing it, and the tick script refuses a
digest the state does not hold, so a worker still running an older function file never
fires a schedule the newer file changed. Schedules a registry does not define are
retired only once no worker holding them lives (or at once by a reload that removed
them); every heartbeat reads which those are, so one brought back later is retired too.
A worker not heard for REHEAR_S (frozen, cut off) adopts its registry again.

A definition that lost stands by (standby.py): it takes the schedule back when the
holders of the winning one go quiet, and it rejoins when its own definition holds again.
"""

from __future__ import annotations

import heapq
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from runner import outbox
from runner.catalog.registry import Registry
from runner.catalog.schedules import Schedule, Step, Timeline, iso, plan
from runner.errors import NotReplicated
from runner.runtime import Runtime
from runner.store import codec, records
from runner.store.connection import NodeStalled
from runner.store.keys import QueueKeys
from runner.store.outage import OUTAGE, Outage
from runner.store.schedules import TOMBSTONE_S, ServerClock, handled_ticks, last_jobs, registered
from runner.store.scripts import NewJob, job_entry
from runner.worker.faults import fault
from runner.worker.lifeline import vital
from runner.worker.standby import HEARTBEAT_S, TAKEOVER_S, Standby

log = logging.getLogger("runner.ticker")

WAKE_S = 0.5  # the longest sleep by a clock that may jump (the schedules' test clock)
STEADY_S = 5.0  # the longest sleep by the server's clock

BATCH = 250  # tick script calls per pipelined round trip
LANES = 2  # round trips in flight at once
ADOPT_CHUNK = 500
RETRY_MS = 1000  # a tick whose master did not answer is sent again this much later
LOG_EACH = 10  # a pass that fires more ticks than this logs one summary line
# Quiet this long (frozen, cut off from Redis), a worker adopts its registry again: the
# others see a holder quiet only after TAKEOVER_S, so half of it leaves a margin, and
# three heartbeats leave one between beats that come late under load.
REHEAR_S = max(TAKEOVER_S / 2, 3 * HEARTBEAT_S)


class Clock(Protocol):
    """Epoch milliseconds; production's is the Redis server's (ServerClock). ``steady``:
    it only moves on, so the ticker may sleep until the next tick by it."""

    steady: bool

    def now_ms(self) -> int: ...


@dataclass(order=True, slots=True)
class _Entry:
    next_ms: int
    seq: int
    schedule: Schedule = field(compare=False)
    line: Timeline = field(compare=False)
    floor_ms: int = field(compare=False, default=0)  # ticks at or before it are handled


@dataclass(slots=True)
class _Adopted:
    """What one queue's adoption gave (Ticker._adopt_queue)."""

    heap: list[_Entry] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    standby: dict[str, Schedule] = field(default_factory=dict)
    kept: list[str] = field(default_factory=list)
    retired: int = 0


def _undefined(reg: Registry, index: dict[str, dict[str, str]]) -> dict[str, list[str]]:
    """Per queue, the schedules Redis registers there that this registry does not define.
    A file that failed to load keeps its schedules, and a folder that failed (none there:
    a volume not mounted, a wrong directory) says nothing about which were removed."""
    if any(Path(p).suffix != ".py" for p in reg.errors):
        return {}
    broken = {Path(p).stem for p in reg.errors}
    defined = {(s.queue, s.id) for s in reg.schedules()}
    out: dict[str, list[str]] = {}
    for queue, ids in index.items():
        gone = [i for i in ids if (queue, i) not in defined and i.split(":")[0] not in broken]
        if gone:
            out[queue] = gone
    return out


class Ticker:
    def __init__(self, runtime: Runtime, clock: Clock | None = None) -> None:
        self.rt = runtime
        self.clock: Clock = clock or ServerClock(runtime.redis, runtime.config.redis.prefix, list(runtime.keys),
                                                   runtime.scripts)
        self._stop = threading.Event()
        self._wake = threading.Event()  # a registry swapped in, or the stop
        self._unhook: Any = None
        self._thread = threading.Thread(target=vital(self._loop), name="ticker", daemon=True)
        self._registry: Registry | None = None
        self._born_ms = 0
        self._before: set[str] = set()  # the schedules of the registry before (a reload's removals)
        # Queues whose schedules the registry's adoption did not reach (their master away
        # or stalled), tried again from _adopt_at on (monotonic).
        self._unadopted: set[str] = set()
        self._adopt_at = 0.0
        self._said_away: set[str] = set()  # of those, the ones a warning named
        self._heap: list[_Entry] = []
        self._standby = Standby(runtime)
        self._beat_ms = 0
        self._said_at = 0.0  # monotonic, the last stamp
        self._heard_at = 0.0  # monotonic, the last stamp that reached Redis
        self._seq = 0
        self._lanes = ThreadPoolExecutor(LANES, thread_name_prefix="ticker-send")
        # The entries of this fire whose tick did not reach their master (away or stalled):
        # each is tried again RETRY_MS later, while the other masters' ticks go on.
        self._unsent: set[int] = set()

    def start(self) -> None:
        self._unhook = self.rt.on_swap(self._wake.set)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._unhook is not None:
            self._unhook()
        self._thread.join(timeout=5)
        self._lanes.shutdown(wait=False)

    # --- one pass ------------------------------------------------------------------

    def step(self) -> float:
        """Adopt a new registry if one was swapped in, fire what is due; returns seconds
        until the next tick or heartbeat (at most STEADY_S, or WAKE_S on a clock that
        may jump)."""
        now = self.clock.now_ms()
        reg = self.rt.registry
        quiet = time.monotonic() - self._heard_at
        if reg is not self._registry:
            self._adopt(reg, now)
        elif self._unadopted and time.monotonic() >= self._adopt_at:
            self._adopt_queues()  # (a queue whose master did not answer at the adoption)
        elif quiet >= REHEAR_S:
            # Frozen or cut off this long, this worker may have looked gone: another may
            # have retired or taken over what it defines. Heard again, it adopts its
            # registry again, as a restart would (adopt.lua decides, by first seen).
            log.info("schedules: this worker was not heard for %.0f s; adopting its schedules again", quiet)
            self._adopt(reg, now)
        due: list[_Entry] = []
        while self._heap and self._heap[0].next_ms <= now:
            due.append(heapq.heappop(self._heap))
        if due:
            try:
                self._fire(due, now)
            except BaseException:
                for e in due:  # nothing is lost: the ticks are still unhandled in Redis
                    heapq.heappush(self._heap, e)
                raise
        if now >= self._beat_ms:
            self._beat(now)
            self._beat_ms = now + int(HEARTBEAT_S * 1000)
        wait = min(STEADY_S if self.clock.steady else WAKE_S, (self._beat_ms - now) / 1000)
        if self._heap:
            wait = min(wait, (self._heap[0].next_ms - self.clock.now_ms()) / 1000)
        return max(0.001, wait)

    def _adopt(self, reg: Registry, now: int) -> None:
        """Register this registry's definitions (born now), retire what it dropped, and
        schedule the ones it holds from where Redis says they are: each queue's on its own
        (its index and state live in its home partition), so a queue whose master does
        not answer (away, stalled: each read and call is given up in the node wait) is
        left for a later step while the others' schedules tick."""
        before = {s.id for s in self._registry.schedules()} if self._registry is not None else set()
        self._heap, self._registry, self._born_ms, self._before = [], reg, now, before
        self._standby.reset({}, {})
        self._unadopted = set(self.rt.keys)
        self._heard_at = time.monotonic()
        self._adopt_queues()

    def _adopt_queues(self) -> None:
        """Adopt the registry in each queue not adopted yet (see _adopt); raises when none
        answered, and tries the others again RETRY_MS later."""
        rt, reg = self.rt, self._registry
        assert reg is not None
        scheds = reg.schedules()
        heap: list[_Entry] = []
        lost: list[str] = []
        retired = n_kept = 0
        away: dict[str, BaseException] = {}
        for queue in sorted(self._unadopted):
            k = rt.keys[queue]
            try:
                index = rt.scripts.on_node(k.schedules, partial(registered, rt.redis, [k]), "the schedules' index")
                got = self._adopt_queue(k, [s for s in scheds if s.queue == queue],
                                        _undefined(reg, index).get(queue, []))
            except OUTAGE as exc:
                away[queue] = exc
                continue
            self._unadopted.discard(queue)
            heap += got.heap
            lost += got.lost
            retired += got.retired
            n_kept += len(got.kept)
            self._standby.waiting.pop(queue, None)
            self._standby.undefined.pop(queue, None)
            if got.standby:
                self._standby.waiting[queue] = got.standby
            if got.kept:
                self._standby.undefined[queue] = got.kept
        if away and len(away) == len(rt.keys):
            raise next(iter(away.values()))  # (no queue's master answered: the ticker's own outage)
        for e in heap:
            heapq.heappush(self._heap, e)
        self._adopt_at = time.monotonic() + RETRY_MS / 1000
        self._beat_ms = 0  # say at once which schedules this registry holds
        said = [q for q in sorted(away) if q not in self._said_away]  # (once each, not every retry)
        if said:
            log.warning("schedules of queue %s not adopted now (%s); tried again every %g s, the other queues' tick",
                        ", ".join(said), away[said[0]], RETRY_MS / 1000)
            self._said_away.update(said)
        back = sorted(self._said_away - away.keys() - self._unadopted)
        if back:
            log.info("schedules of queue %s adopted, their master answering again", ", ".join(back))
            self._said_away.difference_update(back)
        if heap or lost or retired or n_kept:
            log.info("schedules: %d active%s%s%s", len(heap),
                     f", {len(lost)} held by a newer deploy ({', '.join(lost[:5])})" if lost else "",
                     f", {retired} retired" if retired else "",
                     f", {n_kept} not defined here kept while workers that define them live" if n_kept else "")

    def _adopt_queue(self, k: QueueKeys, mine: list[Schedule], retire: list[str]) -> _Adopted:
        """One queue's adoption (adopt.lua, ADOPT_CHUNK schedules a call): what it holds,
        lost, stands by for and keeps, and how many it retired."""
        out = _Adopted()
        retire.sort(key=lambda i: i not in self._before)  # a reload's own removals first: forced
        forced = sum(1 for i in retire if i in self._before)
        for start in range(0, max(len(mine), len(retire), 1), ADOPT_CHUNK):
            part = mine[start:start + ADOPT_CHUNK]
            gone = retire[start:start + ADOPT_CHUNK]
            if not part and not gone:
                break
            reply = self.rt.scripts.adopt(k, self._born_ms, int(TOMBSTONE_S * 1000), [(s.id, s.digest) for s in part],
                                          gone, forced=max(0, min(len(gone), forced - start)))
            for j, sid in enumerate(gone):
                if int(reply[3 * len(part) + j]) == 0:
                    out.kept.append(sid)
            for i, s in enumerate(part):
                won, floor = int(reply[3 * i]), int(reply[3 * i + 1])
                if not won:
                    out.lost.append(s.id)
                    if reply[3 * i + 2]:  # held by another definition, not removed
                        out.standby[s.id] = s
                    continue
                out.heap.append(self._entry(s, floor))
            out.retired += sum(int(x) == 1 for x in reply[3 * len(part):])
        return out

    def _entry(self, s: Schedule, floor: int) -> _Entry:
        self._seq += 1
        line = s.timeline
        return _Entry(line.next_after(floor), self._seq, s, line, floor)

    def _beat(self, now: int) -> None:
        """Say which schedules this worker holds; take back those whose holders went quiet,
        and retire those it does not define once no living worker holds them."""
        self._say_alive(now)
        try:
            self._look_around(now)
        except OUTAGE as exc:
            # A master away or stalled (every call here is given up on one in the node wait):
            # the schedules' fires go on, and the next heartbeat looks again.
            log.debug("schedules: the standby schedules not looked at now: %s", exc)

    def _look_around(self, now: int) -> None:
        for s, floor in self._standby.take_back(now, self._born_ms):
            heapq.heappush(self._heap, self._entry(s, floor))
        if self._registry is not None:
            # A schedule this registry does not define may come back after its adoption (an
            # older worker that defines it started again): retire it too once that one left.
            rt = self.rt
            index = rt.scripts.bounded("the schedules' index", lambda: registered(rt.redis, rt.keys.values()),
                                       [k.schedules for k in rt.keys.values()])
            for queue, ids in _undefined(self._registry, index).items():
                listed = self._standby.undefined.setdefault(queue, [])
                listed += [i for i in ids if i not in listed]
                if not listed:
                    del self._standby.undefined[queue]
        self._standby.retire_quiet(now, self._born_ms)

    def _say_alive(self, now: int, firing: Sequence[_Entry] = ()) -> None:
        """Stamp the schedules this worker holds (and those it is ``firing`` now) as alive;
        those of the heap it turns out to have lost (a newer deploy took them over) leave it
        for the standby list at once (a fired one learns it from its tick's refusal)."""
        rt = self.rt
        self._said_at = time.monotonic()
        in_flight = {e.seq for e in firing}
        held: dict[str, list[_Entry]] = {}
        for e in [*self._heap, *firing]:
            held.setdefault(e.schedule.queue, []).append(e)
        gone: set[int] = set()
        away: BaseException | None = None
        stamped = 0
        for queue, entries in held.items():
            for start in range(0, len(entries), ADOPT_CHUNK):
                part = entries[start:start + ADOPT_CHUNK]
                try:
                    lost = dict(rt.scripts.alive(rt.keys[queue], now,
                                                 [(e.schedule.id, e.schedule.digest) for e in part]))
                except OUTAGE as exc:  # that queue's master is away or stalled: the others are stamped
                    away = exc
                    break
                stamped += 1
                for e in part:
                    if e.schedule.id in lost and e.seq not in in_flight:
                        gone.add(e.seq)
                        self._standby.add(e.schedule, lost[e.schedule.id])
        if gone:
            self._heap = [e for e in self._heap if e.seq not in gone]
            heapq.heapify(self._heap)
        if away is not None and not stamped:
            raise away  # (not heard at all: the ticker's own outage)
        self._heard_at = time.monotonic()

    def _fire(self, due: Sequence[_Entry], now: int) -> None:
        plans: dict[tuple[int, int, str], list[Step]] = {}  # shared by schedules on one timeline
        calls: list[tuple[_Entry, Step]] = []
        # Every ticker has the same due ticks; each starts at a random point of the list, so
        # that two tickers mostly fire different ticks instead of racing for the same ones
        # (the loser's calls are refused, but they cost it as much to build and send).
        turn = random.randrange(len(due))
        for e in [*due[turn:], *due[:turn]]:
            key = (id(e.line), e.floor_ms, e.schedule.missed)
            steps = plans.get(key)
            if steps is None:
                steps = plans[key] = plan(e.line, e.schedule.missed, e.floor_ms, now)
            calls.extend((e, st) for st in steps)
        fired: list[tuple[Schedule, Step, str]] = []
        dropped: dict[int, str] = {}  # entry seq -> the winning digest ('' removed)
        self._unsent = set()
        # LANES batches in flight at once, on connections of their own: one is built and
        # sent while Redis runs another (a burst of 10,000 ticks took 0.9 s one batch at a
        # time, about half of it waiting for replies).
        # Once a whole batch comes back refused, another ticker is firing the ticks ahead:
        # from then on each batch first looks which of its ticks are still unhandled (one
        # cheap read each) and builds tick scripts for those only.
        pending: deque[Future[list[tuple[_Entry, Step, str, Any]]]] = deque()
        look = False
        for i in range(0, len(calls), BATCH):
            pending.append(self._lanes.submit(self._send, calls[i:i + BATCH], look))
            if len(pending) >= LANES:
                look = self._apply(pending.popleft().result(), fired, dropped) or look
            if time.monotonic() - self._said_at >= HEARTBEAT_S:
                # A long catch-up (thousands of missed ticks) still says this worker lives:
                # a standby that saw it quiet would take over from a living holder.
                self._say_alive(self.clock.now_ms(), due)
        while pending:
            self._apply(pending.popleft().result(), fired, dropped)
        for e in due:
            if e.seq not in dropped:
                e.next_ms = e.line.next_after(e.floor_ms)
                if e.seq in self._unsent:  # its master was away: tried again in a moment, not at once
                    e.next_ms = max(e.next_ms, now + RETRY_MS)
                heapq.heappush(self._heap, e)
            else:
                self._standby.add(e.schedule, dropped[e.seq])
        self._report(fired)

    def _send(self, chunk: Sequence[tuple[_Entry, Step]], look: bool) -> list[tuple[_Entry, Step, str, Any]]:
        """One pipelined round trip of tick scripts; each batch reads the clock again, so its
        jobs' creation time and lateness are those of its own round trip."""
        rt = self.rt
        if look:
            pairs = [(rt.keys[e.schedule.queue], e.schedule.id) for e, _ in chunk]
            try:
                done: list[int | None] = rt.scripts.bounded(
                    "the handled ticks", lambda: handled_ticks(rt.redis, pairs), [k.schedule(sid) for k, sid in pairs])
            except OUTAGE:  # a master away or stalled: no look this time, the tick scripts decide
                done = [None] * len(pairs)
            for (e, st), tick in zip(chunk, done, strict=True):
                if tick is not None and tick >= st.tick_ms:
                    e.floor_ms = max(e.floor_ms, tick)
            chunk = [(e, st) for (e, st), tick in zip(chunk, done, strict=True) if tick is None or tick < st.tick_ms]
            if not chunk:
                return []
        sent = self.clock.now_ms()
        away = self._away(chunk)
        seen, unseen = self._seen(chunk)
        batch = rt.scripts.batch()
        ids, entries = [], []
        for n, (e, st) in enumerate(chunk):
            if n in unseen:  # not sent: where its last jobs are is not known now
                ids.append("")
                entries.append("")
                continue
            s = e.schedule
            job = NewJob(id=records.new_id(), type=s.function, version=s.version, payload=s.payload_json,
                         max_attempts=s.max_attempts, run_at_ms=0, delay_ms=0, idem_key="", payload_hash="-",
                         resource_key=s.resource_key, limits=s.limits, priority=s.priority,
                         meta=codec.dumps({"schedule": s.id, "tick": iso(st.tick_ms)}))
            ids.append(job.id)
            entries.append(codec.dumps(job_entry(s.queue, job)) if n in away else "")
            rt.scripts.tick(rt.keys[s.queue], s.id, job, mode="fire" if st.fire else "skip", tick_ms=st.tick_ms,
                            digest=s.digest, born_ms=self._born_ms, overlap=s.overlap, missed=st.missed,
                            late_ms=max(0, sent - st.tick_ms), now_ms=sent, pipe=batch, away=entries[-1],
                            seen=seen.get(n, ""))
        fault("before_tick")
        try:
            told = batch.execute(raise_on_error=False)
        except NotReplicated as exc:
            # The ticks ran and are recorded on the master; only their copy on the replicas is
            # unconfirmed. Firing them again would be refused as handled, so warn and go on.
            log.warning("schedules: %d tick(s) written but confirmed by %d of %d replica(s) in %g s; "
                        "a failover now could lose them", len(chunk), exc.acked, exc.wanted, exc.timeout_s)
            told = exc.replies
        fault("after_tick")
        answers = iter(told)
        replies = [unseen[n] if n in unseen else next(answers) for n in range(len(chunk))]
        # Each master's ticks went on their own (Redis Cluster), given up on one that did not
        # answer in the node wait: those ticks are still unhandled there (or handled late,
        # which tick.lua then refuses again as handled), and tried again; the rest stand.
        failed = [r for r in replies if isinstance(r, BaseException)]
        other = next((r for r in failed if not isinstance(r, OUTAGE)), None)
        if other is not None:
            raise other
        if failed and len(failed) == len(replies) and not all(isinstance(r, NodeStalled) for r in failed):
            raise failed[0]  # (no master answered: the ticker's own outage; a stalled one's wait RETRY_MS)
        if failed:
            log.debug("schedules: %d of %d tick(s) not sent now (%s); tried again",
                      len(failed), len(replies), failed[0])
        self._place([(e.schedule.queue, entry) for (e, _), entry, reply in zip(chunk, entries, replies, strict=True)
                     if entry and not isinstance(reply, BaseException) and int(reply[0]) == 1])
        return [(e, st, job_id, reply) for (e, st), job_id, reply in zip(chunk, ids, replies, strict=True)]

    def _away(self, chunk: Sequence[tuple[_Entry, Step]]) -> set[int]:
        """The indexes of the fired ticks whose jobs go to another partition of their queue
        than the schedule's own: where their keys route them (outbox.destinations)."""
        rt = self.rt
        by_queue: dict[str, list[int]] = {}
        for n, (e, st) in enumerate(chunk):
            if st.fire and e.schedule.limits and len(rt.parts[e.schedule.queue]) > 1:
                by_queue.setdefault(e.schedule.queue, []).append(n)
        out: set[int] = set()
        for queue, idx in by_queue.items():
            home = rt.keys[queue].tag
            parts = rt.parts[queue]
            jobs = [outbox.Keyed(chunk[n][0].schedule.function, "", chunk[n][0].schedule.limits) for n in idx]
            for p, which in outbox.destinations(rt, queue, jobs).items():
                if parts[p].tag != home:
                    out.update(idx[i] for i in which)
        return out

    def _seen(self, chunk: Sequence[tuple[_Entry, Step]]) -> tuple[dict[int, str], dict[int, BaseException]]:
        """For the fired ticks under OVERLAP = "skip" on a queue of more than one partition,
        by index: what the tick script's ``seen`` says of the schedule's last jobs, which may
        live in another partition than the schedule's state (schedules.last_jobs); and the
        ticks whose queue's read did not answer (its master away or stalled: each queue's
        is given up in the node wait), with why, to be sent again RETRY_MS later."""
        rt = self.rt
        idx = [n for n, (e, st) in enumerate(chunk)
               if st.fire and e.schedule.overlap == "skip" and len(rt.parts[e.schedule.queue]) > 1]
        if not idx:
            return {}, {}
        # (a catch-up under MISSED = "all" has many steps of one schedule: read it once)
        by_queue: dict[str, list[str]] = {}
        for q, sid in dict.fromkeys((chunk[n][0].schedule.queue, chunk[n][0].schedule.id) for n in idx):
            by_queue.setdefault(q, []).append(sid)
        seen: dict[tuple[str, str], str] = {}
        away: dict[str, BaseException] = {}
        for q, sids in by_queue.items():
            k = rt.keys[q]
            wanted = [(k, sid) for sid in sids]
            try:
                got = rt.scripts.bounded(f"queue {q}'s schedules' last jobs",
                                         partial(last_jobs, rt.redis, rt.scripts, wanted, rt.parts),
                                         [k.schedule(sid) for sid in sids])
            except OUTAGE as exc:
                away[q] = exc
                continue
            seen.update(zip(((q, sid) for sid in sids), got, strict=True))
        out: dict[int, str] = {}
        unseen: dict[int, BaseException] = {}
        for n in idx:
            s = chunk[n][0].schedule
            if s.queue in away:
                unseen[n] = away[s.queue]
            else:
                out[n] = seen[(s.queue, s.id)]
        return out, unseen

    def _place(self, entries: Sequence[tuple[str, str]]) -> None:
        """Place the jobs of fired ticks that went to their queue's outbox (queue, entry)
        at once, rather than a relay pass later; a failure leaves them to the relay."""
        if not entries:
            return
        rt = self.rt
        try:
            placed = set(outbox.place(rt, [entry for _, entry in entries]))
            fault("tick_placed")  # placed, still in the outbox: placed again as nothing
            by_queue: dict[str, list[str]] = {}
            for queue, entry in entries:
                if entry in placed:
                    by_queue.setdefault(queue, []).append(entry)
            for queue, done in by_queue.items():
                outbox.remove(rt, rt.keys[queue], done)
        except OUTAGE as exc:
            log.info("schedules: %d tick job(s) left in the outbox for the relay: %s", len(entries), exc)

    def _apply(self, answers: list[tuple[_Entry, Step, str, Any]], fired: list[tuple[Schedule, Step, str]],
               dropped: dict[int, str]) -> bool:
        """Apply one batch's answers; True when every tick of it was refused as handled."""
        refused = 0
        for e, st, job_id, reply in answers:
            if isinstance(reply, BaseException):  # its master did not answer: this tick and those after it, later
                self._unsent.add(e.seq)
                continue
            if e.seq in self._unsent:
                continue  # (a later step of a schedule whose earlier tick is unsent: not past it)
            code = int(reply[0])
            if code == -3:
                dropped[e.seq] = str(reply[1])
                continue
            if code == -4:  # a last job moved while its status was read: read again, next step
                continue
            e.floor_ms = max(e.floor_ms, st.tick_ms, int(reply[1]) if code == -2 else 0)
            refused += code == -2
            if code == 1:
                fired.append((e.schedule, st, job_id))
        return bool(answers) and refused == len(answers)

    @staticmethod
    def _report(fired: list[tuple[Schedule, Step, str]]) -> None:
        if len(fired) > LOG_EACH:
            late = max(st.late_ms for _, st, _ in fired)
            log.info("schedules: fired %d tick(s), the latest %d ms after its time", len(fired), late)
            return
        for s, st, job_id in fired:
            log.info("schedule %s: tick %s fired", s.id, iso(st.tick_ms),
                     extra={"schedule": s.id, "tick": iso(st.tick_ms), "job_id": job_id, "type": s.function,
                            "late_ms": st.late_ms})

    # --- the thread ----------------------------------------------------------------

    def _loop(self) -> None:
        outage = Outage("ticker", log)
        while not self._stop.is_set():
            try:
                wait = self.step()
                outage.ok()
            except OUTAGE as exc:  # (a cluster node away, too)
                self._standby.outage()
                outage.failed(exc, self._stop)
                continue
            except Exception:
                log.exception("ticker: unexpected error; continuing")
                wait = 1.0
            self._wake.wait(wait)
            self._wake.clear()

