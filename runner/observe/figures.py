"""Read the cluster-wide figures from Redis: queue structures, the stats hashes and the
per-minute throughput series (layouts in keys.py and metrics.py). Read-only; /metrics,
GET /queues, the dashboard and `runner stats` all read through here, so every process
shows the whole cluster and they agree. ``queue_view`` is the one documented shape of a
queue's figures, for GET /queues and `runner stats --json` alike.
"""

from __future__ import annotations

import contextlib
import heapq
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from runner.config import QueueConfig
from runner.observe import metrics
from runner.store.shards import on_cluster
from runner.store.stats import minute_hashes, partition_rows, ready_since, server_ms, stats_hashes

T = TypeVar("T")


class Source(Protocol):
    """What the readers need of a Runtime: its Redis client, queue keys and registry."""

    @property
    def redis(self) -> Any: ...
    @property
    def keys(self) -> Mapping[str, Any]: ...
    @property
    def parts(self) -> Mapping[str, Sequence[Any]]: ...
    @property
    def registry(self) -> Any: ...
    def discover_for_reading(self) -> Any: ...

# Claims held back, by reason: deferred (a full resource or concurrency limit), paused (a
# pause), ratelimited (no rate token due yet).
COUNTERS = ("enqueued", "succeeded", "retried", "dead", "cancelled", "duplicates", "deduplicated", "deferred", "paused",
            "ratelimited", "lost", "expired", "followups", "relayed", "abandoned", "steps", "replays", "sleeps",
            "waits", "signals", "invokes")
# The stats hash says "?" for jobs buried before their type could be read (malformed), and
# for a type that can be no function's name (metrics.counted).
MALFORMED = metrics.MALFORMED
# A queue's figures name each function loaded here, the malformed "?", and at most this
# many other type names of its stats hash (the busiest: most jobs counted), each a series
# of about 40 samples in /metrics; the rest are summed under OTHER. Type names reach the
# hash from records (another writer's, a function since removed): 10,000 of them made a
# scrape take 18 s, 100,000 time out, and each was a series Prometheus keeps.
MAX_NAMED = 100
# No function's name: files starting with "_" are never loaded. A type of that name in
# the hash (another writer's) is summed into it too, so no two series share the label.
OTHER = "_other"
_LE_MS: tuple[float, ...] = (*map(float, metrics.BUCKETS_MS), float("inf"))
_LE_INDEX = {str(b): i for i, b in enumerate(metrics.BUCKETS_MS)} | {"inf": len(metrics.BUCKETS_MS)}


@dataclass(slots=True)
class Histogram:
    """Per-bucket counts (not cumulative) over ``metrics.BUCKETS_MS`` plus +Inf; sum in ms."""

    counts: list[int] = field(default_factory=lambda: [0] * len(_LE_MS))
    sum_ms: int = 0

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound in ms, cumulative count); the last bound is +Inf."""
        out: list[tuple[float, int]] = []
        total = 0
        for le, n in zip(_LE_MS, self.counts, strict=True):
            total += n
            out.append((le, total))
        return out

    def quantile(self, q: float) -> float | None:
        """Estimate like PromQL's histogram_quantile: linear within the bucket, in ms."""
        total = self.count
        if total == 0:
            return None
        rank = q * total
        lower, seen = 0.0, 0
        for le, n in zip(_LE_MS, self.counts, strict=True):
            if n and seen + n >= rank:
                if le == float("inf"):
                    return lower  # beyond the top bound: the top bound is all we know
                return lower + (le - lower) * (rank - seen) / n
            seen += n
            if le != float("inf"):
                lower = le
        return lower

    def summary(self) -> dict[str, Any]:
        n = self.count
        return {
            "count": n,
            "sum_ms": self.sum_ms,
            "mean_ms": round(self.sum_ms / n, 3) if n else None,
            "p50_ms": _round(self.quantile(0.5)),
            "p95_ms": _round(self.quantile(0.95)),
            "p99_ms": _round(self.quantile(0.99)),
        }


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


