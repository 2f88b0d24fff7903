"""The roster: which worker processes are alive, what they serve and run, and which
function versions they know, kept in one hash per app (``<prefix>:workers``, a slot of
its own on Redis Cluster, whatever the queues' partitions).

Each worker's scheduler writes its entry every HEARTBEAT_S, stamped with the server's
clock: a beat is a fixed handful of commands whatever the size of the fleet (TIME, then
its HSET and a bid for the pruning, sent together), and nothing per job (the jobs it runs
now are read from its ledgers when the entry is written, so they are as fresh as the last
heartbeat). An entry carries its own time to live (``ttl_ms``, STALE_S): a reader leaves
out an entry not refreshed within it (a worker SIGKILLed, or cut off). A worker that
stops cleanly deletes its own entry.

Dead entries are pruned in bounded work: once per HEARTBEAT_S one worker wins the bid
(``<prefix>:workers:pruner``, SET NX with the heartbeat as its expiry) and reads one
page of PRUNE_PAGE entries with HSCAN, from where the last pruning stopped. It deletes a
stale one only while the entry still holds the value it read (a compare-and-delete
script, unroster.lua): a worker that beats again between the read and the delete (a host back from a
pause) keeps its entry, instead of vanishing from the roster until its next beat.

A roster another program made another Redis type is set aside by the next beat (renamed to
``<key>:corrupt``, lua/aside.lua), which writes its entry again: every worker is listed
again within a heartbeat. Until then a reader lists none and names the key (damage.py).

`GET /workers`, `runner workers` and the dashboard list it; `runner check` reads it to
catch the rolling-deploy direction the deploy gate cannot see in the queues: new code on
disk (accepted by new web processes) that live workers do not know yet.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runner.store import codec, damage, records, scriptkeys

if TYPE_CHECKING:
    from runner.store.scripts import Scripts


def _timing() -> tuple[float, float]:
    """How often a worker writes its entry, and how long the entry lives without one
    (seconds). Tests shorten both: RUNNER_TEST_ROSTER="<heartbeat>,<ttl>"."""
    raw = os.environ.get("RUNNER_TEST_ROSTER")
    if raw:
        beat, ttl = (float(x) for x in raw.split(","))
        return beat, ttl
    return 5.0, 30.0


# A heartbeat every 5 s keeps the jobs shown as running within seconds of the truth at
# one write per worker; a worker is gone after six missed beats (a pause of a loaded
# host, or of Redis, is not a death).
HEARTBEAT_S, STALE_S = _timing()
# Which write sets a damaged roster aside (damage.py).
MENDS = f"The next heartbeat of any worker (every {HEARTBEAT_S:g} s)"


def key(prefix: str) -> str:
    return f"{prefix}:workers"


def server_ms(redis: Any) -> int:
    sec, usec = redis.time()
    return int(sec) * 1000 + int(usec) // 1000


@dataclass(frozen=True, slots=True)
class Member:
    id: str
    host: str
    pid: int
    queues: tuple[str, ...]
    functions: Mapping[str, int]  # type -> newest payload version it knows
    started_ms: int
    seen_ms: int
    concurrency: int = 0  # handlers it runs at once, over its queues
    isolation: str = ""  # "thread", "process" or "mixed": how its functions' handlers run
    version: str = ""  # runner's version
    release: str | None = None  # the deploy's release or commit, when the platform says
    running: Sequence[Running] = ()  # the jobs its handlers run now
    ttl_ms: int = 0  # how long the entry lives without a beat (0: STALE_S)

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "host": self.host, "pid": self.pid, "queues": list(self.queues),
                "functions": dict(self.functions), "started_ms": self.started_ms, "seen_ms": self.seen_ms,
                "concurrency": self.concurrency, "isolation": self.isolation, "version": self.version,
                "release": self.release, "running": [[r.id, r.type, r.started_ms] for r in self.running],
                "ttl_ms": self.ttl_ms or int(STALE_S * 1000)}

    def view(self) -> dict[str, Any]:
        """As GET /workers shows it: times as epoch seconds, as a job's are (None for one
        past the last date: another writer's entry, see _member)."""
        return {"id": self.id, "host": self.host, "pid": self.pid, "queues": list(self.queues),
                "concurrency": self.concurrency, "isolation": self.isolation, "version": self.version,
                "release": self.release, "started_at": records.seconds_of(self.started_ms),
                "last_seen": records.seconds_of(self.seen_ms),
                "running": [{"id": r.id, "type": r.type, "started": records.seconds_of(r.started_ms)}
                            for r in self.running],
                "functions": dict(self.functions)}

    def live(self, now_ms: int) -> bool:
        return now_ms - self.seen_ms <= (self.ttl_ms or STALE_S * 1000)


@dataclass(frozen=True, slots=True)
class Running:
    id: str
    type: str
    started_ms: int  # when its handler started (server ms)


def release() -> str | None:
    """The deploy's release as the platform names it, if it does: RUNNER_RELEASE, else
    Heroku's (dyno metadata) or a build's source commit."""
    for name in ("RUNNER_RELEASE", "HEROKU_RELEASE_VERSION", "SOURCE_VERSION", "GIT_COMMIT"):
        if os.environ.get(name):
            return os.environ[name]
    return None


@dataclass(slots=True)
class Pulse:
    """What one worker's beats carry from one to the next: its start as the roster has
    it (the server's time of its first beat) and where its last pruning stopped."""

    started_ms: int = 0
    cursor: int = 0


