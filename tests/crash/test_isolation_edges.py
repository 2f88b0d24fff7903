"""Process isolation beside thread isolation, and a hard TIMEOUT, with real children: an
abandoned thread's exit must not kill the child its slot runs now (Linux's parent-death
signal follows the thread that started a child, not the process), and a TIMEOUT kill
stops the handler's own subprocesses with it."""

from __future__ import annotations

import itertools
import os
import time

from crashkit import wait_final

from conftest import Project, wait_for


def add_function(project: Project, name: str, source: str) -> None:
    project.add_function(name, source)


SLEEPER = '''
import time
QUEUE = "fast"
TIMEOUT = 1
MAX_ATTEMPTS = 1

def handle(payload, ctx):
    time.sleep(payload["s"])  # a C call: abandoned at TIMEOUT plus the grace
'''

PWORK = '''
import os, time
QUEUE = "fast"
ISOLATION = "process"
TIMEOUT = 20
MAX_ATTEMPTS = 1

def handle(payload, ctx):
    time.sleep(payload.get("s", 0))
    return {"pid": os.getpid()}
'''


def test_an_abandoned_threads_exit_does_not_kill_the_slots_child(project: Project) -> None:
    """One slot, a child per job (so the slot's thread starts each child): a thread
    handler stuck in a C call is abandoned and a new thread takes the slot; a process job
    then runs in a child the old thread started. When the stuck call returns and the old
    thread exits, the process job still finishes."""
    add_function(project, "sleeper", SLEEPER)
    add_function(project, "pwork", PWORK)
    project.write_config(vt=5, concurrency=1, prefetch=0, max_attempts=1, fast="max_jobs_per_child = 1")
    c = project.client
    first = c.enqueue("pwork", {}).id
    project.spawn_worker("fast")
    assert wait_final(project, [first], timeout=60)[first]["status"] == "done"
    stuck = c.enqueue("sleeper", {"s": 5}).id
    work = c.enqueue("pwork", {"s": 6}).id  # runs from about 2 s to 8 s; the old thread ends at 5 s
    final = wait_final(project, [stuck, work], timeout=60)
    assert final[stuck]["status"] == "dead"
    assert final[work]["status"] == "done", final[work]["last_error"]


SHELLOUT = '''
import os
QUEUE = "fast"
ISOLATION = "process"
TIMEOUT = 1
MAX_ATTEMPTS = 1

def handle(payload, ctx):
    record = os.path.join(os.environ["RECORD_DIR"], ctx.job_id)
    os.system(f"echo $$ >> {record}; exec sleep 60")  # an external tool, the ordinary way
'''


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def assert_stops(pid: int, within_s: float, when: str) -> None:
    """The handler's subprocess ``pid`` is gone within ``within_s`` (killed if not, after)."""
    deadline = time.monotonic() + within_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert not _alive(pid), f"the handler's subprocess {pid} still runs {when}"
    finally:
        if _alive(pid):
            os.kill(pid, 9)


def test_a_timeout_kill_stops_the_handlers_subprocess_too(project: Project) -> None:
    """Past TIMEOUT the child is killed with every process it started (its process
    group), so a tool it ran does not run on orphaned, one more per retry."""
    add_function(project, "shellout", SHELLOUT)
    project.write_config(vt=5, concurrency=1, prefetch=0, max_attempts=1)
    job = project.client.enqueue("shellout", {}).id
    project.spawn_worker("fast")
    final = wait_final(project, [job], timeout=60)[job]
    assert final["status"] == "dead" and final["last_error"]["type"] == "JobTimeout", final["last_error"]
    assert_stops(int(project.runs(job)[0]), 3, "after its job timed out")


def test_a_killed_worker_takes_its_childs_subprocesses_with_it(project: Project) -> None:
    """The worker is SIGKILLed (the OOM killer) while a process-isolated handler waits on
    a tool it started: the child dies with its parent (PR_SET_PDEATHSIG), and the tool
    must stop too, not run on orphaned while the job is reclaimed and run again."""
    add_function(project, "shellout", SHELLOUT.replace("TIMEOUT = 1", "TIMEOUT = 20"))
    project.write_config(vt=30, concurrency=1, prefetch=0, max_attempts=1)
    job = project.client.enqueue("shellout", {}).id
    w = project.spawn_worker("fast")
    wait_for(lambda: project.runs(job), timeout=30, what="the handler's tool to start")
    pid = int(project.runs(job)[0])
    w.kill()
    w.wait(timeout=10)
    assert_stops(pid, 5, "after its worker was killed")


SWALLOW = '''
import asyncio, os, time
QUEUE = "fast"
TIMEOUT = 1
MAX_ATTEMPTS = 1

async def handle(payload, ctx):
    path = os.path.join(os.environ["RECORD_DIR"], ctx.job_id)
    while True:
        try:
            with open(path, "a") as f:
                f.write(f"{time.time()}\\n")
            await asyncio.sleep(0.05)
        except BaseException:  # a retry loop written too broadly: swallows its own cancel
            pass
'''

NAP = '''
import asyncio
QUEUE = "fast"
TIMEOUT = 10
MAX_ATTEMPTS = 1

async def handle(payload, ctx):
    await asyncio.sleep(payload["s"])
    return {"ok": True}
'''


