"""A suspended durable function's view shows the attempt it ran and when that run began
(its first start), the same in client.get, GET /jobs/{id} and `runner job ID --json`,
and the same start while its resumed run goes on and once it is done."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
import requests
from test_web_support import runner_web

from conftest import Project, wait_for

WAITER = '''
import os, time
QUEUE = "fast"
{isolation}

def handle(payload, ctx):
    ctx.step("before", lambda: 1)
    answer = ctx.wait_for_signal("approval")
    gate = os.path.join(os.environ["RECORD_DIR"], ctx.job_id + "-go")
    deadline = time.monotonic() + 60
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.02)
    return {{"answer": answer, "attempt": ctx.attempt}}
'''


def _cli(project: Project, job_id: str) -> dict[str, Any]:
    shown = subprocess.run([sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"), "job",
                            job_id, "--json"], env=project.env, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown
    return json.loads(shown.stdout)  # type: ignore[no-any-return]


@pytest.mark.parametrize("isolation", ["", 'ISOLATION = "process"'], ids=["thread", "process"])
def test_a_suspended_job_shows_the_attempt_it_ran_and_its_first_start(project: Project, isolation: str) -> None:
    """Waiting: attempt 1 and a start, in all three views alike; resumed and running, and
    done, the same start (the run's first), not the resumed run's."""
    project.write_config(concurrency=1)  # one job: one child under process isolation, not eight
    project.add_function("waiter", WAITER.format(isolation=isolation))
    c = project.client
    project.spawn_worker("fast")
    job = c.enqueue("waiter", {}).id
    wait_for(lambda: c.get(job).status == "waiting", timeout=60, what="the job to wait")
    waiting = c.get(job).as_dict()
    assert waiting["attempt"] == 1 and waiting["started_at"] is not None, waiting
    with runner_web(project, "web", workers=1) as web:
        http = requests.get(f"{web.url}/jobs/{job}", headers={"Authorization": "Bearer t"}, timeout=10).json()
    cli = _cli(project, job)
    for view in (http, cli):
        assert (view["status"], view["attempt"], view["started_at"]) == ("waiting", 1, waiting["started_at"]), view
    assert c.signal(job, "approval", "yes") == "resumed"
    wait_for(lambda: c.get(job).status == "processing", timeout=60, what="the job to resume")
    running = c.get(job).as_dict()
    assert (running["attempt"], running["started_at"]) == (1, waiting["started_at"]), running
    (project.records / f"{job}-go").touch()
    done = c.wait(job, 30).as_dict()
    assert done["status"] == "done" and done["result"] == {"answer": "yes", "attempt": 1}, done
    assert (done["attempt"], done["started_at"]) == (1, waiting["started_at"]), done


NAPS = '''
QUEUE = "fast"

def handle(payload, ctx):
    if payload.get("wait"):
        ctx.wait_for_signal("go", timeout=600)
    else:
        ctx.sleep("nap", 600)
'''


def test_sleeping_and_waiting_jobs_are_counted_apart_from_scheduled(project: Project) -> None:
    """2 sleeping, 3 waiting and 1 delayed job: GET /queues (and `runner stats`, /metrics,
    the console's tabs) counts 1 scheduled, 2 sleeping and 3 waiting, as their lists show
    them (the sleepers and waiters were counted as 5 more scheduled)."""
    from prometheus_client import CollectorRegistry, generate_latest

    from runner.observe.figures import queue_view, read_queues
    from runner.web.exposition import RunnerCollector

    project.add_function("naps", NAPS)
    c = project.client
    ids = [c.enqueue("naps", {}).id for _ in range(2)] + [c.enqueue("naps", {"wait": True}).id for _ in range(3)]
    c.enqueue("naps", {}, delay=600)
    project.spawn_worker("fast")
    wait_for(lambda: {c.get(i).status for i in ids} == {"sleeping", "waiting"}, timeout=30, what="the naps")
    q = next(q for q in read_queues(project.runtime) if q.name == "fast")
    view = queue_view(q, project.runtime.config.queues["fast"])
    assert (view["scheduled"], view["sleeping"], view["waiting"]) == (1, 2, 3), view
    assert view["scheduled_due"] == 0
    # client.stats() (`runner stats`' counts) keeps counting every job waiting for a time as
    # scheduled, the sleepers too (in a set of their own: suspend.lua).
    assert c.stats()["fast"]["scheduled"] == 6
    assert len(c.jobs(status="scheduled", queue="fast").jobs) == 1
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunnerCollector(project.runtime))
    text = generate_latest(registry).decode()
    assert 'runner_queue_scheduled_jobs{queue="fast"} 1.0' in text
    assert 'runner_queue_sleeping_jobs{queue="fast"} 2.0' in text
    assert 'runner_queue_waiting_jobs{queue="fast"} 3.0' in text
