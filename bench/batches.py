"""BATCH drain (docs/events.md, "Batches"): N no-op jobs drained by one worker with
``BATCH = {"size": 100, "wait": 0.05}`` (one ``handle_batch`` call per batch, each job
still settled on its own) against the same jobs without BATCH (one ``handle`` call
each), side by side in one run, on one Redis, the median of ``--reps`` runs of each.

A drain is timed from the worker's first claim (the queue's ready count drops below N)
to the last settlement (nothing ready, nothing held), so the worker's start is left out
of both. ``--spy PATH`` also samples one drain of each with py-spy (the worker's thread holding
the GIL) and prints where its time went.

Usage: python bench/batches.py [--jobs 20000] [--reps 3] [--spy .../py-spy]
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

import redis

if __name__ == "__main__":  # run by itself: the repository's runner
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runner import config as config_mod
from runner.client import Client, Request
from runner.runtime import Runtime
from runner.store.embedded import Server

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness.profile import summarize

SINGLE = 'QUEUE = "{queue}"\n\ndef handle(payload, ctx):\n    return None\n'
BATCHED = ('QUEUE = "{queue}"\nBATCH = {{"size": {size}, "wait": {wait}}}\n\n'
           'def handle_batch(payloads, ctx):\n    return None\n')
TOML = """
[redis]
prefix = "bb"
[queues.single]
[queues.batched]
[retention]
done = 600
"""


def project(root: Path, size: int, wait: float) -> None:
    (root / "functions").mkdir(parents=True)
    for name, src in (("single", SINGLE.format(queue="single")),
                      ("batched", BATCHED.format(queue="batched", size=size, wait=wait))):
        (root / "functions" / f"{name}.py").write_text(src)
        (root / "schemas" / name).mkdir(parents=True)
        (root / "schemas" / name / "v1.json").write_text('{"type": "object"}')
    (root / "runner.toml").write_text(TOML)


def _cpu_s(pid: int) -> float:
    """A process's CPU seconds so far (user and system)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _redis_cpu_s(r: Any) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def drain(client: Client, root: Path, env: dict[str, str], queue: str, n: int, cap_s: float,
          spy: str | None = None, profile_to: Path | None = None) -> dict[str, Any]:
    """Enqueue ``n`` jobs, start one worker on ``queue``, time the drain; the worker stops.
    ``spy``: py-spy, which samples the worker (the thread holding the GIL) from its first
    claim into ``profile_to`` (raw, folded stacks)."""
    for at in range(0, n, 1000):
        client.enqueue_many([Request(queue, {"i": i}) for i in range(at, min(n, at + 1000))])
    args = [sys.executable, "-m", "runner.cli", "--config", str(root / "runner.toml"), "worker", "--queue", queue]
    proc = subprocess.Popen(args, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    spying: subprocess.Popen[bytes] | None = None
    raw = redis.Redis.from_url(env["REDIS_URL"])  # (INFO cpu only: the bench's own look at the server)
    cpu0 = cpu1 = rcpu0 = rcpu1 = 0.0
    try:
        first = end = None
        deadline = time.monotonic() + cap_s + 60
        while time.monotonic() < deadline:
            s = client.stats()[queue]
            now = time.monotonic()
            if first is None and s["ready"] < n:
                first = now
                cpu0, rcpu0 = _cpu_s(proc.pid), _redis_cpu_s(raw)
                if spy and profile_to:
                    spying = subprocess.Popen([spy, "record", "-p", str(proc.pid), "-r", "500", "-f", "raw", "-o",
                                               str(profile_to), "--nonblocking", "--gil"],
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if first is not None and s["ready"] == 0 and s["processing"] == 0:
                end = now
                cpu1, rcpu1 = _cpu_s(proc.pid), _redis_cpu_s(raw)
                break
            time.sleep(0.05)
        if first is None or end is None:
            raise RuntimeError(f"{queue}: not drained within {cap_s + 60:.0f} s")
        return {"jobs": n, "seconds": end - first, "jobs_per_s": n / (end - first),
                "worker_cpu_us_per_job": 1e6 * (cpu1 - cpu0) / n, "redis_cpu_us_per_job": 1e6 * (rcpu1 - rcpu0) / n}
    finally:
        if spying is not None:
            spying.send_signal(2)  # SIGINT: py-spy writes what it has
            spying.wait(timeout=30)
        proc.send_signal(2)  # SIGINT: a graceful stop
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def run(n: int = 20000, reps: int = 3, size: int = 100, wait: float = 0.05, url: str | None = None,
        spy: str | None = None) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-batches-"))
    server = None if url else Server(tmp / "redis").start()
    try:
        root = tmp / "project"
        project(root, size, wait)
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")},
               "REDIS_URL": url or (server.url if server else "")}
        # The worker runs the runner this script imported (not another installed one).
        import runner

        env["PYTHONPATH"] = os.pathsep.join([str(Path(runner.__file__).resolve().parent.parent),
                                             *filter(None, [env.get("PYTHONPATH")])])
        client = Client(Runtime.create(config_mod.load(root / "runner.toml", env=env)))
        single, batched = [], []
        for _ in range(reps):  # interleaved: a slower moment of the host costs both alike
            single.append(drain(client, root, env, "single", n, 120))
            batched.append(drain(client, root, env, "batched", n, 120))
        out: dict[str, Any] = {
            "jobs": n, "reps": reps, "size": size, "wait": wait,
            "single_jobs_per_s": statistics.median(r["jobs_per_s"] for r in single),
            "batched_jobs_per_s": statistics.median(r["jobs_per_s"] for r in batched),
            "single_runs": [round(r["jobs_per_s"]) for r in single],
            "batched_runs": [round(r["jobs_per_s"]) for r in batched],
        }
        for name, runs in (("single", single), ("batched", batched)):
            for k in ("worker_cpu_us_per_job", "redis_cpu_us_per_job"):
                out[f"{name}_{k}"] = statistics.median(r[k] for r in runs)
        out["speedup"] = out["batched_jobs_per_s"] / out["single_jobs_per_s"]
        if spy:
            for queue in ("single", "batched"):
                raw = tmp / f"{queue}.txt"
                drain(client, root, env, queue, n, 120, spy, raw)
                out[f"profile_{queue}"] = summarize(raw)
        client.close()
        return out
    finally:
        if server is not None:
            server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=20000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--spy", help="py-spy's path: also sample one drain of each under py-spy")
    a = ap.parse_args()
    r = run(a.jobs, a.reps, spy=a.spy)
    print(f"{r['jobs']:,} no-op jobs, one worker, median of {r['reps']}: without BATCH "
          f"{r['single_jobs_per_s']:,.0f} jobs/s {r['single_runs']}; with BATCH size {r['size']} wait {r['wait']} s "
          f"{r['batched_jobs_per_s']:,.0f} jobs/s {r['batched_runs']}; {r['speedup']:.2f}x")
    for name in ("single", "batched"):
        print(f"  {name}: worker CPU {r[f'{name}_worker_cpu_us_per_job']:.0f} us/job, Redis CPU "
              f"{r[f'{name}_redis_cpu_us_per_job']:.0f} us/job")
    for queue in ("single", "batched"):
        prof = r.get(f"profile_{queue}")
        if prof:
            print(f"\n{queue}: {prof['samples']} samples of the thread holding the GIL; by bucket: {prof['buckets']}")
            for name, pct in prof["self"][:15]:
                print(f"  {pct:5.1f}%  {name}")


if __name__ == "__main__":
    main()
