"""Light load: most production queues trickle, each job arriving alone, and a worker then
pays per job for every round trip and every wake-up of its threads. These pin what one
job costs the worker at light load, counted in script calls (not timed)."""

from __future__ import annotations

import math
import os
import queue as stdqueue
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runner.errors import JobTimeout
from runner.store.scripts import Scripts
from runner.worker import renewer as renewer_mod
from runner.worker import scheduler as scheduler_mod
from runner.worker.execute import Done
from runner.worker.fetcher import Fetcher
from runner.worker.ledger import Ledger, Settlement
from runner.worker.renewer import Renewer
from runner.worker.settler import Settler
from runner.worker.worker import Worker

from conftest import Project, wait_for

JOBS = 25


def test_a_job_arriving_alone_costs_one_claim(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim short of what it asked for took every job ready: the fetcher then waits for
    a wake-up instead of claiming again at once (that claim found nothing, and cost a
    script call per job at light load). Claims per job: one, plus one per second of the
    fetcher's wait that ends without a wake-up."""
    claims: list[int] = []

    def counted(call: Any) -> Any:
        def counting(self: Scripts, *args: Any, **kw: Any) -> Any:
            claims.append(1)
            return call(self, *args, **kw)
        return counting

    for name in ("claim", "claim_woken"):
        monkeypatch.setattr(Scripts, name, counted(getattr(Scripts, name)))
    c = project.client
    w = Worker(project.runtime, ["fast"])
    w.start()
    try:
        first = c.enqueue("noop", {"warm": True}).id
        wait_for(lambda: c.get(first).status == "done", timeout=20)
        before, t0 = len(claims), time.monotonic()
        for i in range(JOBS):
            job_id = c.enqueue("noop", {"i": i}).id
            wait_for(lambda: c.get(job_id).status == "done", timeout=20)  # noqa: B023 - used at once
        spent, quiet_s = len(claims) - before, time.monotonic() - t0
    finally:
        w.stop(grace_s=5)
    # (Twice as many before: every claim that took a job was followed by one that found none.)
    assert spent <= JOBS + quiet_s + 2, (spent, round(quiet_s, 1))



def test_a_timeout_sooner_than_the_renewers_next_wake_up_lands_on_time(project: Project) -> None:
    """The lease renewer sleeps until its next renewal (a second here) rather than ticking:
    a thread handler that starts with a TIMEOUT sooner than that wakes it (expect), so the
    TIMEOUT is raised near its time, not at the renewal."""
    rt = project.runtime
    q = rt.config.queues["fast"]
    project.client.enqueue("noop", {})
    ledger = Ledger(q.concurrency, 4, 1)
    fetcher = Fetcher(rt, q, ledger, stdqueue.SimpleQueue(), stdqueue.SimpleQueue(), "w-timer")
    assert fetcher.claim(1, 1) == (1, 0)
    (run,) = ledger.renewable()
    renewer = Renewer(rt, q, ledger)  # (vt 2 s in tests: it renews every 0.67 s)
    raised: list[float] = []

    def handler() -> None:
        try:
            while True:
                time.sleep(0.005)
        except JobTimeout:
            raised.append(time.monotonic())

    renewer.start()
    try:
        time.sleep(0.1)  # asleep until its first renewal, about 0.57 s from now
        t = threading.Thread(target=handler)
        t.start()
        deadline = time.monotonic() + 0.1
        with ledger.lock:
            run.thread_id, run.deadline = t.ident, deadline
        renewer.expect(deadline)
        t.join(timeout=10)
    finally:
        renewer.stop()
    assert raised, "the TIMEOUT was never raised"
    # (Without the wake-up it landed at the renewal, about 0.47 s late.)
    assert raised[0] - deadline < 0.3, f"raised {raised[0] - deadline:.2f} s after the deadline"


STUCK = '''"""Loops past its TIMEOUT in short sleeps (each ends at a bytecode, where the timeout lands)."""
import time

QUEUE = "fast"
TIMEOUT = 0.2
MAX_ATTEMPTS = 1


def handle(payload, ctx):
    end = time.monotonic() + 10
    while time.monotonic() < end:
        time.sleep(0.01)
'''


def test_a_timeout_lands_on_time_on_a_worker_that_was_idle(project: Project) -> None:
    """The lease renewer sleeps while nothing is held, and with runs held until the next
    renewal (a second here): a thread handler that starts with a TIMEOUT sooner than that
    wakes it, so the TIMEOUT is raised near its time, not at the renewer's next wake-up."""
    project.write_config(vt=30)
    project.add_function("stuck", STUCK)
    c = project.client
    w = Worker(project.runtime, ["fast"])
    w.start()
    try:
        warm = c.enqueue("noop", {}).id
        wait_for(lambda: c.get(warm).status == "done", timeout=20)
        time.sleep(0.3)  # the renewer has seen the ledger empty and parked
        job = c.enqueue("stuck", {}).id
        seen = wait_for(lambda: (j := c.get(job).as_dict())["status"] == "dead" and j, timeout=20)
    finally:
        w.stop(grace_s=5)
    (entry,) = seen["history"]
    ran_s = (entry["at_ms"] - entry["started_ms"]) / 1000
    assert "imeout" in entry["error"]["type"], entry
    # (About 1 s before: the renewer raised it at its next renewal.)
    assert ran_s < 0.2 + 0.5, f"the TIMEOUT of 0.2 s landed after {ran_s:.2f} s"


NAPPER = '''"""Sleeps in a child process, longer than its queue's lease."""
import time

QUEUE = "fast"
ISOLATION = "process"
TIMEOUT = 10
MAX_ATTEMPTS = 1


def handle(payload, ctx):
    time.sleep(payload["s"])
'''


def test_a_job_claimed_by_an_idle_worker_keeps_its_lease(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lease renewer of an idle worker sleeps with nothing to renew (here for as long as
    the test runs): the claim wakes it, so a job in a child process (no thread TIMEOUT to
    wake it) that runs past its lease of 1 s is renewed from the start and runs once."""
    monkeypatch.setattr(renewer_mod, "PARK_S", 120.0)
    project.write_config(vt=1, fast="max_timeout = 10", concurrency=1)  # one child: warm, then idle
    project.add_function("napper", NAPPER)
    c = project.client
    w = Worker(project.runtime, ["fast"])
    w.start()
    try:
        warm = c.enqueue("napper", {"s": 0}).id  # the child started and the worker idle again
        wait_for(lambda: c.get(warm).status == "done", timeout=30)
        time.sleep(0.5)
        job = c.enqueue("napper", {"s": 2.5}).id
        seen = wait_for(lambda: (j := c.get(job).as_dict())["status"] in ("done", "dead") and j, timeout=30)
    finally:
        w.stop(grace_s=5)
    assert seen["status"] == "done" and seen["attempt"] == 1, seen


def _switches(pid: int) -> dict[int, int]:
    """Context switches so far of each thread of ``pid`` (each is a wake-up, or a thread
    made to give way)."""
    out: dict[int, int] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:
            continue  # ended meanwhile
        out[int(tid)] = sum(int(n) for n in re.findall(r"^(?:non)?voluntary_ctxt_switches:\s+(\d+)", status, re.M))
    return out


IDLE_S = 5.0


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="counts threads' context switches in /proc")
def test_an_idle_worker_sleeps(project: Project) -> None:
    """A worker with nothing queued and nothing scheduled, at the shipped scheduler_interval
    (0.5 s), wakes its threads a few times a second in all: the renewer, the ticker and the
    main thread sleep until something is due, the scheduler's pass is one round trip, and
    the fetcher's wait and its claim are one. (It woke about 40 times a second before: 10
    of them the renewer's ticks, 5 the main thread's.) The reclaim's check of the queue's
    keys for damage, a TYPE per key, is not sent on every pass either."""
    toml = project.root / "runner.toml"
    toml.write_text(toml.read_text().replace("scheduler_interval = 0.05", "scheduler_interval = 0.5"))
    c = project.client
    worker = project.spawn_worker("fast")
    job = c.enqueue("noop", {}).id
    wait_for(lambda: c.get(job).status == "done", timeout=30, what="the worker to run a job")
    time.sleep(1.0)  # its settlement and start-up work done
    r = project.runtime.redis

    def types() -> int:
        return int(r.info("commandstats").get("cmdstat_type", {}).get("calls", 0))

    before, types0, t0 = _switches(worker.pid), types(), time.monotonic()
    time.sleep(IDLE_S)
    after, types1, span = _switches(worker.pid), types(), time.monotonic() - t0
    assert worker.poll() is None, (project.root / "worker-0.log").read_text()[-2000:]
    per_s = {tid: (n - before.get(tid, 0)) / span for tid, n in after.items()}
    assert sum(per_s.values()) < 15, sorted(per_s.values(), reverse=True)
    assert types1 == types0, "the reclaim checked key types on an idle pass"


def test_a_key_damaged_under_a_running_worker_is_set_aside_after_the_first_refusal(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reclaim checks the queue's keys for damage (a TYPE each) only now and then and
    after an error reply, not on every pass (here not by the clock at all: TRIM_EVERY_S
    is an hour). A leases key overwritten with another type makes the next claim fail;
    the pass after it renames the key aside, and the queue runs jobs again."""
    monkeypatch.setattr(scheduler_mod, "TRIM_EVERY_S", 3600.0)
    c, r, k = project.client, project.runtime.redis, project.keys()
    w = Worker(project.runtime, ["fast"])
    w.start()
    try:
        first = c.enqueue("noop", {}).id
        wait_for(lambda: c.get(first).status == "done", timeout=20)
        r.set(k.leases, "clobbered")
        job = c.enqueue("noop", {}).id  # its wake-up makes the fetcher claim, and fail
        wait_for(lambda: r.exists(k.leases + ":corrupt"), timeout=10, what="the damaged key set aside")
        wait_for(lambda: c.get(job).status == "done", timeout=20, what="the job to run after all")
    finally:
        w.stop(grace_s=5)
    assert r.hget(k.stats, "corrupt|leases") == "1"
    # ... and on /metrics, by queue and key (it was in the stats hash only).
    from prometheus_client import CollectorRegistry, generate_latest

    from runner.web.exposition import RunnerCollector

    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunnerCollector(project.runtime))
    assert 'runner_corrupt_keys_total{key="leases",queue="fast"} 1.0' in generate_latest(registry).decode()


