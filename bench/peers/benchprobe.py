"""The probe every benchmarked job calls: it counts job starts in its worker process and
reports them to the benchmark through a small file, so no system pays a Redis command
for being measured.

Per process it keeps the count, the first and last start time (epoch seconds) and, for
jobs that carry their enqueue time ``t``, the enqueue->start latency. A reporter thread
rewrites ``$BENCH_PROBE_DIR/<pid>.json`` (write, then rename) at most every 50 ms while
the figures change. Lock-free on the job's side (``next()`` on a counter and a list
append are atomic in CPython), so it costs every system about the same, very little.
Standard library only: it runs in every system's environment.

The handler's own work, the same for every system, is chosen by $BENCH_WORK: empty (the
no-op), ``incr`` (one Redis INCR round trip on a connection of the thread's own, as a
real handler makes one call to something) or ``sleep`` (1 ms of waiting, as for a slow
downstream). Sync handlers call ``work()``; async ones ``await awork()`` (redis-py's
asyncio client, ``asyncio.sleep``), so an event loop is never blocked by the benchmark.
redis-py is imported only for ``incr``: every system's environment has it.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time

_DIR = os.environ.get("BENCH_PROBE_DIR", "")
_MAX_LAT = 100_000

_started = False
_counter = itertools.count(1)
_first = 0.0
_last = 0.0
_lat: list[float] = []


def _report_loop() -> None:
    peeks = 0
    written = -1
    pid = os.getpid()
    path = os.path.join(_DIR, f"{pid}.json")
    tmp = path + ".tmp"
    while True:
        time.sleep(0.05)
        count = next(_counter) - 1 - peeks  # the reporter's own next() calls are not hits
        peeks += 1
        if count == written:
            continue
        written = count
        body = json.dumps({"pid": pid, "count": count, "first": _first, "last": _last,
                           "lat": _lat[:count]})
        with open(tmp, "w") as f:
            f.write(body)
        os.replace(tmp, path)


_start_lock = threading.Lock()


def _start() -> None:
    global _started
    with _start_lock:  # two threads' first jobs must not start two reporters
        if _started:
            return
        _started = True
        if _DIR:
            threading.Thread(target=_report_loop, name="bench-probe", daemon=True).start()


def _after_fork() -> None:
    """A forked child counts for itself and starts its own reporter on its first hit."""
    global _started, _counter, _first, _last, _lat, _start_lock
    _started, _counter, _first, _last, _lat = False, itertools.count(1), 0.0, 0.0, []
    _start_lock = threading.Lock()
    _local.__dict__.clear()  # a connection is never shared across a fork
    _aclients.clear()


os.register_at_fork(after_in_child=_after_fork)

# The reporter starts at import, not at the first job: a process-isolated runner child
# imports its functions before its first job, and a thread started by a handler is one it
# left running (the child is then replaced, never reused). A forked worker starts its own
# at its first hit (_after_fork).
if _DIR:
    _start()


_WORK = os.environ.get("BENCH_WORK", "")
if _WORK not in ("", "incr", "sleep"):
    raise ValueError(f"BENCH_WORK must be empty, incr or sleep, got {_WORK!r}")
_local = threading.local()
_aclients: dict[int, object] = {}


def _conn() -> object:
    c = getattr(_local, "redis", None)
    if c is None:
        import redis

        c = _local.redis = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"], single_connection_client=True)
    return c


def work() -> None:
    """The handler's work ($BENCH_WORK), from a sync handler."""
    if _WORK == "incr":
        _conn().incr("bench:probe:incr")  # type: ignore[attr-defined]
    elif _WORK == "sleep":
        time.sleep(0.001)


async def awork() -> None:
    """The handler's work ($BENCH_WORK), from an async handler: awaited, never blocking."""
    import asyncio

    if _WORK == "incr":
        loop = id(asyncio.get_running_loop())
        c = _aclients.get(loop)
        if c is None:
            import redis.asyncio

            c = _aclients[loop] = redis.asyncio.Redis.from_url(os.environ["BENCH_REDIS_URL"])
        await c.incr("bench:probe:incr")  # type: ignore[attr-defined]
    elif _WORK == "sleep":
        await asyncio.sleep(0.001)


def hit(t: float | None = None) -> None:
    """Record one job start; ``t`` is the epoch time the producer enqueued it (0: none)."""
    global _first, _last
    now = time.time()
    if not _started:
        _start()
    if not _first:
        _first = now
    _last = now
    if t and len(_lat) < _MAX_LAT:
        _lat.append(now - t)
    next(_counter)
