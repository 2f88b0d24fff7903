"""Call and wait: a caller gets a job's end pushed to it (one subscriber per process),
over the Python client, HTTP (?wait=) and `runner call`."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import falcon.testing
import pytest
from test_web_support import Web, gunicorn

from runner import JobFailed, StillRunning
from runner.web import create_app

from conftest import Project, wait_for

TOKEN = "t0ken-for-tests"


def pubsub_clients(project: Project) -> int:
    """Connections of this server in pub/sub mode (CLIENT LIST flag P)."""
    return sum(1 for c in project.runtime.redis.client_list() if "P" in c["flags"])


@pytest.fixture
def web(project: Project) -> Iterator[Web]:
    project.write_config(extra="\n[api]\nmax_wait = 30\n")
    with gunicorn(project, token=TOKEN) as w:
        yield w


def test_call_returns_the_result_and_raises_for_a_dead_job(project: Project) -> None:
    """client.call enqueues and returns the handler's result as soon as it is done; a job
    that dies raises JobFailed with its error; a timeout first raises StillRunning."""
    project.spawn_worker("fast", "slow")
    client = project.client
    t0 = time.monotonic()
    assert client.call("noop", {"x": 1}, timeout=20) == {"x": 1}
    assert time.monotonic() - t0 < 10
    with pytest.raises(JobFailed) as failed:
        client.call("perm", {}, timeout=20)
    assert "can never succeed" in str(failed.value)
    with pytest.raises(StillRunning):
        client.call("slow", {"seconds": 5}, timeout=0.5)


def test_closing_a_runtime_after_a_call_returns_at_once(project: Project) -> None:
    """The waiter's subscriber blocks in a read of up to a second; closing the runtime
    wakes it instead of waiting that read out (`runner call` exited 1 s after its job)."""
    from runner.client import Client
    from runner.runtime import Runtime

    project.spawn_worker("fast")
    rt = Runtime.create(project.runtime.config)
    try:
        assert Client(rt).call("noop", {"x": 1}, timeout=20) == {"x": 1}
        listening = pubsub_clients(project)  # the worker's subscriber and this one's
    finally:
        t0 = time.monotonic()
        rt.close()
        took = time.monotonic() - t0
    assert took < 0.3, f"closing took {took:.2f} s"
    wait_for(lambda: pubsub_clients(project) == listening - 1, timeout=5, what="the subscriber's connection to close")


def test_post_wait_answers_200_with_the_end_or_202_after_the_wait(project: Project, web: Web) -> None:
    """POST /jobs/{type}?wait=5: a fast job answers 200 with its result, a job that dies
    answers 200 with status dead and its error; and with ?wait=2 a 10 s job answers the
    usual 202 with Location once the 2 s are up."""
    project.spawn_worker("fast", "slow")
    r = web.post("/jobs/noop?wait=5", json={"n": 1})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "done" and r.json()["result"] == {"n": 1}
    assert "waited" not in r.json()  # the waiters' mark is not a field of the job

    r = web.post("/jobs/perm?wait=5", json={})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "dead"
    assert "can never succeed" in r.json()["last_error"]["message"]

    t0 = time.monotonic()
    r = web.post("/jobs/slow?wait=2", json={"seconds": 10})
    took = time.monotonic() - t0
    assert r.status_code == 202, r.text
    assert 1.5 < took < 6, took
    assert r.headers["Location"] == f"/jobs/{r.json()['id']}"


def test_get_wait_answers_once_a_job_enqueued_without_waiting_ends(project: Project, web: Web) -> None:
    """GET /jobs/{id}?wait=S on a job enqueued plainly (no mark) still gets its end pushed:
    the wait marks the job (watch.lua) and answers as soon as it is done; a wait over
    api.max_wait is a 400."""
    r = web.post("/jobs/slow", json={"seconds": 1})
    job_id = r.json()["id"]
    assert web.get(f"/jobs/{job_id}?wait=31").status_code == 400
    project.spawn_worker("slow")
    t0 = time.monotonic()
    got = web.get(f"/jobs/{job_id}?wait=8")
    assert got.status_code == 200 and got.json()["status"] == "done", got.text
    assert time.monotonic() - t0 < 7
    assert got.json()["result"] == {"slept": 1}


def test_200_concurrent_waits_share_one_subscriber_connection(project: Project) -> None:
    """Two hundred waits at once in one process (asyncio tasks) cost one pub/sub
    connection, and each ends with its own job's result."""
    client = project.client
    before = pubsub_clients(project)

    async def many() -> list[Any]:
        jobs = [await client.aenqueue("noop", {"i": i}, waited=True) for i in range(200)]
        waits = [asyncio.ensure_future(client.aresult(j.id, timeout=60)) for j in jobs]
        await asyncio.sleep(0.5)  # every wait registered and subscribed before any job runs
        during.append(pubsub_clients(project))
        project.spawn_worker("fast")
        return list(await asyncio.gather(*waits))

    during: list[int] = []
    results = asyncio.run(many())
    assert results == [{"i": i} for i in range(200)]
    assert during == [before + 1]