def test_a_timed_out_async_handler_does_not_run_on_in_later_jobs(project: Project) -> None:
    """An async handler past its TIMEOUT that swallows its cancellation fails as a timeout
    and never runs again: the slot leaves that event loop behind (a task still pending on
    it used to wake up inside every later async job of the slot, side effects and all)."""
    add_function(project, "swallow", SWALLOW)
    add_function(project, "nap", NAP)
    project.write_config(vt=5, concurrency=1, prefetch=0, max_attempts=1)
    c = project.client
    bad = c.enqueue("swallow", {}).id
    project.spawn_worker("fast")
    final = wait_final(project, [bad], timeout=30)[bad]
    assert final["status"] == "dead" and final["last_error"]["type"] == "JobTimeout", final["last_error"]
    settled = final["finished_at"]
    naps = [c.enqueue("nap", {"s": 1}).id for _ in range(3)]
    assert all(f["status"] == "done" for f in wait_final(project, naps, timeout=30).values())
    late = [float(x) for x in project.runs(bad) if float(x) > settled + 0.2]
    assert not late, f"the timed-out handler ran on {len(late)} time(s) after its job was settled"


HOGGER = '''
import os, time
QUEUE = "fast"
TIMEOUT = 1
MAX_ATTEMPTS = 2
RESOURCE_KEY = "printer:{p}"

def handle(payload, ctx):
    path = os.path.join(os.environ["RECORD_DIR"], "printer")
    with open(path, "a") as f:
        f.write(f"start {ctx.job_id} {time.time()}\\n")
    time.sleep(payload["s"])  # one C call: TIMEOUT cannot interrupt it
    with open(path, "a") as f:
        f.write(f"end {ctx.job_id} {time.time()} {ctx.lock_lost}\\n")
'''


def test_an_abandoned_thread_keeps_its_resource_until_it_ends(project: Project) -> None:
    """A thread handler stuck in a C call past TIMEOUT plus the grace is given up (its slot
    goes to a new thread), but the run holds its RESOURCE_KEY, and its lease, until the
    call really returns: neither its own retry nor another job of the key starts beside
    it (they did, 5 of 6 starts, and ctx.lock_lost never said so)."""
    project.add_function("hogger", HOGGER, '{"type": "object", "properties": {"p": {"type": "integer"}}}')
    project.write_config(vt=2, concurrency=2, prefetch=0, max_attempts=2, worker="timeout_grace = 0.3")
    c = project.client
    jobs = [c.enqueue("hogger", {"s": 2, "p": 1}).id, c.enqueue("hogger", {"s": 0.1, "p": 1}).id]
    project.spawn_worker("fast")
    final = wait_final(project, jobs, timeout=60)
    assert final[jobs[0]]["status"] == "dead" and final[jobs[0]]["last_error"]["type"] == "JobTimeout"
    assert final[jobs[1]]["status"] == "done"
    # Each run holds the printer from its start for its sleep (the timeout raised as the
    # sleep returns ends it there).
    took = {jobs[0]: 2.0, jobs[1]: 0.1}
    runs = sorted((float(t), float(t) + took[j]) for _, j, t in (x.split() for x in project.runs("printer")
                                                                          if x.startswith("start")))
    assert len(runs) == 3
    overlaps = [(a, b) for a, b in itertools.pairwise(runs) if b[0] < a[1]]
    assert not overlaps, f"runs of one resource overlapped: {project.runs('printer')}"


WARMS_UP = '''
import os, threading, time
QUEUE = "fast"
ISOLATION = "process"
TIMEOUT = 20
MAX_ATTEMPTS = 1
DONE = os.path.join(os.environ.get("RECORD_DIR", "."), "warmed")

def _warm_up():  # a library's thread started at import (a warm-up, a credential prefetch)
    while not os.path.exists(DONE):
        time.sleep(0.01)

import __main__
if getattr(getattr(__main__, "__spec__", None), "name", "") == "runner.worker.child":
    threading.Thread(target=_warm_up, name="warm-up", daemon=True).start()

def handle(payload, ctx):
    if payload.get("leave"):
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()  # left running
        open(DONE, "w").close()  # the warm-up ends meanwhile: the count of threads is as before
        while any(t.name == "warm-up" for t in threading.enumerate()):
            time.sleep(0.01)
    return {"pid": os.getpid()}
'''


def test_a_thread_left_running_retires_its_child_though_an_import_thread_ended_meanwhile(
        project: Project) -> None:
    """A handler that leaves a thread running while a thread started at import ends: its
    child is not used again (the threads were counted, so one ended and one left cancelled
    out, and the left thread ran on beside the next job in the same child)."""
    add_function(project, "warms", WARMS_UP)
    project.write_config(vt=5, concurrency=1, prefetch=0, max_attempts=1)
    project.spawn_worker("fast")
    a = project.client.enqueue("warms", {"leave": True}).id
    first = wait_final(project, [a], timeout=60)[a]
    b = project.client.enqueue("warms", {}).id
    second = wait_final(project, [b], timeout=60)[b]
    assert first["status"] == second["status"] == "done", (first["last_error"], second["last_error"])
    assert first["result"]["pid"] != second["result"]["pid"]
