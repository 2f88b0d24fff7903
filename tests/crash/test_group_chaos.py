"""A group of members (400 in the default run; 1,000 with RUNNER_TEST_FULL=1 or
GROUP_CHAOS_MEMBERS) under random failures and worker SIGKILLs: members fail for
good (dead), fail once (retried), or kill their worker on every attempt (buried by the
lease reclaim as "worker lost"), while the workers of the members' queue are also killed
at random moments and at random fault points (mid-handler, after the ack, before the
relay...). The then-job, on
another queue, is written once, by the settle of the last member, and runs once with all
outcomes in member order, each as its member ended."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import textwrap
import time

import pytest
from crashkit import configure, wait_final

from runner.client import Request
from runner.worker.faults import POINTS, RELAY_POINTS

from conftest import Project, size, wait_for

MEMBER = '''
import os, signal, time
import runner
QUEUE = "fast"

def handle(payload, ctx):
    if payload["fate"] == "poison":  # kills its worker on every attempt: "worker lost"
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(payload["sleep"])
    if payload["fate"] == "doomed":
        raise runner.PermanentFailure("doomed " + str(payload["n"]))
    if payload["fate"] == "flaky" and ctx.attempt == 1:
        raise RuntimeError("flaky " + str(payload["n"]))
    return {"n": payload["n"]}
'''

THEN = '''
import json, os
QUEUE = "slow"

def handle(payload, ctx):
    with open(os.path.join(os.environ["RECORD_DIR"], "then-runs"), "a") as f:
        f.write(json.dumps({"id": ctx.job_id, "group": payload["group"]}) + "\\n")
'''

N = int(size("GROUP_CHAOS_MEMBERS", 400, 1000))


def add(project: Project, name: str, src: str) -> None:
    (project.root / "functions" / f"{name}.py").write_text(textwrap.dedent(src))
    (project.root / "schemas" / name).mkdir(exist_ok=True)
    (project.root / "schemas" / name / "v1.json").write_text('{"type": "object"}')
    project._runtime = None


def then_runs(project: Project) -> list[dict]:
    """The then-job's runs recorded so far: whole lines only (a run's line, over 64 KiB with
    a group of 1,000, lands in more than one write, and a read may come between them)."""
    p = project.records / "then-runs"
    if not p.exists():
        return []
    text = p.read_text()
    return [json.loads(x) for x in text[:text.rfind("\n") + 1].splitlines()]


@pytest.mark.timeout(360)
def test_then_runs_once_with_every_outcome_through_kills(project: Project) -> None:
    rnd = random.Random(24)
    configure(project, vt=1, concurrency=3, max_attempts=3, prefetch=2, batch=16, grace=1)
    add(project, "member", MEMBER)
    add(project, "gather", THEN)
    c = project.client
    fates = rnd.choices(["ok", "flaky", "doomed", "poison"], weights=[745, 150, 100, 5], k=N)
    members = [Request("member", {"n": i, "fate": f, "sleep": round(rnd.uniform(0.005, 0.03), 3)})
               for i, f in enumerate(fates)]
    g = c.group(members, then=Request("gather", {}))
    # The then-job's own worker is never killed: what is under test is that the members'
    # settles write it exactly once, not the at-least-once run of a job.
    project.spawn_worker("slow")
    workers: list[subprocess.Popen[bytes]] = []
    kills = armed = 0

    def spawn() -> None:
        nonlocal armed
        env = None
        if rnd.random() < 0.5:
            env = {"RUNNER_FAULT": rnd.choice(POINTS + RELAY_POINTS), "RUNNER_FAULT_AFTER": str(rnd.randint(0, 40))}
            armed += 1
        workers.append(project.spawn_worker("fast", env=env))

    for _ in range(2):
        spawn()
    deadline = time.monotonic() + 150
    while not c.get_group(g.id)["complete"]:
        assert time.monotonic() < deadline, c.get_group(g.id)
        time.sleep(rnd.uniform(0.3, 1.0))  # the time between two faults
        alive = [w for w in workers if w.poll() is None]
        if alive and rnd.random() < 0.6:
            victim = rnd.choice(alive)
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            kills += 1
        workers[:] = [w for w in workers if w.poll() is None]
        while len(workers) < 2:
            spawn()
    project.spawn_worker("fast")  # an unarmed one, so the outbox surely drains
    wait_for(lambda: then_runs(project), timeout=60, what="the then-job to run")
    assert c.wait(g.then_id, 30).status == "done"
    final = wait_final(project, g.members, timeout=60)

    [run] = then_runs(project)
    assert kills > 0 or armed > 0
    assert run["id"] == g.then_id
    group = run["group"]
    outcomes = group["outcomes"]
    assert group["total"] == N and len(outcomes) == N
    assert [o["id"] for o in outcomes] == list(g.members)
    assert [o["status"] for o in outcomes] == [final[m]["status"] for m in g.members]
    assert group["done"] + group["dead"] == N and group["cancelled"] == 0
    for i, (o, f) in enumerate(zip(outcomes, fates, strict=True)):
        if f == "doomed":
            assert o["status"] == "dead"
        if f == "poison":
            assert (o["status"], o["reason"]) == ("dead", "worker lost"), o
        if o["status"] == "done":
            assert o["result"] == {"n": i}
        else:
            assert o["reason"] in ("permanent failure", "max attempts reached", "worker lost"), o
    view = c.get_group(g.id)
    assert (view["pending"], view["complete"], view["then"]["status"]) == (0, True, "done")
    assert c.stats()["fast"]["counters"].get("groups_completed") == 1
