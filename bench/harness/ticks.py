"""Schedules under load: 10,000 schedules due on the same minute, fired by two worker
processes on the 2 cores, and the CPU that idle schedules cost a worker.

- ``burst``: a function file declares N schedules ``* * * * *`` (one list entry each,
  its own payload); two workers adopt them; the schedules' clock (the server's, shifted
  by the tests' offset key) is moved to 2 s before a minute, and each of the N ticks is
  measured from its tick time to its job's creation (both on the server's clock). Repeated
  for a few minutes in a row.
- ``idle``: one worker with N schedules that are not due (``0 0 1 1 *``), its CPU over a
  window, against a worker with none: CPU seconds per second per 1,000 schedules.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import redis

from harness.procs import Group

REPO = Path(__file__).resolve().parents[2]
PREFIX = "benchsched"
HANDLER = '''"""A no-op for the schedule benchmark."""
QUEUE = "fast"
MISSED = "skip"
SCHEDULE = [{entries}]


def handle(payload, ctx):
    return None
'''
TOML = f"""[redis]
prefix = "{PREFIX}"

[queues.fast]
visibility_timeout = 30
concurrency = 16

[log]
level = "INFO"
format = "json"
"""


def _project(root: Path, n: int, cron: str) -> Path:
    (root / "functions").mkdir(parents=True, exist_ok=True)
    (root / "schemas" / "tick").mkdir(parents=True, exist_ok=True)
    entries = ",\n".join(f'{{"cron": "{cron}", "id": "s{i}", "payload": {{"i": {i}}}}}' for i in range(n))
    (root / "functions" / "tick.py").write_text(HANDLER.format(entries=entries))
    (root / "schemas" / "tick" / "v1.json").write_text(json.dumps({"type": "object"}))
    (root / "runner.toml").write_text(TOML)
    return root / "runner.toml"


def _workers(url: str, toml: Path, count: int, log: Path) -> Group:
    env = {**os.environ, "REDIS_URL": url, "RUNNER_TEST_SCHEDULES": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "runner.cli", "--config", str(toml), "worker"]
    return Group().start([cmd] * count, env, str(toml.parent), log)


def _adopted(log: Path, count: int, n: int) -> bool:
    return sum(f"schedules: {n} active" in p.read_text(errors="replace")
               for p in log.parent.glob(log.name + ".*.log")) >= count if n else True


def _wait(pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _server_ms(r: redis.Redis) -> int:
    sec, usec = r.time()  # type: ignore[misc]
    return int(sec) * 1000 + int(usec) // 1000


def burst(url: str, work: Path, n: int = 10_000, rounds: int = 3, workers: int = 2) -> dict[str, Any]:
    r = redis.Redis.from_url(url, decode_responses=True)
    r.flushall()
    toml = _project(work / "burst", n, "* * * * *")
    log = work / "burst" / "worker"
    offset_key = f"{PREFIX}:test:clock_offset_ms"
    base = 1_893_456_000_000  # 2030-01-01T00:00Z, a minute boundary
    r.set(offset_key, base + 20_000 - _server_ms(r))
    group = _workers(url, toml, workers, log)
    try:
        t0 = time.monotonic()
        _wait(lambda: _adopted(log, workers, n), 120, f"{workers} workers to adopt {n} schedules")
        adopt_s = time.monotonic() - t0
        # The ticks' jobs stay queued (a paused queue still takes jobs), so each one's
        # record, and the time it was written, can be read after the round.
        r.hset(f"{PREFIX}:{{fast}}:paused", "queue", _server_ms(r))
        out = []
        for k in range(1, rounds + 1):
            tick = base + k * 60_000
            r.set(offset_key, tick - 2_000 - _server_ms(r))
            cpu0 = group.cpu_s()
            _wait(lambda t=tick: _fired(r, n, t), 30, f"{n} ticks at round {k}")
            # When the poll saw the last one: an upper bound on the slowest tick (the poll
            # itself reads 10,000 states, so it adds its own few tens of ms).
            seen_all = _server_ms(r) + int(r.get(offset_key) or 0) - tick
            cpu = group.cpu_s() - cpu0
            late = _lateness(r, n, tick)
            out.append({"tick": k, "fired": len(late), "max_late_ms": max(late), "all_seen_ms": seen_all,
                        "p50_late_ms": statistics.median(late), "p99_late_ms": sorted(late)[int(0.99 * len(late)) - 1],
                        "worker_cpu_s": round(cpu, 3)})
            print(f"    round {k}: {len(late)} fired, late p50 {out[-1]['p50_late_ms']:.0f} ms, "
                  f"p99 {out[-1]['p99_late_ms']:.0f} ms, max {out[-1]['max_late_ms']:.0f} ms, "
                  f"all seen at +{seen_all} ms, {cpu:.2f} s worker CPU", flush=True)
        return {"schedules": n, "workers": workers, "adopt_s": round(adopt_s, 2), "rounds": out,
                "max_late_ms": max(x["max_late_ms"] for x in out),
                "within_2s": all(x["max_late_ms"] <= 2000 for x in out)}
    finally:
        group.stop()


def _fired(r: redis.Redis, n: int, tick: int) -> bool:
    pipe = r.pipeline(transaction=False)
    for i in range(0, n, max(1, n // 50)):  # a sample first: cheap while the burst runs
        pipe.hget(f"{PREFIX}:{{fast}}:schedule:tick:s{i}", "fired")
    if not all(v is not None and int(v) >= tick for v in pipe.execute()):
        return False
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        pipe.hget(f"{PREFIX}:{{fast}}:schedule:tick:s{i}", "fired")
    return all(v is not None and int(v) >= tick for v in pipe.execute())


def _lateness(r: redis.Redis, n: int, tick: int) -> list[float]:
    """Per schedule: its tick's job's creation (server clock, shifted like the ticks) minus
    the tick, ms."""
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        pipe.hget(f"{PREFIX}:{{fast}}:schedule:tick:s{i}", "job")
    ids = pipe.execute()
    pipe = r.pipeline(transaction=False)
    for job_id in ids:
        pipe.get(f"{PREFIX}:{{fast}}:job:{job_id}")
    # A record is one string whose fifth field is created_ms (see runner/store/records.py).
    created = [raw.split("\x1f", 5)[4] for raw in pipe.execute() if isinstance(raw, str)]
    return [int(c) - tick for c in created if c.isdigit()]


def idle(url: str, work: Path, counts: tuple[int, ...] = (0, 1_000, 10_000), seconds: float = 20.0) -> dict[str, Any]:
    r = redis.Redis.from_url(url, decode_responses=True)
    rows = []
    for n in counts:
        r.flushall()
        toml = _project(work / f"idle-{n}", n, "0 0 1 1 *")
        log = work / f"idle-{n}" / "worker"
        group = _workers(url, toml, 1, log)
        try:
            _wait(lambda n=n, log=log: _adopted(log, 1, n), 120, f"a worker to adopt {n} schedules")
            time.sleep(2.0)  # let start-up work settle before the window opens
            cpu0, t0 = group.cpu_s(), time.monotonic()
            time.sleep(seconds)  # the measured window: nothing is due, the worker idles
            rows.append({"schedules": n, "cpu_s_per_s": (group.cpu_s() - cpu0) / (time.monotonic() - t0)})
        finally:
            group.stop()
    base = rows[0]["cpu_s_per_s"]
    for row in rows[1:]:
        row["extra_cpu_ms_per_s_per_1000"] = round((row["cpu_s_per_s"] - base) * 1000 / (row["schedules"] / 1000), 4)
    for row in rows:
        row["cpu_ms_per_s"] = round(row.pop("cpu_s_per_s") * 1000, 3)
    return {"window_s": seconds, "rows": rows}


def run(url: str, work: Path, n: int = 10_000, rounds: int = 3, idle_s: float = 20.0) -> dict[str, Any]:
    return {"burst": burst(url, work, n, rounds), "idle": idle(url, work, seconds=idle_s)}
