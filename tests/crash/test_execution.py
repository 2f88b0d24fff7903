"""Execution that cannot lose its lease: what a worker guarantees when a handler is slow,
CPU-bound, blocking, leaking memory or crashing its interpreter, each driven through
real worker processes on a real server.

- A lease lost while the handler still runs costs one more run, never a cascade.
- Under ``ISOLATION = "process"`` the handler runs in a child process: a handler that
  holds the GIL longer than the lease runs once; TIMEOUT kills a stuck child; MEMORY_MB
  caps it; a child that dies fails only its own attempt ("executor crashed").
- An attempt is spent when a handler starts: jobs a dead worker had prefetched spend none.
- A handler that finished but whose ack was refused (its lease lapsed on the last attempt)
  is recorded as done, not buried.
"""

from __future__ import annotations

import itertools
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from crashkit import (
    add_crash_fixtures,
    assert_quiet,
    configure,
    kill,
    log_records,
    new_project,
    outcomes,
    rec,
    wait_exit,
    wait_final,
    worker_log,
)

from runner.store.embedded import Server

from conftest import Project, assert_no_job_in_two_structures, wait_for


def marks(project: Project, job_id: str, what: str) -> list[list[str]]:
    return [line.split() for line in project.runs(job_id) if line.startswith(what + " ")]


def force_lease_loss(project: Project, queue: str = "fast") -> None:
    """Take back every claimed job of the queue now, as the scheduler does once a lease
    has lapsed, by running the reclaim with a clock an hour ahead (the test clock)."""
    sc = project.runtime.scripts
    k = project.keys(queue)
    requeued, buried = (int(x) for x in sc.reclaim(k, 100, 10**7, now_ms=int(time.time() * 1000) + 3_600_000))
    assert requeued + buried >= 1, "no lease to take back"


@pytest.fixture
def crash_project(project: Project) -> Project:
    add_crash_fixtures(project)
    return project


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, server: Server) -> Iterator[Project]:
    """One crash project and one worker (one slot, 5 s leases) for the module's tests that
    only enqueue jobs of their own, wait for their outcomes and find the queue quiet after:
    a worker per test (its start and imports) was much of such a test's time."""
    project = new_project(tmp_path_factory.mktemp("served"), server)
    configure(project, vt=5, concurrency=1)
    project.spawn_worker("fast")
    try:
        yield project
    finally:
        project.close()


def test_a_lease_lost_on_a_healthy_worker_costs_one_more_run(crash_project: Project) -> None:
    """The lease of a running job is taken back while its handler still runs and the same
    worker claims the job again: the first run's ack is refused, the second run is renewed,
    acknowledged and done. Two runs in all, never a cascade into "worker lost"."""
    project = crash_project
    configure(project, vt=1, concurrency=2, prefetch=2)
    job = project.client.enqueue("held", {"sleep": 2.0}).id
    project.spawn_worker("fast")
    wait_for(lambda: marks(project, job, "start"), timeout=15, what="the first run to start")
    force_lease_loss(project)
    final = wait_final(project, [job], timeout=30)[job]
    assert final["status"] == "done", (final["last_error"], final["history"])
    assert final["attempt"] == 2
    assert len(marks(project, job, "start")) == 2, project.runs(job)
    assert outcomes(final) == ["worker lost", "done"]
    assert_quiet(project)


def test_a_gil_holding_handler_runs_once_under_process_isolation(crash_project: Project) -> None:
    """A handler that holds the GIL for seconds in one C call, on a queue with a 1 s lease
    and two workers: its worker never runs handler code, so the lease is renewed on time
    and the job runs exactly once, in one attempt."""
    project = crash_project
    configure(project, vt=1, concurrency=2)
    job = project.client.enqueue("gil", {"n": 26}).id
    project.spawn_worker("fast")
    project.spawn_worker("fast")
    final = wait_final(project, [job], timeout=60)[job]
    assert final["status"] == "done", (final["last_error"], final["history"])
    assert final["attempt"] == 1 and outcomes(final) == ["done"]
    assert len(marks(project, job, "start")) == 1, project.runs(job)
    assert_quiet(project)


