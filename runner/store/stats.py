"""Plain reads of the queue structures and counters, each in one pipelined round trip
(layout in keys.py): every partition's sizes and stats hashes (observe/figures.py sums
them into a queue's figures), when the next jobs to run became ready, the per-minute
throughput hashes, and the best priority waiting in each partition (the fetcher's look
before a claim of a partitioned queue); and the one write, the worker's summed figures
of its successes (add_counts; add_counts_by_master on Redis Cluster, a round trip per
master).

Imports no redis-py: the reading commands run these on their own connection (link.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from runner.store import scriptkeys
from runner.store.keys import QueueKeys
from runner.store.records import SEP

# What ``partition_rows`` reads of each partition, in this order.
ROW = ("ready", "leases", "leases_expired", "scheduled", "scheduled_due", "dead", "next_ready", "stats", "paused",
       "prio", "cancelled", "next_prio", "sleeping", "waiting", "stats_bytes", "sleeping_due", "sleeping_old")


def both_sets(pipe: Any, k: QueueKeys) -> None:
    """Queue the count of the ids in both the scheduled and the sleeping set: the sleepers
    an earlier release suspended (there the sleeping set was an index of scheduled), which a
    worker's start moves out of scheduled (index_delayed.lua); until then they are not
    counted twice. ZINTERCARD walks the smaller set: O(1) with either empty."""
    pipe.execute_command("ZINTERCARD", 2, k.sleeping, k.scheduled)


def server_ms(redis: Any) -> int:
    """Epoch milliseconds by the Redis server: a queue's figures (the oldest job's age, the
    leases lapsed, the throughput window) are the server's, as every deadline is, not the
    reading host's (a web host 2 h ahead showed a job waiting for 2 h)."""
    sec, usec = redis.time()
    return int(sec) * 1000 + int(usec) // 1000


def partition_rows(redis: Any, every: Sequence[QueueKeys], now_ms: int) -> list[list[Any]]:
    """One row per partition of ``every``, as ROW names its fields: the sizes of its
    structures (leases and scheduled also counted up to ``now_ms``; scheduled holds the
    sleeping set too, where sleeping jobs wait for their wake time; sleeping and waiting
    from their sets, 0 for a damaged one), the id at the RPOP
    end of ready (None when empty) and a list of prio's first id ([] when empty): the
    next jobs a worker takes; its stats hash's count of fields and its bytes (weigh) and
    its paused hash."""
    pipe = redis.pipeline(transaction=False)
    for k in every:
        pipe.llen(k.ready)
        pipe.zcard(k.leases)
        pipe.zcount(k.leases, "-inf", now_ms)
        pipe.zcard(k.scheduled)
        pipe.zcount(k.scheduled, "-inf", now_ms)
        pipe.zcard(k.dead)
        pipe.lindex(k.ready, -1)  # RPOP end: the next job a worker takes
        pipe.hlen(k.stats)  # (read after, whole or by name: stats_hashes)
        pipe.hgetall(k.paused)
        pipe.zcard(k.prio)
        pipe.zcard(k.cancelled)
        pipe.zrange(k.prio, 0, 0)  # the next job of priority a worker takes
        pipe.zcard(k.sleeping)  # (sleeping jobs wait there alone; waiting ones in scheduled too)
        pipe.zcard(k.waiting)
        weigh(pipe, k)
        pipe.zcount(k.sleeping, "-inf", now_ms)  # (these two last: taken off the row below)
        both_sets(pipe, k)
    raw = pipe.execute(raise_on_error=False)
    n = len(ROW)
    rows = [raw[n * i: n * i + n] for i in range(len(every))]
    for row in rows:
        for j, value in enumerate(row):
            if isinstance(value, Exception):
                if ROW[j] not in _BEST_EFFORT:
                    raise value  # (as execute() would: an outage, or a damaged queue key)
                row[j] = 0  # a damaged list index counts nothing; the reclaim puts it aside
        # Sleeping jobs wait in their own set (suspend.lua), as the scheduled set's: counted
        # with it, once. (One an earlier release suspended is in both until a worker's start
        # moves it: index_delayed.lua; due, it wakes within a pass, so the due count is not
        # corrected.)
        old = row.pop()
        row[3] += row[12] - old
        row[4] += row.pop()
    return rows


