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
