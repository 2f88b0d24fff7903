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
from pathlib import Path

import pytest
from crashkit import wait_final

from conftest import Project, wait_for

# The first run holds its slot long enough to be caught stale; the retry that took the slot
# only has to end done, so it is short (the test waits for it).
FIRST_RUN_LONG = '''
def first_run_s(s):
    try:
        os.close(os.open(os.path.join(os.environ["RECORD_DIR"], "first"), os.O_CREAT | os.O_EXCL))
        return s
    except FileExistsError:
        return 0.3
'''

HOLDER = '''
import os, time
QUEUE = "fast"
ISOLATION = "{isolation}"
TIMEOUT = 20
MAX_ATTEMPTS = 3
{limit}
''' + FIRST_RUN_LONG + '''

def handle(payload, ctx):
    path = os.path.join(os.environ["RECORD_DIR"], "ticks")
    end = time.time() + first_run_s(payload["s"])
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


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie, killed and not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.parametrize("isolation", ["thread", "process"])
@pytest.mark.parametrize("limit", ["resource", "concurrency"])
def test_a_stale_handler_learns_its_slot_went_with_its_lease(project: Project, isolation: str, limit: str) -> None:
    project.add_function("holder", HOLDER.format(isolation=isolation, limit=LIMITS[limit]),
                         '{"type": "object", "properties": {"p": {"type": "integer"}, "s": {"type": "number"}}}')
    project.write_config(vt=2, concurrency=1, prefetch=0, max_attempts=3, worker="timeout_grace = 1")
    c = project.client
    job = c.enqueue("holder", {"p": 1, "s": 18}).id
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

    def stale() -> list[tuple[float, bool]]:
        return [(t, lost) for p, t, lost in ticks(project) if p == first and t > thawed]

    if isolation == "thread":
        # The stale run (one thread, stopped with its worker) runs on after the thaw: a
        # thread cannot be stopped, but it is told at the next renewal (within a second).
        wait_for(lambda: any(lost for _, lost in stale()) or time.time() > thawed + 3.5, timeout=10,
                 what="the stale run to be told, or 3.5 s past the thaw")
        told = [t for t, lost in stale() if lost]
        assert told, f"ctx.lock_lost never turned true in the stale run: {stale()[-3:]}"
        assert told[0] - thawed < 3, f"ctx.lock_lost turned true {told[0] - thawed:.1f} s after the thaw"
        log = (project.root / "worker-0.log").read_text()
        assert "or the whole worker was stopped" in log, log[-3000:]
    else:
        # The child ran on through its worker's stop; once the worker sees the lease lost
        # (its first renewal after the thaw) the handler is told, and its child is killed
        # timeout_grace (1 s) later. (Its own run would last 18 s: watch it past 3.5 s.)
        wait_for(lambda: not alive(first) or time.time() > thawed + 4, timeout=10,
                 what="the stale child to end, or 4 s past the thaw")
        time.sleep(0.2)  # a last tick it wrote as it was killed
        seen = stale()
        last = max((t for t, _ in seen), default=thawed)
        assert last - thawed < 3.5, f"the stale child ran on {last - thawed:.1f} s after its worker's thaw"
        assert seen and seen[-1][1], f"ctx.lock_lost never turned true in the stale child: {seen[-3:]}"
        log = (project.root / "worker-0.log").read_text()
        assert "its child process" in log and "is killed" in log, log[-3000:]
        # Its late renewal is no handler's doing: no handler runs in the worker's threads.
        assert "held the GIL" not in log and "stopped or starved" in log, log[-3000:]


# A thread's call, which nothing can stop, ends a moment after it is told (as a handler
# that heeds ctx.lock_lost does), so its retry need not wait out its slot; a child's call
# heeds nothing, for the worker must kill it.
BATCH_HOLDER = '''
import os, time
QUEUE = "fast"
ISOLATION = "{isolation}"
TIMEOUT = 25
MAX_ATTEMPTS = 3
CONCURRENCY = 2
BATCH = {{"size": 2, "wait": 1.0}}
''' + FIRST_RUN_LONG + '''
def handle_batch(payloads, ctx):
    path = os.path.join(os.environ["RECORD_DIR"], "ticks")
    end = time.time() + first_run_s(max(p["s"] for p in payloads))
    told = None
    while time.time() < end and not (told and time.time() > told + 0.5 and ISOLATION == "thread"):
        lost = ctx.lock_lost and all(j.lock_lost for j in ctx.jobs)
        told = told or (lost and time.time())
        with open(path, "a") as f:
            f.write(f"{{os.getpid()}} {{time.time()}} {{lost}}\\n")
        time.sleep(0.1)
    return [{{"pid": os.getpid()}} for _ in payloads]
