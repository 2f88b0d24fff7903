"""ctx.wait_for_event through real workers, under both isolations: a waiting job holds no
slot and resumes with the first matching event emitted after its wait began (by the
client, over HTTP or from the CLI); a non-matching event, or one emitted before the wait,
does not resume it; a timeout returns None; a cancel takes its waiter off the registry;
the relay tells the waiters an emitter left; a partitioned queue works."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
import requests
from durable_helpers import ISOLATION_IDS, ISOLATIONS, ORDER_PAID_WAITER, registered, runs, until_waiting
from test_web_support import runner_web

from runner.store.embedded import Server

from conftest import Project, assert_no_job_in_two_structures, structures, wait_for, worker_project


@pytest.fixture(scope="module")
def waiting(tmp_path_factory: pytest.TempPathFactory, server: Server) -> Iterator[Project]:
    """One project and worker (fast queue) for the tests of one job's wait in either
    isolation: the waiter as ``waiter_thread`` and ``waiter_process``, there before the
    worker starts. Each test's job is alone in the registry while it runs (the tests of
    a process run one after the other, and each one's job ends before the next starts). A
    worker per test, and a first child for each process test, was most of their time."""
    functions = {f"waiter_{name}": ORDER_PAID_WAITER.format(isolation=isolation)
                 for isolation, name in zip(ISOLATIONS, ISOLATION_IDS, strict=True)}
    with worker_project(tmp_path_factory.mktemp("waiting") / "project", server, functions, concurrency=2) as project:
        yield project


@pytest.mark.parametrize("isolation", ISOLATION_IDS)
def test_a_matching_emit_resumes_the_waiting_job_with_the_event(waiting: Project, isolation: str) -> None:
    """The job waits (status waiting, in scheduled alone, its view and `runner job` naming
    the event and match); an emit of another order does not resume it; the matching emit
    does (nobody subscribes to the event: waiters are told all the same), and the wait
    returns {id, name, data, ts}; each step ran once; the registry is empty after."""
    project = waiting
    c = project.client
    job = c.enqueue(f"waiter_{isolation}", {"order_id": 7}).id
    until_waiting(c, job)
    view = c.get(job).as_dict()
    assert view["waiting_for"]["event"] == "order.paid" and view["waiting_for"]["match"] == {"order_id": 7}, view
    assert [(s["name"], s["kind"], s["status"]) for s in view["steps"]] == [
        ("before", "step", "ok"), ("order.paid", "event", "waiting")]
    assert job in structures(project)["scheduled"]
    assert_no_job_in_two_structures(project)
    assert registered(project) == 1
    shown = subprocess.run([sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"), "job",
                            job], env=project.env, capture_output=True, text=True, timeout=60)
    assert "2. order.paid (event) waiting" in shown.stdout and 'matching {"order_id":7}' in shown.stdout, shown
    assert '"event":"order.paid","match":{"order_id":7}' in shown.stdout, shown  # waiting_for
    c.emit("order.paid", {"order_id": 8, "amount": 1})
    c.emit("order.paid", {"order_id": "7"})  # a string is not the number 7
    c.emit("order.shipped", {"order_id": 7})
    assert c.get(job).status == "waiting"
    out = c.emit("order.paid", {"order_id": 7.0, "amount": 12})  # 7.0 is 7
    done = c.wait(job, 30).as_dict()
    assert done["status"] == "done", done
    event = done["result"]["event"]
    assert event["id"] == out.id and event["name"] == "order.paid" and event["data"] == {"order_id": 7.0,
                                                                                          "amount": 12}
    assert isinstance(event["ts"], int) and event["ts"] == out.at_ms
    assert len(runs(project, job, "before")) == 1 and len(runs(project, job, "after")) == 1
    assert registered(project) == 0
    listed = [e for e in c.events(name="order.paid") if e["id"] == out.id]
    assert listed and listed[0]["waiters_resumed"] == 1, listed


@pytest.mark.parametrize("isolation", ISOLATION_IDS)
def test_an_emit_before_the_wait_does_not_count_and_a_timeout_returns_none(waiting: Project,
                                                                          isolation: str) -> None:
    """An event emitted while the job sleeps before its wait is not delivered to that wait
    (Inngest's rule: only events after the wait began); the wait times out and returns
    None, and its waiter leaves the registry."""
    project = waiting
    c = project.client
    job = c.enqueue(f"waiter_{isolation}", {"order_id": 1, "nap": 1.5, "timeout": 1.5}).id
    wait_for(lambda: c.get(job).status == "sleeping", timeout=30, what="the job to sleep")
    c.emit("order.paid", {"order_id": 1})
    done = c.wait(job, 30).as_dict()
    assert done["status"] == "done" and done["result"] == {"event": None}, done
    assert registered(project) == 0


def test_run_inline_answers_waits_for_events(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """run_inline's ``events={name: data}`` gives a wait its event when the data holds
    its match, else None (as on a timeout); the step log records the wait."""
    from runner.testing import run_inline

    monkeypatch.setenv("RECORD_DIR", str(project.records))
    project.add_function("waiter", ORDER_PAID_WAITER.format(isolation=""))
    out = run_inline("waiter", {"order_id": 3}, project=project.root, events={"order.paid": {"order_id": 3, "x": 1}})
    assert out.status == "done" and out.result["event"]["data"] == {"order_id": 3, "x": 1}, out
    assert out.result["event"]["name"] == "order.paid"
    miss = run_inline("waiter", {"order_id": 3}, project=project.root, events={"order.paid": {"order_id": 4}})
    assert miss.status == "done" and miss.result == {"event": None}, miss
    assert [s["kind"] for s in miss.steps] == ["step", "event", "step"]
    assert run_inline("waiter", {"order_id": 3}, project=project.root).result == {"event": None}


def test_emits_over_http_and_the_cli_deliver_and_a_cancel_takes_the_waiter_off(project: Project) -> None:
    """POST /events/{name} and `runner emit` resume their waiters as the client does;
    GET /events counts the waiters each event resumed; a cancelled waiting job leaves the
    registry at once, and a later emit does not bring it back."""
    project.add_function("waiter", ORDER_PAID_WAITER.format(isolation=""))
    c = project.client
    project.spawn_worker("fast")
    auth = {"Authorization": "Bearer t"}
    one, two, three = (c.enqueue("waiter", {"order_id": n}).id for n in (1, 2, 3))
    for j in (one, two, three):
        until_waiting(c, j)
    with runner_web(project, "web", workers=1) as web:
        r = requests.post(f"{web.url}/events/order.paid", json={"order_id": 1}, headers=auth, timeout=10)
        assert r.status_code == 202, r.text
        assert c.wait(one, 30).as_dict()["result"]["event"]["data"] == {"order_id": 1}
        listed = requests.get(f"{web.url}/events", headers={**auth, "Accept": "application/json"},
                              timeout=10).json()["events"]
        assert [e["waiters_resumed"] for e in listed if e["id"] == r.json()["id"]] == [1], listed
    cli = [sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"), "emit"]
    out = subprocess.run([*cli, "order.paid", '{"order_id": 2}'], env=project.env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out
    assert c.wait(two, 30).as_dict()["result"]["event"]["data"] == {"order_id": 2}
    assert registered(project) == 1
    assert c.cancel(three) == "cancelled"
    assert registered(project) == 0
    c.emit("order.paid", {"order_id": 3})
    assert c.get(three).status == "cancelled"
    assert_no_job_in_two_structures(project)


def test_the_relay_tells_the_waiters_an_emitter_left(project: Project) -> None:
    """An event whose emitter told nobody (it died after its write: here the entry is put
    back on the wakes list) is delivered by a worker's relay within a few seconds."""
    project.add_function("waiter", ORDER_PAID_WAITER.format(isolation=""))
    c = project.client
    project.spawn_worker("fast")
    job = c.enqueue("waiter", {"order_id": 5}).id
    until_waiting(c, job)
    rt = c.runtime
    k = rt.keys["fast"]
    # The emit's own step, without its emitter's telling: the script alone.
    from runner.store import records

    reply = rt.scripts.emit(k, [], event_id=records.new_id(), name="order.paid", data='"data":{"order_id":5}',
                            whole='{"order_id":5}', idem_key="", data_hash="", idem_ms=1000, keep=10, away="[]",
                            entries=[])
    assert rt.redis.llen(k.wakes) == 1 and str(reply[-1]).startswith('{"id":')
    done = c.wait(job, 30).as_dict()
    assert done["result"]["event"]["data"] == {"order_id": 5}, done
    wait_for(lambda: rt.redis.llen(k.wakes) == 0, timeout=10, what="the relay to take the entry off")


@pytest.mark.parametrize("partitions", [2, 4])
def test_waits_on_a_partitioned_queue(project: Project, partitions: int) -> None:
    """partitions = 2 and 4: waiters in every partition are told by one emit each, two
    waiters of one match by the same emit, with its data whole however big."""
    project.write_config(fast=f"partitions = {partitions}")
    project.add_function("waiter", ORDER_PAID_WAITER.format(isolation=""))
    c = project.client
    project.spawn_worker("fast")
    jobs = {n: c.enqueue("waiter", {"order_id": n}).id for n in range(9)}
    rt = c.runtime
    for j in jobs.values():
        until_waiting(c, j)
    assert len({next(k.tag for k in rt.parts["fast"] if rt.redis.exists(k.job(j))) for j in jobs.values()}) > 1
    shared = c.enqueue("waiter", {"order_id": 100}).id
    also = c.enqueue("waiter", {"order_id": 100}).id
    until_waiting(c, shared)
    until_waiting(c, also)
    for n in jobs:
        c.emit("order.paid", {"order_id": n})
    big = {"order_id": 100, "blob": "x" * 10_000}  # (the event's record keeps a preview; waiters get it whole)
    c.emit("order.paid", big)
    for n, j in jobs.items():
        assert c.wait(j, 30).as_dict()["result"]["event"]["data"] == {"order_id": n}
    for j in (shared, also):
        assert c.wait(j, 30).as_dict()["result"]["event"]["data"] == big
    assert registered(project) == 0