@dataclass(slots=True)
class FunctionFigures:
    name: str
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    latency: Histogram = field(default_factory=Histogram)
    run: Histogram = field(default_factory=Histogram)

    def as_dict(self) -> dict[str, Any]:
        return {**self.counters, "latency": self.latency.summary(), "run_time": self.run.summary()}


@dataclass(frozen=True, slots=True)
class PartitionFigures:
    """One partition of a partitioned queue (docs/partitions.md): where its jobs are."""

    partition: int
    tag: str
    draining: bool  # of another count, served until it holds nothing
    ready: int
    processing: int
    scheduled: int
    dead: int
    held: bool = False  # its master short of [redis] wait_replicas: nothing of it runs

    def as_dict(self) -> dict[str, Any]:
        return {"partition": self.partition, "tag": self.tag, "draining": self.draining, "ready": self.ready,
                "processing": self.processing, "scheduled": self.scheduled, "dead": self.dead, "held": self.held}


@dataclass(slots=True)
class QueueFigures:
    name: str
    ready: int = 0
    processing: int = 0
    lease_expired: int = 0
    scheduled: int = 0  # delayed, retrying or deferred: not the durable jobs below
    scheduled_due: int = 0
    sleeping: int = 0  # durable jobs at ctx.sleep (their list index)
    waiting: int = 0  # durable jobs at a wait for a signal, an event or a child
    dead: int = 0
    cancelled: int = 0
    oldest_ready_age_s: float | None = None
    stray: int = 0
    corrupt: dict[str, int] = field(default_factory=dict)  # keys set aside as damaged, by name
    groups_completed: int = 0
    events_emitted: int = 0  # events whose home is this queue (emit.lua)
    events_jobs: int = 0  # the jobs they started
    paused: bool = False
    paused_functions: list[str] = field(default_factory=list)
    functions: dict[str, FunctionFigures] = field(default_factory=dict)
    partitions: list[PartitionFigures] = field(default_factory=list)  # of a queue of several
    # Fields of its stats hash not read: a hash too wide to read whole (store/stats.py
    # STATS_WHOLE) is read by the names of the functions loaded, "?" and OTHER only.
    stats_left_out: int = 0
    # Every partition (number, tag, held): held while its master has fewer replicas
    # connected than [redis] wait_replicas (a master just promoted, its replica not back):
    # a claim's WAIT falls short there and its jobs are handed back, so none of them runs,
    # and enqueues to it are refused (NotReplicated).
    holds: list[tuple[int, str, bool]] = field(default_factory=list)
    # Redis Cluster: the partitions (number, tag) this read left out, their master stalled,
    # down or refusing (read_queues); the figures above are the others'. ``unread``: every
    # one of them was left out, so the figures above are no reading at all.
    left_out: list[tuple[int, str]] = field(default_factory=list)
    unread: bool = False

    @property
    def held(self) -> list[str]:
        return [tag for _, tag, held in self.holds if held]

    def function(self, name: str) -> FunctionFigures:
        f = self.functions.get(name)
        if f is None:
            f = self.functions[name] = FunctionFigures(name)
        return f


def _int(v: Any) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return 0


def _split(name: str) -> tuple[str, str, str] | None:
    """A stats field's (figure, type, bucket), bucket '' but for lat and run; None for a
    per-queue field. A type another writer gave a "|" is one type (the figure is the
    first part, a bucket the last), shown as the malformed "?" as metrics.counted counts it."""
    kind, sep, rest = name.partition("|")
    if not sep:
        return None
    bucket = ""
    if kind in ("lat", "run"):
        rest, sep, bucket = rest.rpartition("|")
        if not sep:
            return kind, bucket, ""  # (no bucket: a field no writer makes, skipped)
    return kind, rest, bucket


