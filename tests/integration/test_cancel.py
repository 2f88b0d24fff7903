"""Cancel: a job not started ends cancelled at once and never runs, even from a worker
that prefetched it; a running one is asked to stop and sees ctx.cancelled within 2 s;
an ended one is a 409; the cancel lives in Redis, so it survives worker restarts."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from test_web_support import Web, gunicorn

from runner import JobEnded

from conftest import Project, wait_for

TOKEN = "t0ken-for-tests"

COOP = '''"""Runs until cancelled, checking at each step (as a cooperative handler does)."""
import os
import time

QUEUE = "slow"
TIMEOUT = 60
{extra}

def handle(payload, ctx):
    with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id), "a") as f:
        f.write("started\\n")
    end = time.time() + payload["seconds"]
    release = payload.get("until")  # a file whose appearance ends the run early
    while time.time() < end and not (release and os.path.exists(release)):
        if payload.get("cooperate", True):
            ctx.raise_if_cancelled()
        time.sleep(0.02)
    return {{"ran": payload["seconds"]}}
'''
SCHEMA = ('{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object",'
          '"properties":{"seconds":{"type":"number"},"cooperate":{"type":"boolean"},"until":{"type":"string"}},"required":["seconds"]}')


def add_coop(project: Project, extra: str = "") -> None:
    (project.root / "functions" / "coop.py").write_text(COOP.format(extra=extra))
    (project.root / "schemas" / "coop").mkdir(exist_ok=True)
    (project.root / "schemas" / "coop" / "v1.json").write_text(SCHEMA)
    project.write_config(grace=1)


def one_slot_that_prefetches(project: Project) -> None:
    """The coop function on a slow queue with one executor that claims jobs ahead."""
    add_coop(project)
    project.write_config(grace=1, extra="")
    toml = project.root / "runner.toml"
    head = "[queues.slow]\nvisibility_timeout = 10\nconcurrency = 2"
    assert head in toml.read_text()
    toml.write_text(toml.read_text().replace(head, "[queues.slow]\nvisibility_timeout = 10\nconcurrency = 1\n"
                                             "prefetch = 4"))


def status(project: Project, job_id: str) -> str | None:
    return project.client.get(job_id).status


def test_a_queued_and_a_scheduled_job_end_cancelled_and_never_run(project: Project) -> None:
    """A queued job and a delayed one are cancelled at once (status cancelled, a terminal
    status a second cancel refuses); a worker started afterwards runs neither, and a
    worker restart changes nothing: the cancel is in Redis."""
    client = project.client
    queued = client.enqueue("record", {"n": 1}).id
    scheduled = client.enqueue("record", {"n": 2}, delay=0.5).id
    assert client.cancel(queued) == "cancelled"
    assert client.cancel(scheduled) == "cancelled"
    assert status(project, queued) == status(project, scheduled) == "cancelled"
    with pytest.raises(JobEnded):
        client.cancel(queued)
    w = project.spawn_worker("fast")
    after = client.enqueue("record", {"n": 3}).id
    wait_for(lambda: status(project, after) == "done", timeout=20, what="a later job to run")
    time.sleep(0.6)  # past the delay: the scheduled one would be due now
    w.kill()
    w.wait()
    project.spawn_worker("fast")
    again = client.enqueue("record", {"n": 4}).id
    wait_for(lambda: status(project, again) == "done", timeout=20, what="the restarted worker")
    assert project.runs(queued) == [] and project.runs(scheduled) == []
    assert status(project, queued) == status(project, scheduled) == "cancelled"


def test_a_prefetched_job_is_never_started(project: Project) -> None:
    """A job claimed ahead by a worker whose executors are busy is dropped by that worker
    on the cancel's notice: it never starts, and the job ends cancelled."""
    one_slot_that_prefetches(project)
    client = project.client
    busy = client.enqueue("coop", {"seconds": 30}).id
    ahead = client.enqueue("coop", {"seconds": 30}).id
    project.spawn_worker("slow")
    wait_for(lambda: project.runs(busy), timeout=20, what="the first job to start")
    k = project.keys("slow")
    claim = wait_for(lambda: project.runtime.redis.hget(k.claims, ahead), timeout=10, what="the prefetch")
    assert claim.split()[3].find("p") >= 0, claim
    assert client.cancel(ahead) == "cancelled"
    assert client.cancel(busy) == "requested"
    wait_for(lambda: status(project, busy) == "cancelled", timeout=10, what="the running job to stop")
    time.sleep(0.5)
    assert project.runs(ahead) == []
    assert status(project, ahead) == "cancelled"


def test_a_prefetched_job_cancelled_as_its_executor_frees_never_starts(project: Project) -> None:
    """The executor frees up a moment after the cancel of the job it claimed ahead, well
    before any renewal could tell the worker: the job still never starts (the worker
    drops it on the cancel's notice, and the answer waits for that) and ends cancelled."""
    one_slot_that_prefetches(project)
    client = project.client
    flag = project.root / "release-busy"
    for attempt in range(3):  # each round: a busy job, one claimed ahead
        flag.unlink(missing_ok=True)
        busy = client.enqueue("coop", {"seconds": 30, "until": str(flag)}).id
        ahead = client.enqueue("coop", {"seconds": 0.1}).id
        if attempt == 0:
            project.spawn_worker("slow")
        wait_for(lambda b=busy: project.runs(b), timeout=20, what="the busy job to start")
        wait_for(lambda a=ahead: project.runtime.redis.hget(project.keys("slow").claims, a), timeout=10,
                 what="the prefetch")
        assert client.cancel(ahead) == "cancelled"
        flag.touch()  # the executor is free at once
        wait_for(lambda b=busy: status(project, b) == "done", timeout=10, what="the busy job to end")
        time.sleep(0.3)
        assert project.runs(ahead) == [], f"round {attempt}: a cancelled job started"
        assert status(project, ahead) == "cancelled"


