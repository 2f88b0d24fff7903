"""Records another writer put in Redis are trusted with nothing: a count a view expands
(a durable function's steps) or shows (attempt, deferrals, a time) out of its range reads
as damaged, and a log line or a stream chunk nested past every limit reads as a damaged
line; every view of such a job answers, small, and `runner logs` prints it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from test_web_support import Web, gunicorn

from runner.store import records

from conftest import Project

TOKEN = "foreign-t0ken"
DEEP = "[" * 3000 + "]" * 3000  # 6 KB of valid JSON, past every decoder's recursion


@pytest.fixture
def web(project: Project) -> Iterator[Web]:
    with gunicorn(project, token=TOKEN) as w:
        yield w


def _plant_dead(project: Project, job_id: str, **state: str) -> None:
    r, k = project.runtime.redis, project.keys()
    r.set(k.job(job_id), records.encode({"type": "record", "version": 1, "payload": "{}", "max_attempts": 3}))
    r.hset(k.state(job_id), mapping={"status": "dead", "reason": "permanent failure", **state})
    r.zadd(k.dead, {job_id: 1})


def test_counts_out_of_range_read_as_damaged_not_expanded(project: Project, web: Web) -> None:
    """steps=1000000 (7 bytes) made each view build a million step entries (48 MB for one
    job); a 30-digit attempt could not be encoded at all. Each view is now small and names
    the damaged fields; the step log shows one unreadable step."""
    _plant_dead(project, "huge1", steps="1000000", attempt="1" * 30, deferrals="-3", started_ms="9" * 40)
    for path in ("/jobs/huge1", "/dead/fast?limit=1", "/jobs?queue=fast&status=dead&limit=1"):
        got = web.get(path)
        assert got.status_code == 200, (path, got.status_code, got.text[:300])
        assert len(got.content) < 20_000, (path, len(got.content))
    view = web.get("/jobs/huge1").json()
    assert view["steps"] == [records.DAMAGED_STEP]
    assert sorted(view["damaged"]) == ["attempt", "deferrals", "started_ms", "steps"], view["damaged"]
    assert (view["attempt"], view["deferrals"], view["started_at"]) == (0, 0, None)
    listed = web.get("/dead/fast?limit=1").json()["jobs"][0]
    assert listed["steps"] == [records.DAMAGED_STEP] and "steps" in listed["damaged"]


def test_a_count_in_range_is_shown_as_it_is(project: Project) -> None:
    _plant_dead(project, "fine1", steps="1", attempt="2", deferrals="4",
                **{"step:0": '{"name":"a","kind":"step","status":"done"}'})
    view = project.client.get("fine1").as_dict()
    assert (view["attempt"], view["deferrals"], [s["name"] for s in view["steps"]]) == (2, 4, ["a"])
    assert "damaged" not in view


def test_a_log_line_or_chunk_nested_past_every_limit_renders(project: Project, web: Web) -> None:
    """json.loads raised RecursionError on such an entry: /logs, ?follow=1 and /stream
    answered 500 and `runner logs` printed a traceback. It reads as a damaged line."""
    _plant_dead(project, "deep1")
    r, k = project.runtime.redis, project.keys()
    r.rpush(k.log("deep1"), '{"ts":1,"level":"INFO","src":"log","msg":"before"}',
            '{"ts":1,"level":"INFO","src":"log","msg":' + DEEP + "}")
    r.rpush(k.stream("deep1"), '{"a":1,"i":0,"ts":1,"data":"fine"}', '{"a":1,"i":1,"ts":1,"data":' + DEEP + "}")
    for path in ("/jobs/deep1/logs", "/jobs/deep1/logs?follow=1", "/jobs/deep1/stream"):
        got = web.get(path)
        assert got.status_code == 200, (path, got.status_code, got.text[:300])
    lines = web.get("/jobs/deep1/logs").json()["lines"]
    assert lines[0]["msg"] == "before" and lines[1]["msg"].startswith('{"ts":1'), lines[1]["msg"][:80]
    cli = subprocess.run([sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"),
                          "logs", "deep1"], env=project.env, capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0 and "Traceback" not in cli.stderr, cli.stderr[-600:]
    assert "before" in cli.stdout


# --- times and shapes out of range in every kind of record -----------------------------------

FOREIGN_JOB = "foreign1"
FOREIGN_GROUP = "gdam"
FOREIGN_WORKER = "foreign-w"
HUGE_MS = 10**17  # the year 3,170,843
HUGE = 1e300


def plant_foreign(project: Project) -> None:
    """Records another writer put in Redis, each valid JSON with times and shapes out of
    range: a dead job (history, meta, error, progress, a log line), a worker's roster
    entry, four event records, an audit entry and a group whose then-job is unreadable.
    (The dashboard's test plants them too.)"""
    import json

    from runner.store import keys, roster

    r, k = project.runtime.redis, project.keys()
    meta = {"x_at": HUGE, "lease_expires_at": HUGE, "sleeping_until": HUGE, "steps": "abc", "waiting_for": 7}
    r.set(k.job(FOREIGN_JOB), records.encode({"type": "record", "version": 1, "payload": "{}", "max_attempts": 3,
                                              "meta": json.dumps(meta)}))
    r.hset(k.state(FOREIGN_JOB), mapping={
        "status": "dead", "reason": "permanent failure", "attempt": "1",
        "history": f'{{"attempt":1,"outcome":"failed","at_ms":{HUGE_MS}}},{{"attempt":2,"outcome":"failed",'
                   f'"foo_at":{HUGE},"started_ms":{HUGE}}}',
        "error": '{"type":{"a":1},"message":[1,2],"traceback":5}',
        "progress": '{"percent":"x","message":{"a":1}}'})
    r.zadd(k.dead, {FOREIGN_JOB: 1})
    r.rpush(k.log(FOREIGN_JOB), f'{{"ts":{HUGE},"level":"INFO","src":"log","msg":"far"}}',
            '{"ts":"soon","level":"INFO","src":"log","msg":{"an":"object"}}')
    now = roster.server_ms(r)
    r.hset(roster.key(project.prefix), FOREIGN_WORKER, json.dumps({
        "id": FOREIGN_WORKER, "host": "elsewhere", "pid": 1, "queues": ["fast"], "functions": {"noop": 1},
        "started_ms": HUGE, "seen_ms": now + 60_000, "running": [["x", "noop", HUGE]], "ttl_ms": 600_000}))
    event = {"id": "foreign-ev", "name": "order.created", "at_ms": now, "data": {"o": 1},
             "jobs": [{"id": "j1", "type": "noop", "status": "queued", "queue": "fast"}]}
    for change in ({"at_ms": "soon"}, {"at_ms": HUGE_MS}, {"jobs": "abc"}, {"jobs": [None]}):
        r.lpush(k.emitted, json.dumps({**event, **change}))
    # (an entry whose ids and names are no text: its page shows them as JSON, not "[object Object]")
    r.lpush(keys.audit(project.prefix), json.dumps({"by": "ops", "action": "cancel", "queue": {"q": 1},
                                                    "function": {"f": 1}, "job_id": {"a": 1}, "ids": 5,
                                                    "at_ms": now, "repeats": "many"}))
    r.lpush(keys.audit(project.prefix), json.dumps({"by": "ops", "action": "requeue", "queue": "fast",
                                                    "job_id": "x", "at_ms": HUGE_MS, "repeats": 2,
                                                    "last_at_ms": HUGE_MS}))
    r.hset(k.group(FOREIGN_GROUP), mapping={"then": '{"a": [', "total": "1", "done": "0", "sealed": "1",
                                            "created_ms": str(now)})


def _in_range(seconds: object) -> bool:
    return seconds is None or (isinstance(seconds, int | float) and 0 < seconds <= records.MAX_TIME_MS / 1000)


def test_times_and_shapes_out_of_range_reach_no_view(project: Project, web: Web) -> None:
    """Every view hands on only bounded, well-typed fields of a foreign record: an event
    whose at_ms is a string made GET /events answer 500 and `runner events` print a
    traceback (the sort compared str with int); times past the year 9999 in a history
    entry, a meta key, a log line, a roster entry, an event or an audit entry reached the
    dashboard (which threw on them) and made `runner job`, `runner workers` and `runner
    events` print tracebacks (ValueError, OverflowError, AttributeError on jobs=[null]).
    Such a time is shown as absent and named in the view's "damaged"."""
    plant_foreign(project)
    paths = [f"/jobs/{FOREIGN_JOB}", f"/jobs/{FOREIGN_JOB}/logs", "/dead/fast", "/workers", "/events?limit=100",
             "/audit", f"/groups/{FOREIGN_GROUP}"]
    got = {}
    for path in paths:
        answer = web.get(path, headers={"Accept": "application/json"})
        assert answer.status_code == 200, (path, answer.status_code, answer.text[:300])
        got[path] = answer.json()

    job = got[f"/jobs/{FOREIGN_JOB}"]
    assert [h.get("at_ms") for h in job["history"]] == [None, None], job["history"]
    assert job["history"][1]["foo_at"] is None and job["history"][1]["started_ms"] is None
    for name in ("x_at", "lease_expires_at", "sleeping_until"):
        assert _in_range(job.get(name)), (name, job.get(name))
    assert "steps" not in job and "waiting_for" not in job, job
    assert {"history[0].at_ms", "history[1].foo_at", "history[1].started_ms", "meta.x_at", "meta.lease_expires_at",
            "meta.sleeping_until", "meta.steps", "meta.waiting_for"} <= set(job["damaged"]), job["damaged"]
    lines = got[f"/jobs/{FOREIGN_JOB}/logs"]["lines"]
    assert [line["ts"] for line in lines] == [None, None], lines
    assert lines[1]["msg"] == '{"an":"object"}', lines[1]
    worker = next(w for w in got["/workers"]["workers"] if w["id"] == FOREIGN_WORKER)
    assert worker["started_at"] is None and worker["running"][0]["started"] is None, worker
    events = got["/events?limit=100"]["events"]
    assert len(events) == 4, events
    for e in events:
        assert e["at_ms"] is None or (isinstance(e["at_ms"], int) and 0 < e["at_ms"] <= records.MAX_TIME_MS), e
        assert isinstance(e["jobs"], list) and all(isinstance(j, dict) and isinstance(j["id"], str)
                                                   for j in e["jobs"]), e
    assert sorted(d for e in events for d in e.get("damaged", [])) == ["at_ms", "at_ms", "jobs", "jobs[0]"], events
    entry = next(e for e in got["/audit"]["entries"] if e["action"] == "requeue")
    assert entry["at"] is None and entry["last_at"] is None and entry["damaged"] == ["at_ms", "last_at_ms"], entry
    group = got[f"/groups/{FOREIGN_GROUP}"]
    assert group["then"]["status"] is None and "then" in group["damaged"], group  # not "waiting": no job to wait

    for args in (["job", FOREIGN_JOB], ["logs", FOREIGN_JOB], ["workers"], ["events"], ["dead", "ls"]):
        cli = subprocess.run([sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"),
                              *args], env=project.env, capture_output=True, text=True, timeout=60)
        assert cli.returncode == 0 and "Traceback" not in cli.stderr, (args, cli.stderr[-600:])
        if args[0] == "job":
            assert "meta.lease_expires_at" in cli.stdout, cli.stdout
