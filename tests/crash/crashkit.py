"""Helpers shared by the crash tests: a tunable runner.toml, the crash fixture functions,
record inspection, log and process probes. Everything waits by polling with a deadline.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

from runner.store.embedded import Server

from conftest import SCAN_COUNT, Project, make_project, structures, wait_for

CRASH_FIXTURES = Path(__file__).parent / "fixtures"


def configure(
    project: Project, *, vt: float = 1, slow_vt: float = 10, concurrency: int = 8,
    max_attempts: int = 3, batch: int = 64, grace: float = 5, prefetch: int = 0, isolation: str = "thread",
) -> None:
    """Write runner.toml with the knobs crash tests turn (short leases, small pools). No
    prefetch by default, so a kill strands only the jobs it names; the chaos and load
    tests turn it on as shipped."""
    project.write_config(vt=vt, slow_vt=slow_vt, grace=grace, concurrency=concurrency,
                         max_attempts=max_attempts, batch=batch, prefetch=prefetch,
                         fast=f'isolation = "{isolation}"')


def add_crash_fixtures(project: Project) -> None:
    shutil.copytree(CRASH_FIXTURES / "functions", project.root / "functions", dirs_exist_ok=True)
    shutil.copytree(CRASH_FIXTURES / "schemas", project.root / "schemas", dirs_exist_ok=True)
    project._runtime = None


def new_project(root: Path, server: Any) -> Project:
    p = make_project(root, server)
    add_crash_fixtures(p)
    return p


@contextmanager
def own_server(data_dir: Path, **kwargs: Any) -> Iterator[Server]:
    """A server of this test's own (appendonly on), so it can be stopped and restarted."""
    s = Server(data_dir, appendonly=True, **kwargs).start()
    try:
        yield s
    finally:
        s.stop(kill=True)


def rec(project: Project, job_id: str) -> dict[str, Any]:
    return project.client.get(job_id).as_dict()


def outcomes(record: dict[str, Any]) -> list[str]:
    return [h.get("outcome") for h in record["history"]]


def wait_final(project: Project, ids: Iterable[str], timeout: float = 30.0) -> dict[str, dict[str, Any]]:
    """Wait until every job is done or dead; return their records."""
    pending = set(ids)
    out: dict[str, dict[str, Any]] = {}

    def settled() -> bool:
        for job_id in list(pending):
            r = rec(project, job_id)
            if r["status"] in ("done", "dead"):
                out[job_id] = r
                pending.discard(job_id)
        return not pending

    wait_for(settled, timeout=timeout, interval=0.05, what=f"{len(pending)} job(s) to finish")
    return out


def lock_keys(project: Project, queue: str = "fast") -> list[str]:
    """Limit keys (resource locks) with a slot still held or reserved."""
    k = project.keys(queue)
    pattern = k.lim_prefix.replace("{", "\\{").replace("}", "\\}") + "*"
    r = project.runtime.redis
    return [key for key in r.scan_iter(match=pattern, count=SCAN_COUNT)
            if not key.endswith(":w") and r.type(key) == "zset" and r.zcard(key) > 0]


def assert_quiet(project: Project, queue: str = "fast") -> None:
    """Nothing left in flight: ready, leases and scheduled empty, no resource lock held,
    and no id in two structures."""
    s = structures(project, queue)
    assert s["ready"] == [], f"left in ready: {s['ready'][:10]}"
    assert s["leases"] == [], f"left in leases: {s['leases'][:10]}"
    assert s["scheduled"] == [], f"left in scheduled: {s['scheduled'][:10]}"
    assert lock_keys(project, queue) == []


def run_lines(project: Project, job_id: str) -> list[str]:
    return project.runs(job_id)


def log_records(path: Path) -> list[dict[str, Any]]:
    """The JSON log lines of a worker log (other lines are skipped)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_bytes().splitlines():
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


def wait_log(path: Path, needle: str, timeout: float = 15.0) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        for r in log_records(path):
            if needle in str(r.get("msg", "")):
                return r
        return None

    return wait_for(found, timeout=timeout, interval=0.05, what=f"log line {needle!r} in {path.name}")


def worker_log(project: Project, proc: subprocess.Popen[bytes]) -> Path:
    """The log file a spawned worker writes (spawn_worker names it by its index)."""
    return project.root / f"worker-{project.procs.index(proc)}.log"


def wait_exit(proc: subprocess.Popen[bytes], timeout: float) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"worker {proc.pid} still running after {timeout} s") from None


def kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def ready_when_serving(project: Project, proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """Wait until a spawned worker logged that it serves its queues."""
    wait_log(worker_log(project, proc), "serving", timeout=timeout)


def monotonic_deadline(seconds: float) -> float:
    return time.monotonic() + seconds