'''


def force_lease_loss(project: Project, queue: str = "fast") -> None:
    """Take back every claimed job of the queue now, as the scheduler does once a lease
    has lapsed (the reclaim run with a clock an hour ahead)."""
    k = project.keys(queue)
    requeued, buried = (int(x) for x in project.runtime.scripts.reclaim(
        k, 100, 10**7, now_ms=int(time.time() * 1000) + 3_600_000))
    assert requeued + buried >= 1, "no lease to take back"


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_stale_batch_learns_its_slots_went_with_its_leases(project: Project, isolation: str) -> None:
    """A BATCH call whose members' leases (and CONCURRENCY slots) are taken back while it
    runs: the call sees ctx.lock_lost (and ctx.jobs[i].lock_lost) turn true at the next
    renewal, as a single job's handler does, and under process isolation its child is
    killed timeout_grace later. Before, a batch's ctx had no lock_lost (it raised), and a
    child's call ran on to its end, beside whatever took its slots."""
    project.add_function("bholder", BATCH_HOLDER.format(isolation=isolation),
                         '{"type": "object", "properties": {"s": {"type": "number"}}}')
    project.write_config(vt=3, concurrency=2, prefetch=0, max_attempts=3, worker="timeout_grace = 1")
    c = project.client
    ids = [c.enqueue("bholder", {"s": 22}).id for _ in range(2)]
    project.spawn_worker("fast")
    first = wait_for(lambda: ticks(project), timeout=60, what="the batch's call to start")[0][0]
    time.sleep(0.5)
    force_lease_loss(project)
    lost_at = time.time()
    final = wait_final(project, ids, timeout=90)
    for i in ids:
        assert final[i]["status"] == "done", final[i]

    def stale() -> list[tuple[float, bool]]:
        return [(t, lost) for p, t, lost in ticks(project) if p == first and t > lost_at]

    wait_for(lambda: any(lost for _, lost in stale()) or time.time() > lost_at + 5, timeout=15,
             what="the stale call to be told, or 5 s past the loss")
    told = [t for t, lost in stale() if lost]
    assert told, f"ctx.lock_lost never turned true in the stale batch: {stale()[-3:]}"
    assert told[0] - lost_at < 5, f"ctx.lock_lost turned true {told[0] - lost_at:.1f} s after the loss"
    if isolation == "process":
        # Run again by a new child: the stale call's results were not kept.
        assert all(final[i]["result"]["pid"] != first for i in ids), final
        # Told at the first renewal after the loss (a second), killed timeout_grace later.
        # (Its own call would last 22 s: watch it past 4 s.)
        wait_for(lambda: not alive(first) or time.time() > told[0] + 4.5, timeout=15,
                 what="the stale child to end, or 4.5 s past its telling")
        time.sleep(0.2)  # a last tick it wrote as it was killed
        last = max(t for t, _ in stale())
        assert last - told[0] < 4, f"the stale child ran on {last - told[0]:.1f} s after it was told"
        assert last - lost_at < 10, f"the stale child ran on {last - lost_at:.1f} s after the loss"
        log = (project.root / "worker-0.log").read_text()
        assert "its child process" in log and "is killed" in log, log[-3000:]


BATCH_CANCELLED = '''
import os, time
from runner import Cancelled
QUEUE = "fast"
ISOLATION = "{isolation}"
TIMEOUT = 25
MAX_ATTEMPTS = 3
BATCH = {{"size": 2, "wait": 1.0}}

def handle_batch(payloads, ctx):
    with open(os.path.join(os.environ["RECORD_DIR"], "began"), "a") as f:
        f.write("began\\n")
    end = time.time() + 20
    while time.time() < end and not ctx.cancelled:
        time.sleep(0.05)
    ctx.raise_if_cancelled()
    return [{{"ran": "on"}} for _ in payloads]
'''


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_cancel_reaches_a_running_batch_call(project: Project, isolation: str) -> None:
    """Both members of a running BATCH call cancelled: the call sees ctx.cancelled and
    stops, and both end cancelled, under either isolation (a child's call never heard of
    a cancel that came once it ran, and ran on to its end, done)."""
    project.add_function("bcancel", BATCH_CANCELLED.format(isolation=isolation))
    project.write_config(vt=3, concurrency=2, prefetch=0, max_attempts=3)
    c = project.client
    ids = [c.enqueue("bcancel", {}).id for _ in range(2)]
    project.spawn_worker("fast")
    wait_for(lambda: project.runs("began"), timeout=60, what="the batch's call to start")
    asked = time.time()
    for i in ids:
        c.cancel(i)
    wait_for(lambda: all(c.get(i).status in ("done", "dead", "cancelled") for i in ids), timeout=60,
             what="both members to end")
    assert time.time() - asked < 15, "the call ran on past its cancel"
    assert [c.get(i).status for i in ids] == ["cancelled", "cancelled"], [c.get(i).as_dict() for i in ids]
