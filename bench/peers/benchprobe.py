"""The probe every benchmarked job calls: it counts job starts in its worker process and
reports them to the benchmark through a small file, so no system pays a Redis command
for being measured.

Per process it keeps the count, the first and last start time (epoch seconds) and, for
jobs that carry their enqueue time ``t``, the enqueue->start latency. A reporter thread
rewrites ``$BENCH_PROBE_DIR/<pid>.json`` (write, then rename) at most every 50 ms while
the figures change. Standard library only: it runs in every system's environment.
"""

from __future__ import annotations

import json
import os
import threading
import time

_DIR = os.environ.get("BENCH_PROBE_DIR", "")
_MAX_LAT = 100_000

_lock = threading.Lock()
_pid = 0
_count = 0
_first = 0.0
_last = 0.0
_lat: list[float] = []


def _report_loop() -> None:
    written = -1
    pid = os.getpid()
    path = os.path.join(_DIR, f"{pid}.json")
    tmp = path + ".tmp"
    while True:
        time.sleep(0.05)
        with _lock:
            if _count == written or os.getpid() != pid:
                continue
            written = _count
            body = json.dumps({"pid": pid, "count": _count, "first": _first, "last": _last,
                               "lat": _lat})
        with open(tmp, "w") as f:
            f.write(body)
        os.replace(tmp, path)


def _start() -> None:
    """(Re)start the reporter in this process (also after a fork)."""
    global _pid, _count, _first, _last, _lat
    _pid = os.getpid()
    _count, _first, _last, _lat = 0, 0.0, 0.0, []
    if _DIR:
        threading.Thread(target=_report_loop, name="bench-probe", daemon=True).start()


def hit(t: float | None = None) -> None:
    """Record one job start; ``t`` is the epoch time the producer enqueued it (0: none)."""
    global _count, _first, _last
    now = time.time()
    with _lock:
        if _pid != os.getpid():
            _start()
        _count += 1
        if not _first:
            _first = now
        _last = now
        if t and len(_lat) < _MAX_LAT:
            _lat.append(now - t)
