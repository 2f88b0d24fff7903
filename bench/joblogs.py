"""Per-job logs (issue 51): a worker's CPU per job for a handler that logs 10 lines
through ctx.logger, side by side with the same handler logging nothing, and the cost per
line (target: at most 0.02 ms of worker CPU per line). The worker logs at WARNING, as
in production, so the INFO lines cost only their capture and their write with the
settlement, not the worker's own log output.

    python bench/joblogs.py            # 3 repetitions of 20,000 jobs each way, interleaved
    python bench/joblogs.py --n 2000 --reps 1

One real worker process (the fast queue, its shipped defaults) on a server of its own on
a free port; each run enqueues N jobs of one kind, then reads the worker's CPU time
(/proc user + system) from before the first job to after the last has ended. Prints the
medians and writes bench/results/joblogs.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO))

from runner import config as config_mod  # noqa: E402
from runner.client import Client, Request  # noqa: E402
from runner.runtime import Runtime  # noqa: E402
from runner.store.embedded import Server  # noqa: E402

LINES = 10
QUIET = 'QUEUE = "fast"\n\n\ndef handle(payload, ctx):\n    return None\n'
CHATTY = ('QUEUE = "fast"\n\n\ndef handle(payload, ctx):\n'
          f'    for i in range({LINES}):\n        ctx.logger.info("step %d of job %s", i, ctx.job_id)\n'
          '    return None\n')
TOML = """[redis]
prefix = "benchlogs"

[queues.fast]
visibility_timeout = 30
concurrency = 16
prefetch = 16
max_attempts = 5

[log]
level = "WARNING"
"""


def cpu_s(pid: int) -> float:
    """A process's user + system CPU seconds (/proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def project(root: Path) -> Path:
    for name, src in (("quiet", QUIET), ("chatty", CHATTY)):
        (root / "functions").mkdir(parents=True, exist_ok=True)
        (root / "functions" / f"{name}.py").write_text(src)
        (root / "schemas" / name).mkdir(parents=True, exist_ok=True)
        (root / "schemas" / name / "v1.json").write_text('{"type": "object"}')
    (root / "runner.toml").write_text(TOML)
    return root / "runner.toml"


def drain(client: Client, pid: int, type_: str, n: int) -> float:
    """Worker CPU seconds per job for ``n`` jobs of ``type_``."""
    before = cpu_s(pid)
    jobs = client.enqueue_many([Request(type_, {}) for _ in range(n)])
    last = jobs[-1]
    assert not isinstance(last, Exception), last
    deadline = time.monotonic() + 300
    while client.get(last.id).status != "done":
        if time.monotonic() > deadline:
            raise RuntimeError(f"{type_}: the drain did not end within 300 s")
        time.sleep(0.05)
    for j in jobs:  # every job of the drain, not only the last, has ended
        assert not isinstance(j, Exception)
    time.sleep(0.2)  # the last settlements' figures
    return (cpu_s(pid) - before) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20000, help="jobs per run")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of each kind (interleaved)")
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-joblogs-"))
    server = Server(work / "redis", appendonly=False).start()
    worker = None
    try:
        toml = project(work / "project")
        env = {**os.environ, "REDIS_URL": server.url, "PYTHONPATH": str(REPO)}
        worker = subprocess.Popen([sys.executable, "-m", "runner.cli", "--config", str(toml), "worker"],
                                  cwd=toml.parent, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.environ["REDIS_URL"] = server.url
        client = Client(Runtime.create(config_mod.load(toml)))
        drain(client, worker.pid, "quiet", 500)  # warm: imports, children, first claims
        drain(client, worker.pid, "chatty", 500)
        runs: dict[str, list[float]] = {"quiet": [], "chatty": []}
        for _ in range(a.reps):
            for kind in ("quiet", "chatty"):
                runs[kind].append(drain(client, worker.pid, kind, a.n))
        quiet, chatty = statistics.median(runs["quiet"]), statistics.median(runs["chatty"])
        per_line_ms = (chatty - quiet) / LINES * 1000
        out: dict[str, Any] = {
            "n": a.n, "reps": a.reps, "lines_per_job": LINES,
            "worker_cpu_ms_per_job": {"no logging": round(quiet * 1000, 4), "10 lines": round(chatty * 1000, 4)},
            "runs_ms_per_job": {k: [round(v * 1000, 4) for v in vs] for k, vs in runs.items()},
            "worker_cpu_ms_per_line": round(per_line_ms, 4), "target_ms_per_line": 0.02,
        }
        print(f"worker CPU per job, median of {a.reps} x {a.n:,} jobs:")
        print(f"  no logging   {quiet * 1000:.4f} ms   runs {out['runs_ms_per_job']['quiet']}")
        print(f"  10 lines     {chatty * 1000:.4f} ms   runs {out['runs_ms_per_job']['chatty']}")
        print(f"  per line     {per_line_ms:.4f} ms   (target <= 0.02 ms)")
        if not a.no_write:
            (BENCH / "results").mkdir(exist_ok=True)
            (BENCH / "results" / "joblogs.json").write_text(json.dumps(out, indent=2) + "\n")
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(30)
        server.stop()


if __name__ == "__main__":
    main()
