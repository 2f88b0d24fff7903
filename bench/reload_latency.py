"""Hot-reload latency of `runner dev`: from saving a function file to the first job that
runs the new code.

A fresh project (the shipped examples plus a ``probe`` function that returns a mark) is
served by `runner dev` on an embedded Valkey. Each round saves ``probe.py`` with a new
mark, then enqueues probe jobs over HTTP one after another until one returns the new
mark. Two figures per edit:

- ``latency``: save -> the start of the first job that ran the new code (the job's
  ``started_at``, stamped by the worker), which is what a developer waits for;
- ``reload``: the work of the reload itself, as `runner dev` logs it.

Usage: python bench/reload_latency.py [--edits 15]; prints a summary and writes
bench/results/reload_latency.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

from runner.store.embedded import Server, free_port

REPO = Path(__file__).resolve().parent.parent
PROBE = '''"""Returns the mark of the code that ran it."""
QUEUE = "fast"
MARK = {mark}


def handle(payload, ctx):
    return {{"mark": MARK}}
'''
TOML = """
[redis]
prefix = "bench"

[queues.fast]
visibility_timeout = 30

[queues.slow]
visibility_timeout = 900

[log]
level = "INFO"
"""


def wait(pred: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.005)
    raise SystemExit(f"timed out waiting for {what}")


def run_probe(base: str) -> dict[str, Any]:
    job_id = requests.post(f"{base}/jobs/probe", json={}, timeout=5).json()["id"]

    def finished() -> dict[str, Any] | None:
        rec = requests.get(f"{base}/jobs/{job_id}", timeout=5).json()
        return rec if rec["status"] in ("done", "dead") else None

    return dict(wait(finished, 10, "a probe job"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--edits", type=int, default=15)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "reload_latency.json"))
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="reload-bench-"))
    server = Server(work / "redis").start()
    root = work / "app"
    shutil.copytree(REPO / "functions", root / "functions")
    shutil.copytree(REPO / "schemas", root / "schemas")
    (root / "runner.toml").write_text(TOML)
    probe = root / "functions" / "probe.py"
    probe.write_text(PROBE.format(mark=0))
    (root / "schemas" / "probe").mkdir()
    (root / "schemas" / "probe" / "v1.json").write_text('{"type": "object"}')

    port = free_port()
    log_path = work / "dev.log"
    env = {**os.environ, "REDIS_URL": server.url, "OUTBOX_DIR": str(root / "outbox")}
    dev = subprocess.Popen([sys.executable, "-m", "runner.cli", "dev", "--port", str(port)], cwd=root,
                           env=env, stdout=log_path.open("wb"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    latencies: list[float] = []
    try:
        wait(lambda: "runner.dev: serving" in log_path.read_text(), 30, "runner dev to start")
        assert run_probe(base)["result"] == {"mark": 0}
        for mark in range(1, args.edits + 1):
            time.sleep(0.3)  # let the previous reload settle: one edit at a time
            tmp = probe.with_suffix(".tmp")
            tmp.write_text(PROBE.format(mark=mark))
            saved = time.time()
            os.replace(tmp, probe)  # how most editors save
            while True:
                rec = run_probe(base)
                if rec["result"] == {"mark": mark}:
                    latencies.append((rec["started_at"] - saved) * 1000)
                    break
                if time.time() - saved > 10:
                    raise SystemExit(f"edit {mark} did not take effect in 10 s")
    finally:
        dev.send_signal(signal.SIGTERM)
        dev.wait(timeout=30)
        server.stop()
    log = log_path.read_text()
    reloads = [float(m) for m in re.findall(r"reloaded in (\d+) ms", log)]
    shutil.rmtree(work, ignore_errors=True)

    result = {
        "what": "runner dev: save of a function file -> start of the first job running the new code",
        "edits": len(latencies),
        "median_ms": round(statistics.median(latencies), 1),
        "min_ms": round(min(latencies), 1),
        "max_ms": round(max(latencies), 1),
        "samples_ms": [round(x, 1) for x in latencies],
        "reload_work_median_ms": statistics.median(reloads) if reloads else None,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "system": platform.system()},
        "measured_at": time.strftime("%Y-%m-%d"),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"reload latency over {result['edits']} edits: median {result['median_ms']} ms "
          f"(min {result['min_ms']}, max {result['max_ms']}); the reload itself: "
          f"median {result['reload_work_median_ms']} ms -> {out}")


if __name__ == "__main__":
    main()
