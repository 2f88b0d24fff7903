"""A worker stopped longer than its lease (SIGSTOP) while a handler holds a RESOURCE_KEY or
CONCURRENCY slot: another worker reclaims the job, which releases the slot, and runs it
again. The stale handler must learn that its exclusion is gone: a thread-isolated one sees
ctx.lock_lost turn true at the next renewal; a process-isolated one sees it too, and is
stopped (its child killed) past timeout_grace, since nothing it does counts any more.
Before, neither happened: the stale run went on to its end beside the retry, with
ctx.lock_lost false throughout, and the late renewal was blamed on a handler holding the
GIL even with the handler in a child."""

from __future__ import annotations

import signal
import time

import pytest
from crashkit import wait_final

from conftest import Project, wait_for

HOLDER = '''
import os, time
QUEUE = "fast"
ISOLATION = "{isolation}"
TIMEOUT = 20
MAX_ATTEMPTS = 3
{limit}

def handle(payload, ctx):
    path = os.path.join(os.environ["RECORD_DIR"], "ticks")
    end = time.time() + payload["s"]
    while time.time() < end:
        with open(path, "a") as f:
            f.write(f"{{os.getpid()}} {{time.time()}} {{ctx.lock_lost}}\\n")
        time.sleep(0.1)
    return {{"pid": os.getpid()}}
'''

LIMITS = {"resource": 'RESOURCE_KEY = "printer:{p}"', "concurrency": "CONCURRENCY = 1"}


def ticks(project: Project) -> list[tuple[int, float, bool]]:
    """Each tick of a run: the pid running it (a worker's, or a child's), when, and what
    ctx.lock_lost said. (Runs are told apart by pid: a process job's first run may count
    no attempt, if its start mark had not landed when its worker stopped.)"""
    return [(int(p), float(t), lost == "True") for p, t, lost in (x.split() for x in project.runs("ticks"))]


@pytest.mark.parametrize("isolation", ["thread", "process"])
@pytest.mark.parametrize("limit", ["resource", "concurrency"])
def test_a_stale_handler_learns_its_slot_went_with_its_lease(project: Project, isolation: str, limit: str) -> None:
    project.add_function("holder", HOLDER.format(isolation=isolation, limit=LIMITS[limit]),
                         '{"type": "object", "properties": {"p": {"type": "integer"}, "s": {"type": "number"}}}')
    project.write_config(vt=2, concurrency=1, prefetch=0, max_attempts=3, worker="timeout_grace = 1")
    c = project.client
    job = c.enqueue("holder", {"p": 1, "s": 15}).id
    w1 = project.spawn_worker("fast")
    first = wait_for(lambda: ticks(project), timeout=30, what="the first run to start")[0][0]
    w1.send_signal(signal.SIGSTOP)
    try:
        project.spawn_worker("fast")
        # The second worker reclaims the lapsed lease and starts the job's retry.
        wait_for(lambda: any(p != first for p, _, _ in ticks(project)), timeout=90, what="the retry to start")
    finally:
        w1.send_signal(signal.SIGCONT)
    thawed = time.time()
    final = wait_final(project, [job], timeout=60)[job]
    assert final["status"] == "done" and final["result"]["pid"] != first, final
    stale = [(t, lost) for p, t, lost in ticks(project) if p == first and t > thawed]
    if isolation == "thread":
        # The stale run (one thread, stopped with its worker) runs on after the thaw: a
        # thread cannot be stopped, but it is told at the next renewal (within a second).
        told = [t for t, lost in stale if lost]
        assert told, f"ctx.lock_lost never turned true in the stale run: {stale[-3:]}"
        assert told[0] - thawed < 3, f"ctx.lock_lost turned true {told[0] - thawed:.1f} s after the thaw"
        log = (project.root / "worker-0.log").read_text()
        assert "or the whole worker was stopped" in log, log[-3000:]
    else:
        # The child ran on through its worker's stop; once the worker sees the lease lost
        # (its first renewal after the thaw) the handler is told, and its child is killed
        # timeout_grace (1 s) later.
        last = max((t for t, _ in stale), default=thawed)
        assert last - thawed < 3.5, f"the stale child ran on {last - thawed:.1f} s after its worker's thaw"
        assert stale and stale[-1][1], f"ctx.lock_lost never turned true in the stale child: {stale[-3:]}"
        log = (project.root / "worker-0.log").read_text()
        assert "its child process" in log and "is killed" in log, log[-3000:]
        # Its late renewal is no handler's doing: no handler runs in the worker's threads.
        assert "held the GIL" not in log and "stopped or starved" in log, log[-3000:]