GATED_FAIL = """
import os, time
QUEUE = "fast"
MAX_ATTEMPTS = 2
BACKOFF = {"base": 0.01, "cap": 0.01, "jitter": "none"}

def handle(payload, ctx):
    gate = os.path.join(os.environ["RECORD_DIR"], "go")
    open(os.path.join(os.environ["RECORD_DIR"], "started-" + str(ctx.attempt)), "w").close()
    if ctx.attempt == 1:
        deadline = time.monotonic() + 15
        while not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.01)
        raise ValueError("first attempt fails")
    return {"attempt": ctx.attempt}
"""


def test_a_set_damaged_while_a_job_runs_costs_it_nothing(project: Project) -> None:
    """The scheduled set overwritten with another type while a job runs: its retry is
    refused whole (it gave up the claim, then failed on the set, and the job was in no
    structure), the worker settles again, the scheduler's pass after the error reply puts
    the key aside, and the job is retried and done."""
    project.add_function("gated", GATED_FAIL)
    c, r, k = project.client, project.runtime.redis, project.keys()
    project.spawn_worker("fast")
    job = c.enqueue("gated", {}).id
    wait_for(lambda: (project.records / "started-1").exists(), timeout=20, what="the first attempt")
    r.set(k.scheduled, "clobbered")
    (project.records / "go").touch()
    wait_for(lambda: c.get(job).status == "done", timeout=30, what="the job retried and done")
    assert c.get(job).as_dict()["attempt"] == 2
    assert r.get(k.scheduled + ":corrupt") == "clobbered"


