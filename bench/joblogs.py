"""Per-job logs (issue 51): a worker's CPU per job for a handler that logs 10 lines
through ctx.logger, side by side with the same handler logging nothing, and the cost per
line (target: at most 0.02 ms of worker CPU per line), at each worker log level asked
(INFO, the shipped default, and WARNING, by default): at INFO the worker also writes each
line to its own output (within the job log's bounds), and that output goes to a file, as
a log drain would take it; at WARNING the lines cost only their capture and their write
with the settlement.

    python bench/joblogs.py            # 3 repetitions of 20,000 jobs each way, interleaved
    python bench/joblogs.py --n 2000 --reps 1 --levels INFO

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
    ap.add_argument("--levels", default="INFO,WARNING", help="worker log levels, comma-separated")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-joblogs-"))
    server = Server(work / "redis", appendonly=False).start()
    try:
        toml = project(work / "project")
        os.environ["REDIS_URL"] = server.url
        client = Client(Runtime.create(config_mod.load(toml)))
        out: dict[str, Any] = {"n": a.n, "reps": a.reps, "lines_per_job": LINES, "target_ms_per_line": 0.02,
                               "levels": {}}
        for level in a.levels.split(","):
            out["levels"][level] = one_level(client, server.url, toml, work, level, a.n, a.reps)
        if not a.no_write:
            (BENCH / "results").mkdir(exist_ok=True)
            (BENCH / "results" / "joblogs.json").write_text(json.dumps(out, indent=2) + "\n")
    finally:
        server.stop()


def one_level(client: Client, url: str, toml: Path, work: Path, level: str, n: int, reps: int) -> dict[str, Any]:
    """The runs of one worker at log ``level``, its output to a file."""
    env = {**os.environ, "REDIS_URL": url, "PYTHONPATH": str(REPO), "RUNNER_LOG_LEVEL": level}
    with open(work / f"worker-{level}.log", "wb") as output:
        worker = subprocess.Popen([sys.executable, "-m", "runner.cli", "--config", str(toml), "worker"],
                                  cwd=toml.parent, env=env, stdout=output, stderr=subprocess.STDOUT)
        try:
            drain(client, worker.pid, "quiet", 500)  # warm: imports, children, first claims
            drain(client, worker.pid, "chatty", 500)
            runs: dict[str, list[float]] = {"quiet": [], "chatty": []}
            for _ in range(reps):
                for kind in ("quiet", "chatty"):
                    runs[kind].append(drain(client, worker.pid, kind, n))
        finally:
            worker.terminate()
            worker.wait(30)
    quiet, chatty = statistics.median(runs["quiet"]), statistics.median(runs["chatty"])
    per_line_ms = (chatty - quiet) / LINES * 1000
    got: dict[str, Any] = {
        "worker_cpu_ms_per_job": {"no logging": round(quiet * 1000, 4), "10 lines": round(chatty * 1000, 4)},
        "runs_ms_per_job": {k: [round(v * 1000, 4) for v in vs] for k, vs in runs.items()},
        "worker_cpu_ms_per_line": round(per_line_ms, 4),
    }
    print(f"worker log level {level}: worker CPU per job, median of {reps} x {n:,} jobs:")
    print(f"  no logging   {quiet * 1000:.4f} ms   runs {got['runs_ms_per_job']['quiet']}")
    print(f"  10 lines     {chatty * 1000:.4f} ms   runs {got['runs_ms_per_job']['chatty']}")
    print(f"  per line     {per_line_ms:.4f} ms   (target <= 0.02 ms)")
    return got


if __name__ == "__main__":
    main()
