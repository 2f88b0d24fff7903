"""MAX_AGE through a real worker: a job that waited past its function's MAX_AGE behind a
busy queue goes dead as "expired" (its handler never runs, no attempt spent, ON_FAILURE
fires, the history says why); a job started in time runs as usual."""

from __future__ import annotations

import json
import textwrap
import time

import pytest

from conftest import Project, wait_for

BLOCKER = '''
import os, time
QUEUE = "fast"

def handle(payload, ctx):
    deadline = time.monotonic() + 20
    open(os.path.join(os.environ["RECORD_DIR"], "blocker-started"), "w").close()
    while not os.path.exists(os.path.join(os.environ["RECORD_DIR"], "release")):
        if time.monotonic() > deadline:
            raise RuntimeError("never released")
        time.sleep(0.01)
'''

FRESH = '''
import os
QUEUE = "fast"
MAX_AGE = 0.3
ON_FAILURE = "notice"

def handle(payload, ctx):
    with open(os.path.join(os.environ["RECORD_DIR"], "ran-" + ctx.job_id), "w") as f:
        f.write("ran")
    return {"ok": True}
'''

NOTICE = '''
import json, os
QUEUE = "slow"

def handle(payload, ctx):
    # Written aside, then renamed: the test reads it as soon as the name appears.
    path = os.path.join(os.environ["RECORD_DIR"], "notice-" + payload["job"]["id"])
    with open(path + ".tmp", "w") as f:
        f.write(json.dumps(payload))
    os.replace(path + ".tmp", path)
'''


def write(project: Project, name: str, src: str) -> None:
    (project.root / "functions" / f"{name}.py").write_text(textwrap.dedent(src))
    (project.root / "schemas" / name).mkdir(exist_ok=True)
    (project.root / "schemas" / name / "v1.json").write_text('{"type": "object"}')
    project._runtime = None


def server_ms(project: Project) -> int:
    s, us = project.runtime.redis.time()
    return int(s) * 1000 + int(us) // 1000


@pytest.mark.parametrize("prefetch", [0, 8])
def test_a_job_past_max_age_expires_unrun_and_one_in_time_runs(project: Project, prefetch: int) -> None:
    """With prefetch 8 the late job is claimed ahead while the executor is busy, and
    expires when the executor would start it, as one claimed late does."""
    project.write_config(concurrency=1, prefetch=prefetch)
    for name, src in (("blocker", BLOCKER), ("fresh", FRESH), ("notice", NOTICE)):
        write(project, name, src)
    c = project.client
    assert c.runtime.registry.get("fresh").describe()["max_age"] == 0.3
    project.spawn_worker("fast", "slow")
    assert c.wait(c.enqueue("noop", {}).id, 20).status == "done"  # the worker serves

    on_time = c.enqueue("fresh", {}).id
    assert c.wait(on_time, 20).status == "done"
    assert (project.records / f"ran-{on_time}").exists()

    c.enqueue("blocker", {})
    wait_for(lambda: (project.records / "blocker-started").exists(), timeout=20, what="the blocker to start")
    late = c.enqueue("fresh", {}).id
    created_ms = int(c.get(late).as_dict()["created_at"] * 1000)
    # Past MAX_AGE by the server's clock while the only executor is busy, then unblock.
    wait_for(lambda: server_ms(project) - created_ms > 400, timeout=5, what="MAX_AGE to pass")
    (project.records / "release").touch()

    job = c.wait(late, 20).as_dict()
    assert job["status"] == "dead" and job["reason"] == "expired", job
    assert job["attempt"] == 0  # it never ran: no attempt spent
    assert job["last_error"]["type"] == "Expired" and "MAX_AGE 0.3 s" in job["last_error"]["message"]
    assert [h["outcome"] for h in job["history"]] == ["expired"]
    assert not (project.records / f"ran-{late}").exists()
    assert late in c.dead_ids("fast")
    notice = wait_for(lambda: (project.records / f"notice-{late}").exists() and
                      json.loads((project.records / f"notice-{late}").read_text()), timeout=20,
                      what="the ON_FAILURE destination")
    assert notice["error"]["type"] == "Expired"
    counters = c.stats()["fast"]["counters"]
    assert counters.get("expired|fresh") == 1 and counters.get("dead|fresh") == 1


STALE = '''
import os, time
QUEUE = "fast"
CONCURRENCY = 1
MAX_AGE = 2
TIMEOUT = 20

def handle(payload, ctx):
    with open(os.path.join(os.environ["RECORD_DIR"], "in-" + ctx.job_id), "w") as f:
        f.write(str(time.time()))
    time.sleep(payload.get("hold", 0))
'''


def test_jobs_that_expire_when_woken_from_a_limit_hand_its_slot_on_at_once(project: Project) -> None:
    """CONCURRENCY 1 and MAX_AGE 2: three jobs wait on the limit behind a 3 s job and go
    stale. As each is woken it expires, and its reserved slot goes to the next waiter at
    once (it was held until the reservation lapsed, 10 s a stale job), so a fresh job
    sent when the long one ends starts within a second."""
    write(project, "stale", STALE)
    c = project.client
    project.spawn_worker("fast")
    # The worker claims before the long job is sent: a start slower than MAX_AGE (a loaded
    # machine) would otherwise expire the long job itself before it ever runs.
    warm = c.enqueue("stale", {}).id
    assert c.wait(warm, 30).status in ("done", "dead")
    first = c.enqueue("stale", {"hold": 3}).id
    wait_for(lambda: (project.records / f"in-{first}").exists(), timeout=20, what="the long job to start")
    parked = [c.enqueue("stale", {}).id for _ in range(3)]
    wait_for(lambda: all(c.get(p).status == "deferred" for p in parked), timeout=10, what="three waiting")
    assert c.wait(first, 20).status == "done"
    sent = time.time()
    fresh = c.enqueue("stale", {}).id
    assert c.wait(fresh, 15).status == "done"
    started = float((project.records / f"in-{fresh}").read_text())
    assert started - sent < 1.5, f"started {started - sent:.1f} s after its enqueue"
    for p in parked:
        job = c.get(p).as_dict()
        assert job["status"] == "dead" and job["reason"] == "expired", job
