"""A worker stopped by SIGTERM exits once its stop is done, whatever threads a
thread-isolated handler left running: a thread of its own that is not a daemon, or a
long task on a module-level ThreadPoolExecutor. Python's exit waits for such threads,
so the worker logged "stopped" and stayed up until the platform's SIGKILL (30 s on a
PaaS, 90 s under systemd), with every later SIGTERM ignored."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from conftest import Project, wait_for

LEAVES = '''
import threading, time
from concurrent.futures import ThreadPoolExecutor
QUEUE = "fast"
POOL = ThreadPoolExecutor(2)

def handle(payload, ctx):
    if payload["how"] == "thread":
        threading.Thread(target=time.sleep, args=(120,), daemon=False).start()
    else:
        POOL.submit(time.sleep, 120)
    return {}
'''


@pytest.mark.parametrize("how", ["thread", "pool"])
def test_a_sigterm_ends_the_worker_though_a_handler_left_a_thread_running(project: Project, how: str) -> None:
    project.add_function("leaves", LEAVES)
    job = project.client.enqueue("leaves", {"how": how}).id
    w = project.spawn_worker("fast")
    wait_for(lambda: project.client.get(job).status == "done", timeout=30, what="the job done")
    t0 = time.monotonic()
    w.send_signal(signal.SIGTERM)
    try:
        code = w.wait(timeout=15)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the worker was still up {time.monotonic() - t0:.0f} s after SIGTERM") from None
    assert code == 0, code
    log = (project.root / "worker-0.log").read_text()
    assert "still running" in log and "exiting without them" in log, log[-2000:]