def named(raw: Mapping[str, str], known: Collection[str]) -> Callable[[str], str]:
    """The name each type of a stats hash is shown under: its own for a ``known`` one (the
    functions loaded), the malformed "?" (and any name no function can have: one past
    metrics.MAX_TYPE_BYTES, or with "|" or a space, as metrics.counted says) and the
    MAX_NAMED others with the most jobs counted (enqueued, succeeded, dead: what every job
    adds to), else OTHER; a name starting with "_" (no function's) is OTHER too."""
    activity: dict[str, int] = {}
    for name, value in raw.items():
        parts = _split(name)
        if parts is None or parts[0] in ("corrupt", "own"):  # (corrupt|<key>: no type; own|<type>: a mark)
            continue
        fn = parts[1]
        if fn in known or fn == MALFORMED or fn.startswith("_") or metrics.counted(fn) == MALFORMED:
            continue
        activity[fn] = activity.get(fn, 0) + (_int(value) if parts[0] in ("enqueued", "succeeded", "dead") else 0)
    kept = set(activity) if len(activity) <= MAX_NAMED else set(
        heapq.nlargest(MAX_NAMED, activity, key=lambda fn: (activity[fn], fn)))

    def shown(fn: str) -> str:
        if fn in kept or fn in known or fn == MALFORMED:
            return fn
        return MALFORMED if not fn.startswith("_") and metrics.counted(fn) == MALFORMED else OTHER
    return shown


def parse_stats(q: QueueFigures, raw: Mapping[str, str], known: Collection[str] = ()) -> None:
    """Fold one queue's stats hash into ``q``; unknown fields are skipped (newer writers).
    Its types past MAX_NAMED beyond the ``known`` are summed under OTHER (``named``)."""
    shown = named(raw, known)
    for name, value in raw.items():
        parts = _split(name)
        if parts is None:
            if name == "stray":
                q.stray = _int(value)
            elif name == "groups_completed":
                q.groups_completed = _int(value)
            elif name == "events_emitted":
                q.events_emitted = _int(value)
            elif name == "events_jobs":
                q.events_jobs = _int(value)
            continue
        kind, typ, le = parts
        if kind == "corrupt":  # (the key's name, as reclaim.lua counts it, not a type)
            if typ in CORRUPT_NAMES:  # (another writer's name is no series)
                q.corrupt[typ] = q.corrupt.get(typ, 0) + _int(value)
            continue
        fn = shown(typ)
        if not le:
            if kind in COUNTERS:
                q.function(fn).counters[kind] += _int(value)
            elif kind == "lat_sum":
                q.function(fn).latency.sum_ms += _int(value)
            elif kind == "run_sum":
                q.function(fn).run.sum_ms += _int(value)
        elif le in _LE_INDEX:
            f = q.function(fn)
            h = f.latency if kind == "lat" else f.run
            h.counts[_LE_INDEX[le]] += _int(value)


# The names reclaim.lua counts a damaged key under ("corrupt|<name>"); joblog.lua and
# emit.lua a job's log or stream, and a partition's recent events, set aside by their writer.
CORRUPT_NAMES = ("stats", "claims", "done meta", "leases", "ready", "dead", "notify", "scheduled", "limwait",
                 "delayed", "sleeping", "waiting", "log", "stream", "events")
_QUEUE_FIELDS = ("stray", "groups_completed", "events_emitted", "events_jobs")


def stats_names(functions: Collection[str]) -> list[str]:
    """Every field parse_stats reads of a queue's stats hash for ``functions`` (and the
    malformed "?" and OTHER): what a reader asks by name of a hash too wide to read whole."""
    out = [*_QUEUE_FIELDS, *(f"corrupt|{n}" for n in CORRUPT_NAMES)]
    for fn in sorted({*functions, MALFORMED, OTHER}):
        out += [f"{c}|{fn}" for c in COUNTERS]
        out += [f"lat_sum|{fn}", f"run_sum|{fn}", f"own|{fn}"]  # (own: its mark, read so not left out)
        out += [f"{kind}|{fn}|{le}" for kind in ("lat", "run") for le in _LE_INDEX]
    return out


def _wanted(rt: Source) -> int:
    """[redis] wait_replicas of the reader's config (0: no partition is ever held)."""
    config = getattr(rt, "config", None)
    return int(getattr(getattr(config, "redis", None), "wait_replicas", 0) or 0)


