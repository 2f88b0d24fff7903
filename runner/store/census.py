"""What waits in a queue, read off Redis, for the deploy gate (catalog/checks.py):

- ``counts``: the census the scripts keep, jobs not done per (type, version) in each
  queue's ``census`` hash; one HGETALL per queue whatever the depth;
- ``scan`` and ``waiting_versions``: every job of the priority set, ready, leases,
  scheduled and dead, and the jobs held back (a paused function's held list, a limit's
  waiters), with some of its fields (its state's read by name, never whole), read
  without SCAN (LRANGE/ZRANGE in chunks, then one pipelined read per chunk): the slow,
  exact answer per state (`runner check --scan`).
  The held lists read are those of the functions paused now. It is a snapshot:
  a job that moves between two structures while it runs may be seen twice or not at all,
  which only matters for jobs that were runnable anyway.

Besides: ``due_now``, `runner dev`'s nudge of a job handed back while its function was
away, ``every_id``, the test harness's list of every job a queue holds (it scans the
job keys: never on a production path), and ``forget_prefix``, its emptying of a prefix.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from runner.store import records
from runner.store.keys import QueueKeys

CHUNK = 1000


def _ids(redis: Any, key: str, is_list: bool) -> Iterator[list[str]]:
    start = 0
    while True:
        end = start + CHUNK - 1
        chunk = redis.lrange(key, start, end) if is_list else redis.zrange(key, start, end)
        if not chunk:
            return
        yield chunk
        if len(chunk) < CHUNK:
            return
        start += CHUNK


def _held_back(redis: Any, k: QueueKeys) -> list[tuple[str, str, bool]]:
    """The lists of deferred jobs: each paused function's held list, each limit's waiters."""
    held = [k.held(field[3:]) for field in redis.hkeys(k.paused) if field.startswith("fn:")]
    waiters = [k.waiters(name) for name in redis.zrange(k.limwait, 0, -1)]
    return [("deferred", key, True) for key in held + waiters]


def scan(redis: Any, k: QueueKeys, fields: tuple[str, ...] = ("type", "version"),
         states: tuple[str, ...] = ("queued", "processing", "scheduled", "deferred", "dead"),
         ) -> Iterator[tuple[str, str, list[str | None]]]:
    """Every waiting job of a queue as (state, id, [field values]); records gone are skipped."""
    # Only the state fields asked for (and the status): a durable job's state holds its
    # checkpoint and step log (4 MiB), never read here.
    wanted = ["status", *(f for f in fields if f not in records.RECORD_FIELDS and f not in ("payload", "status"))]
    # Sleeping jobs wait in the sleeping set alone (suspend.lua): read as scheduled ones,
    # once each (one an earlier release suspended is in scheduled too).
    structures = [("queued", k.prio, False), ("queued", k.ready, True), ("processing", k.leases, False),
                  ("scheduled", k.scheduled, False), ("scheduled", k.sleeping, False), ("dead", k.dead, False)]
    asleep: set[str] = set()
    if "deferred" in states:
        structures += _held_back(redis, k)
    for state, key, is_list in structures:
        if state not in states:
            continue
        for chunk in _ids(redis, key, is_list):
            pipe = redis.pipeline(transaction=False)
            for job_id in chunk:
                pipe.get(k.job(job_id))
                pipe.hmget(k.state(job_id), wanted)
            replies = _checked(pipe.execute(raise_on_error=False))
            for n, job_id in enumerate(chunk):
                rec, st = replies[2 * n], replies[2 * n + 1]
                held = {f: v for f, v in zip(wanted, st, strict=True) if v is not None} if isinstance(st, list) else {}
                view = records.view(job_id, rec if isinstance(rec, str) else None, held, None, None)
                if state == "deferred" and view.get("status") != "deferred":
                    continue  # a stale entry of a held or waiter list: the job is elsewhere
                if view.get("status") == "sleeping":
                    if job_id in asleep:
                        continue
                    asleep.add(job_id)
                elif key == k.sleeping:
                    continue  # a stale entry: the job is elsewhere
                values = [view.get(f) for f in fields]
                if values[0] is not None:
                    yield state, job_id, values


Keys = Mapping[str, QueueKeys] | Iterable[QueueKeys]


def _each(keys: Keys) -> list[QueueKeys]:
    """Queue keys given by queue name, or as they come (every partition of a queue)."""
    return list(keys.values()) if isinstance(keys, Mapping) else list(keys)


def waiting_versions(redis: Any, keys: Keys) -> tuple[int, Counter[tuple[str, str, str, str]]]:
    """(jobs read, counts per (queue, state, type, version)) over every queue (and every
    partition given: their counts add up under their queue's name)."""
    read = 0
    groups: Counter[tuple[str, str, str, str]] = Counter()
    for k in _each(keys):
        for state, _job_id, (type_, version) in scan(redis, k):
            read += 1
            groups[(k.queue, state, type_ or "", version or "")] += 1
    return read, groups


def counts(redis: Any, keys: Keys) -> tuple[int, Counter[tuple[str, str, str, str]]]:
    """(jobs counted, counts per (queue, "waiting", type, version)) from the census the
    scripts keep: O(1) in the depth of the queues."""
    each = _each(keys)
    pipe = redis.pipeline(transaction=False)
    for k in each:
        pipe.hgetall(k.census)
    total = 0
    groups: Counter[tuple[str, str, str, str]] = Counter()
    for k, fields in zip(each, pipe.execute(), strict=True):
        queue = k.queue
        for field, n in fields.items():
            type_, _, version = field.rpartition("|")
            if int(n) > 0:
                groups[(queue, "waiting", type_, version)] += int(n)
                total += int(n)
    return total, groups


def due_now(redis: Any, k: QueueKeys, job_id: str) -> bool:
    """Make a scheduled job due now, if it still waits there (XX: one promote moved on
    meanwhile stays moved), and in the scheduled list's index with it; whether it did."""
    pipe = redis.pipeline(transaction=True)
    pipe.zadd(k.scheduled, {job_id: 0}, xx=True, ch=True)
    pipe.zadd(k.delayed, {job_id: 0}, xx=True)
    return bool(pipe.execute()[0])


def done_ids(redis: Any, k: QueueKeys) -> list[str]:
    """The ids with an outcome in the done generations kept (their logs list them)."""
    gen = int(redis.hget(k.done_meta, "gen") or 0)
    pipe = redis.pipeline(transaction=False)
    for g in range(gen, gen - 4, -1):
        pipe.lrange(k.done(g) + ":log", 0, -1)
    return [i for ids in pipe.execute() for i in ids]


def every_id(redis: Any, k: QueueKeys) -> set[str]:
    """Every job id ``k`` holds a record or an outcome of: a SCAN over its job keys, and
    the done logs. For tests (runner.testing): it walks the whole keyspace."""
    pattern = k.job("*")
    stem = pattern[:-1]
    ids = {key[len(stem):] for key in redis.scan_iter(match=pattern, count=500) if not key.endswith(":s")}
    return ids | set(done_ids(redis, k))


def forget_prefix(redis: Any, prefix: str) -> int:
    """Delete every key under ``prefix`` (a SCAN, then UNLINK in chunks); returns how many.
    For tests (runner.testing): a private server's prefix emptied before each test."""
    gone, chunk = 0, []
    for key in redis.scan_iter(match=f"{prefix}:*", count=CHUNK):
        chunk.append(key)
        if len(chunk) >= CHUNK:
            gone += int(redis.unlink(*chunk))
            chunk = []
    if chunk:
        gone += int(redis.unlink(*chunk))
    return gone


def _checked(replies: Any) -> list[Any]:
    """outage.checked, imported when called: the reading commands load no redis-py."""
    from runner.store.outage import checked

    return checked(replies)
