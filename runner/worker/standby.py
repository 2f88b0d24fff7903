"""A ticker's schedules whose definition lost: standing by to take them back.

Deploys hand a schedule to the definition Redis first saw most recently (adopt.lua). A
definition that lost stands by here, so that a definition whose workers live holds the
schedule. Every HEARTBEAT_S the ticker says which schedules it
holds (alive.lua, ticker.py) and, for those it lost, this standby:

- adopts them again as a rejoin: it wins where the state holds its own definition (a
  sibling took the schedule back) or an older one (a takeover writes its taker's born),
  never a schedule a newer deploy removed or whose state is gone;
- takes back those whose holders went quiet (a canary withdrawn): once it has itself
  seen their stamp unchanged for TAKEOVER_S on its own clock, and the stamp is that old
  by the server's clock too. adopt.lua's takeover checks the silence again atomically. An
  outage resets what it saw: no stamp reached Redis meanwhile, the holders' neither.

It also retires, by the same test of silence, the schedules its registry does not define
that living workers held when it was adopted (adopt.lua keeps those: an older release
never retires what a newer one added, and nothing tells the two apart but whether the
schedule's holders live).

What it wins goes back to the ticker, which fires it from where the state says, under
MISSED.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator

from runner.catalog.schedules import Schedule
from runner.runtime import Runtime
from runner.store.keys import QueueKeys
from runner.store.schedules import TEST_ENV, TOMBSTONE_S, last_seen

log = logging.getLogger("runner.ticker")


def _timing() -> tuple[float, float]:
    """How often a ticker says it lives, and how long holders may be quiet before a
    standby takes over (seconds). Tests shorten both (with the schedules' test clock on):
    RUNNER_TEST_STANDBY="<heartbeat>,<takeover>"."""
    if os.environ.get(TEST_ENV) == "1" and os.environ.get("RUNNER_TEST_STANDBY"):
        beat, takeover = (float(x) for x in os.environ["RUNNER_TEST_STANDBY"].split(","))
        return beat, takeover
    return 10.0, 60.0


HEARTBEAT_S, TAKEOVER_S = _timing()
REJOIN = -1  # adopt.lua's stale_before for a standby's rejoin
CHUNK = 500  # schedules per adopt call, as the ticker's adoption


class Standby:
    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime
        self.waiting: dict[str, dict[str, Schedule]] = {}  # queue -> id -> a definition that lost
        self.undefined: dict[str, list[str]] = {}  # queue -> ids it does not define, not retired
        self._quiet: dict[str, tuple[int | None, float]] = {}  # id -> (seen, when first read, monotonic)

    def reset(self, waiting: dict[str, dict[str, Schedule]], undefined: dict[str, list[str]] | None = None) -> None:
        """A new registry was adopted: these are its definitions that lost, and the
        schedules it does not define that living workers hold (adopt.lua kept them)."""
        self.waiting, self.undefined, self._quiet = waiting, undefined or {}, {}

    def outage(self) -> None:
        self._quiet.clear()

    def add(self, s: Schedule, winner: str) -> None:
        """This worker's definition lost: to another definition (``winner``), which it may
        take back should that one's holders go quiet, or to a deploy that removed it ('')."""
        if winner:
            self.waiting.setdefault(s.queue, {})[s.id] = s
            log.info("schedule %s: a newer deploy holds its definition; this worker no longer fires it, "
                     "and stands by", s.id)
        else:
            log.info("schedule %s: a newer deploy removed it; this worker no longer fires it", s.id)

    def take_back(self, now: int, born: int) -> list[tuple[Schedule, int]]:
        """Rejoin, then take back from quiet holders (the module's docstring); returns what
        this worker holds again, each with its floor (ticks at or before it are handled)."""
        won: list[tuple[Schedule, int]] = []
        stale_before = now - int(TAKEOVER_S * 1000)
        mono = time.monotonic()
        for queue, waiting in self.waiting.items():
            k = self.rt.keys[queue]
            for s, held, floor, winner in self._readopt(k, list(waiting.values()), REJOIN, now, born):
                if held:
                    won.append(self._hold(waiting, s, floor, "its definition holds it again; this worker fires it",
                                          logging.INFO))
                elif not winner:  # removed by a newer deploy (or its state is gone)
                    del waiting[s.id]
                    self._quiet.pop(s.id, None)
                    log.info("schedule %s: a newer deploy removed it; this worker no longer fires it", s.id)
            ids = list(waiting)
            quiet: list[Schedule] = []
            for sid, seen in zip(ids, last_seen(self.rt.redis, k, ids), strict=True):
                first = self._quiet.get(sid)
                if seen is None or first is None or first[0] != seen:
                    self._quiet[sid] = (seen, mono)  # a new stamp (or none): watch from here
                elif mono - first[1] >= TAKEOVER_S and seen < stale_before:
                    quiet.append(waiting[sid])
            for s, held, floor, _ in self._readopt(k, quiet, stale_before, now, born):
                if held:
                    won.append(self._hold(waiting, s, floor, f"the workers holding another definition of it have "
                                          f"not been seen for {TAKEOVER_S:g} s (a deploy withdrawn?); this worker "
                                          "takes it back", logging.WARNING))
        return won

    def retire_quiet(self, now: int, born: int) -> None:
        """Retire the schedules this worker does not define once their holders are quiet
        (a rollback, or the last worker of a release that added them gone), as seen on
        its own clock and the server's alike, as a takeover is."""
        stale_before = now - int(TAKEOVER_S * 1000)
        mono = time.monotonic()
        for queue, ids in list(self.undefined.items()):
            k = self.rt.keys[queue]
            quiet: list[str] = []
            for sid, seen in zip(ids, last_seen(self.rt.redis, k, ids), strict=True):
                first = self._quiet.get(sid)
                if seen is None or first is None or first[0] != seen:
                    self._quiet[sid] = (seen, mono)
                elif mono - first[1] >= TAKEOVER_S and seen < stale_before:
                    quiet.append(sid)
            done: set[str] = set()
            for start in range(0, len(quiet), CHUNK):
                part = quiet[start:start + CHUNK]
                reply = self.rt.scripts.adopt(k, born, int(TOMBSTONE_S * 1000), [], part,
                                              stale_before_ms=stale_before, now_ms=now)
                for sid, code in zip(part, reply, strict=True):
                    if int(code) == 1:
                        log.info("schedule %s: no worker defining it has been seen for %g s; retired",
                                 sid, TAKEOVER_S, extra={"schedule": sid})
                    if int(code) != 0:
                        done.add(sid)
                        self._quiet.pop(sid, None)
            left = [i for i in ids if i not in done]
            if left:
                self.undefined[queue] = left
            else:
                del self.undefined[queue]

    def _readopt(self, k: QueueKeys, schedules: list[Schedule], stale_before: int, now: int,
                 born: int) -> Iterator[tuple[Schedule, bool, int, str]]:
        """adopt.lua over standby definitions, a chunk a call: each one's (schedule, won,
        floor, winning digest)."""
        for start in range(0, len(schedules), CHUNK):
            some = schedules[start:start + CHUNK]
            reply = self.rt.scripts.adopt(k, born, int(TOMBSTONE_S * 1000), [(s.id, s.digest) for s in some], [],
                                          stale_before_ms=stale_before, now_ms=now)
            for i, s in enumerate(some):
                yield s, bool(int(reply[3 * i])), int(reply[3 * i + 1]), str(reply[3 * i + 2])

    def _hold(self, waiting: dict[str, Schedule], s: Schedule, floor: int, why: str,
              level: int) -> tuple[Schedule, int]:
        del waiting[s.id]
        self._quiet.pop(s.id, None)
        log.log(level, "schedule %s: %s", s.id, why, extra={"schedule": s.id})
        return s, floor