def test_thread_mode_says_when_the_gil_held_up_renewal(crash_project: Project) -> None:
    """The same handler under thread isolation: the renewer comes back late, and says how
    late and that ISOLATION = "process" is the fix."""
    project = crash_project
    fn = project.root / "functions" / "gil.py"
    fn.write_text(fn.read_text().replace('ISOLATION = "process"', 'ISOLATION = "thread"'))
    configure(project, vt=1, concurrency=2)
    project.client.enqueue("gil", {"n": 26})
    w = project.spawn_worker("fast")

    def warned() -> dict[str, Any] | None:
        return next((r for r in log_records(worker_log(project, w))
                     if "late" in str(r.get("msg")) and 'ISOLATION = "process"' in str(r.get("msg"))), None)

    wait_for(warned, timeout=30, what="the renewer's late warning")


@pytest.mark.parametrize("mode", ["sleep", "recv", "swallow"])
def test_timeout_kills_a_stuck_child_and_the_next_job_runs(served: Project, mode: str) -> None:
    """TIMEOUT = 1 under process isolation: a handler asleep for an hour, one blocked in
    recv() and one that catches every Exception are each stopped within TIMEOUT plus the
    kill grace, fail their attempt as a timeout, and the next job runs."""
    project = served
    c = project.client
    # The slot's child warm first: a job claimed while its child still starts is on
    # record as started from the claim, and a child's start took 2 s on a loaded machine.
    # A process-isolated job (gil, instant at n=1) finishes only once the child is up.
    warm = c.enqueue("gil", {"n": 1}).id
    wait_final(project, [warm], timeout=60)
    stuck = c.enqueue("stuck", {"mode": mode}).id
    after = c.enqueue("one", {}).id
    final = wait_final(project, [stuck, after], timeout=30)
    s = final[stuck]
    assert s["status"] == "dead" and s["reason"] == "max attempts reached", s
    assert s["last_error"]["type"] == "JobTimeout", s["last_error"]
    took = s["finished_at"] - s["started_at"]
    # (0.99: the two times are the server's clock in ms, read by two scripts)
    assert 0.99 <= took < 3.5, f"stopped after {took:.3f} s"
    assert final[after]["status"] == "done"
    assert_quiet(project)


def test_timeout_in_thread_mode_cannot_be_swallowed(crash_project: Project) -> None:
    """Under thread isolation the timeout is raised in the handler's thread as an error that
    `except Exception` does not catch: the swallowing handler still fails as a timeout."""
    project = crash_project
    fn = project.root / "functions" / "stuck.py"
    fn.write_text(fn.read_text().replace('ISOLATION = "process"', 'ISOLATION = "thread"'))
    configure(project, vt=5, concurrency=1)
    job = project.client.enqueue("stuck", {"mode": "swallow"}).id
    project.spawn_worker("fast")
    final = wait_final(project, [job], timeout=20)[job]
    assert final["status"] == "dead" and final["last_error"]["type"] == "JobTimeout", final
    assert final["finished_at"] - final["started_at"] < 3.0


