"""Durable functions' costs (docs/durable.md), each against its plain counterpart in one run:

- step overhead: a worker draining no-op jobs, and the same jobs with 3 no-op steps; the
  worker process's CPU time per job (utime + stime), and so per recorded step;
- signal to resume: a job waiting for a signal with the worker idle; from the signal's
  send to the resumed run's start (p50, p95);
- sleeping jobs' memory: N jobs that recorded one step and went to sleep (the typical
  durable job between its steps): Redis's used_memory per job from before their enqueue
  to all asleep, the same beyond their payload and step log, what sleeping costs more than
  the same job queued beyond its step log (the issue's target: at most 300 bytes), and
  their state hash's encoding (listpack while every field is at most 64
  bytes); ``sleeping_memory`` is also bench/run.py's "sleeping" scenario;
- a mass wake-up: N jobs asleep until the same second, 2 worker processes: how long
  after that second the last one's resumed run started.

Usage: python bench/durable.py [--jobs N] [--signals N] [--sleepers N] [--wakers N].
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run by itself: the repository's runner (bench/run.py: its frozen copy)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import runner
from runner import config as config_mod
from runner.client import Client, Request
from runner.runtime import Runtime
from runner.store.embedded import Server

FUNCTIONS = {
    "plain": 'QUEUE = "q"\n\ndef handle(payload, ctx):\n    return None\n',
    "stepped": 'QUEUE = "q"\n\ndef nothing():\n    return None\n\n'
               'def handle(payload, ctx):\n    for name in ("a", "b", "c"):\n        ctx.step(name, nothing)\n',
    "waiter": 'import os, time\nQUEUE = "q"\n\ndef handle(payload, ctx):\n'
              '    if ctx.step_key is None and os.environ.get("MARKS"):\n'
              '        with open(os.path.join(os.environ["MARKS"], ctx.job_id), "a") as f:\n'
              '            f.write(repr(time.time()) + "\\n")\n'
              '    ctx.wait_for_signal("go")\n',
    "sleeper": 'QUEUE = "q"\n\ndef charge():\n    return {"ok": True}\n\n'
               'def handle(payload, ctx):\n    ctx.step("charge", charge)\n    ctx.sleep("nap", 3600)\n',
    "waker": 'import os, time\nQUEUE = "q"\n\ndef handle(payload, ctx):\n    ctx.sleep_until("at", payload["at"])\n'
             '    with open(os.path.join(os.environ["MARKS"], "woke"), "a") as f:\n'
             '        f.write(repr(time.time()) + "\\n")\n',
}
TOML = """
[redis]
prefix = "bd"
[queues.q]
concurrency = 8
[worker]
scheduler_interval = 0.05
"""


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def drain(root: Path, env: dict[str, str], client: Client, type_: str, n: int) -> float:
    """Worker CPU seconds per job to drain n jobs of type_ (enqueued before it starts)."""
    client.enqueue_many([Request(type_, {}) for _ in range(n)])
    proc = subprocess.Popen([sys.executable, "-m", "runner.cli", "--config", str(root / "runner.toml"), "worker"],
                            cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while client.stats()["q"]["counters"].get(f"succeeded|{type_}", 0) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        spent = cpu_s(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    return spent / n


def _imported_runner() -> str:
    """The folder of the runner this script imported: its workers run the same one."""
    return str(Path(runner.__file__).resolve().parent.parent)


def sleeping_memory(n: int = 20000, url: str | None = None) -> dict[str, Any]:
    """Redis memory of ``n`` jobs asleep after one step (see the module docstring), on
    the server at ``url`` (else one of its own), with a worker of its own; nothing else
    may write to the server meanwhile (the figure is a difference of used_memory)."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-sleeping-"))
    server = None if url else Server(tmp / "redis").start()
    try:
        root = tmp / "project"
        (root / "functions").mkdir(parents=True)
        (root / "functions" / "sleeper.py").write_text(FUNCTIONS["sleeper"])
        (root / "schemas" / "sleeper").mkdir(parents=True)
        (root / "schemas" / "sleeper" / "v1.json").write_text('{"type": "object"}')
        (root / "runner.toml").write_text(TOML.replace('prefix = "bd"', 'prefix = "bsleep"'))
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")},
               "REDIS_URL": url or (server.url if server else ""),
               "PYTHONPATH": _imported_runner()}
        rt = Runtime.create(config_mod.load(root / "runner.toml", env=env))
        client, r, k = Client(rt), rt.redis, rt.keys["q"]
        before = r.info("memory")
        base = int(before["used_memory"])
        for at in range(0, n, 1000):
            client.enqueue_many([Request("sleeper", {}) for _ in range(at, min(n, at + 1000))])
        queued = int(r.info("memory")["used_memory"]) - base
        proc = subprocess.Popen([sys.executable, "-m", "runner.cli", "--config", str(root / "runner.toml"),
                                 "worker"], cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 600
            while r.zcard(k.sleeping) < n and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            proc.kill()
            proc.wait()
        asleep = r.zcard(k.sleeping)
        after = r.info("memory")
        used = int(after["used_memory"]) - base
        # Of which the scripts loaded meanwhile and the Lua heap: held once per server, not
        # per job (about 40 B a job at 20,000 jobs, 8 at 100,000).
        scripts = sum(int(after.get(f, 0)) - int(before.get(f, 0)) for f in ("used_memory_scripts", "used_memory_lua"))
        one = r.zrange(k.sleeping, 0, 0)[0]
        log_bytes = r.hstrlen(k.state(one), "step:0") + r.hstrlen(k.state(one), "step:1")  # (its two entries)
        payload_bytes = 2  # the payload, {}
        per_job = used / n
        more = (used - queued) / n  # than the same job queued (its record and its place in ready)
        out = {"jobs": n, "asleep": asleep, "bytes_per_job": per_job, "queued_bytes_per_job": queued / n,
               "step_log_bytes": log_bytes, "beyond_payload_and_log": per_job - log_bytes - payload_bytes,
               "more_than_queued": more, "more_than_queued_beyond_log": more - log_bytes,
               "scripts_and_lua_per_job": scripts / n,
               "state_encoding": r.object("encoding", k.state(one))}
        rt.close()
        return out
    finally:
        if server is not None:
            server.stop(kill=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--signals", type=int, default=100)
    ap.add_argument("--sleepers", type=int, default=20000)
    ap.add_argument("--wakers", type=int, default=10000)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-durable-"))
    server = Server(tmp / "redis").start()
    try:
        root = tmp / "project"
        (root / "functions").mkdir(parents=True)
        for name, src in FUNCTIONS.items():
            (root / "functions" / f"{name}.py").write_text(src)
            (root / "schemas" / name).mkdir(parents=True)
            (root / "schemas" / name / "v1.json").write_text('{"type": "object"}')
        (root / "runner.toml").write_text(TOML)
        marks = tmp / "marks"
        marks.mkdir()
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}, "REDIS_URL": server.url,
               "MARKS": str(marks), "PYTHONPATH": _imported_runner()}
        rt = Runtime.create(config_mod.load(root / "runner.toml", env=env))
        client = Client(rt)
        # Warm-up, then side by side (plain, stepped, plain again).
        drain(root, env, client, "plain", 500)
        plain = drain(root, env, client, "plain", a.jobs)
        stepped = drain(root, env, client, "stepped", a.jobs)
        per_step_ms = (stepped - plain) / 3 * 1000
        print(f"worker CPU per job: no-op {plain * 1000:.3f} ms, 3 no-op steps {stepped * 1000:.3f} ms "
              f"-> {per_step_ms:.3f} ms per recorded step")

        proc = subprocess.Popen([sys.executable, "-m", "runner.cli", "--config", str(root / "runner.toml"),
                                 "worker"], cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        lat: list[float] = []
        try:
            for _ in range(a.signals):
                job = client.enqueue("waiter", {}).id
                while client.get(job).status != "waiting":
                    time.sleep(0.002)
                sent = time.time()
                client.signal(job, "go", 1)
                path = marks / job
                while not path.exists() or len(path.read_text().splitlines()) < 2:
                    time.sleep(0.0005)
                lat.append(float(path.read_text().splitlines()[1]) - sent)
        finally:
            proc.kill()
            proc.wait()
        lat.sort()
        print(f"signal to resumed run: p50 {statistics.median(lat) * 1000:.2f} ms, "
              f"p95 {lat[int(len(lat) * 0.95)] * 1000:.2f} ms ({len(lat)} signals, worker idle)")

        r = rt.redis
        r.flushall()
        m = sleeping_memory(a.sleepers, server.url)
        print(f"memory: {m['asleep']:,} jobs asleep after one step, {m['bytes_per_job']:.0f} B each "
              f"(step log {m['step_log_bytes']} B): {m['beyond_payload_and_log']:.0f} B per sleeping job beyond "
              f"payload and step log; {m['more_than_queued']:.0f} B more than queued, "
              f"{m['more_than_queued_beyond_log']:.0f} B of it beyond the log (target 300); state hash "
              f"{m['state_encoding']}; of each job's bytes, {m['scripts_and_lua_per_job']:.0f} B are the scripts "
              f"and Lua heap, held once per server")
        r.flushall()
        k = rt.keys["q"]
        at = time.time() + 60  # the workers suspend them all before then
        client.enqueue_many([Request("waker", {"at": at}) for _ in range(a.wakers)])
        procs = [subprocess.Popen([sys.executable, "-m", "runner.cli", "--config", str(root / "runner.toml"),
                                   "worker"], cwd=root, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL) for _ in range(2)]
        woke = marks / "woke"
        try:
            while r.zcard(k.sleeping) < a.wakers and time.time() < at:
                time.sleep(0.1)
            asleep_before = r.zcard(k.sleeping)
            deadline = at + 120
            while time.time() < deadline and (not woke.exists() or len(woke.read_text().splitlines()) < a.wakers):
                time.sleep(0.1)
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
        times = sorted(float(t) for t in woke.read_text().splitlines()) if woke.exists() else []
        print(f"mass wake-up: {asleep_before:,} asleep until the same second; {len(times):,} resumed, the last "
              f"{(times[-1] - at) if times else float('nan'):.2f} s after it (p50 "
              f"{(times[len(times) // 2] - at) if times else float('nan'):.2f} s), 2 worker processes")
        rt.close()
    finally:
        server.stop(kill=True)


if __name__ == "__main__":
    main()