def test_a_job_claimed_beside_a_damaged_set_costs_it_nothing(project: Project) -> None:
    """The scheduled set overwritten with another type before a job is enqueued: a plain
    claim checks no key's type (a command per call at light load), so the job is claimed
    and runs; its retry, which writes the set, is refused whole with the claim kept, the
    scheduler's pass after the error reply puts the key aside, and the job is retried and
    done, once more and no more."""
    project.add_function("gated", GATED_FAIL)
    c, r, k = project.client, project.runtime.redis, project.keys()
    (project.records / "go").touch()
    r.set(k.scheduled, "clobbered")
    project.spawn_worker("fast")
    job = c.enqueue("gated", {}).id
    wait_for(lambda: c.get(job).status == "done", timeout=30, what="the job retried and done")
    assert c.get(job).as_dict()["attempt"] == 2
    assert sorted(p.name for p in project.records.glob("started-*")) == ["started-1", "started-2"]
    assert r.get(k.scheduled + ":corrupt") == "clobbered"


def _gil_hold_s(n: int, clock: Callable[[], float] = time.monotonic) -> float:
    t = clock()
    re.match(r"(a+)+$", "a" * n + "b")  # one C call: the GIL held throughout
    return clock() - t


def test_a_gil_hold_that_begins_as_a_claim_wakes_the_renewer_is_reported_late(
        project: Project, caplog: pytest.LogCaptureFixture) -> None:
    """The renewer parks with nothing held; a claim pokes it, and the handler takes the GIL
    before the renewer's thread could run. Its wake-up then came seconds after the poke:
    late, and said so (it counted a poked wake-up as on time, and said nothing)."""
    # Sized by the thread's CPU time, the same from one hold to the next: a wall-clock
    # size taken while the machine was busy held the GIL only 0.6 s once it was not. Each
    # "a" more about doubles it: timed where a hold is short, at n and n + 1, the growth
    # gives the n of a hold of at least 1.4 s (1.5 s aimed at), without holding it once
    # more to size it.
    n = 16
    while (short := _gil_hold_s(n, time.thread_time)) < 0.05:
        n += 1
    growth = min(2.0, max(1.5, _gil_hold_s(n + 1, time.thread_time) / short))  # (a guess errs long)
    n += 1 + max(0, math.ceil(math.log(1.5 / (short * growth)) / math.log(growth)))
    rt = project.runtime
    q = rt.config.queues["fast"]
    project.client.enqueue("noop", {})
    ledger = Ledger(q.concurrency, 4, 1)
    fetcher = Fetcher(rt, q, ledger, stdqueue.SimpleQueue(), stdqueue.SimpleQueue(), "w-gil")
    renewer = Renewer(rt, q, ledger)
    renewer.start()
    try:
        time.sleep(0.2)  # parked: nothing held
        assert fetcher.claim(1, 1) == (1, 0)
        (run,) = ledger.renewable()
        with ledger.lock:
            run.thread_id = threading.get_ident()
        with caplog.at_level("WARNING", logger="runner.worker"):
            renewer.held()
            held = _gil_hold_s(n)
            wait_for(lambda: any("lease renewal ran" in r.getMessage() for r in caplog.records),
                     timeout=5, what=f"the late warning after a {held:.1f} s GIL hold")
    finally:
        renewer.stop()
    msg = next(r.getMessage() for r in caplog.records if "lease renewal ran" in r.getMessage())
    assert 'ISOLATION = "process"' in msg, msg


