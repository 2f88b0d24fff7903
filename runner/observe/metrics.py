"""Names of the cluster-wide counters kept in each queue's stats hash, and the histogram
buckets. The worker adds them to the scripts it already calls (no extra round trip),
except a success's: those of landed acks are summed in the worker (Pending) and added at
most a second later, in one round trip for every job of that second (a SIGKILL loses at
most that second's). /metrics, `runner stats` and the dashboard read the same hash.

    enqueued|<type>            accepted jobs
    succeeded|<type>           done by a handler
    retried|<type>             transient failures scheduled for another attempt
    dead|<type>                buried (any reason)
    duplicates|<type>          done without running: the idempotency key had completed
    deduplicated|<type>        enqueues answered with the key's existing job
    deferred|<type>            claims held back by a full limit (resource or CONCURRENCY)
    paused|<type>              claims held back by the function's pause
    ratelimited|<type>         claims held back by RATE_LIMIT (scheduled for their token)
    lost|<type>                lapsed leases put back to ready
    expired|<type>             jobs buried: the function's MAX_AGE passed before they could run (again)
    followups|<type>           follow-ups (ctx.enqueue, ON_SUCCESS, ON_FAILURE) this function's
                               jobs wrote, counted in the step that settled them
    relayed|<type>             jobs of this function placed from another queue's outbox
    abandoned|<type>           thread runs given up TIMEOUT plus the grace past their deadline
    groups_completed           (per queue) groups whose last member settled here: then-jobs written
    events_emitted             (per queue) events whose home is this queue, accepted (not a
                               duplicate emit), counted in the emit's own step
    events_jobs                (per queue) the jobs those events started: new jobs of the home
                               queue, and those sent to other queues or partitions
    lat|<type>|<le_ms>         ready-to-start latency of each attempt that succeeded, per
                               bucket (not cumulative); a failed attempt has its own counter
                               (retried, dead, cancelled) and no timings, so a bucket count
                               sums to succeeded|<type>
    lat_sum|<type>             sum of those latencies, ms
    run|<type>|<le_ms>         handler run time of each attempt that succeeded, per bucket
    run_sum|<type>             sum of run times, ms
"""

from __future__ import annotations

import bisect

BUCKETS_MS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)


_LABELS = (*map(str, BUCKETS_MS), "inf")  # made once: two per settled job


# The longest name a function can have: its file's stem (a file name holds 255 bytes).
MAX_TYPE_BYTES = 252
# Where the stats hash counts a type that can be no function's name (lua/includes/stats.lua).
MALFORMED = "?"