def test_thread_mode_abandons_a_handler_stuck_in_a_c_call(crash_project: Project) -> None:
    """Under thread isolation nothing can interrupt a long time.sleep: TIMEOUT plus the
    grace later the run is abandoned and its slot replaced, so the next job runs; the
    abandoned run keeps its lease until the call returns (its retry must not start beside
    it), then its attempt fails as a timeout, and the worker logs and counts it."""
    project = crash_project
    fn = project.root / "functions" / "stuck.py"
    fn.write_text(fn.read_text().replace('ISOLATION = "process"', 'ISOLATION = "thread"'))
    configure(project, vt=1, concurrency=1)
    c = project.client
    stuck = c.enqueue("stuck", {"mode": "nap", "s": 6}).id
    after = c.enqueue("one", {}).id
    w = project.spawn_worker("fast")
    assert wait_final(project, [after], timeout=30)[after]["status"] == "done"
    assert rec(project, stuck)["status"] == "processing"  # still in its call: still held
    final = wait_final(project, [stuck], timeout=30)
    assert final[stuck]["status"] == "dead" and final[stuck]["last_error"]["type"] == "JobTimeout"
    assert "abandoned" in final[stuck]["last_error"]["message"]
    # The attempt is on record as run from its start to its real end, like any other.
    entry = final[stuck]["history"][-1]
    assert entry["started_ms"] > 0 and entry["at_ms"] - entry["started_ms"] >= 5000, entry
    assert any("abandoned" in str(r.get("msg")) for r in log_records(worker_log(project, w)))
    assert c.stats()["fast"]["counters"].get("abandoned|stuck") == 1
    from prometheus_client import CollectorRegistry, generate_latest

    from runner.web.exposition import RunnerCollector

    registry = CollectorRegistry()
    registry.register(RunnerCollector(project.runtime))
    exposed = [ln for ln in generate_latest(registry).decode().splitlines()
               if ln.startswith("runner_jobs_abandoned_total{") and '"stuck"' in ln]
    assert len(exposed) == 1 and exposed[0].endswith(" 1.0"), exposed
    assert w.poll() is None


def test_memory_limit_fails_the_attempt_and_other_jobs_run(served: Project) -> None:
    """MEMORY_MB = 128 and a handler that allocates 1 GiB: the attempt fails with "memory
    limit", the worker lives on and the next job runs."""
    project = served
    c = project.client
    hog = c.enqueue("hog", {}).id
    after = c.enqueue("one", {}).id
    (w,) = project.procs
    final = wait_final(project, [hog, after], timeout=30)
    assert final[hog]["status"] == "dead"
    assert "memory limit" in final[hog]["last_error"]["message"], final[hog]["last_error"]
    assert final[after]["status"] == "done"
    assert w.poll() is None
    # Within the cap it runs.
    small = c.enqueue("hog", {"mb": 16}).id
    assert wait_final(project, [small], timeout=20)[small]["status"] == "done"


@pytest.mark.parametrize(("mode", "cause"), [("segv", "SIGSEGV"), ("exit", "exited with code 3")])
def test_a_crashing_child_fails_only_its_attempt(crash_project: Project, mode: str, cause: str) -> None:
    """A segfault and an os._exit(3) in the handler: each attempt fails with "executor
    crashed" naming the signal or exit code, the job retries by policy (2 attempts) and
    ends dead; the worker process lives and runs the other jobs meanwhile."""
    project = crash_project
    configure(project, vt=5, concurrency=2)
    c = project.client
    crash = c.enqueue("crasher", {"mode": mode}).id
    others = [c.enqueue("one", {}).id for _ in range(5)]
    w = project.spawn_worker("fast")
    final = wait_final(project, [crash, *others], timeout=30)
    f = final[crash]
    assert f["status"] == "dead" and f["attempt"] == 2, f
    message = f["last_error"]["message"]
    assert message.startswith("executor crashed: the child process running the handler ") and cause in message, f
    assert all(final[o]["status"] == "done" for o in others)
    assert w.poll() is None
    assert_quiet(project)


def test_prefetched_jobs_of_a_dead_worker_spend_no_attempt(crash_project: Project) -> None:
    """A poison job (it kills its worker) claimed together with four prefetched jobs, every
    one allowed a single attempt: the poison ends dead as "worker lost", and the four, which
    never started, run on the next worker and end done with attempt 1."""
    project = crash_project
    configure(project, vt=1, concurrency=1, prefetch=4, batch=8)
    c = project.client
    poison = c.enqueue("poison1", {}).id
    others = [c.enqueue("one", {}).id for _ in range(4)]
    first = project.spawn_worker("fast")
    assert wait_exit(first, 20) == -signal.SIGKILL
    project.spawn_worker("fast")
    final = wait_final(project, [poison, *others], timeout=30)
    assert final[poison]["status"] == "dead" and final[poison]["reason"] == "worker lost"
    for o in others:
        assert final[o]["status"] == "done" and final[o]["attempt"] == 1, final[o]
        assert project.runs(o) == [f"1 {project.procs[1].pid}"]
    assert_quiet(project)


