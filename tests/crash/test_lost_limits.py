"""A worker stopped longer than its lease (SIGSTOP) while a handler holds a RESOURCE_KEY or
CONCURRENCY slot: another worker reclaims the job, which releases the slot, and runs it
again. The stale handler must learn that its exclusion is gone: a thread-isolated one sees
ctx.lock_lost turn true at the next renewal; a process-isolated one is stopped (its child
killed), since nothing it does counts any more. Before, neither happened: the stale run
went on to its end beside the retry, with ctx.lock_lost false throughout."""

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
            f.write(f"{{ctx.attempt}} {{time.time()}} {{ctx.lock_lost}}\\n")
        time.sleep(0.1)
    return {{"attempt": ctx.attempt}}
'''

LIMITS = {"resource": 'RESOURCE_KEY = "printer:{p}"', "concurrency": "CONCURRENCY = 1"}


def ticks(project: Project) -> list[tuple[int, float, bool]]:
    return [(int(a), float(t), lost == "True") for a, t, lost in (x.split() for x in project.runs("ticks"))]


@pytest.mark.parametrize("isolation", ["thread", "process"])
@pytest.mark.parametrize("limit", ["resource", "concurrency"])
def test_a_stale_handler_learns_its_slot_went_with_its_lease(project: Project, isolation: str, limit: str) -> None:
    project.add_function("holder", HOLDER.format(isolation=isolation, limit=LIMITS[limit]),
                         '{"type": "object", "properties": {"p": {"type": "integer"}, "s": {"type": "number"}}}')
    project.write_config(vt=2, concurrency=1, prefetch=0, max_attempts=3, worker="timeout_grace = 1")
    c = project.client
    job = c.enqueue("holder", {"p": 1, "s": 15}).id
    w1 = project.spawn_worker("fast")
    wait_for(lambda: ticks(project), timeout=30, what="the first attempt to start")
    w1.send_signal(signal.SIGSTOP)
    try:
        project.spawn_worker("fast")
        # The second worker reclaims the lapsed lease and starts the job's retry.
        wait_for(lambda: any(a == 2 for a, _, _ in ticks(project)), timeout=90, what="the retry to start")
    finally:
        w1.send_signal(signal.SIGCONT)
    thawed = time.time()
    final = wait_final(project, [job], timeout=60)[job]
    assert final["status"] == "done" and final["result"] == {"attempt": 2}, final
    stale = [(t, lost) for a, t, lost in ticks(project) if a == 1 and t > thawed]
    if isolation == "thread":
        # The stale run (one thread, stopped with its worker) runs on after the thaw: a
        # thread cannot be stopped, but it is told at the next renewal (within a second).
        told = [t for t, lost in stale if lost]
        assert told, f"ctx.lock_lost never turned true in the stale run: {stale[-3:]}"
        assert told[0] - thawed < 3, f"ctx.lock_lost turned true {told[0] - thawed:.1f} s after the thaw"
    else:
        # The child ran on through its worker's stop; it is killed once the worker sees
        # the lease lost (its first renewal after the thaw).
        last = max((t for t, _ in stale), default=thawed)
        assert last - thawed < 3, f"the stale child ran on {last - thawed:.1f} s after its worker's thaw"
        log = (project.root / "worker-0.log").read_text()
        assert "its child process" in log and "is killed" in log, log[-3000:]