_BEST_EFFORT = frozenset({"sleeping", "waiting", "stats_bytes", "sleeping_due", "sleeping_old"})


# A stats hash of at most this many fields is read whole (HGETALL: about 3 ms of Redis at
# 20,000); a wider one by name. The writers fold new names past 10,000 fields
# (lua/includes/stats.lua), so only a hash grown before, or by another writer, is wider:
# 1.44 million fields held Redis 0.7-0.85 s in one HGETALL.
STATS_WHOLE = 20_000
# Nor is a hash of more than this many bytes (weigh): 1,000 fields named by 100 KB types,
# which a worker of the release before counted foreign records under, made each read an
# HGETALL of 100 MB (0.65-0.97 s a scrape). 20,000 fields of the longest names runner
# writes take about 2 MB.
STATS_BYTES = 4 * 1024 * 1024
# Fields per HMGET of a wide hash (each call bounded, whatever the names asked).
_HMGET = 2_000


def weigh(pipe: Any, k: QueueKeys) -> None:
    """Queue the exact bytes of ``k``'s stats hash when it holds at most STATS_WHOLE fields,
    else 0 (lua/weigh.lua: MEMORY USAGE's default sampling reads 5 entries, and missed 115
    MB of heavy fields beside ordinary ones). By its source (EVAL): a cluster pipeline
    refuses EVALSHA, and EVAL cannot answer NOSCRIPT, so the read stays one round trip.
    An error reply (a server that refuses scripts) counts as 0: the field count decides."""
    from runner.store.sources import SOURCES  # here: loaded on a read's first use

    pipe.execute_command("EVAL", SOURCES["weigh"], 1, k.stats, STATS_WHOLE)


def stats_hashes(redis: Any, every: Sequence[QueueKeys], sizes: Sequence[int], weights: Sequence[Any],
                 names: Callable[[], Sequence[str]]) -> list[dict[str, str]]:
    """The stats hash of each partition of ``every``, in one pipelined round trip: whole
    when its size (``sizes``, partition_rows' HLEN) is at most STATS_WHOLE and its bytes
    (``weights``, weigh: 0 unknown) at most STATS_BYTES, else only
    the fields ``names()`` lists (called once, and only for such a hash), those it holds."""
    pipe = redis.pipeline(transaction=False)
    plan: list[int] = []
    wanted: Sequence[str] = ()
    for k, size, weight in zip(every, sizes, weights, strict=True):
        if size <= STATS_WHOLE and int(weight or 0) <= STATS_BYTES:
            pipe.hgetall(k.stats)
            plan.append(0)
            continue
        wanted = wanted or names()
        for i in range(0, len(wanted), _HMGET):
            pipe.hmget(k.stats, list(wanted[i:i + _HMGET]))
        plan.append(len(range(0, len(wanted), _HMGET)))
    raw = iter(pipe.execute())
    out: list[dict[str, str]] = []
    for calls in plan:
        if not calls:
            out.append(next(raw))
            continue
        values = [v for _ in range(calls) for v in next(raw)]
        out.append({f: v for f, v in zip(wanted, values, strict=True) if v is not None})
    return out


def ready_since(redis: Any, jobs: Sequence[tuple[QueueKeys, str]]) -> list[str | None]:
    """The server ms each (partition, id) became ready, as a string, or None when neither
    its state nor its record says (gone meanwhile). A job that waits untouched has no
    state: it became ready at creation, the record's created_ms."""
    if not jobs:
        return []
    pipe = redis.pipeline(transaction=False)
    for k, job_id in jobs:
        pipe.hget(k.state(job_id), "ready_ms")
        pipe.get(k.job(job_id))
    got = _checked(pipe.execute(raise_on_error=False))
    out: list[str | None] = []
    for ready, record in zip(got[::2], got[1::2], strict=True):
        # (The record string's fifth field is created_ms: see records.py.)
        parts = record.split(SEP, 5) if isinstance(record, str) else []
        out.append(ready if isinstance(ready, str) else parts[4] if len(parts) > 5 else None)
    return out