GATED = '''
import os, time
QUEUE = "fast"
MAX_ATTEMPTS = 1
TIMEOUT = 10

def handle(payload, ctx):
    with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id), "a") as f:
        f.write(f"{ctx.attempt} {os.getpid()}\\n")
    while not os.path.exists(os.environ["GATE"]):
        time.sleep(0.02)
    return {}
'''


def test_prefetched_thread_jobs_that_never_started_spend_nothing_however_often(crash_project: Project) -> None:
    """Thread isolation, one executor and a prefetch of 8, every job allowed one attempt,
    each handler blocked on a gate: a worker SIGKILLed three times, each time once it
    claimed every job left anew (one of them started, the rest waiting in its inbox).
    The jobs whose handler never ran are charged nothing (the second loss of a job
    claimed ahead used to count, and it went dead as "worker lost" unrun); with the gate
    open the next worker runs each of them once, at attempt 1. The ones that did start
    spent their attempt (dead, "worker lost")."""
    project = crash_project
    project.add_function("gated", GATED)
    configure(project, vt=1, concurrency=1, prefetch=8, max_attempts=1)
    gate = project.root / "gate"
    env = {"GATE": str(gate)}
    jobs = [project.client.enqueue("gated", {"i": i}).id for i in range(9)]
    before: dict[str, str] = {}
    for _ in range(3):
        w = project.spawn_worker("fast", env=env)
        ran = {j for j in jobs if project.runs(j)}

        def claimed_anew(old: dict[str, str] = before, ran: set[str] = ran) -> bool:
            dead = set(project.runtime.redis.zrange(project.keys().dead, 0, -1))
            live = [j for j in jobs if j not in ran and j not in dead]
            if not live:
                return True  # (every job left went dead: the assertions below say which)
            entries = project.runtime.redis.hmget(project.keys().claims, live)
            now = {i: e.split()[0] for i, e in zip(live, entries, strict=True) if e}
            return (len(now) == len(live) and all(now[i] != old.get(i) for i in live)
                    and any(project.runs(j) for j in live))  # (one of them started: the gate holds it)

        wait_for(claimed_anew, timeout=30, what="every job left claimed anew, one started")
        entries = project.runtime.redis.hmget(project.keys().claims, jobs)
        before = {i: e.split()[0] for i, e in zip(jobs, entries, strict=True) if e}
        kill(w)
    unrun = [j for j in jobs if not project.runs(j)]
    charged = [outcomes(r) for j in unrun if (r := rec(project, j))["status"] == "dead"]
    assert not charged, f"{len(charged)} of {len(unrun)} jobs never started went dead: {charged[0]}"
    assert len(unrun) == len(jobs) - 3, [project.runs(j) for j in jobs]  # (one started a round)
    gate.write_text("open")
    project.spawn_worker("fast", env=env)
    final = wait_final(project, jobs, timeout=60)
    for j in jobs:
        if j in unrun:
            assert final[j]["status"] == "done" and final[j]["attempt"] == 1, (final[j], outcomes(final[j]))
            assert len(project.runs(j)) == 1
        else:
            assert final[j]["status"] == "dead" and final[j]["reason"] == "worker lost", final[j]