# Entries one pruning reads (HSCAN's COUNT: a hint, which a small hash, under 128 entries,
# answers whole): dead entries go at this many per HEARTBEAT_S across the fleet, more
# than workers die, and a reader leaves them out meanwhile anyway.
PRUNE_PAGE = 100

def pruner_key(prefix: str) -> str:
    return f"{prefix}:workers:pruner"


def beat(scripts: Scripts, prefix: str, member: Member, pulse: Pulse | None = None,
         now_ms: int | None = None) -> None:
    """Write this worker's entry, stamped now by the server's clock, and, when this beat
    wins the bid, prune one page of stale entries (through the script transport: the
    compare-and-delete is unroster.lua). A member without ``started_ms`` (0) is on record
    from its first beat's time (kept in ``pulse``): the server's, as every time a user
    sees, not its host's (``now_ms``: read already by the caller)."""
    redis = scripts.client
    pulse = Pulse() if pulse is None else pulse
    now = server_ms(redis) if now_ms is None else now_ms
    started = member.started_ms or pulse.started_ms or now
    pulse.started_ms = started
    entry = {**member.as_dict(), "seen_ms": now, "started_ms": started}
    pipe = redis.pipeline(transaction=False)
    pipe.hset(key(prefix), member.id, codec.dumps(entry))
    pipe.set(pruner_key(prefix), member.id, nx=True, px=max(1, int(HEARTBEAT_S * 1000)))
    wrote, won = pipe.execute(raise_on_error=False)
    if isinstance(won, Exception):
        raise won
    if isinstance(wrote, Exception):
        if not damage.wrong_type(wrote):
            raise wrote
        # Another type (another program's write): set aside, and this entry written again.
        scripts.aside(key(prefix), "hash")
        redis.hset(key(prefix), member.id, codec.dumps(entry))
    if won:
        _prune(scripts, prefix, member.id, now, pulse)


def _prune(scripts: Scripts, prefix: str, own: str, now_ms: int, pulse: Pulse) -> None:
    """One page of the roster read, and its stale entries deleted unless beaten since."""
    cursor, page = scripts.client.hscan(key(prefix), pulse.cursor, count=PRUNE_PAGE)
    pulse.cursor = int(cursor)
    stale = [(field, raw) for field, raw in page.items() if field != own and not _is_live(raw, now_ms)]
    if not stale:
        return
    # One round trip on one server; on Redis Cluster each call on its own to the roster's
    # master, in order (a page holds few dead entries: workers that died since the last).
    batch = scripts.batch()
    keys = scriptkeys.keys("unroster", roster=key(prefix))
    for field, raw in stale:
        batch.add("unroster", keys, [field, raw])
    batch.execute()


def _is_live(raw: str, now_ms: int) -> bool:
    """Whether an entry as stored is live; a malformed one is not (nothing reads it)."""
    m = _member(raw)
    return m is not None and m.live(now_ms)


def leave(redis: Any, prefix: str, member_id: str) -> None:
    try:
        redis.hdel(key(prefix), member_id)
    except Exception as exc:  # (a roster of another type holds no entry of this worker)
        if not damage.wrong_type(exc):
            raise


def read(redis: Any, prefix: str, now_ms: int | None = None, include_stale: bool = False,
         damaged: list[damage.Damaged] | None = None) -> list[Member]:
    """The live workers (seen within their entry's time to live), oldest first; a
    malformed entry is skipped. An entry of an older release (no running jobs, no ttl)
    reads with the defaults. A roster of another Redis type lists none, and is named in
    ``damaged``."""
    now = server_ms(redis) if now_ms is None else now_ms
    out = []
    try:
        raws = redis.hvals(key(prefix))
    except Exception as exc:
        if not damage.wrong_type(exc):
            raise
        if damaged is not None:
            damaged.append(damage.found(redis, key(prefix), "hash", MENDS))
        raws = []
    for raw in raws:
        m = _member(raw)
        if m is not None and (include_stale or m.live(now)):
            out.append(m)
    out.sort(key=lambda m: (m.started_ms, m.id))
    return out


def _member(raw: str | bytes) -> Member | None:
    """An entry as stored, or None when it is malformed."""
    try:
        d = codec.loads(raw)
        rel = d.get("release")
        return Member(id=str(d["id"]), host=str(d["host"]), pid=int(d["pid"]), queues=tuple(d["queues"]),
                      functions={str(k): int(v) for k, v in d["functions"].items()},
                      started_ms=_ms(d["started_ms"]), seen_ms=int(d["seen_ms"]),
                      concurrency=int(d.get("concurrency") or 0), isolation=str(d.get("isolation") or ""),
                      version=str(d.get("version") or ""), release=None if rel is None else str(rel),
                      running=tuple(Running(str(i), str(t), _ms(s)) for i, t, s in d.get("running") or ()),
                      ttl_ms=int(d.get("ttl_ms") or 0))
    except (codec.DecodeError, KeyError, TypeError, ValueError, AttributeError):
        return None


def _ms(raw: Any) -> int:
    """A start time of an entry: 0 (unknown) unless a whole number of ms a date can show
    (another writer's 1e300 made `runner workers` and the console fail)."""
    return raw if isinstance(raw, int) and not isinstance(raw, bool) and 0 < raw <= records.MAX_TIME_MS else 0
