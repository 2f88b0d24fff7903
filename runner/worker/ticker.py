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

Alternatives weighed: the ordinary enqueue with a deterministic idempotency key per tick
plus a separate "last fired" write needs two steps (the key guards the gap) and one key
per tick; a lease-holding leader (as RQ's and asynq's schedulers, or a beat) stalls every
schedule while a dead leader's lease runs out.

Time is the server's (``TIME``, store/schedules.py): tickers on hosts with skewed clocks
agree on when a tick is due. Each pass reads it, fires the schedules whose next tick has
come (one pipelined round trip per BATCH ticks), and sleeps until the next tick or at
most WAKE_S, so a hot reload's new registry is adopted within a second.

Deploys: a registry (a worker start, or a reload in `runner dev`) is *adopted* at a
server time, its born time (store/lua/adopt.lua). Where Redis holds another definition
of a schedule (another digest) the most recently born wins, and schedules a newer
registry no longer defines are retired. A ticker whose definition lost stops firing it,
and the tick script refuses a digest the state does not hold, so a worker still running
an older function file never fires a schedule the newer file changed or removed.

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
from pathlib import Path
from typing import Any, Protocol

from runner.catalog.registry import Registry
from runner.catalog.schedules import Schedule, Step, Timeline, iso, plan
from runner.errors import NotReplicated
from runner.runtime import Runtime
from runner.store import codec, records
from runner.store.connection import UNAVAILABLE
from runner.store.outage import Outage
from runner.store.schedules import TOMBSTONE_S, ServerClock, handled_ticks, registered
from runner.store.scripts import NewJob
from runner.worker.faults import fault
from runner.worker.lifeline import vital
from runner.worker.standby import HEARTBEAT_S, Standby

log = logging.getLogger("runner.ticker")

WAKE_S = 0.5

BATCH = 250  # tick script calls per pipelined round trip
LANES = 2  # round trips in flight at once
ADOPT_CHUNK = 500
LOG_EACH = 10  # a pass that fires more ticks than this logs one summary line


class Clock(Protocol):
    """Epoch milliseconds; production's is the Redis server's (ServerClock)."""

    def now_ms(self) -> int: ...


@dataclass(order=True, slots=True)
class _Entry:
    next_ms: int
    seq: int
    schedule: Schedule = field(compare=False)
    line: Timeline = field(compare=False)
    floor_ms: int = field(compare=False, default=0)  # ticks at or before it are handled