def test_a_finished_last_attempt_whose_ack_was_refused_is_done(crash_project: Project) -> None:
    """The only attempt's lease is taken back while its handler runs (so it is buried as
    "worker lost"), then the handler finishes: the run is known to have finished, so the
    job is done, its result kept, and its idempotency key completed."""
    project = crash_project
    configure(project, vt=1, concurrency=1)
    c = project.client
    job = c.enqueue("lastgasp", {"k": "g1", "sleep": 1.5}).id
    project.spawn_worker("fast")
    wait_for(lambda: project.runs(job), timeout=15, what="the handler to start")
    force_lease_loss(project)
    wait_for(lambda: len(project.runs(job)) == 2, timeout=15, what="the handler to finish")
    final = wait_for(lambda: (r := rec(project, job))["status"] == "done" and r, timeout=15,
                     what="the late success to be recorded")
    assert final["result"] == {"k": "g1"}
    again = c.enqueue("lastgasp", {"k": "g1", "sleep": 1.5})
    assert again.duplicate and again.id == job and again.status == "done"
    assert_no_job_in_two_structures(project)


LATE_LINES = '''
import time

QUEUE = "fast"
MAX_ATTEMPTS = 1
TIMEOUT = 8


def handle(payload, ctx):
    ctx.logger.info("before")
    ctx.stream("c0")
    time.sleep(payload["sleep"])
    ctx.logger.info("after")
    ctx.stream("c1")
    return "late"
'''


def test_a_late_success_keeps_the_lines_its_run_wrote_after_its_lease_was_taken_back(
        crash_project: Project) -> None:
    """The only attempt's lease is taken back while its handler runs, and nobody runs the
    job since: its run's lines and chunks written after that land with its late success,
    as the run that ended the job. (Each write was refused once the claim was gone, and
    so the last lines of the run that ended the job were lost.)"""
    project = crash_project
    configure(project, vt=1, concurrency=1)
    project.add_function("late_lines", LATE_LINES)
    c = project.client
    job = c.enqueue("late_lines", {"sleep": 2.5}).id
    project.spawn_worker("fast")
    wait_for(lambda: [ln["msg"] for ln in c.logs(job)["lines"]] == ["before"], timeout=15,
             what="the first line")
    force_lease_loss(project)
    final = wait_for(lambda: (r := rec(project, job))["status"] == "done" and r, timeout=15,
                     what="the late success to be recorded")
    assert final["result"] == "late"
    from runner.client import watching
    assert [ln["msg"] for ln in c.logs(job)["lines"]] == ["before", "after"]
    assert [x["data"] for x in watching.stream_chunks(c, job)["chunks"]] == ["c0", "c1"]


def test_shutdown_never_hands_back_a_job_whose_handler_still_runs(crash_project: Project) -> None:
    """SIGTERM with a grace period shorter than the running handler (thread isolation): the
    job is not given to another worker while the first one's handler is still running; it
    runs again only after that worker has exited, and no attempt is spent on the shutdown."""
    project = crash_project
    configure(project, vt=2, concurrency=1, grace=0.5)
    c = project.client
    # The handler runs until the test lets it go (up to 7 s, under its TIMEOUT of 8), well
    # past the SIGTERM it is here to outlast, however long a second worker's start takes on
    # a loaded host (a fixed 3 s run had ended before it). The run after the shutdown need
    # not sleep: it only has to start after the first ended.
    release = project.root / "release"
    job = c.enqueue("held", {"sleep": 7.0, "again_sleep": 0.0, "beat": True, "until": str(release)}).id
    first = project.spawn_worker("fast")
    wait_for(lambda: marks(project, job, "start"), timeout=15, what="the handler to start")
    second = project.spawn_worker("fast")
    wait_for(lambda: any("serving" in str(x.get("msg")) for x in log_records(worker_log(project, second))),
             timeout=15, what="the second worker to serve")
    assert not marks(project, job, "end"), "the handler ended before the SIGTERM: the host is too slow for this test"
    first.send_signal(signal.SIGTERM)
    time.sleep(1.5)  # three times the grace period: the handler outlasts it
    assert not marks(project, job, "end")
    release.touch()
    assert wait_exit(first, 15) == 0
    exited = time.time()  # the handler's thread ran until here at the latest
    final = wait_final(project, [job], timeout=30)[job]
    assert final["status"] == "done"
    starts = marks(project, job, "start")
    assert len(starts) == 2
    assert float(starts[1][3]) > exited, "the job was handed on before its first handler stopped"
    assert outcomes(final) == ["interrupted", "done"] and final["attempt"] == 1, "the shutdown spent an attempt"


