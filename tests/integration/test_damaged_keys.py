"""Keys of another Redis type (another program's write, or damage) outside a queue's own
sets: a job's log and stream, the workers' roster, the two audit trails and a
partition's recent events. A reader never fails on one: it answers with what it can
read and names the damaged key and what to do (``damaged_keys``), and `runner logs`,
`runner workers` and `runner events` say so without a traceback. The next writer of
the key sets it aside as ``<key>:corrupt``, as the reclaim does a queue's own keys, and
goes on: the job's log and stream go on, the roster lists the workers again, an
operator's action is answered and audited, an event is recorded."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from test_web_support import Web, gunicorn

from runner.store import keys

from conftest import Project, wait_for

TOKEN = "damage-t0ken"

CHATTY = '''"""Logs a line and streams a chunk ``n`` times, ``every`` seconds."""
import time

QUEUE = "fast"
TIMEOUT = 15

def handle(payload, ctx):
    for i in range(payload.get("n", 1)):
        ctx.logger.info("line %d", i)
        ctx.stream(f"chunk {i}")
        time.sleep(payload.get("every", 0))
    return {"ok": True}
'''

HEARD = '''"""Runs for each "order.made" event."""
QUEUE = "fast"
TRIGGERS = ["order.made"]

def handle(payload, ctx):
    return payload
'''


@pytest.fixture
def web(project: Project) -> Iterator[Web]:
    project.add_function("chatty", CHATTY)
    project.add_function("heard", HEARD)
    project.write_config()
    with gunicorn(project, token=TOKEN) as w:
        yield w


def _cli(project: Project, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"), *args],
                          env=project.env, capture_output=True, text=True, timeout=60)


def _damaged(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["key"]: d for d in body.get("damaged_keys", [])}


def _clobber(r: Any, key: str, kind: str) -> None:
    """``key`` made another Redis type than runner's, as another program would."""
    r.delete(key)
    if kind == "string":
        r.set(key, "garbage")
    else:
        r.hset(key, "x", "y")


def test_a_jobs_log_or_stream_of_another_type_reads_as_damaged_and_says_what_to_do(
        project: Project, web: Web) -> None:
    """A done job whose log key another program made a hash and whose stream key a
    string: GET /jobs/{id}/logs (and ?follow=1) and /stream answer 200 (they were a 500
    for good) with no line or chunk, naming the key and what to do; `runner logs` names
    it too, with no traceback."""
    project.spawn_worker()
    c, r, k = project.client, project.runtime.redis, project.keys()
    job = c.enqueue("chatty", {"n": 2}).id
    wait_for(lambda: c.get(job).status == "done", timeout=30, what="the job to end")
    assert len(c.logs(job)["lines"]) == 2
    _clobber(r, k.log(job), "hash")
    _clobber(r, k.stream(job), "string")

    got = web.get(f"/jobs/{job}/logs")
    assert got.status_code == 200, (got.status_code, got.text[:500])
    body = got.json()
    assert body["status"] == "done" and body["lines"] == []
    note = _damaged(body)[k.log(job)]
    assert note["type"] == "hash" and "DEL" in note["detail"] and k.log(job) in note["detail"], note
    follow = web.get(f"/jobs/{job}/logs?follow=1")
    assert follow.status_code == 200 and "event: end" in follow.text, (follow.status_code, follow.text[:500])
    assert "event: damaged" in follow.text and k.log(job) in follow.text, follow.text[:500]
    stream = web.get(f"/jobs/{job}/stream")
    assert stream.status_code == 200 and "event: end" in stream.text, (stream.status_code, stream.text[:500])
    assert "event: damaged" in stream.text and k.stream(job) in stream.text, stream.text[:500]
    assert "event: chunk" not in stream.text

    cli = _cli(project, "logs", job)
    assert "Traceback" not in cli.stderr and cli.returncode == 1, (cli.returncode, cli.stderr[-800:])
    assert k.log(job) in cli.stderr and "DEL" in cli.stderr, cli.stderr
    as_json = _cli(project, "logs", job, "--json")
    assert as_json.returncode == 1 and "Traceback" not in as_json.stderr, as_json.stderr[-800:]
    assert k.log(job) in _damaged(json.loads(as_json.stdout.splitlines()[0])), as_json.stdout
    # Left as they are: a reader writes nothing.
    assert r.type(k.log(job)) == "hash" and r.type(k.stream(job)) == "string"


