"""Records another writer put in Redis are trusted with nothing: a count a view expands
(a durable function's steps) or shows (attempt, deferrals, a time) out of its range reads
as damaged, and a log line or a stream chunk nested past every limit reads as a damaged
line; every view of such a job answers, small, and `runner logs` prints it."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from test_web_support import Web, gunicorn

from runner.errors import JobNotFound
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


# --- a state hash of very many fields -------------------------------------------------------

WIDE = 200_000  # fields, 20 times records.MAX_STATE_FIELDS


def _commands(r: Any) -> dict[str, int]:
    return {name.removeprefix("cmdstat_"): v["calls"] for name, v in r.info("commandstats").items()}


def _plant_wide(project: Project, job_id: str) -> None:
    """A dead job whose state hash holds WIDE junk fields beside its own."""
    _plant_dead(project, job_id, attempt="2", error='{"type":"E","message":"boom"}', history='{"attempt":1}')
    r, k = project.runtime.redis, project.keys()
    for start in range(0, WIDE, 10_000):
        r.hset(k.state(job_id), mapping={f"junk{i}": "v" * 20 for i in range(start, start + 10_000)})


def test_a_state_hash_of_very_many_fields_is_never_read_whole(project: Project, web: Web) -> None:
    """One dead job whose state hash held 300,000 fields held Redis 2.5 s in each list that
    showed it (MEMORY USAGE, HKEYS, one HSTRLEN a field), and its job view read it whole
    (HGETALL). Each view and command now reads a bounded number of its fields, by name,
    whatever it holds, and says the state is damaged."""
    _plant_wide(project, "wide1")
    r = project.runtime.redis
    assert r.hlen(project.keys().state("wide1")) > WIDE
    for path in ("/jobs/wide1", "/dead/fast?limit=10", "/jobs?queue=fast&status=dead&limit=10",
                 "/jobs/wide1/logs"):
        r.config_resetstat()
        got = web.get(path)
        used = _commands(r)
        assert got.status_code == 200, (path, got.status_code, got.text[:300])
        assert not {"hgetall", "hkeys", "hvals", "hscan", "memory"} & set(used), f"{path} {used}"
        assert sum(used.values()) < 1_000, (path, used)
    view = web.get("/jobs/wide1").json()
    assert "state" in view["damaged"], view.get("damaged")
    assert (view["status"], view["type"], view["attempt"], view["reason"]) == ("dead", "record", 2,
                                                                               "permanent failure")
    assert view["last_error"] == {"type": "E", "message": "boom"}
    listed = web.get("/dead/fast?limit=10").json()["jobs"]
    assert [j["id"] for j in listed] == ["wide1"] and "state" in listed[0]["damaged"], listed
    assert listed[0]["status"] == "dead" and listed[0]["attempt"] == 2
    for args in (("dead", "ls"), ("job", "wide1"), ("logs", "wide1"), ("jobs", "--status", "dead")):
        r.config_resetstat()
        cli = subprocess.run([sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"),
                              *args], env=project.env, capture_output=True, text=True, timeout=60)
        used = _commands(r)
        assert cli.returncode == 0 and "Traceback" not in cli.stderr, (args, cli.stderr[-600:])
        assert not {"hgetall", "hkeys", "hvals", "hscan", "memory"} & set(used), f"{args} {used}"
        assert sum(used.values()) < 1_000, (args, used)


def test_a_requeue_of_a_job_whose_state_hash_is_very_wide_reads_it_by_name(project: Project) -> None:
    """An operator's requeue read the dead job's state whole (HGETALL) to find its type."""
    _plant_wide(project, "wide2")
    r = project.runtime.redis
    r.config_resetstat()
    project.client.requeue("fast", "wide2")
    used = _commands(r)
    assert not {"hgetall", "hkeys", "hvals", "hscan"} & set(used), used
    assert sum(used.values()) < 1_000, used
    assert project.client.get("wide2").as_dict()["status"] == "queued"


def test_a_requeue_of_a_record_of_the_release_before_grown_very_wide_reads_it_by_name(project: Project) -> None:
    """A record of the release before is one hash holding record and state; one of 300,000
    fields was read whole (HGETALL) by requeue, 0.2 s of Redis in one command. It is read
    by name past records.MAX_STATE_FIELDS, as a wide state hash is."""
    r, k = project.runtime.redis, project.keys()
    r.hset(k.job("old1"), mapping={"type": "noop", "version": "1", "payload": "{}", "max_attempts": "3",
                                   "status": "dead", "attempt": "3"})
    for start in range(0, 20_000, 10_000):
        r.hset(k.job("old1"), mapping={f"junk{i}": "v" for i in range(start, start + 10_000)})
    r.zadd(k.dead, {"old1": 1})
    r.config_resetstat()
    with contextlib.suppress(JobNotFound):
        project.client.requeue("fast", "old1")
    used = _commands(r)
    assert not {"hgetall", "hkeys", "hvals", "hscan"} & set(used), used
    assert sum(used.values()) < 1_000, used


def test_a_page_of_dead_jobs_just_under_the_wide_bound_reads_a_bounded_share_of_each(project: Project) -> None:
    """150 dead jobs whose state hashes held 9,990 fields each (just under the bound past
    which a hash is read by name) held Redis 0.35-0.7 s for one page of GET /dead/{queue}:
    each row read every field name and sized every field. A row reads a bounded number of
    fields whatever the hash holds, and still shows the job."""
    r, k = project.runtime.redis, project.keys()
    rows = 20
    for n in range(rows):
        _plant_dead(project, f"near{n}", attempt="2", error='{"type":"E","message":"boom"}')
        r.hset(k.state(f"near{n}"), mapping={f"junk{i}": "v" * 20 for i in range(9_990 - 5)})
    r.config_resetstat()
    total, jobs = project.client.dead("fast", limit=rows)
    used = _commands(r)
    assert total == rows and sorted(j.id for j in jobs) == sorted(f"near{n}" for n in range(rows))
    assert all(j.as_dict()["status"] == "dead" and j.as_dict()["attempt"] == 2 for j in jobs)
    assert sum(used.values()) < rows * 300, used


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


def test_a_dead_job_whose_state_key_is_no_hash_is_shown_damaged_and_requeued(project: Project, web: Web) -> None:
    """Five dead jobs, one of whose state key another writer made a string: its view names
    the state damaged, and requeues (one by one over HTTP, and `runner dead requeue --all`)
    put every one back, that one with a fresh state. Before, the script's HMGET raised
    WRONGTYPE: a 500 over HTTP, and `--all` failed with a traceback, requeuing none of the
    five (and a call's jobs before the bad one were rewritten yet left dead)."""
    c, r, k = project.client, project.runtime.redis, project.keys()
    ids = [c.enqueue("record", {"n": i}).id for i in range(5)]
    for job_id in ids:
        r.lrem(k.ready, 0, job_id)
        r.hset(k.state(job_id), mapping={"status": "dead", "reason": "planned"})
        r.zadd(k.dead, {job_id: 1})
    bad = ids[2]
    r.delete(k.state(bad))
    r.set(k.state(bad), "junk")
    view = web.get(f"/jobs/{bad}").json()
    assert "state" in view.get("damaged", []), view
    assert view["status"] == "dead", view  # (where it is: its state cannot say; it showed "queued")
    got = web.post(f"/dead/fast/{bad}/requeue")
    assert got.status_code == 200, (got.status_code, got.text[:500])
    assert r.type(k.state(bad)) == "hash" and c.get(bad).status == "queued"
    r.lrem(k.ready, 0, bad)  # dead again, with the damage, beside the other four
    r.delete(k.state(bad))
    r.set(k.state(bad), "junk")
    r.zadd(k.dead, {bad: 1})
    cli = subprocess.run([sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"),
                          "dead", "requeue", "--all", "--queue", "fast"], env=project.env, capture_output=True,
                         text=True, timeout=60)
    assert cli.returncode == 0 and "Traceback" not in cli.stderr, (cli.returncode, cli.stderr[-800:])
    assert r.zcard(k.dead) == 0
    assert {c.get(i).status for i in ids} == {"queued"}
    assert sorted(r.lrange(k.ready, 0, -1)) == sorted(ids)