def test_a_claim_that_lands_during_shutdown_is_handed_back(crash_project: Project) -> None:
    """A claim still in flight when SIGTERM arrives (the server paused writes for 7 s, longer
    than the worker waits for its fetcher) lands after the executors stopped: its jobs are
    handed back at once, unspent, and the next worker runs each in its first attempt."""
    import threading

    project = crash_project
    configure(project, vt=2, concurrency=2)
    w = project.spawn_worker("fast")
    wait_for(lambda: any("serving" in str(x.get("msg")) for x in log_records(worker_log(project, w))),
             timeout=15, what="the worker to serve")
    project.runtime.redis.execute_command("CLIENT", "PAUSE", "7000", "WRITE")
    # The enqueue waits behind the pause too, so it goes from a thread; it was sent before
    # the fetcher's next claim, so the claim that follows the pause takes its jobs.
    ids: list[str] = []
    t = threading.Thread(target=lambda: ids.extend(project.client.enqueue("one", {}).id for _ in range(3)))
    t.start()
    time.sleep(1.5)  # the fetcher's idle wait (1 s) ends and its claim waits on the pause
    w.send_signal(signal.SIGTERM)
    assert wait_exit(w, 30) == 0
    t.join(timeout=30)
    project.spawn_worker("fast")
    final = wait_final(project, ids, timeout=30)
    for job_id in ids:
        assert final[job_id]["status"] == "done" and final[job_id]["attempt"] == 1, final[job_id]
    assert_quiet(project)


def test_worker_keeps_serving_after_each_isolation_failure(crash_project: Project) -> None:
    """One worker, one of each failure in a row (timeout, memory, segfault, exit): every
    job ends where it should and the worker is the same process at the end."""
    project = crash_project
    configure(project, vt=5, concurrency=2)
    c = project.client
    ids = [c.enqueue("stuck", {"mode": "sleep"}).id, c.enqueue("hog", {}).id,
           c.enqueue("crasher", {"mode": "segv"}).id, c.enqueue("crasher", {"mode": "exit"}).id]
    ok = [c.enqueue("one", {}).id for _ in range(4)]
    w = project.spawn_worker("fast")
    final = wait_final(project, ids + ok, timeout=60)
    assert [final[i]["status"] for i in ids] == ["dead"] * 4
    assert all(final[i]["status"] == "done" for i in ok)
    assert w.poll() is None
    kill(w)


GUARDED = '''"""Holds resource g while it runs and records whether it lost it."""
import os
import time

QUEUE = "fast"
RESOURCE_KEY = "g:{g}"
TIMEOUT = 8


def handle(payload, ctx):
    end = time.time() + payload["hold"]
    while time.time() < end and not ctx.lock_lost:
        time.sleep(0.02)
    with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id), "a") as f:
        f.write(f"lock_lost={ctx.lock_lost}\\n")
'''

BLOCKER = '''"""An async handler that blocks its event loop (time.sleep, not await), or one that awaits."""
import asyncio
import os
import time

QUEUE = "fast"
TIMEOUT = 8


async def handle(payload, ctx):
    if payload.get("block"):
        time.sleep(payload["block"])
    else:
        await asyncio.sleep(0.01)
    with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id), "a") as f:
        f.write(f"{time.time()}\\n")
'''


def _add(project: Project, name: str, source: str, props: str) -> None:
    (project.root / "functions" / f"{name}.py").write_text(source)
    (project.root / "schemas" / name).mkdir(exist_ok=True)
    (project.root / "schemas" / name / "v1.json").write_text(
        '{"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object", "properties": {' + props + "}}")
    project._runtime = None


