"""Per-job logs (issue 51): a worker's CPU per job for a handler that logs 10 lines
through ctx.logger, side by side with the same handler logging nothing, and the cost per
line (target: at most 0.02 ms of worker CPU per line), at each worker log level asked
(INFO, the shipped default, and WARNING, by default): at INFO the worker also writes each
line to its own output (within the job log's bounds), and that output goes to a file, as
a log drain would take it; at WARNING the lines cost only their capture and their write
with the settlement.

    python bench/joblogs.py            # 3 repetitions of 20,000 jobs each way, interleaved
    python bench/joblogs.py --n 2000 --reps 1 --levels INFO
    python bench/joblogs.py --isolation process   # handlers in child processes: the worker's
                                                  # CPU, and its children's beside it

One real worker process (the fast queue, its shipped defaults) on a server of its own on
a free port; each run enqueues N jobs of one kind, then reads the worker's CPU time
(/proc user + system) from before the first job to after the last has ended. Prints the
medians and writes bench/results/joblogs.json.
"""

from __future__ import annotations

import argparse
import contextlib
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


def children(pid: int) -> list[int]:
    """A process's children (/proc)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            out += [int(x) for x in (task / "children").read_text().split()]
    return out


def children_cpu_s(pid: int) -> float:
    """The CPU seconds of a worker's child processes now running (warm: the same ones
    through a drain)."""
    total = 0.0
    for c in children(pid):
        with contextlib.suppress(OSError):
            total += cpu_s(c)
    return total


def project(root: Path, isolation: str = "thread") -> Path:
    for name, src in (("quiet", QUIET), ("chatty", CHATTY)):
        if isolation != "thread":
            src = f'ISOLATION = "{isolation}"\n' + src
        (root / "functions").mkdir(parents=True, exist_ok=True)
        (root / "functions" / f"{name}.py").write_text(src)
        (root / "schemas" / name).mkdir(parents=True, exist_ok=True)
        (root / "schemas" / name / "v1.json").write_text('{"type": "object"}')
    (root / "runner.toml").write_text(TOML)
    return root / "runner.toml"


def drain(client: Client, pid: int, type_: str, n: int, kids: list[float] | None = None) -> float:
    """Worker CPU seconds per job for ``n`` jobs of ``type_`` (``kids``: its children's
    per job is appended there)."""
    before, kids_before = cpu_s(pid), children_cpu_s(pid)
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
    if kids is not None:
        kids.append((children_cpu_s(pid) - kids_before) / n)
    return (cpu_s(pid) - before) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20000, help="jobs per run")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of each kind (interleaved)")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--levels", default="INFO,WARNING", help="worker log levels, comma-separated")
    ap.add_argument("--isolation", default="thread", choices=("thread", "process"))
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-joblogs-"))
    server = Server(work / "redis", appendonly=False).start()
    try:
        toml = project(work / "project", a.isolation)
        os.environ["REDIS_URL"] = server.url
        client = Client(Runtime.create(config_mod.load(toml)))
        out: dict[str, Any] = {"n": a.n, "reps": a.reps, "lines_per_job": LINES, "target_ms_per_line": 0.02,
                               "isolation": a.isolation, "levels": {}}
        for level in a.levels.split(","):
            out["levels"][level] = one_level(client, server.url, toml, work, level, a.n, a.reps)
        if not a.no_write:
            (BENCH / "results").mkdir(exist_ok=True)
            name = "joblogs.json" if a.isolation == "thread" else f"joblogs-{a.isolation}.json"
            (BENCH / "results" / name).write_text(json.dumps(out, indent=2) + "\n")
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
            kids: dict[str, list[float]] = {"quiet": [], "chatty": []}
            for _ in range(reps):
                for kind in ("quiet", "chatty"):
                    runs[kind].append(drain(client, worker.pid, kind, n, kids[kind]))
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
    kq, kc = statistics.median(kids["quiet"]), statistics.median(kids["chatty"])
    if kq or kc:  # (process isolation)
        got["children_cpu_ms_per_job"] = {"no logging": round(kq * 1000, 4), "10 lines": round(kc * 1000, 4)}
        got["children_cpu_ms_per_line"] = round((kc - kq) / LINES * 1000, 4)
    print(f"worker log level {level}: worker CPU per job, median of {reps} x {n:,} jobs:")
    print(f"  no logging   {quiet * 1000:.4f} ms   runs {got['runs_ms_per_job']['quiet']}")
    print(f"  10 lines     {chatty * 1000:.4f} ms   runs {got['runs_ms_per_job']['chatty']}")
    print(f"  per line     {per_line_ms:.4f} ms   (target <= 0.02 ms)")
    if "children_cpu_ms_per_line" in got:
        print(f"  its children: {got['children_cpu_ms_per_job']}, per line {got['children_cpu_ms_per_line']:.4f} ms")
    return got


if __name__ == "__main__":
    main()