def test_a_running_job_sees_the_cancel_within_2_s_and_ends_cancelled(project: Project) -> None:
    """A running handler that checks ctx.raise_if_cancelled() stops within 2 s of the
    cancel (the request rides on the lease renewal) and the job ends cancelled, not
    retried; a caller waiting on it hears of it (JobFailed). The cancel's history entry
    (who asked) stays before the attempt's own."""
    add_coop(project)
    client = project.client
    job_id = client.enqueue("coop", {"seconds": 30}).id
    project.spawn_worker("slow")
    wait_for(lambda: project.runs(job_id), timeout=20, what="the handler to start")
    t0 = time.monotonic()
    assert client.cancel(job_id, by="ops") == "requested"
    ended = client.settle(job_id, 10)
    assert ended.status == "cancelled", ended.as_dict()
    assert time.monotonic() - t0 < 2.5
    assert project.runs(job_id) == ["started"]  # not retried
    assert ended.as_dict()["attempt"] == 1
    # Who asked stays on record through the run's own end, written after it.
    history = ended.as_dict()["history"]
    assert (history[0].get("outcome"), history[0].get("by")) == ("cancel", "ops"), history
    assert len(history) == 2 and history[1]["attempt"] == 1 and history[1]["at_ms"] >= history[0]["at_ms"], history


def test_a_handler_that_ignores_the_cancel_is_killed_under_process_isolation(project: Project) -> None:
    """Under ISOLATION = "process" a handler that never checks is killed once its grace
    passes after the cancel, and the job ends cancelled."""
    add_coop(project, extra='ISOLATION = "process"')
    client = project.client
    job_id = client.enqueue("coop", {"seconds": 30, "cooperate": False}).id
    project.spawn_worker("slow")
    wait_for(lambda: project.runs(job_id), timeout=30, what="the handler to start")
    t0 = time.monotonic()
    client.cancel(job_id)
    ended = client.settle(job_id, 15)
    assert ended.status == "cancelled", ended.as_dict()
    assert time.monotonic() - t0 < 6


@pytest.fixture
def web(project: Project) -> Iterator[Web]:
    with gunicorn(project, token=TOKEN) as w:
        yield w


def test_delete_cancels_and_a_finished_job_is_409(project: Project, web: Web) -> None:
    """DELETE /jobs/{id} cancels a queued job (200); a finished job answers 409; an
    unknown id 404; `runner cancel` exits 1 for an ended job."""
    queued = web.post("/jobs/record", json={"n": 1}).json()["id"]
    r = web.call("DELETE", f"/jobs/{queued}")
    assert r.status_code == 200 and r.json() == {"id": queued, "cancel": "cancelled"}, r.text
    assert web.get(f"/jobs/{queued}").json()["status"] == "cancelled"
    project.spawn_worker("fast")
    done = web.post("/jobs/noop?wait=10", json={}).json()
    assert done["status"] == "done"
    r = web.call("DELETE", f"/jobs/{done['id']}")
    assert r.status_code == 409, r.text
    assert web.call("DELETE", "/jobs/nope").status_code == 404
    cli = subprocess.run([sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"),
                          "cancel", done["id"]], env=project.env, capture_output=True, text=True, timeout=60)
    assert cli.returncode == 1 and "ended already" in cli.stdout, (cli.stdout, cli.stderr)


def test_runner_cancel_all_of_a_type_in_a_status(project: Project) -> None:
    """`runner cancel --all --type T --status queued` cancels every queued job of that
    type and no other; --status scheduled does the same for delayed ones."""
    from click.testing import CliRunner

    from runner.cli import cli

    client = project.client
    mine = [client.enqueue("record", {"n": i}).id for i in range(30)]
    other = [client.enqueue("noop", {"i": i}).id for i in range(5)]
    later = [client.enqueue("record", {"n": i}, delay=600).id for i in range(7)]
    base = ["--config", str(project.root / "runner.toml"), "cancel", "--all", "--type", "record"]
    out = CliRunner().invoke(cli, [*base, "--status", "queued"], env=project.env, catch_exceptions=False)
    assert out.exit_code == 0, out.output
    assert "cancelled 30 job(s)" in out.stdout
    out = CliRunner().invoke(cli, [*base, "--status", "scheduled"], env=project.env, catch_exceptions=False)
    assert out.exit_code == 0 and "cancelled 7 job(s)" in out.stdout, out.output
    assert {status(project, i) for i in mine + later} == {"cancelled"}
    assert {status(project, i) for i in other} == {"queued"}
    assert client.jobs("queued").jobs and {j.id for j in client.jobs("queued").jobs} == set(other)
    bare = CliRunner().invoke(cli, base[:3], env=project.env)  # `runner cancel` and nothing to cancel
    assert bare.exit_code == 2 and "give the ids of the jobs to cancel, or --all" in bare.output, bare.output
