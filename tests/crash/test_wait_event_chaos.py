"""ctx.wait_for_event under SIGKILL: 20 jobs wait for their own order's event while two
workers die at random (killed from outside, and at the relay's fault points between telling
a waiter and taking the event off its list), and half the events are left by an emitter
that died right after its write (the emit's step alone: the relay must tell those). Every
job ends done once, with its own event; each step's side effect ran once, except where a
kill fell between a step's function returning and its record landing (at most as many as
the kills); no waiter is left on the registry. The default run kills workers 8 times (each kill
starts a worker again, and a process-isolated one its children: the run's cost);
RUNNER_TEST_FULL=1 kills 12 times (WAIT_EVENT_CHAOS_KILLS sets the count) and runs the
200-job variant, marked slow (WAIT_EVENT_CHAOS_JOBS sets its count)."""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from runner.store import codec, listeners, records
from runner.store.keys import EventKeys
from runner.worker.faults import POINTS, WAKE_POINTS

from conftest import Project, assert_no_job_in_two_structures, make_project, size, wait_for

KILLS = int(size("WAIT_EVENT_CHAOS_KILLS", 8, 12))

WAITER = '''
import os
QUEUE = "fast"
MAX_ATTEMPTS = 50
{isolation}

def bump(name, ctx):
    with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id + "-" + name), "a") as f:
        f.write(ctx.step_key + "\\n")
    return name

def handle(payload, ctx):
    ctx.step("before", bump, "before", ctx)
    event = ctx.wait_for_event("order.paid", match={{"order_id": payload["order_id"]}}, timeout=600)
    ctx.step("after", bump, "after", ctx)
    return {{"order_id": event["data"]["order_id"], "event": event["id"]}}
'''


def _spawn(project: Project, rnd: random.Random, armed: bool = True) -> Any:
    """A worker that dies at a random fault point (the relay's telling twice as likely),
    or, once the run has had its kills, one that does not."""
    if not armed:
        return project.spawn_worker("fast")
    point = rnd.choice(WAKE_POINTS + WAKE_POINTS + POINTS)
    return project.spawn_worker("fast", env={"RUNNER_FAULT": point, "RUNNER_FAULT_AFTER": str(rnd.randint(0, 6))})


def _left_by_a_dead_emitter(project: Project, order_id: int) -> str:
    """The emit's own step (event, record, pending wake), and nobody told: its emitter died."""
    rt = project.client.runtime
    event_id = records.new_id()
    body = codec.dumps({"order_id": order_id})
    rt.scripts.emit(rt.keys["fast"], [], event_id=event_id, name="order.paid", data='"data":' + body, whole=body,
                    idem_key="", data_hash="", idem_ms=1000, keep=100, away="[]", entries=[])
    return event_id


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_no_wake_is_lost_when_workers_and_emitters_die(tmp_path: Path, server: object, isolation: str) -> None:
    """Twenty waiting jobs, SIGKILLs around the emits and the relay's telling: all end
    done once, each with its own order's event."""
    _run(tmp_path, server, isolation, int(size("WAIT_EVENT_CHAOS_JOBS", 20, 20)), 240)


@pytest.mark.slow
@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_no_wake_is_lost_when_workers_and_emitters_die_200_jobs(tmp_path: Path, server: object,
                                                                 isolation: str) -> None:
    """The same with 200 waiting jobs (RUNNER_TEST_FULL=1, or WAIT_EVENT_CHAOS_JOBS)."""
    _run(tmp_path, server, isolation, int(size("WAIT_EVENT_CHAOS_JOBS", 200, 200)), 900)


def _run(tmp_path: Path, server: object, isolation: str, count: int, seconds: float) -> None:
    project: Project = make_project(tmp_path / "project", server)  # type: ignore[arg-type]
    try:
        project.write_config(vt=1, concurrency=4, max_attempts=50, fast=f'isolation = "{isolation}"')
        project.add_function("waiter", WAITER.format(isolation=""))
        c = project.client
        rnd = random.Random(50)
        workers = [_spawn(project, rnd), _spawn(project, rnd)]
        ids = {n: c.enqueue("waiter", {"order_id": n}).id for n in range(count)}
        emitted: dict[int, str] = {}
        kills = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            views = {n: c.get(j).as_dict() for n, j in ids.items()}
            if all(v["status"] == "done" for v in views.values()):
                break
            assert not any(v["status"] == "dead" for v in views.values()), \
                [v for v in views.values() if v["status"] == "dead"][:1]
            for n, v in views.items():
                if v["status"] == "waiting" and n not in emitted:  # its wait is on record: an emit now counts
                    emitted[n] = (_left_by_a_dead_emitter(project, n) if n % 2 else c.emit("order.paid",
                                                                                          {"order_id": n}).id)
            for i, w in enumerate(workers):
                if w.poll() is not None:  # died at its fault point
                    kills += 1
                    workers[i] = _spawn(project, rnd, kills < KILLS)
            if kills < KILLS and rnd.random() < 0.3:
                victim = rnd.randrange(len(workers))
                workers[victim].send_signal(signal.SIGKILL)
                workers[victim].wait(timeout=10)
                kills += 1
                workers[victim] = _spawn(project, rnd, kills < KILLS)
            time.sleep(rnd.uniform(0.1, 0.4))
        views = {n: c.get(j).as_dict() for n, j in ids.items()}
        assert all(v["status"] == "done" for v in views.values()), \
            [v for v in views.values() if v["status"] != "done"][:2]
        repeats = 0
        for n, view in views.items():
            assert view["result"] == {"order_id": n, "event": emitted[n]}, view
            for step in ("before", "after"):
                runs = (project.records / f"{ids[n]}-{step}").read_text().splitlines()
                assert runs and all(r == runs[0] for r in runs), runs
                repeats += len(runs) - 1
        print(f"wait_for_event chaos ({isolation}): {count} jobs done, {kills} kills, {repeats} step(s) run again")
        assert repeats <= kills, (repeats, kills)
        rt = c.runtime
        assert listeners.waiting(rt.redis, EventKeys(rt.config.redis.prefix, "order.paid")) == 0
        wait_for(lambda: all(rt.redis.llen(k.wakes) == 0 for k in rt.parts["fast"]), timeout=30,
                 what="every pending event taken off its list")
        assert_no_job_in_two_structures(project)
    finally:
        project.close()