def test_runner_call_exit_codes(project: Project) -> None:
    """`runner call TYPE JSON`: prints the result and exits 0 when done, exits 1 with the
    error when dead, 4 when still running at --timeout."""
    project.spawn_worker("fast", "slow")
    base = [sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"), "call"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*base, *args], env=project.env, capture_output=True, text=True, timeout=60)

    ok = run("noop", '{"a": 1}', "--timeout", "20")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == '{"a":1}' or ok.stdout.strip() == '{"a": 1}'
    dead = run("perm", "{}", "--timeout", "20")
    assert dead.returncode == 1, dead.stderr
    assert "can never succeed" in dead.stderr
    slow = run("slow", '{"seconds": 5}', "--timeout", "0.5")
    assert slow.returncode == 4, slow.stderr
    assert "still" in slow.stderr


def test_a_wait_across_a_redis_restart_still_ends_right(tmp_path: Any) -> None:
    """Redis restarts while a call waits: the subscriber reconnects, reads the job again,
    and the wait ends with the result rather than at its timeout."""
    from runner.store.embedded import Server

    from conftest import make_project

    with Server(tmp_path / "redis", appendonly=True) as own:
        project = make_project(tmp_path / "p", own)
        try:
            client = project.client
            job = client.enqueue("slow", {"seconds": 3}, waited=True)
            got: list[Any] = []
            import threading

            t = threading.Thread(target=lambda: got.append(client.settle(job.id, 40)))
            t.start()
            wait_for(lambda: pubsub_clients(project) == 1, what="the subscriber")
            project.spawn_worker("slow")
            wait_for(lambda: client.get(job.id).status == "processing", timeout=15, what="the job to start")
            own.restart()
            t.join(timeout=45)
            assert got and got[0].status == "done", got
            assert got[0].as_dict()["result"] == {"slept": 3}
        finally:
            project.stop_all()
            project.runtime.close()


def test_only_waited_jobs_are_published(project: Project) -> None:
    """The ack and bury scripts publish the ids of waited jobs alone: a job nobody waits
    for ends with no notice at all."""
    client = project.client
    ps = project.runtime.redis.pubsub()
    ps.subscribe(project.keys("fast").ended)
    wait_for(lambda: ps.get_message(timeout=0.1), what="the subscription")
    plain = [client.enqueue("noop", {"i": i}).id for i in range(20)]
    waited = client.enqueue("noop", {"w": 1}, waited=True).id
    dying = client.enqueue("perm", {}, waited=True).id
    project.spawn_worker("fast")
    heard: list[str] = []

    def both() -> bool:
        msg = ps.get_message(timeout=0.1)
        if msg and msg["type"] == "message":
            heard.extend(msg["data"].split())
        return {waited, dying} <= set(heard)

    wait_for(both, timeout=20, what="both notices")
    wait_for(lambda: all(client.get(i).status == "done" for i in plain), what="the plain jobs")
    assert not set(heard) & set(plain)
    ps.close()


def test_a_waited_retry_whose_first_job_was_trimmed_is_a_200_duplicate(project: Project) -> None:
    """A caller retries POST /jobs/{type}?wait= with the same Idempotency-Key after the
    first job's done record was trimmed (done_max on a busy queue) while the key is still
    remembered: the answer is the 200 duplicate a plain POST gets, not a 404."""
    toml = project.root / "runner.toml"
    toml.write_text(toml.read_text().replace("done = 3600\n", "done = 3600\ndone_max = 4\n"))
    project._runtime = None
    c = project.client
    web = falcon.testing.TestClient(create_app(project.runtime))
    project.spawn_worker("fast")
    headers = {"Idempotency-Key": "invoice-7"}
    first = web.simulate_post("/jobs/idem?wait=10", json={"k": "a"}, headers=headers)
    assert first.status_code == 200 and first.json["status"] == "done", first.text
    for i in range(12):  # other traffic on the queue trims the first job's record
        c.wait(c.enqueue("noop", {"i": i}).id, 10)
    retry = web.simulate_post("/jobs/idem?wait=10", json={"k": "a"}, headers=headers)
    assert retry.status_code == 200 and retry.json["id"] == first.json["id"], retry.text


def test_client_wait_is_pushed_not_polled(project: Project) -> None:
    """Client.wait is the pushed wait: over a second on a job nobody runs it reads the job
    a few times (after subscribing and marking it), not every few milliseconds, and it
    answers a job's end as soon as it is published."""
    client = project.client
    job = client.enqueue("slow", {"seconds": 0.2})
    client.wait(job.id, timeout_s=0.1)  # the subscriber started, the scripts loaded

    def script_calls() -> int:
        stats = project.runtime.redis.info("commandstats")
        return sum(int(v["calls"]) for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))

    before = script_calls()
    t0 = time.monotonic()
    got = client.wait(job.id, timeout_s=1.0)
    assert got.status == "queued" and time.monotonic() - t0 >= 1.0
    # A read is a lookup script per queue, the mark one more: a poll every 20 ms is hundreds.
    assert script_calls() - before <= 20, "the wait read the job over and over (a poll)"
    project.spawn_worker("slow")
    t0 = time.monotonic()
    assert client.wait(job.id, timeout_s=20).status == "done"
    assert time.monotonic() - t0 < 10