def read_queues(rt: Source, now_ms: int | None = None, loaded_functions: bool = True) -> list[QueueFigures]:
    """Every configured queue's figures, in three pipelined round trips (and one for the
    server's clock, unless ``now_ms`` is given: tests pin it); a stats hash too wide to
    read whole is read by name and its fields left out counted (``stats_left_out``).

    Functions loaded now appear even before they have run (with zeros), so a scrape sees
    a counter from its first value; ``loaded_functions=False`` leaves them out (only the
    functions with counts appear) for a reader that sums them and should not load the
    registry for that.

    On Redis Cluster each round trip goes to every master at once, each master waited
    for at most a reader's bound (2 s, longer for one whose recent round trips are slow),
    as a read of jobs is (Transport.each_master): a master that does not answer within it
    (stalled, down, refusing) is marked and its partitions left out, the reads after it
    skip it at once, and the figures are the others' with each queue's ``left_out``
    naming them (docs/partitions.md, "A shard down"). A read that left out every
    partition raises the outage. On one server, on the caller's thread as before.
    """
    keys = rt.keys
    rt.discover_for_reading()  # a long-lived reader (a /metrics scrape) learns of draining partitions
    every = [k for parts in rt.parts.values() for k in parts]
    bound = cluster_scripts(rt)
    with bounded_reads(bound):
        if now_ms is None:
            now_ms = server_ms(rt.redis) if bound is None else int(bound.server_ms())
        at = now_ms
        reads = ByMaster(bound, every)
        # Each as store/stats.py's ROW names its fields.
        rows = reads.each(range(len(every)), lambda idx: partition_rows(rt.redis, [every[i] for i in idx], at))
        if every and not rows:
            raise next(iter(reads.away.values()))
        # The stats hashes in a second round trip, each read whole or by name (by its size).
        hashes = reads.each(sorted(rows), lambda idx: stats_hashes(
            rt.redis, [every[i] for i in idx], [rows[i][7] for i in idx], [rows[i][14] for i in idx],
            lambda: stats_names(list(rt.registry.functions))))
        wanted = _wanted(rt)
        replicas: dict[int, int | None] = {}
        if wanted:  # (guard.py loads logging: a reading command without wait_replicas never does)
            from runner.store.guard import replicas_by_key

            replicas = reads.each(sorted(hashes), lambda idx: replicas_by_key(rt.redis, [every[i].ready for i in idx]))
        # The next jobs to run: when each became ready, for the oldest one's age.
        heads = {i: [j for j in (rows[i][6], rows[i][11][0] if rows[i][11] else None) if j]
                 for i in hashes if i not in reads.away}
        since = reads.each([i for i in sorted(heads) if heads[i]], lambda idx: _grouped(
            ready_since(rt.redis, [(every[i], j) for i in idx for j in heads[i]]), [len(heads[i]) for i in idx]))
    live = [i for i in range(len(every)) if i not in reads.away]
    if every and not live:
        raise next(iter(reads.away.values()))
    left_out: dict[str, int] = {}
    holds: dict[str, list[tuple[int, str, bool]]] = {}
    for i in live:
        k, row, h = every[i], rows[i], hashes[i]
        left_out[k.queue] = left_out.get(k.queue, 0) + row[7] - len(h)
        row[7] = h
        have = replicas.get(i) if wanted else None
        holds.setdefault(k.queue, []).append((k.partition, k.tag, have is not None and have < wanted))
    # A partitioned queue's figures are its partitions' summed: every count and histogram
    # bucket of the stats hashes adds up; its pause is its home partition's (written to all).
    sums: dict[str, list[Any]] = {}
    each: dict[str, list[PartitionFigures]] = {}
    for i in live:
        k, row = every[i], rows[i]
        if len(rt.parts[k.queue]) > 1:
            each.setdefault(k.queue, []).append(PartitionFigures(
                k.partition, k.tag, k.draining, ready=row[0] + row[9], processing=row[1],
                scheduled=max(0, row[3] - row[12] - row[13]), dead=row[5],
                held=any(held for _, tag, held in holds[k.queue] if tag == k.tag)))
        acc = sums.get(k.queue)
        if acc is None:
            sums[k.queue] = [*row[:6], dict(row[7]), row[8], row[9], row[10], row[12], row[13]]
            continue
        for j in range(6):
            acc[j] += row[j]
        for name, value in row[7].items():
            acc[6][name] = str(_int(acc[6].get(name)) + _int(value))
        acc[8] += row[9]
        acc[9] += row[10]
        acc[10] += row[12]
        acc[11] += row[13]
        if k is keys[k.queue]:
            acc[7] = row[8]
    away: dict[str, list[tuple[int, str]]] = {}
    for i in sorted(reads.away):
        away.setdefault(every[i].queue, []).append((every[i].partition, every[i].tag))
    out: list[QueueFigures] = []
    by_name: dict[str, QueueFigures] = {}
    known = frozenset(rt.registry.functions) if loaded_functions else frozenset()
    for name in keys:
        if name not in sums:  # every partition left out (its shard down: cli shards_down; or away now)
            out.append(by_name.setdefault(name, QueueFigures(name, left_out=away.get(name, []), unread=True)))
            continue
        ready, leases, expired, sched, due, dead, stats, paused, prio, cancelled, sleeping, waiting = sums[name]
        # The scheduled set also holds the sleeping and waiting durable jobs (their wake-up
        # times): counted on their own, as their lists show them.
        q = QueueFigures(name, ready=ready + prio, processing=leases, lease_expired=expired,
                         scheduled=max(0, sched - sleeping - waiting), scheduled_due=due, sleeping=sleeping,
                         waiting=waiting, dead=dead, cancelled=cancelled, paused="queue" in paused,
                         paused_functions=sorted(f[3:] for f in paused if f.startswith("fn:")),
                         partitions=each.get(name, []), stats_left_out=left_out.get(name, 0),
                         holds=holds.get(name, []), left_out=away.get(name, []))
        parse_stats(q, stats, known)
        out.append(q)
        by_name[name] = q
    for fn in rt.registry.functions.values() if loaded_functions else ():
        for q in out:
            if q.name == fn.queue:
                q.function(fn.name)
    for i in live:
        for ready_ms in since.get(i, ()):
            if ready_ms:
                q = by_name[every[i].queue]
                age = max(0.0, (now_ms - _int(ready_ms)) / 1000)
                q.oldest_ready_age_s = max(q.oldest_ready_age_s or 0.0, age)
    return out


