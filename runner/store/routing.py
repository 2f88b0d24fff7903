"""Which partition of its queue a job goes to (see docs/partitions.md, "Routing").

Locks, limits and deduplication live in a partition's slot, so every job that must meet
the same lock or idempotency key goes where that key sends it: the first of its limit
keys (RESOURCE_KEY, then CONCURRENCY, then RATE_LIMIT, the order of the ``limits`` lines
catalog/limits.py writes), else its idempotency key, else nowhere in particular.

After a change of ``partitions`` a key may live where another count put it: ``Placement``
looks there (one pipelined round trip, only while another count was recorded lately) and
sends the job to the partition that still holds its key. While two counts are live (a
rolling deploy) producers on each must also agree on a key nobody placed yet, or on one
they placed apart before they knew of each other: the first job of such a key claims its
partition with one ``SET NX`` (the place key, under a hash tag of its own), and every
producer, on either count, sends the key's jobs where the claim says.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # scripts.py routes follow-ups with this module
    from runner.store.keys import QueueKeys
    from runner.store.scripts import NewJob


class Routed(Protocol):
    """What routing reads of a job (a NewJob, or a relayed entry's fields)."""

    @property
    def type(self) -> str: ...
    @property
    def idem_key(self) -> str: ...
    @property
    def limits(self) -> str: ...


def route(job: Routed) -> str:
    """The key that decides the job's partition, '' when it may go to any."""
    return route_of(job.type, job.idem_key, job.limits, getattr(job, "meta", "") or "")


def route_of(type_: str, idem_key: str, limits: str, meta: str = "") -> str:
    """``route`` from a job's fields (its type, idempotency key, limit lines and meta). A
    DEBOUNCE function's burst lives under its debounce key, so every enqueue of one key
    must reach one partition (after a limit key, which must: a lock holds per partition)."""
    if limits:
        first = limits.split("\n", 1)[0]
        return first.partition(" ")[2]
    if meta and '"debounce":' in meta:
        key = _debounce_key(meta)
        if key is not None:
            return f"d:{type_}:{key}"
    if idem_key:
        return f"i:{type_}:{idem_key}"
    return ""


def _debounce_key(meta: str) -> str | None:
    """The debounce key in a job's meta (JSON; see client/enqueuing.py), as jobs.lua
    renders it (tostring of the JSON value)."""
    import orjson

    try:
        d = orjson.loads(meta).get("debounce")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    if not isinstance(d, dict) or "key" not in d:
        return None
    key = d["key"]
    return str(key) if not isinstance(key, bool) else str(key).lower()


def partition_of(key: str, n: int) -> int:
    """The partition a route key goes to: a stable hash (every process agrees)."""
    return zlib.crc32(key.encode("utf-8", "surrogatepass")) % n if n > 1 else 0


def stays(job: NewJob, partition: int, n: int) -> bool:
    """Whether a job may be written in ``partition`` of its queue: it routes there, or it
    has no route (a follow-up then stays with its parent, in the parent's own step)."""
    key = route(job)
    return not key or partition_of(key, n) == partition


class Spread:
    """Where jobs without a route go: all of one round trip to one partition, the next
    round trip to the next, so a batch costs one script call more at most and the
    partitions fill evenly. A partition whose node could not be reached, or whose WAIT
    fell short of ``wait_replicas`` (a promoted master with no replica yet), is passed
    over for AWAY_S, and one whose master was given up as stalled until it answers again
    (keyless jobs may go anywhere). Shared by threads: a lost update only repeats a
    partition."""

    AWAY_S = 2.0

    def __init__(self, start: int | None = None) -> None:
        # A random first turn: each client (a process per job, a CLI call) starts at its own
        # partition, not every one at partition 0, which loaded one master.
        first = random.randrange(1 << 30) if start is None else start
        self._turn = itertools.count(first)
        self._now = first  # the turn of the jobs picked one at a time (``current``)
        # partition -> (monotonic time it is tried again, and what keeps it passed over past
        # that: its master known stalled, until it answers again)
        self._away: dict[int, tuple[float, Callable[[], bool] | None]] = {}

    def avoid(self, partition: int, still: Callable[[], bool] | None = None) -> None:
        """Pass ``partition`` over for AWAY_S, and after that while ``still()`` holds."""
        self._away[partition] = (time.monotonic() + self.AWAY_S, still)

    def next(self, n: int) -> int:
        return self._pick(next(self._turn), n)

    def current(self, n: int) -> int:
        """Where a job picked on its own goes now (on Redis Cluster each partition has its
        own round trips, and a job picks one as it is submitted): the same partition
        until ``advance``, called as a round trip is sent, moves on to the next. So
        callers that arrive together share a round trip, a lone caller's next job goes to
        the next partition, and the callers that arrive while a stalled partition's round
        trip waits go elsewhere."""
        return self._pick(self._now, n)

    def advance(self) -> None:
        self._now += 1

    def _pick(self, turn: int, n: int) -> int:
        if n <= 1:
            return 0
        p = turn % n
        if self._away:
            now = time.monotonic()
            for i in range(n):
                until, still = self._away.get((p + i) % n, (0.0, None))
                if until <= now and (still is None or not still()):
                    return (p + i) % n
        return p


def split(jobs: Sequence[NewJob], n: int, spread: Spread, loose: int = -1) -> dict[int, list[int]]:
    """The indexes of ``jobs`` by partition (in order within each); those without a route
    in partition ``loose`` (-1: the spread's next)."""
    if n <= 1:
        return {0: list(range(len(jobs)))}
    out: dict[int, list[int]] = {}
    for i, job in enumerate(jobs):
        key = route(job)
        if key:
            p = partition_of(key, n)
        else:
            if loose < 0:
                loose = spread.next(n)
            p = loose
        out.setdefault(p, []).append(i)
    return out


@dataclass(frozen=True, slots=True)
class Placement:
    """Where other counts of a queue's partitions put keyed jobs: per count, its partitions
    by index (None: a tag no longer recorded, so drained and empty)."""

    others: tuple[tuple[int, tuple[QueueKeys | None, ...]], ...]
    # The place keys' prefix (``<prefix>:place:<queue>``) and how long a claim lives: the
    # longest a key stays alive in a partition (its idempotency key, a done job's record).
    claims: str = ""
    claim_ms: int = 0

    def place_key(self, key: str) -> str:
        """Where a route key's claimed partition is kept: under a hash tag of its own, so
        the claims spread over a cluster's slots."""
        digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=10).hexdigest()
        return f"{self.claims}:{{{digest}}}"

    def relocate(self, redis: Any, jobs: Sequence[Routed], groups: dict[int, list[int]],
                 parts: Sequence[QueueKeys]) -> dict[int, list[int]]:
        """``groups`` (partition index -> job indexes, by the current count) with each keyed
        job whose key another count placed in another partition, where it still lives,
        moved there. One pipelined round trip of one EXISTS per (key, partition)."""
        probes: dict[tuple[str, tuple[str, ...]], int] = {}  # (tag, keys) -> reply index
        wanted: list[tuple[int, int, list[tuple[int, QueueKeys]]]] = []  # (job, from, [(probe, to)])
        for p, idx in groups.items():
            here = parts[p].tag
            for i in idx:
                job = jobs[i]
                key = route(job)
                if not key:
                    continue
                seen: list[tuple[int, QueueKeys]] = []
                for m, theirs in self.others:
                    k = theirs[partition_of(key, m)]
                    if k is None or k.tag == here:
                        continue
                    look = (k.tag, _marks(k, job, key))
                    seen.append((probes.setdefault(look, len(probes)), k))
                if seen:
                    wanted.append((i, p, seen))
        if not wanted:
            return groups
        pipe = redis.pipeline(transaction=False)
        for _, keys in probes:
            pipe.exists(*keys)
        found = pipe.execute()
        moved: dict[int, int] = {}
        for i, _, seen in wanted:
            for probe, k in seen:
                if int(found[probe]):
                    moved[i] = k.partition
                    break
        if self.claims:
            self._claim(redis, jobs, wanted, moved, parts)
        if not any(moved.get(i, p) != p for i, p, _ in wanted):
            return groups
        out: dict[int, list[int]] = {}
        for p, idx in groups.items():
            for i in idx:
                out.setdefault(moved.get(i, p), []).append(i)
        for idx in out.values():
            idx.sort()
        return out


    def _claim(self, redis: Any, jobs: Sequence[Routed], wanted: Sequence[tuple[int, int, Any]],
               moved: dict[int, int], parts: Sequence[QueueKeys]) -> None:
        """Make ``moved`` send each of the ``wanted`` jobs (keys the counts place apart)
        to its key's claimed partition: the first claim of a key (``SET NX``, the place
        the look-up found, else this count's) wins, and later ones, from a producer on
        any count, read it back (``GET``). One pipelined round trip."""
        first: dict[str, str] = {}  # route key -> the tag this producer claims for it
        for i, p, _ in wanted:
            key = route(jobs[i])
            first.setdefault(key, parts[moved.get(i, p)].tag)
        pipe = redis.pipeline(transaction=False)
        for key, tag in first.items():
            pipe.set(self.place_key(key), tag, nx=True, px=self.claim_ms, get=True)  # (Redis 7.0: NX with GET)
        replies = pipe.execute()
        index = {k.tag: n for n, k in enumerate(parts)}
        won: dict[str, int] = {}
        for (key, tag), got in zip(first.items(), replies, strict=True):
            claimed = got.decode() if isinstance(got, bytes) else got
            won[key] = index.get(claimed if isinstance(claimed, str) else tag, index[tag])
        for i, _, _ in wanted:
            moved[i] = won[route(jobs[i])]


def _marks(k: QueueKeys, job: Routed, key: str) -> tuple[str, ...]:
    """The keys whose presence in partition ``k`` says the job's key lives there: its
    idempotency key (kept a retention after its job), a DEBOUNCE burst's marker (there
    while the burst's job waits: a re-send must join it, not start a second burst), and
    for a limit its holders, its parked jobs and the marker of a job under it enqueued
    there lately (enqueue.lua)."""
    idem = (k.idem(job.type, job.idem_key),) if job.idem_key else ()
    if key.startswith("i:"):
        return idem
    meta = getattr(job, "meta", "") or ""
    burst = _debounce_key(meta) if '"debounce":' in meta else None
    debounced = (k.debounce(job.type, burst),) if burst is not None else ()
    if key.startswith("d:"):
        return (*debounced, *idem)
    return (k.limit(key), k.waiters(key), k.placed(key), *debounced, *idem)