def test_a_handler_is_told_when_its_resource_went_to_another_job(crash_project: Project) -> None:
    """While a handler holds resource g, its slot is taken by someone else (as after a stall
    longer than the lease): at the next renewal ctx.lock_lost turns true and the handler
    can stop; the worker logs it."""
    project = crash_project
    _add(project, "guarded", GUARDED, '"g": {"type": "string"}, "hold": {"type": "number"}')
    configure(project, vt=1, concurrency=1)
    job = project.client.enqueue("guarded", {"g": "x", "hold": 6}).id
    w = project.spawn_worker("fast")
    r = project.runtime.redis
    slot = project.keys().limit("r:g:x")
    wait_for(lambda: r.zcard(slot) == 1 and not r.zscore(slot, "=" + job), timeout=15, what="the slot to be held")
    # Another claim takes the slot: the holder's entry gives way to another token.
    r.delete(slot)
    r.zadd(slot, {"someone-else": int(time.time() * 1000) + 60_000})
    done = wait_final(project, [job], timeout=20)[job]
    assert done["status"] == "done"
    assert project.runs(job) == ["lock_lost=True"]
    assert any("resource slot went to another job" in str(x.get("msg")) for x in log_records(worker_log(project, w)))


def test_an_async_handler_that_blocks_its_loop_stalls_no_other(crash_project: Project) -> None:
    """Async handlers run on an event loop per executor slot: one that blocks its loop for
    3 s (time.sleep inside async def) holds only its own slot; quick async jobs started
    after it finish long before it does."""
    project = crash_project
    _add(project, "blocker", BLOCKER, '"block": {"type": "number"}')
    configure(project, vt=5, concurrency=4)
    c = project.client
    slow = c.enqueue("blocker", {"block": 3}).id
    project.spawn_worker("fast")
    wait_for(lambda: c.get(slow).status == "processing", timeout=15, what="the blocking job to start")
    quick = [c.enqueue("blocker", {}).id for _ in range(6)]
    final = wait_final(project, [slow, *quick], timeout=30)
    slow_end = float(project.runs(slow)[0])
    assert all(final[q]["status"] == "done" for q in quick)
    assert max(float(project.runs(q)[0]) for q in quick) < slow_end - 1.0


WHOAMI = '''"""Answers with the pid of the process that ran it."""
import os

QUEUE = "fast"
ISOLATION = "process"


def handle(payload, ctx):
    return {"pid": os.getpid()}
'''


@pytest.mark.parametrize("limit", ["max_jobs_per_child = 3", "max_rss_mb = 1"])
def test_children_are_recycled_after_their_job_count_or_above_their_memory(
        crash_project: Project, limit: str) -> None:
    """Jobs one after the other in one slot: with max_jobs_per_child = 3 each child runs
    three and the next job gets a new one; with max_rss_mb = 1 (any interpreter is over
    it) every job gets a new child. The worker goes on serving throughout."""
    project = crash_project
    (project.root / "functions" / "whoami.py").write_text(WHOAMI)
    (project.root / "schemas" / "whoami").mkdir(exist_ok=True)
    (project.root / "schemas" / "whoami" / "v1.json").write_text('{"type": "object"}')
    project.write_config(vt=5, concurrency=1, prefetch=0, fast=f'isolation = "process"\n{limit}')
    ids = [project.client.enqueue("whoami", {"i": i}).id for i in range(7)]
    project.spawn_worker("fast")
    final = wait_final(project, ids, timeout=90)
    assert all(final[i]["status"] == "done" for i in ids), final
    pids = [project.client.get(i).as_dict()["result"]["pid"] for i in ids]
    runs = [len(list(g)) for _, g in itertools.groupby(pids)]
    if "max_jobs_per_child" in limit:
        assert runs == [3, 3, 1], pids
    else:
        assert runs == [1] * 7, pids