def test_a_thread_run_leaves_no_cyclic_garbage(project: Project) -> None:
    """A job's context and the hooks stored in it are freed when the run ends, by reference
    counting: none of it waits for the cyclic collector (a closure holding the context it
    was stored in made every job's context a cycle, and the collector's passes cost a
    thread-mode job about a tenth of its instructions)."""
    import gc

    c = project.client
    w = Worker(project.runtime, ["fast"])
    w.start()
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        ids = [c.enqueue("noop", {"i": i}).id for i in range(60)]
        wait_for(lambda: all(c.get(i).status == "done" for i in ids), timeout=30, what="every job done")
        gc.collect()
        left = sorted({type(o).__qualname__ for o in gc.garbage if type(o).__module__.startswith("runner.")})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        w.stop(grace_s=5)
    assert left == [], f"runner objects freed only by the cyclic collector: {left}"
def _commands(r: Any) -> Counter[str]:
    """Calls per command so far, from INFO commandstats (it counts a script's commands)."""
    return Counter({k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in r.info("commandstats").items()})


def test_a_job_alone_in_its_calls_costs_27_commands(project: Project) -> None:
    """What one job costs Redis at light load, where each job is its own enqueue call, its
    own wake-up and claim and its own ack (issue 53; docs/benchmarks.md, "Light load"):
    counted from INFO commandstats around N jobs sent one at a time through the producer's
    enqueue, the fetcher's woken claim (BLPOP and the claim in one round trip) and the
    settler's ack, with no background thread running. Per job: enqueue 7, wake-up 1,
    claim 8, ack 11 (each script's EVALSHA included). A change that brings a command back
    to any of them fails here; a cut lowers the pin."""
    rt = project.runtime
    q = rt.config.queues["fast"]
    ledger = Ledger(q.concurrency, 16, 1)
    inbox: stdqueue.SimpleQueue[Any] = stdqueue.SimpleQueue()
    fetcher = Fetcher(rt, q, ledger, inbox, stdqueue.SimpleQueue(), "w-count")
    settler = Settler(rt, q, ledger, stdqueue.SimpleQueue())
    r, c = rt.redis, project.client
    by_step: dict[str, Counter[str]] = {"enqueue": Counter(), "claim": Counter(), "ack": Counter()}

    def step(name: str, call: Any) -> Any:
        before = _commands(r)
        got = call()
        spent = _commands(r) - before
        spent["info"] -= 1
        by_step[name] += +spent
        return got

    def one(i: int) -> str:
        job_id = step("enqueue", lambda: c.enqueue("noop", {"i": i}).id)
        fetcher._woken = True  # idle: the claim waits behind a BLPOP, as at light load
        assert step("claim", lambda: fetcher.claim(16, 4)) == (1, 0)
        run = inbox.get(timeout=5)
        assert run.job.id == job_id
        step("ack", lambda: settler.send([Settlement(run, Done("null"), 0.001, run.job.claimed_ms)]))
        return job_id

    for i in range(3):  # warm: the scripts loaded, the queue's keys made
        one(i)
    for name in by_step:
        by_step[name].clear()
    ids = [one(i) for i in range(JOBS)]
    settler.flush_figures(final=True)  # (outside the count: a second's figures, one pipeline)

    assert all(c.get(job_id).status == "done" for job_id in ids)
    per_job = {name: sum(spent.values()) / JOBS for name, spent in by_step.items()}
    assert per_job == {"enqueue": 7, "claim": 9, "ack": 11}, (per_job, by_step)
    assert by_step["claim"]["blpop"] == JOBS and by_step["claim"]["evalsha"] == JOBS
    assert sum(per_job.values()) == 27
