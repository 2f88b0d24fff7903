"""Durable functions under SIGKILL: a 5-step function with a sleep and a signal between its
steps, two workers killed at random and restarted, in both isolations. Every job ends
done; each step's side effect ran once, except where a kill fell between the step's
function returning and its record landing: such repeats are counted, and there are at
most as many as there were kills. The default run is small; RUNNER_TEST_FULL=1 (or
DURABLE_CHAOS_JOBS) runs 2,000 jobs, marked slow."""

from __future__ import annotations

import contextlib
import random
import signal
import threading
import time
from pathlib import Path

import pytest

from runner.errors import RunnerError

from conftest import Project, assert_no_job_in_two_structures, make_project, size

FIVE = '''
import os
QUEUE = "fast"
MAX_ATTEMPTS = 50
{isolation}

def bump(i, ctx):
    # The step's side effect: one line per run of its function (a counter of runs).
    with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id + "-" + str(i)), "a") as f:
        f.write(ctx.step_key + "\\n")
    return i

def handle(payload, ctx):
    total = ctx.step("one", bump, 1, ctx)
    total += ctx.step("two", bump, 2, ctx)
    ctx.sleep("pause", 0.2)
    total += ctx.step("three", bump, 3, ctx)
    go = ctx.wait_for_signal("go", timeout=600)
    total += ctx.step("four", bump, 4, ctx)
    total += ctx.step("five", bump, 5, ctx)
    return {{"total": total, "go": go}}
'''


def _run(tmp_path: Path, server: object, isolation: str, jobs: int, seconds: float) -> None:
    project: Project = make_project(tmp_path / "project", server)  # type: ignore[arg-type]
    try:
        project.write_config(vt=1, concurrency=8, max_attempts=50, prefetch=4,
                             fast=f'isolation = "{isolation}"')
        project.add_function("five", FIVE.format(isolation=""))
        c = project.client
        workers = [project.spawn_worker("fast"), project.spawn_worker("fast")]
        ids = [c.enqueue("five", {"i": i}).id for i in range(jobs)]
        for job_id in ids[::2]:  # half get their signal early: kept until the wait reads it
            c.signal(job_id, "go", "early")
        stop = threading.Event()
        kills = 0

        def signaller() -> None:
            while not stop.is_set():
                with contextlib.suppress(RunnerError):  # (Redis away, or the job moved on: next round)
                    for j in c.jobs("waiting", limit=500).jobs:
                        with contextlib.suppress(RunnerError):
                            c.signal(j.id, "go", "late")
                time.sleep(0.05)

        sender = threading.Thread(target=signaller, daemon=True)
        sender.start()
        rnd = random.Random(49)
        deadline = time.monotonic() + seconds
        try:
            # Kills at random moments while the jobs run (one every 0.1-0.4 s).
            while time.monotonic() < deadline:
                # The statuses, not the succeeded counter: a worker sums its successes' counts
                # for up to a second, and a SIGKILL loses those, so the counter could stay
                # short of the jobs done and the loop ran to its deadline every time.
                statuses = [c.get(j).status for j in ids]
                if all(st == "done" for st in statuses):
                    break
                assert "dead" not in statuses, [v for v in (c.get(j).as_dict() for j in ids)
                                                if v["status"] == "dead"][:1]
                time.sleep(rnd.uniform(0.1, 0.4))
                if kills >= max(5, jobs // 20):
                    continue  # enough: the rest finish undisturbed
                victim = rnd.randrange(len(workers))
                workers[victim].send_signal(signal.SIGKILL)
                workers[victim].wait(timeout=10)
                kills += 1
                workers[victim] = project.spawn_worker("fast")
        finally:
            stop.set()
            sender.join(timeout=5)
        statuses = {j: c.get(j).as_dict() for j in ids}
        assert all(v["status"] == "done" for v in statuses.values()), \
            [v for v in statuses.values() if v["status"] != "done"][:2]
        repeats = 0
        for job_id, view in statuses.items():
            assert view["result"]["total"] == 15 and view["result"]["go"] in ("early", "late"), view
            for i in range(1, 6):
                runs = (project.records / f"{job_id}-{i}").read_text().splitlines()
                assert runs and all(r == runs[0] for r in runs), runs  # one step_key per step, every run
                repeats += len(runs) - 1
        print(f"durable chaos ({isolation}): {jobs} jobs done, {kills} SIGKILLs, {repeats} step(s) run again "
              "(killed between fn returning and its record landing)")
        assert repeats <= kills, (repeats, kills)
        assert_no_job_in_two_structures(project)
    finally:
        project.close()


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_durable_steps_survive_sigkill(tmp_path: Path, server: object, isolation: str) -> None:
    """A small run in the default suite: every job done, repeats at most the kills (threads
    run 40 such jobs in about 2 s, before the kills have begun: they get more)."""
    _run(tmp_path, server, isolation, int(size("DURABLE_CHAOS_JOBS", 150 if isolation == "thread" else 40, 40)), 60)


@pytest.mark.slow
@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_durable_steps_survive_sigkill_2000_jobs(tmp_path: Path, server: object, isolation: str) -> None:
    """The issue's size: 2,000 jobs."""
    _run(tmp_path, server, isolation, int(size("DURABLE_CHAOS_JOBS", 2000, 2000)), 900)