def minute_hashes(redis: Any, every: Sequence[QueueKeys], minutes: Sequence[int]) -> list[list[dict[str, str]]]:
    """Per partition of ``every``, its throughput hash of each minute (epoch minutes), in
    order; a minute with no hash is {}."""
    pipe = redis.pipeline(transaction=False)
    for k in every:
        for m in minutes:
            pipe.hgetall(k.throughput(m))
    raw = pipe.execute()
    n = len(minutes)
    return [raw[i * n: (i + 1) * n] for i in range(len(every))]


def best_priorities(redis: Any, every: Sequence[QueueKeys]) -> list[int | None]:
    """The best priority waiting in each partition of ``every`` (the first entry of its
    prio set, scored -priority * 1e13 + ms: see keys.py), None where none waits. Raises
    the outage of a node away."""
    pipe = redis.pipeline(transaction=False)
    for k in every:
        pipe.zrange(k.prio, 0, 0, withscores=True)
    return [-int(top[0][1] // 1e13) if top else None for top in pipe.execute()]


def _checked(replies: Any) -> list[Any]:
    """outage.checked, imported when called: the reading commands load no redis-py."""
    from runner.store.outage import checked

    return checked(replies)


# Figures per count.lua call (a second's sums of a queue hold far fewer in practice).
_COUNT_PAIRS = 1_000


def add_counts(scripts: Any, rows: dict[str, dict[str, int]], expiry: dict[str, int] | None = None) -> None:
    """Add the worker's summed figures to their hashes (metrics.Pending: the stats hashes,
    the throughput minutes), in one round trip of count.lua calls: a stats hash's field
    names follow the rule every script's figures do (lua/includes/stats.lua), so a
    function's figures are all its own or all under "_other" whoever adds them. A key in
    ``expiry`` is a throughput minute, given that many ms to live after its add. A hash
    damaged to another type loses its counts, never the others' (the scripts' pcall'd
    HINCRBY); an outage (no answer, BUSY, a read-only replica) raises, and the caller
    keeps them for the next try."""
    batch = scripts.batch()
    for key, counts in rows.items():
        keep = expiry.get(key) if expiry else None
        pairs = [x for f, n in counts.items() for x in (f, n)]
        keys = scriptkeys.keys("count", figures=key)
        for i in range(0, len(pairs), 2 * _COUNT_PAIRS):
            last = i + 2 * _COUNT_PAIRS >= len(pairs)
            batch.add("count", keys, ["" if keep is not None else "1", keep if keep is not None and last else "",
                                      *pairs[i:i + 2 * _COUNT_PAIRS]])
    batch.execute()


def add_counts_by_master(scripts: Any, rows: dict[str, dict[str, int]], expiry: dict[str, int]
                         ) -> tuple[dict[str, dict[str, int]], BaseException | None]:
    """``add_counts`` in one round trip per master (on Redis Cluster), each given up past
    the node wait as a script call to that master is (Transport.bounded): a stalled master
    holds up no other's add. Returns the rows not added, to try again, and the last error."""
    by_master: dict[str, dict[str, dict[str, int]]] = {}
    for key, counts in rows.items():
        by_master.setdefault("" if scripts.one_server else scripts.nodes.node([key]), {})[key] = counts
    left: dict[str, dict[str, int]] = {}
    err: BaseException | None = None
    for sub in by_master.values():
        try:
            scripts.bounded("an add of the figures", partial(add_counts, scripts, sub, expiry), list(sub))
        except Exception as exc:
            left.update(sub)
            err = exc
    return left, err
