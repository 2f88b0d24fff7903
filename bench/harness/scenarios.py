"""The scenarios every system runs, each one bounded in jobs and in seconds.

drain     enqueue N no-op jobs first, then start 2 worker processes; jobs/s from the
          first job start to the last (worker start-up is reported, not charged);
          commands per job (enqueue + drain), worker CPU ms per job, worker RSS,
          Redis CPU ms per job.
enqueue   one producer process, one call per job ("single") or the bulk API ("batch").
latency   idle, warmed-up workers; jobs offered at a fixed rate, open loop; each job's
          start time minus the time its producer called enqueue: p50/p99; worker and
          Redis CPU ms per job and commands per job while the jobs are offered.
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import server
from harness.procs import Group
from harness.systems import System


@dataclass
class Probe:
    count: int
    first: float
    last: float
    lat: list[float]
    processes: int


def read_probe(d: Path) -> Probe:
    count, first, last, lat, procs = 0, 0.0, 0.0, [], 0
    for f in d.glob("*.json"):
        try:
            data = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):
            continue  # being replaced right now; read again on the next poll
        procs += 1
        count += data["count"]
        if data["first"]:
            first = data["first"] if not first else min(first, data["first"])
        last = max(last, data["last"])
        lat.extend(data["lat"])
    return Probe(count, first, last, lat, procs)


def fresh_dir(root: Path, name: str) -> Path:
    d = root / name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    return d


def wait_count(d: Path, target: int, timeout_s: float, group: Group | None = None) -> Probe:
    deadline = time.monotonic() + timeout_s
    while True:
        p = read_probe(d)
        if p.count >= target or time.monotonic() > deadline:
            return p
        if group is not None and not group.alive():
            raise RuntimeError("a worker process exited; see its log")
        time.sleep(0.02)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


@dataclass
class Env:
    redis: server.Redis
    work: Path  # scratch folder: probe files, worker logs

    @property
    def url(self) -> str:
        return self.redis.url


def flush(env: Env) -> server.Stats:
    r = env.redis.client()
    r.flushall()
    st = server.Stats(r)
    st.reset()
    return st


Hook = Callable[[], None] | None


def drain(env: Env, sysm: System, n: int, cap_s: float, before_workers: Hook = None) -> dict[str, Any]:
    st = flush(env)
    mem0 = st.used_memory()
    probe = fresh_dir(env.work, "probe")
    prep = sysm.drive(env.url, probe, "enqueue", "--n", str(n), "--mode", "fast",
                      "--max-seconds", "90", timeout_s=150)
    queued = int(prep["n"])
    mem_queued = st.used_memory()
    enq_cmds = server.summarize(st.commands(), queued)
    if before_workers is not None:
        before_workers()
    st.reset()
    cpu0_redis = st.cpu_s()
    launched = time.monotonic()
    group = Group().start(sysm.worker_cmds, sysm.environ(env.url, probe), sysm.cwd,
                          env.work / f"{sysm.name}-drain")
    try:
        first = wait_count(probe, 1, 60, group)
        if first.count == 0:
            raise RuntimeError(f"{sysm.name}: no job started within 60 s")
        startup_s = time.monotonic() - launched
        cpu_first, count_first = group.cpu_s(), first.count
        redis_first = st.cpu_s()
        done = wait_count(probe, queued, cap_s, group)
        cpu_end, redis_end = group.cpu_s(), st.cpu_s()
        rss = group.max_rss_mb()
        raw = st.commands()
        drain_cmds = server.summarize(raw, done.count)
    finally:
        group.stop()
    # What the system still holds once its workers stopped (each acks what it ran first):
    # results and records kept by default, acked messages not removed.
    mem_held = st.used_memory()
    span = max(1e-6, done.last - done.first)
    after_first = max(1, done.count - count_first)
    return {
        "jobs_per_s": (done.count - 1) / span,
        "jobs": done.count, "queued": queued, "complete": done.count >= queued,
        "seconds": span, "startup_s": startup_s,
        "worker_cpu_ms_per_job": 1000 * (cpu_end - cpu_first) / after_first,
        "redis_cpu_ms_per_job": 1000 * (redis_end - redis_first) / after_first,
        "worker_rss_mb": rss,
        "queued_bytes_per_job": (mem_queued - mem0) / max(1, queued),
        "held_bytes_per_job": (mem_held - mem0) / max(1, done.count),
        "commands_per_job": enq_cmds["commands_per_job"] + drain_cmds["commands_per_job"],
        "script_calls_per_job": enq_cmds["script_calls_per_job"] + drain_cmds["script_calls_per_job"],
        "enqueue_commands": enq_cmds["top"], "drain_commands": drain_cmds["top"],
        "redis_cpu_s_total": redis_end - cpu0_redis,
        # Server time inside scripts (their inner commands included) over its CPU time.
        "script_share": server.script_usec(raw) / 1e6 / max(1e-9, redis_end - cpu0_redis),
    }


def enqueue(env: Env, sysm: System, n: int, mode: str, max_s: float) -> dict[str, Any] | None:
    st = flush(env)
    probe = fresh_dir(env.work, "probe")
    out = sysm.drive(env.url, probe, "enqueue", "--n", str(n), "--mode", mode,
                     "--max-seconds", str(max_s), timeout_s=max_s + 60)
    if out.get("unsupported"):
        return None
    jobs = int(out["n"])
    cmds = server.summarize(st.commands(), jobs)
    return {"jobs_per_s": jobs / max(1e-9, out["seconds"]), "jobs": jobs, "seconds": out["seconds"],
            "commands_per_job": cmds["commands_per_job"], "commands": cmds["top"]}


def latency(
    env: Env, sysm: System, n: int, rate: float, warmup: int = 100, before_workers: Hook = None
) -> dict[str, Any]:
    st = flush(env)
    if before_workers is not None:
        before_workers()
    probe = fresh_dir(env.work, "probe")
    group = Group().start(sysm.worker_cmds, sysm.environ(env.url, probe), sysm.cwd,
                          env.work / f"{sysm.name}-latency")
    try:
        sysm.drive(env.url, probe, "enqueue", "--n", str(warmup), "--mode", "single",
                   "--max-seconds", "30", timeout_s=90)
        warm = wait_count(probe, warmup, 60, group)
        if warm.count < warmup:
            raise RuntimeError(f"{sysm.name}: warm-up jobs did not run within 60 s")
        time.sleep(0.5)  # let every worker go idle (blocked in its wait)
        # CPU and commands from here to the last job's start: the cost of light load, where
        # each job arrives alone (the producer's own commands count; its CPU does not).
        st.reset()
        cpu0, redis0 = group.cpu_s(), st.cpu_s()
        sent = sysm.drive(env.url, probe, "rate", "--n", str(n), "--rate", str(rate),
                          "--max-seconds", str(n / rate * 2 + 5), timeout_s=n / rate * 2 + 60)
        done = wait_count(probe, warmup + int(sent["n"]), 20, group)
        cpu1, redis1 = group.cpu_s(), st.cpu_s()
        cmds = server.summarize(st.commands(), int(sent["n"]))
    finally:
        group.stop()
    lat_ms = [x * 1000 for x in done.lat]
    offered = max(1, int(sent["n"]))
    return {
        "p50_ms": pct(lat_ms, 0.50), "p99_ms": pct(lat_ms, 0.99), "max_ms": max(lat_ms, default=0),
        "jobs": len(lat_ms), "offered": int(sent["n"]), "rate": rate,
        "producer_late_max_ms": sent["late_max_ms"],
        "complete": len(lat_ms) >= int(sent["n"]),
        "worker_cpu_ms_per_job": 1000 * (cpu1 - cpu0) / offered,
        "redis_cpu_ms_per_job": 1000 * (redis1 - redis0) / offered,
        "commands_per_job": cmds["commands_per_job"], "script_calls_per_job": cmds["script_calls_per_job"],
        "commands": cmds["top"],
    }


def summary(runs: list[dict[str, Any]], key: str) -> dict[str, float] | None:
    vals = [r[key] for r in runs if r is not None and r.get(key) == r.get(key)]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