def counted(type_: str) -> str:
    """The type name a job's figures are counted under: its own when it could be a
    function's (an identifier of at most MAX_TYPE_BYTES), else MALFORMED. Another producer's
    record names any type: one with a space or "=" split into other fields (or added a
    count to another's), one with "|" into no series, and a 100 KB one made every /metrics
    scrape carry it in each of its samples."""
    # (A character is at most 4 bytes of UTF-8: the short names skip the encoding.)
    fits = type_.isidentifier() and (len(type_) <= MAX_TYPE_BYTES // 4 or len(type_.encode()) <= MAX_TYPE_BYTES)
    return type_ if fits else MALFORMED


def bucket(ms: float) -> str:
    return _LABELS[bisect.bisect_left(BUCKETS_MS, ms)]


class Totals:
    """Stats fields summed over a batch of settlements, sent once with it ("field=N ...")
    so the script counts the batch in one pass instead of parsing every job's fields."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def add(self, field: str, n: int = 1) -> None:
        self.counts[field] = self.counts.get(field, 0) + n

    def text(self) -> str:
        return " ".join(f"{f}={n}" for f, n in self.counts.items())


# How long a success's figures may wait in the worker before they are added to the
# stats hash: what a SIGKILL of the worker can lose of them.
FLUSH_S = 1.0


# How long a minute's throughput hash (<prefix>:{<queue>}:tput:<minute>) is kept.
THROUGHPUT_KEEP_MS = 6 * 3600 * 1000


class Pending:
    """Landed acks' stats fields, and the throughput minutes' "done" counts, summed per
    hash until they are flushed: at 500 jobs/s, six HINCRBY per job inside the ack become
    a few per second. ``expiry``: the ms each key is kept after a flush (a throughput
    minute's), absent for one kept for ever (a stats hash)."""

    __slots__ = ("expiry", "rows", "since")

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, int]] = {}
        self.expiry: dict[str, int] = {}
        self.since = 0.0  # monotonic time of the oldest unflushed figure; 0.0 none

    def add(self, key: str, counts: dict[str, int], now: float, keep_ms: int = 0) -> None:
        if not counts:
            return  # (nothing to add: no flush to schedule)
        if keep_ms:
            self.expiry[key] = keep_ms
        row = self.rows.setdefault(key, {})
        for f, n in counts.items():
            row[f] = row.get(f, 0) + n
        if not self.since:
            self.since = now

    def add_fields(self, key: str, fields: str, now: float) -> None:
        """One job's fields, as ack.lua reads them ("field field=N ...")."""
        counts: dict[str, int] = {}
        for tok in fields.split():
            f, _, n = tok.partition("=")
            counts[f] = counts.get(f, 0) + (int(n) if n else 1)
        self.add(key, counts, now)

    def due_in(self, now: float) -> float | None:
        """Seconds until a flush is due (0 when it is), None with nothing pending."""
        return max(0.0, self.since + FLUSH_S - now) if self.since else None

    def take(self) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
        """The sums and the keys' expiries, and start again."""
        rows, expiry, self.rows, self.expiry, self.since = self.rows, self.expiry, {}, {}, 0.0
        return rows, expiry


class _TypeFields:
    """One function type's field names, made once (two settled jobs of a type in three
    share every one): its done counter, each bucket's latency and run field, the sums."""

    __slots__ = ("done", "lat", "lat_sum", "run", "run_sum")

    def __init__(self, type_: str) -> None:
        self.done = f"succeeded|{type_}"
        self.lat = [f"lat|{type_}|{b}" for b in _LABELS]
        self.run = [f"run|{type_}|{b}" for b in _LABELS]
        self.lat_sum, self.run_sum = f"lat_sum|{type_}", f"run_sum|{type_}"


_TYPES: dict[str, _TypeFields] = {}
_bisect_left = bisect.bisect_left


def succeeded(type_: str, latency_ms: float, run_ms: float, totals: Totals) -> str:
    """A done job's fields: "succeeded|<type>" and timing_fields(), also added to ``totals``."""
    names = _TYPES.get(type_)
    if names is None:
        names = _TYPES[type_] = _TypeFields(type_)
    lat = int(latency_ms) if latency_ms > 0 else 0  # (once per settled job: no max() call)
    run = int(run_ms) if run_ms > 0 else 0
    lat_f = names.lat[_bisect_left(BUCKETS_MS, lat)]
    run_f = names.run[_bisect_left(BUCKETS_MS, run)]
    c = totals.counts
    c[names.done] = c.get(names.done, 0) + 1
    c[lat_f] = c.get(lat_f, 0) + 1
    c[run_f] = c.get(run_f, 0) + 1
    c[names.lat_sum] = c.get(names.lat_sum, 0) + lat
    c[names.run_sum] = c.get(names.run_sum, 0) + run
    return f"{names.done} {lat_f} {names.lat_sum}={lat} {run_f} {names.run_sum}={run}"


def timing_fields(type_: str, latency_ms: float, run_ms: float) -> str:
    lat = max(0, int(latency_ms))
    run = max(0, int(run_ms))
    return (
        f"lat|{type_}|{bucket(lat)} lat_sum|{type_}={lat} "
        f"run|{type_}|{bucket(run)} run_sum|{type_}={run}"
    )
