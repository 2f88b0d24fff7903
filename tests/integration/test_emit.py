"""Events: an emit starts one job per subscribed function (TRIGGERS), written in one
atomic step on the event's home partition (the other queues' jobs through its outbox), or
nothing at all when any subscriber rejects the data."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import falcon.testing
import pytest

from runner.client.emitting import KEEP_EVENTS
from runner.errors import EventConflict, EventRejected, FunctionLoadError
from runner.web import create_app

from conftest import Project, structures, wait_for

SUB = '''
QUEUE = "{queue}"
TRIGGERS = ["order.created"]

def handle(payload, ctx):
    return payload
'''
ORDER = '{"type": "object", "required": ["order_id"], "properties": {"order_id": {"type": "integer"}}}'


def subscribe(project: Project, name: str, queue: str, schema: str = ORDER) -> None:
    project.add_function(name, textwrap.dedent(SUB.format(queue=queue)), schema)


def written(project: Project) -> dict[str, int]:
    """Jobs in the ready lists and outboxes of both queues, and events recorded."""
    r = project.runtime.redis
    out = {}
    for q in ("fast", "slow"):
        k = project.keys(q)
        out[q] = r.llen(k.ready)
        out[q + "_outbox"] = r.llen(k.outbox)
        out[q + "_events"] = r.llen(k.emitted)
    return out


def test_one_emit_starts_a_job_for_each_subscriber_on_both_queues(project: Project) -> None:
    for i, q in enumerate(["fast", "fast", "fast", "slow", "slow"]):
        subscribe(project, f"sub{i}", q)
    c = project.client
    out = c.emit("order.created", {"order_id": 7})
    assert not out.duplicate
    assert sorted((j["type"], j["queue"]) for j in out.jobs) == [
        ("sub0", "fast"), ("sub1", "fast"), ("sub2", "fast"), ("sub3", "slow"), ("sub4", "slow")]
    for j in out.jobs:
        assert c.get(j["id"]).as_dict()["payload"] == {"order_id": 7}
    assert written(project) == {"fast": 3, "fast_outbox": 0, "fast_events": 1, "slow": 2, "slow_outbox": 0,
                                "slow_events": 0}
    [listed] = c.events()
    assert listed["id"] == out.id and listed["name"] == "order.created" and listed["data"] == {"order_id": 7}
    assert sorted(j["id"] for j in listed["jobs"]) == sorted(j["id"] for j in out.jobs)


def test_a_rejected_emit_writes_nothing_and_names_every_function_and_error(project: Project) -> None:
    subscribe(project, "sub_a", "fast")
    subscribe(project, "sub_b", "slow", '{"type": "object", "required": ["order_id", "total"]}')
    subscribe(project, "sub_c", "slow", '{"type": "object"}')
    c = project.client
    with pytest.raises(EventRejected) as err:
        c.emit("order.created", {"order_id": "seven"})
    assert set(err.value.rejections) == {"sub_a", "sub_b"}
    paths = [e.path for e in err.value.errors]
    assert "sub_a:$.order_id" in paths and any(p.startswith("sub_b:") for p in paths)
    assert "nothing was enqueued" in str(err.value)
    assert written(project) == dict.fromkeys(written(project), 0)
    assert c.events() == []


def test_an_event_nobody_subscribes_to_is_recorded_with_no_jobs(project: Project) -> None:
    out = project.client.emit("nobody.listens", {"x": 1})
    assert out.jobs == []
    assert [e["id"] for e in project.client.events(name="nobody.listens")] == [out.id]


def test_an_idempotency_key_dedupes_the_whole_emit(project: Project) -> None:
    subscribe(project, "sub_a", "fast")
    subscribe(project, "sub_b", "slow")
    c = project.client
    first = c.emit("order.created", {"order_id": 1}, idempotency_key="o-1")
    again = c.emit("order.created", {"order_id": 1}, idempotency_key="o-1")
    assert again.duplicate and again.id == first.id and again.jobs == first.jobs
    assert written(project)["fast"] == 1 and written(project)["slow"] == 1
    with pytest.raises(EventConflict):
        c.emit("order.created", {"order_id": 2}, idempotency_key="o-1")
    assert written(project)["fast"] == 1 and written(project)["slow"] == 1


def test_metrics_count_the_events_and_the_jobs_they_started(project: Project) -> None:
    """/metrics counts, per home queue, the events accepted and the jobs they started in
    every queue: a duplicate emit adds nothing, an event nobody subscribes to is an event
    with no jobs."""
    subscribe(project, "sub_a", "fast")
    subscribe(project, "sub_b", "fast")
    subscribe(project, "sub_c", "slow")
    c = project.client
    c.emit("order.created", {"order_id": 1}, idempotency_key="o-1")
    c.emit("order.created", {"order_id": 1}, idempotency_key="o-1")  # a duplicate
    c.emit("order.created", {"order_id": 2})
    c.emit("nobody.listens", {"x": 1})
    text = falcon.testing.TestClient(create_app(project.runtime)).simulate_get("/metrics").text

    def counted(name: str) -> dict[str, float]:
        return {q: float(v) for q, v in re.findall(rf'^{name}{{queue="([^"]+)"}} (\S+)$', text, re.M)}

    home = project.runtime.registry.subscribers("order.created")[0].queue
    assert sum(counted("runner_events_emitted_total").values()) == 3  # the duplicate not counted
    # sub_c's job went to the other queue, through the outbox: counted on the event's home.
    assert counted("runner_events_jobs_total") == {"fast": 0.0, "slow": 0.0, home: 6.0}
    assert c.stats()[home]["counters"]["events_jobs"] == 6  # `runner stats` shows the same


def test_triggers_are_checked_at_load(project: Project) -> None:
    project.add_function("bad", "TRIGGERS = 'order.created'\ndef handle(p, ctx):\n    pass\n")
    errors = project.runtime.registry.errors
    [err] = [e for p, e in errors.items() if p.endswith("bad.py")]
    assert isinstance(err, FunctionLoadError) and "TRIGGERS must be a list of event names" in str(err)


KILLED_EMITTER = '''
import sys, time
from runner import Client
c = Client.from_config(sys.argv[1])
print("ready", flush=True)
n = 0
while True:
    c.emit("order.created", {"order_id": n})
    n += 1
    time.sleep(0.002)  # fewer events than a partition keeps (KEEP_EVENTS)
'''


def test_an_emit_killed_during_its_write_leaves_all_five_jobs_or_none(project: Project) -> None:
    """A producer SIGKILLed at a random point of a stream of emits (5 subscribers on 2
    queues): after the relay places what was left in the outbox, every event recorded
    has its 5 jobs and no job exists without its event."""
    for i, q in enumerate(["fast", "fast", "fast", "slow", "slow"]):
        subscribe(project, f"sub{i}", q)
    script = project.root / "emitter.py"
    script.write_text(KILLED_EMITTER)
    for delay in (0.3, 0.45, 0.6):
        proc = subprocess.Popen([sys.executable, str(script), str(project.root / "runner.toml")],
                                cwd=project.root, env=project.env, stdout=subprocess.PIPE)
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    # What a killed emitter left in the outbox is the relay's: a worker places it.
    worker = project.spawn_worker("fast", "slow")
    wait_for(lambda: written(project)["fast_outbox"] == 0, timeout=20, what="the outbox drained")
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=10)
    r = project.runtime.redis
    events = [json.loads(e) for e in r.lrange(project.keys("fast").emitted, 0, -1)]
    assert len(events) < KEEP_EVENTS
    assert events, "no emit landed before the kills"
    ids = {j["id"] for e in events for j in e["jobs"]}
    assert all(len(e["jobs"]) == 5 for e in events)
    # Every job of every event exists (run or waiting), and no job without its event.
    seen = set()
    for q in ("fast", "slow"):
        for lst in structures(project, q).values():
            seen.update(lst)
    assert len(ids) == 5 * len(events)
    assert seen == ids, ("jobs without their event", sorted(seen - ids), "or events without their jobs",
                         sorted(ids - seen))


def test_the_http_routes_emit_list_and_refuse(project: Project) -> None:
    """POST /events/{name}: 202 with the jobs, 200 for a duplicate key, 409 for its
    conflict, 422 naming each rejecting function (nothing written), 400 for a bad name;
    GET /events with Accept: application/json lists them; a token scoped to one event
    emits only that one."""
    project.write_config(extra='\n[api.tokens.orders]\nenv = "ORDERS_TOKEN"\nscopes = ["emit:order.created"]\n')
    subscribe(project, "sub_a", "fast")
    subscribe(project, "sub_b", "slow")
    os.environ["ORDERS_TOKEN"] = "orders-token-123"
    try:
        client = falcon.testing.TestClient(create_app(project.runtime))
        auth = {"Authorization": "Bearer orders-token-123"}
        keyed = {**auth, "Idempotency-Key": "o-9"}
        first = client.simulate_post("/events/order.created", json={"order_id": 9}, headers=keyed)
        assert first.status_code == 202, first.text
        assert sorted(j["type"] for j in first.json["jobs"]) == ["sub_a", "sub_b"]
        again = client.simulate_post("/events/order.created", json={"order_id": 9}, headers=keyed)
        assert again.status_code == 200 and again.json["id"] == first.json["id"] and again.json["duplicate"]
        clash = client.simulate_post("/events/order.created", json={"order_id": 10}, headers=keyed)
        assert clash.status_code == 409 and clash.json["event_id"] == first.json["id"]
        before = written(project)
        bad = client.simulate_post("/events/order.created", json={"order_id": "x"}, headers=auth)
        assert bad.status_code == 422, bad.text
        assert [f["function"] for f in bad.json["functions"]] == ["sub_a", "sub_b"]
        assert "nothing was enqueued" in bad.json["detail"]
        assert written(project) == before
        other = client.simulate_post("/events/order.paid", json={}, headers=auth)
        assert other.status_code == 403 and other.json["scope"] == "emit:order.paid"
        assert client.simulate_post("/events/bad name!", json={}, headers=auth).status_code in (400, 403)
        listed = client.simulate_get("/events", headers={**auth, "Accept": "application/json"})
        assert listed.status_code == 403  # listing needs read
    finally:
        del os.environ["ORDERS_TOKEN"]
    project.write_config()
    client = falcon.testing.TestClient(create_app(project.runtime))
    listed = client.simulate_get("/events", headers={"Accept": "application/json"}, params={"limit": "5"})
    assert listed.status_code == 200, listed.text
    assert [e["id"] for e in listed.json["events"]] == [first.json["id"]]
    assert client.simulate_post("/events/bad name!", json={}).status_code == 400
    doc = client.simulate_get("/openapi.json").json
    assert doc["paths"]["/events/order.created"]["post"]["x-runner-scope"] == "emit:order.created"


def test_the_cli_emits_and_lists(project: Project) -> None:
    subscribe(project, "sub_a", "fast")
    cfg = str(project.root / "runner.toml")
    base = [sys.executable, "-m", "runner.cli", "--config", cfg]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*base, *args], env=project.env, cwd=project.root, capture_output=True, text=True,
                              timeout=60)

    ok = run("emit", "order.created", '{"order_id": 3}', "--json")
    assert ok.returncode == 0, ok.stderr
    sent = json.loads(ok.stdout)
    assert [j["type"] for j in sent["jobs"]] == ["sub_a"]
    bad = run("emit", "order.created", '{"order_id": "three"}')
    assert bad.returncode != 0 and "sub_a v1 $.order_id" in bad.stderr and "nothing was enqueued" in bad.stderr
    listed = run("events", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [e["id"] for e in json.loads(listed.stdout)["events"]] == [sent["id"]]
    human = run("events")
    assert sent["id"] in human.stdout and "order.created" in human.stdout


def test_runner_check_fails_on_an_event_no_data_could_satisfy(project: Project) -> None:
    from runner.catalog import checks

    subscribe(project, "sub_a", "fast")
    subscribe(project, "sub_b", "slow", '{"type": "object", "required": ["order_id"], '
                                        '"properties": {"order_id": {"type": "string"}}}')
    report = checks.check_files(project.root / "runner.toml", env=project.env)
    [problem] = [p for p in report.errors() if "TRIGGERS" in p.message]
    assert "'order.created'" in problem.message and "'order_id'" in problem.message
    assert "sub_a" in problem.message and "sub_b" in problem.message
    subscribe(project, "sub_b", "slow", ORDER)
    assert not [p for p in checks.check_files(project.root / "runner.toml", env=project.env).errors()
                if "TRIGGERS" in p.message]


def test_a_reload_adds_and_removes_subscriptions_and_no_past_event_is_replayed(project: Project) -> None:
    """Subscribers are the functions loaded when an emit is made: a reload that swaps the
    registry changes who gets the next event, and a function added later gets none of
    the events before it."""
    from runner.catalog.registry import Registry

    subscribe(project, "sub_a", "fast")
    subscribe(project, "sub_b", "slow")
    rt = project.runtime
    c = project.client
    both = rt.registry
    rt.registry = Registry.of(both.get("sub_a"))
    early = c.emit("order.created", {"order_id": 1})
    assert [j["type"] for j in early.jobs] == ["sub_a"]
    rt.registry = both  # sub_b loaded: the next emit reaches it, the past one is not replayed
    later = c.emit("order.created", {"order_id": 2})
    assert sorted(j["type"] for j in later.jobs) == ["sub_a", "sub_b"]
    assert written(project)["slow"] == 1
    rt.registry = Registry.of(both.get("sub_b"))
    assert [j["type"] for j in c.emit("order.created", {"order_id": 3}).jobs] == ["sub_b"]


def _deep(levels: int) -> object:
    value: object = 1
    for _ in range(levels - 1):
        value = {"a": value}
    return {"a": value}


def test_big_or_deep_data_is_kept_whole_in_the_jobs_and_as_a_preview_in_the_record(project: Project) -> None:
    """The record of an event holds its data whole only when small: a 1 MiB event is a
    4 KiB preview in GET /events (its jobs hold it whole); data nested to the limit sits
    in its record whole (a record may go deeper than a payload), so the emit, its retry
    with the key and the listing all answer."""
    from runner.client.emitting import DATA_SHOWN_BYTES
    from runner.store import codec

    project.add_function("free", textwrap.dedent(SUB.format(queue="fast")), '{"type": "object"}')
    c = project.client
    big = {"blob": "é" * 400_000}
    out = c.emit("order.created", big)
    [job] = out.jobs
    assert c.get(job["id"]).as_dict()["payload"] == big
    deep = _deep(codec.MAX_DEPTH)
    first = c.emit("order.created", deep, idempotency_key="deep-1")
    again = c.emit("order.created", deep, idempotency_key="deep-1")
    assert again.duplicate and again.id == first.id and len(first.jobs) == 1
    listed = {e["id"]: e for e in c.events()}
    assert listed[out.id]["data"] is None and listed[out.id]["truncated"] == {"data": len(codec.dumps(big).encode())}
    assert len(listed[out.id]["data_preview"].encode()) <= DATA_SHOWN_BYTES
    assert listed[out.id]["data_preview"].startswith('{"blob":"éé')
    assert listed[first.id]["data"] == deep  # within the limit: its record holds it whole
    r = project.runtime.redis
    k = project.keys("fast")
    assert sum(len(x) for x in r.lrange(k.emitted, 0, -1)) < 4 * DATA_SHOWN_BYTES
    assert 0 < r.pttl(k.emitted) <= 86_400_000


def test_an_emits_key_still_dedupes_after_a_deploy_moves_its_home(project: Project) -> None:
    """The home partition follows the first subscriber by name: a deploy adding one that
    sorts first, on another queue, moves it. A producer's retry of the same key after that
    deploy is still a duplicate, and a retry with other data a conflict."""
    subscribe(project, "sub_m", "fast")
    c = project.client
    first = c.emit("order.created", {"order_id": 1}, idempotency_key="k-1")
    subscribe(project, "sub_a", "slow")  # sorts first: the home is now the slow queue's
    c = project.client
    again = c.emit("order.created", {"order_id": 1}, idempotency_key="k-1")
    assert again.duplicate and again.id == first.id
    with pytest.raises(EventConflict):
        c.emit("order.created", {"order_id": 2}, idempotency_key="k-1")
    assert written(project)["fast"] == 1 and written(project)["slow"] == 0


def test_a_subscriber_whose_file_fails_to_load_refuses_the_emit(project: Project) -> None:
    """A function file that subscribes but fails to load is not left out silently: the
    emit is refused naming it and saying to fix it, and nothing is written."""
    subscribe(project, "sub_ok", "fast")
    (project.root / "functions" / "sub_broken.py").write_text(
        'QUEUE = "slow"\nTRIGGERS = [\n    "order.created",\n]\nimport not_a_module_here\n\n'
        'def handle(payload, ctx):\n    return 1\n')
    project.write_config()
    c = project.client
    with pytest.raises(EventRejected) as err:
        c.emit("order.created", {"order_id": 3})
    assert set(err.value.rejections) == {"sub_broken"}
    assert "failed to load" in str(err.value) and "fix it" in str(err.value)
    assert written(project) == dict.fromkeys(written(project), 0)
    assert c.emit("other.event", {}).jobs == []  # an event it does not name is not refused


def test_data_past_the_nesting_limit_is_refused_with_no_subscriber_too(project: Project) -> None:
    """An event's data is held to the payload limit whoever subscribes: its waiters
    (ctx.wait_for_event) read it inside a record of their own."""
    from runner.errors import ValidationFailed
    from runner.store import codec

    c = project.client
    with pytest.raises(ValidationFailed, match=f"limit of {codec.MAX_DEPTH} levels"):
        c.emit("nobody.listens", _deep(codec.MAX_DEPTH + 1))
    assert c.emit("nobody.listens", _deep(codec.MAX_DEPTH)).jobs == []


def test_an_emit_deduplicated_away_by_its_jobs_key_names_the_job_that_holds_it(project: Project) -> None:
    """A subscriber with an IDEMPOTENCY_KEY on a partitioned queue: an emit whose job goes
    to another partition, where an enqueue of the same key stands, names that job (the one
    that runs) in its answer and in its record (client.events, GET /events), never an id
    that reads as unknown; one written on the home partition does too."""
    from runner.store.routing import partition_of

    project.write_config(fast="partitions = 4")
    project.add_function("pay", textwrap.dedent(SUB.format(queue="fast")).replace(
        'TRIGGERS', 'IDEMPOTENCY_KEY = "{order_id}"\nTRIGGERS'), ORDER)
    c = project.client
    home = project.runtime.keys["fast"].partition
    away = next(o for o in range(100, 200) if partition_of(f"i:pay:{o}", 4) != home)
    here = next(o for o in range(100, 200) if partition_of(f"i:pay:{o}", 4) == home)
    for order in (away, here):
        first = c.enqueue("pay", {"order_id": order}).id
        emitted = c.emit("order.created", {"order_id": order}).as_dict()
        assert [j["id"] for j in emitted["jobs"]] == [first], (order, emitted)
        [event] = [e for e in c.events(name="order.created") if e["id"] == emitted["id"]]
        assert [j["id"] for j in event["jobs"]] == [first], (order, event)
        assert c.get(first).as_dict()["payload"] == {"order_id": order}
    http = falcon.testing.TestClient(create_app(project.runtime))
    listed = http.simulate_get("/events", headers={"Accept": "application/json"}).json
    named = {j["id"] for e in listed["events"] for j in e["jobs"]}
    assert len(named) == 2 and all(http.simulate_get(f"/jobs/{i}").status_code == 200 for i in named), listed
