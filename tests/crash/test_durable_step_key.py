"""A step retried in a loop after an unrecorded failure keeps its step_key: the worker is
SIGKILLed inside the loop's second try, and the next attempt calls the step at the same
position under the same key, so an idempotency key built from ctx.step_key is the same
for every call of that one payment."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from conftest import Project, assert_no_job_in_two_structures, wait_for

LOOP = '''
import os, time
QUEUE = "fast"
MAX_ATTEMPTS = 3
{isolation}

def pay(ctx):
    path = os.path.join(os.environ["RECORD_DIR"], ctx.job_id + "-pay")
    with open(path, "a") as f:
        f.write(ctx.step_key + "\\n")
    with open(path) as f:
        n = len(f.read().splitlines())
    if n == 1:
        raise ConnectionError("the payment API flaked")
    if n == 2:  # the test SIGKILLs the worker here
        open(os.path.join(os.environ["RECORD_DIR"], "in-second-try"), "w").close()
        time.sleep(60)
    return "paid"

def handle(payload, ctx):
    paid = None
    for _ in range(3):
        try:
            paid = ctx.step("pay", pay, ctx)
            break
        except ConnectionError:
            continue
    ctx.step("after", lambda: ctx.step_key)
    return {{"paid": paid, "attempt": ctx.attempt}}
'''


def _pids(pid: int) -> list[int]:
    """``pid`` and its child processes."""
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [pid, *(int(p) for p in out.split())]


@pytest.mark.parametrize("isolation", ["", 'ISOLATION = "process"'], ids=["thread", "process"])
def test_a_step_retried_in_a_loop_keeps_its_key_across_a_kill(project: Project, isolation: str) -> None:
    """Try 1 fails unrecorded, try 2 is killed with its worker, the next attempt's try
    succeeds: all three calls carried "<id>:pay", and the job is done on attempt 2."""
    project.write_config(concurrency=1)  # one job: one child a worker, not eight
    project.add_function("loop", LOOP.format(isolation=isolation))
    c = project.client
    w1 = project.spawn_worker("fast")
    job = c.enqueue("loop", {}).id
    wait_for(lambda: (project.records / "in-second-try").exists(), timeout=90, what="the loop's second try")
    for p in _pids(w1.pid):
        os.kill(p, signal.SIGKILL)
    w1.wait(10)
    project.spawn_worker("fast")
    done = c.wait(job, 90).as_dict()
    assert done["status"] == "done" and done["result"] == {"paid": "paid", "attempt": 2}, done
    keys = (project.records / f"{job}-pay").read_text().splitlines()
    assert keys == [f"{job}:pay"] * 3, keys
    assert_no_job_in_two_structures(project)