def test_the_next_write_of_a_running_jobs_log_or_stream_sets_the_damaged_key_aside(
        project: Project, web: Web) -> None:
    """A job logs and streams for seconds; another program makes its log a hash and its
    stream a string while it runs. The run's next write renames each aside to
    <key>:corrupt (kept as it was) and goes on: the log and stream hold the lines and
    chunks written after it, and the job ends done (before, every write failed and
    the rest of the run's log was lost)."""
    project.spawn_worker()
    c, r, k = project.client, project.runtime.redis, project.keys()
    job = c.enqueue("chatty", {"n": 60, "every": 0.05}).id
    wait_for(lambda: len(c.logs(job)["lines"]) >= 2, timeout=30, what="the job's first lines")
    _clobber(r, k.log(job), "hash")
    _clobber(r, k.stream(job), "string")
    wait_for(lambda: c.get(job).status == "done", timeout=30, what="the job to end")
    assert r.hgetall(k.log(job) + ":corrupt") == {"x": "y"}
    assert r.get(k.stream(job) + ":corrupt") == "garbage"
    lines = [line["msg"] for line in c.logs(job)["lines"]]
    assert lines and lines[-1] == "line 59", lines[-5:]
    chunks = [json.loads(x)["data"] for x in r.lrange(k.stream(job), 0, -1)]
    assert chunks and chunks[-1] == "chunk 59", chunks[-5:]
    got = web.get(f"/jobs/{job}/logs").json()
    assert "damaged_keys" not in got and got["lines"][-1]["msg"] == "line 59"


def test_a_roster_of_another_type_reads_as_damaged_and_a_heartbeat_sets_it_aside(
        project: Project, web: Web) -> None:
    """The workers' roster made a string: GET /workers answers 200 naming it (it was a
    500), and so does `runner workers`; a worker's next heartbeat renames it aside and
    writes its entry, so the worker is listed again."""
    r = project.runtime.redis
    roster = f"{project.prefix}:workers"
    _clobber(r, roster, "string")
    got = web.get("/workers")
    assert got.status_code == 200, (got.status_code, got.text[:500])
    assert got.json()["workers"] == [] and _damaged(got.json())[roster]["type"] == "string", got.json()
    cli = _cli(project, "workers")
    assert "Traceback" not in cli.stderr and roster in cli.stderr, (cli.returncode, cli.stderr[-800:])
    project.spawn_worker(env={"RUNNER_TEST_ROSTER": "0.2,5"})
    wait_for(lambda: len(web.get("/workers").json()["workers"]) == 1, timeout=30, what="the worker listed")
    assert r.get(roster + ":corrupt") == "garbage"
    assert "damaged_keys" not in web.get("/workers").json()


def test_an_audit_trail_of_another_type_reads_as_damaged_and_the_next_action_is_audited(
        project: Project, web: Web) -> None:
    """The audit trail made a string and the pauses' trail a hash: GET /audit (by cursor
    and by offset) answers 200 naming both; a pause and a cancel are answered 200 and
    are on the trail (each was a 500, the action done yet not audited), the damaged
    trails set aside."""
    r = project.runtime.redis
    trail = keys.audit(project.prefix)
    flow = keys.audit_flow(project.prefix)
    _clobber(r, trail, "string")
    _clobber(r, flow, "hash")
    for query in ("", "?offset=1"):
        got = web.get(f"/audit{query}")
        assert got.status_code == 200, (query, got.status_code, got.text[:500])
        assert got.json()["entries"] == [] and set(_damaged(got.json())) == {trail, flow}, got.json()
    paused = web.post("/queues/fast/pause")
    assert paused.status_code == 200, (paused.status_code, paused.text[:500])
    job = project.client.enqueue("chatty", {}, delay=3600).id
    cancelled = web.call("DELETE", f"/jobs/{job}")
    assert cancelled.status_code == 200, (cancelled.status_code, cancelled.text[:500])
    got = web.get("/audit").json()
    assert [e["action"] for e in got["entries"]] == ["cancel", "pause"] and "damaged_keys" not in got, got
    assert r.get(trail + ":corrupt") == "garbage" and r.hgetall(flow + ":corrupt") == {"x": "y"}


def test_a_partitions_events_of_another_type_read_as_damaged_and_the_next_emit_is_recorded(
        project: Project, web: Web) -> None:
    """A queue's recent events made a hash: GET /events answers 200 naming it (a 500
    before), `runner events` too; the next emit is accepted whole (its job written once)
    and recorded, the damaged list set aside."""
    r, k = project.runtime.redis, project.keys()
    _clobber(r, k.emitted, "hash")
    got = web.get("/events", headers={"Accept": "application/json"})
    assert got.status_code == 200, (got.status_code, got.text[:500])
    assert got.json()["events"] == [] and k.emitted in _damaged(got.json()), got.json()
    cli = _cli(project, "events")
    assert "Traceback" not in cli.stderr and k.emitted in cli.stderr, (cli.returncode, cli.stderr[-800:])
    emitted = web.post("/events/order.made", json={"n": 1})
    assert emitted.status_code == 202, (emitted.status_code, emitted.text[:500])
    (job,) = emitted.json()["jobs"]
    assert r.llen(k.ready) == 1 and r.lrange(k.ready, 0, -1) == [job["id"]]
    got = web.get("/events", headers={"Accept": "application/json"}).json()
    assert [e["id"] for e in got["events"]] == [emitted.json()["id"]] and "damaged_keys" not in got, got
    assert r.hgetall(k.emitted + ":corrupt") == {"x": "y"}