def left_out_view(figures: Sequence[QueueFigures]) -> list[dict[str, str]]:
    """The partitions a read of the figures left out, as GET /queues and `runner stats
    --json` list them (and GET /jobs its pages'): ``[{"queue", "partition"}]``."""
    return [{"queue": q.name, "partition": tag} for q in figures for _, tag in q.left_out]


def cluster_scripts(rt: Source) -> Any:
    """The Transport that bounds each master's read on Redis Cluster; None elsewhere (one
    server, Sentinel, a reading command's own link: read on the caller's thread)."""
    if not on_cluster(rt.redis):
        return None
    return getattr(rt, "scripts", None)


def bounded_reads(scripts: Any) -> Any:
    """A reader's bound on each master (Transport.waiting), on Redis Cluster."""
    if scripts is None:
        return contextlib.nullcontext()
    from runner.store.transport import READ_WAIT_S

    return scripts.waiting(READ_WAIT_S)


def _grouped(flat: Sequence[T], sizes: Sequence[int]) -> list[list[T]]:
    """``flat`` cut into consecutive lists of ``sizes``."""
    out, at = [], 0
    for n in sizes:
        out.append(list(flat[at:at + n]))
        at += n
    return out


class ByMaster:
    """Round trips over the partitions of ``every``, on Redis Cluster a master at a time
    (``scripts``: its Transport, each_master; None: one read on the caller's thread),
    keeping the partitions left out so far (``away``, by index: the outage of each) out
    of the next."""

    def __init__(self, scripts: Any, every: Sequence[Any], what: str = "a read of the queue figures") -> None:
        self.scripts, self.every, self.what = scripts, every, what
        self.away: dict[int, BaseException] = {}

    def each(self, idx: Iterable[int], read: Callable[[list[int]], Sequence[T]]) -> dict[int, T]:
        """``read`` of the partitions at ``idx`` not left out yet (it answers one result for
        each index it is given, in order): by index, the results of those read."""
        todo = [i for i in idx if i not in self.away]
        if not todo:
            return {}
        if self.scripts is None:
            return dict(zip(todo, read(todo), strict=True))
        got, away = self.scripts.each_master([self.every[i].ready for i in todo],
                                             lambda sub: read([todo[j] for j in sub]), self.what)
        for j, exc in away.items():
            self.away[todo[j]] = exc
        return {todo[j]: one for j, one in enumerate(got) if j not in away}


