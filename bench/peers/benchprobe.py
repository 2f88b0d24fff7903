"""The probe every benchmarked job calls: it counts job starts in its worker process and
reports them to the benchmark through a small file, so no system pays a Redis command
for being measured.

Per process it keeps the count, the first and last start time (epoch seconds) and, for
jobs that carry their enqueue time ``t``, the enqueue->start latency. A reporter thread
rewrites ``$BENCH_PROBE_DIR/<pid>.json`` (write, then rename) at most every 50 ms while
the figures change. Lock-free on the job's side (``next()`` on a counter and a list
append are atomic in CPython), so it costs every system about the same, very little.
Standard library only: it runs in every system's environment.
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


os.register_at_fork(after_in_child=_after_fork)


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