class Ticker:
    def __init__(self, runtime: Runtime, clock: Clock | None = None) -> None:
        self.rt = runtime
        self.clock: Clock = clock or ServerClock(runtime.redis, runtime.config.redis.prefix)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=vital(self._loop), name="ticker", daemon=True)
        self._registry: Registry | None = None
        self._born_ms = 0
        self._heap: list[_Entry] = []
        self._standby = Standby(runtime)
        self._beat_ms = 0
        self._said_at = 0.0  # monotonic, the last stamp
        self._seq = 0
        self._lanes = ThreadPoolExecutor(LANES, thread_name_prefix="ticker-send")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._lanes.shutdown(wait=False)

    # --- one pass ------------------------------------------------------------------

    def step(self) -> float:
        """Adopt a new registry if one was swapped in, fire what is due; returns seconds
        until the next tick (at most WAKE_S)."""
        now = self.clock.now_ms()
        reg = self.rt.registry
        if reg is not self._registry:
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
        if not self._heap:
            return WAKE_S
        return min(WAKE_S, max(0.001, (self._heap[0].next_ms - self.clock.now_ms()) / 1000))

    def _adopt(self, reg: Registry, now: int) -> None:
        """Register this registry's definitions (born now), retire what it dropped, and
        schedule the ones it holds from where Redis says they are."""
        rt = self.rt
        scheds = reg.schedules()
        broken = {Path(p).stem for p in reg.errors}  # a file that failed keeps its schedules
        # A folder that failed (none there: a volume not mounted, a wrong directory) says
        # nothing about which schedules were removed: it retires none.
        folder_failed = any(Path(p).suffix != ".py" for p in reg.errors)
        index = registered(rt.redis, rt.keys.values())
        heap: list[_Entry] = []
        lost: list[str] = []
        standby: dict[str, dict[str, Schedule]] = {}
        retired = 0
        for queue, k in rt.keys.items():
            mine = [s for s in scheds if s.queue == queue]
            ids = {s.id for s in mine}
            retire = [] if folder_failed else [
                i for i in index.get(queue, {}) if i not in ids and i.split(":")[0] not in broken]
            for start in range(0, max(len(mine), len(retire), 1), ADOPT_CHUNK):
                part = mine[start:start + ADOPT_CHUNK]
                gone = retire[start:start + ADOPT_CHUNK]
                if not part and not gone:
                    break
                reply = rt.scripts.adopt(k, now, int(TOMBSTONE_S * 1000), [(s.id, s.digest) for s in part], gone)
                for i, s in enumerate(part):
                    won, floor = int(reply[3 * i]), int(reply[3 * i + 1])
                    if not won:
                        lost.append(s.id)
                        if reply[3 * i + 2]:  # held by another definition, not removed
                            standby.setdefault(queue, {})[s.id] = s
                        continue
                    heap.append(self._entry(s, floor))
                retired += sum(int(x) for x in reply[3 * len(part):])
        heapq.heapify(heap)
        self._heap, self._registry, self._born_ms = heap, reg, now
        self._standby.reset(standby)
        self._beat_ms = 0  # say at once which schedules this registry holds
        if scheds or retired:
            log.info("schedules: %d active%s%s", len(heap),
                     f", {len(lost)} held by a newer deploy ({', '.join(lost[:5])})" if lost else "",
                     f", {retired} retired" if retired else "")

    def _entry(self, s: Schedule, floor: int) -> _Entry:
        self._seq += 1
        line = s.timeline
        return _Entry(line.next_after(floor), self._seq, s, line, floor)

    def _beat(self, now: int) -> None:
        """Say which schedules this worker holds; take back those whose holders went quiet."""
        self._say_alive(now)
        for s, floor in self._standby.take_back(now, self._born_ms):
            heapq.heappush(self._heap, self._entry(s, floor))

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
        for queue, entries in held.items():
            for start in range(0, len(entries), ADOPT_CHUNK):
                part = entries[start:start + ADOPT_CHUNK]
                lost = dict(rt.scripts.alive(rt.keys[queue], now, [(e.schedule.id, e.schedule.digest) for e in part]))
                for e in part:
                    if e.schedule.id in lost and e.seq not in in_flight:
                        gone.add(e.seq)
                        self._standby.add(e.schedule, lost[e.schedule.id])
        if gone:
            self._heap = [e for e in self._heap if e.seq not in gone]
            heapq.heapify(self._heap)

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
                look = self._settle(pending.popleft().result(), fired, dropped) or look
            if time.monotonic() - self._said_at >= HEARTBEAT_S:
                # A long catch-up (thousands of missed ticks) still says this worker lives:
                # a standby that saw it quiet would take over from a living holder.
                self._say_alive(self.clock.now_ms(), due)
        while pending:
            self._settle(pending.popleft().result(), fired, dropped)
        for e in due:
            if e.seq not in dropped:
                e.next_ms = e.line.next_after(e.floor_ms)
                heapq.heappush(self._heap, e)
            else:
                self._standby.add(e.schedule, dropped[e.seq])
        self._report(fired)

    def _send(self, chunk: Sequence[tuple[_Entry, Step]], look: bool) -> list[tuple[_Entry, Step, str, Any]]:
        """One pipelined round trip of tick scripts; each batch reads the clock again, so its
        jobs' creation time and lateness are those of its own round trip."""
        rt = self.rt
        if look:
            done = handled_ticks(rt.redis, [(rt.keys[e.schedule.queue], e.schedule.id) for e, _ in chunk])
            for (e, st), tick in zip(chunk, done, strict=True):
                if tick is not None and tick >= st.tick_ms:
                    e.floor_ms = max(e.floor_ms, tick)
            chunk = [(e, st) for (e, st), tick in zip(chunk, done, strict=True) if tick is None or tick < st.tick_ms]
            if not chunk:
                return []
        sent = self.clock.now_ms()
        batch = rt.scripts.batch()
        ids = []
        for e, st in chunk:
            s = e.schedule
            job = NewJob(id=records.new_id(), type=s.function, version=s.version, payload=s.payload_json,
                         max_attempts=s.max_attempts, run_at_ms=0, delay_ms=0, idem_key="", payload_hash="-",
                         resource_key=s.resource_key, limits=s.limits, priority=s.priority,
                         meta=codec.dumps({"schedule": s.id, "tick": iso(st.tick_ms)}))
            ids.append(job.id)
            rt.scripts.tick(rt.keys[s.queue], s.id, job, mode="fire" if st.fire else "skip", tick_ms=st.tick_ms,
                            digest=s.digest, born_ms=self._born_ms, overlap=s.overlap, missed=st.missed,
                            late_ms=max(0, sent - st.tick_ms), now_ms=sent, pipe=batch)
        fault("before_tick")
        try:
            replies = batch.execute()
        except NotReplicated as exc:
            # The ticks ran and are recorded on the master; only their copy on the replicas is
            # unconfirmed. Firing them again would be refused as handled, so warn and go on.
            log.warning("schedules: %d tick(s) written but confirmed by %d of %d replica(s) in %g s; "
                        "a failover now could lose them", len(chunk), exc.acked, exc.wanted, exc.timeout_s)
            replies = exc.replies
        fault("after_tick")
        return [(e, st, job_id, reply) for (e, st), job_id, reply in zip(chunk, ids, replies, strict=True)]

    @staticmethod
    def _settle(answers: list[tuple[_Entry, Step, str, Any]], fired: list[tuple[Schedule, Step, str]],
                dropped: dict[int, str]) -> bool:
        """Apply one batch's answers; True when every tick of it was refused as handled."""
        refused = 0
        for e, st, job_id, reply in answers:
            code = int(reply[0])
            if code == -3:
                dropped[e.seq] = str(reply[1])
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
            except UNAVAILABLE as exc:
                self._standby.outage()
                outage.failed(exc, self._stop)
                continue
            except Exception:
                log.exception("ticker: unexpected error; continuing")
                wait = 1.0
            self._stop.wait(wait)