def queue_view(q: QueueFigures, cfg: QueueConfig) -> dict[str, Any]:
    """One queue's figures as GET /queues and `runner stats --json` show them."""
    return {
        "name": q.name,
        "ready": q.ready,
        "processing": q.processing,
        "lease_expired": q.lease_expired,
        "scheduled": q.scheduled,
        "scheduled_due": q.scheduled_due,
        "sleeping": q.sleeping,
        "waiting": q.waiting,
        "dead": q.dead,
        "cancelled": q.cancelled,
        "oldest_ready_age_s": q.oldest_ready_age_s,
        "paused": q.paused,
        "paused_functions": q.paused_functions,
        "groups_completed": q.groups_completed,
        "events_emitted": q.events_emitted,
        "events_jobs": q.events_jobs,
        "visibility_timeout_s": cfg.visibility_timeout_s,
        "concurrency": cfg.concurrency,
        "max_attempts": cfg.max_attempts,
        "functions": {name: f.as_dict() for name, f in sorted(q.functions.items())},
        "partitions": [p.as_dict() for p in q.partitions],
        "stats_fields_left_out": q.stats_left_out,
        "held": q.held,
    }


def read_throughput(rt: Source, minutes: int, now_ms: int | None = None) -> dict[str, Any]:
    """Per queue, each field of the per-minute hashes ("done", and any other the writers
    add) as a series over the last ``minutes`` minutes by the server's clock (unless
    ``now_ms`` is given), oldest first, with ``times`` the start of each minute in epoch
    seconds; a minute with no hash counts 0. On Redis Cluster a master that does not
    answer within a reader's bound is left out as read_queues leaves it out: the series
    are the other partitions' sums, and ``left_out`` (there only then) names its partitions."""
    rt.discover_for_reading()
    every = [k for parts in rt.parts.values() for k in parts]
    bound = cluster_scripts(rt)
    with bounded_reads(bound):
        if now_ms is None:
            now_ms = server_ms(rt.redis) if bound is None else int(bound.server_ms())
        last = now_ms // 60_000
        span = list(range(last - minutes + 1, last + 1))
        reads = ByMaster(bound, every, "a read of the throughput")
        got = reads.each(range(len(every)), lambda idx: minute_hashes(rt.redis, [every[i] for i in idx], span))
    if every and not got:
        raise next(iter(reads.away.values()))
    per_queue: dict[str, list[dict[str, int]]] = {q: [{} for _ in span] for q in rt.keys}
    for i, minutes_of in sorted(got.items()):
        acc = per_queue[every[i].queue]  # a partitioned queue's minutes add up
        for m, h in enumerate(minutes_of):
            for f, v in h.items():
                acc[m][f] = acc[m].get(f, 0) + _int(v)
    queues: dict[str, dict[str, list[int]]] = {}
    for name in rt.keys:
        hashes = per_queue[name]
        fields = {"done"} | {f for h in hashes for f in h}
        queues[name] = {f: [h.get(f, 0) for h in hashes] for f in sorted(fields)}
    out: dict[str, Any] = {"times": [m * 60 for m in span], "queues": queues}
    if reads.away:
        out["left_out"] = [{"queue": every[i].queue, "partition": every[i].tag} for i in sorted(reads.away)]
    return out
