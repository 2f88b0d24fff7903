"""A `runner worker` process keeps its threads on one core (worker/affinity.py): two
workers on one host take different cores, "off" leaves the mask alone, and a handler
in a child process (ISOLATION = "process") gets every core back."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from conftest import Project, wait_for

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs Linux and two usable cores")

CHILD_FN = '''"""Returns the cores its process may run on."""
import os

QUEUE = "slow"
ISOLATION = "process"


def handle(payload, ctx):
    return sorted(os.sched_getaffinity(0))
'''


def _cores(pid: int) -> set[int]:
    """Every thread's mask, joined: one core when the whole process kept to it."""
    out: set[int] = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out |= os.sched_getaffinity(int(tid))
        except OSError:
            continue  # the thread ended
    return out


def _pinned(proc: subprocess.Popen[bytes]) -> set[int] | None:
    cores = _cores(proc.pid)
    return cores if len(cores) == 1 else None


def test_two_workers_keep_to_two_different_cores(project: Project, tmp_path: Path) -> None:
    env = {"TMPDIR": str(tmp_path)}  # the per-core lock files of this test's host only
    a = project.spawn_worker("fast", env=env)
    first = wait_for(lambda: _pinned(a), timeout=15, what="the first worker to keep to one core")
    b = project.spawn_worker("fast", env=env)
    second = wait_for(lambda: _pinned(b), timeout=15, what="the second worker to keep to one core")
    assert first != second
    allowed = os.sched_getaffinity(0)
    assert first | second <= allowed
    # And it still runs jobs.
    job = project.client.enqueue("noop", {})
    wait_for(lambda: project.client.get(job.id).status == "done", timeout=15)


def test_off_leaves_the_mask_alone(project: Project, tmp_path: Path) -> None:
    w = project.spawn_worker("fast", env={"TMPDIR": str(tmp_path), "RUNNER_CPU_AFFINITY": "off"})
    job = project.client.enqueue("noop", {})
    wait_for(lambda: project.client.get(job.id).status == "done", timeout=15)
    assert _cores(w.pid) == os.sched_getaffinity(0)


def test_a_child_process_handler_gets_every_core_back(project: Project, tmp_path: Path) -> None:
    (project.root / "functions" / "cores.py").write_text(CHILD_FN)
    schemas = project.root / "schemas" / "cores"
    schemas.mkdir(parents=True, exist_ok=True)
    (schemas / "v1.json").write_text('{"type": "object"}')
    w = project.spawn_worker("fast", "slow", env={"TMPDIR": str(tmp_path)})
    wait_for(lambda: _pinned(w), timeout=15, what="the worker to keep to one core")
    job = project.client.enqueue("cores", {})
    done = wait_for(lambda: (j := project.client.get(job.id)).status == "done" and j, timeout=30)
    assert set(done.as_dict()["result"]) == os.sched_getaffinity(0)


def test_a_mask_narrowed_above_the_worker_is_not_widened(project: Project, tmp_path: Path) -> None:
    """A worker started on one core (taskset, or by a pinned worker's thread handler that
    passed its variables on) keeps its children there too."""
    (project.root / "functions" / "cores.py").write_text(CHILD_FN)
    schemas = project.root / "schemas" / "cores"
    schemas.mkdir(parents=True, exist_ok=True)
    (schemas / "v1.json").write_text('{"type": "object"}')
    mine = os.sched_getaffinity(0)
    one = min(mine)
    os.sched_setaffinity(0, {one})  # the spawned worker inherits it
    try:
        project.spawn_worker("slow", env={"TMPDIR": str(tmp_path),
                                          "RUNNER_CPUS_ORIGINAL": ",".join(map(str, sorted(mine)))})
    finally:
        os.sched_setaffinity(0, mine)
    job = project.client.enqueue("cores", {})
    done = wait_for(lambda: (j := project.client.get(job.id)).status == "done" and j, timeout=30)
    assert done.as_dict()["result"] == [one]
