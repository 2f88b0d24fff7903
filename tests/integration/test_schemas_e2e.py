"""Validation before enqueue and at claim, and upgrades of queued payloads, through a real worker."""

from __future__ import annotations

import json
import shutil

import pytest

from runner.errors import UnknownFunction, UnknownVersion, ValidationFailed
from runner.store import records

from conftest import REPO, SCAN_COUNT, Project, wait_for


def use_examples(project: Project) -> None:
    """Put the shipped send_email example into the project, at v1 only."""
    shutil.copy(REPO / "functions" / "send_email.py", project.root / "functions")
    (project.root / "schemas" / "send_email").mkdir()
    shutil.copy(REPO / "schemas" / "send_email" / "v1.json", project.root / "schemas" / "send_email")


def redis_keys(project: Project) -> list[str]:
    return sorted(project.runtime.redis.scan_iter(count=SCAN_COUNT, match=f"{project.prefix}:*"))


def test_invalid_payload_is_refused_and_nothing_is_written(project: Project) -> None:
    c = project.client
    with pytest.raises(ValidationFailed) as err:
        c.enqueue("record", {"n": "seven", "sleep": "x"})
    assert {e.path for e in err.value.errors} == {"$.n", "$.sleep"}
    with pytest.raises(UnknownFunction):
        c.enqueue("nope", {})
    with pytest.raises(UnknownVersion):
        c.enqueue("record", {}, version=9)
    assert redis_keys(project) == []


def test_v1_job_queued_before_v2_runs_as_v2(project: Project) -> None:
    """A team deploys schema v2 + upgrade() while v1 jobs wait; they run as v2."""
    use_examples(project)
    # send_email's IDEMPOTENCY_KEY names fields v1 also has; v1 is the newest here.
    job = project.client.enqueue("send_email", {"user_id": 5, "to": "ann@example.com", "template": "welcome"})
    assert job.version == 1
    shutil.copy(REPO / "schemas" / "send_email" / "v2.json", project.root / "schemas" / "send_email")
    project._runtime = None  # a deploy: fresh processes load v2
    assert project.client.runtime.registry.get("send_email").versions.newest == 2
    project.spawn_worker("fast")
    rec = project.client.wait(job.id, timeout_s=15).as_dict()
    assert rec["status"] == "done", rec
    assert rec["result"] == {"sent_to": ["ann@example.com"], "via": "outbox"}
    mail = json.loads((project.root / "outbox" / "5_welcome.json").read_text())
    assert mail["body"] == "Welcome aboard, ann!"


def test_bad_payload_from_another_producer_is_dead_with_errors_and_no_attempt(project: Project) -> None:
    """Jobs written by another producer that no code here can run go dead with the reason and
    no attempt spent (an unknown type or a newer version at once here: unknown_grace = 0;
    by default they first wait for a newer worker, see test_correctness.py)."""
    project.write_config(worker="unknown_grace = 0")
    r = project.runtime.redis
    k = project.keys()
    for job_id, type_, version, payload in [("foreign1", "record", 1, '{"n": "x"}'), ("foreign2", "ghost", 1, "{}"),
                                            ("foreign3", "record", 4, "{}"), ("foreign4", "record", 1, "{nope")]:
        r.set(k.job(job_id), records.encode({"type": type_, "version": version, "payload": payload,
                                             "max_attempts": 3}))
    r.lpush(k.ready, "foreign1", "foreign2", "foreign3", "foreign4")
    good = project.client.enqueue("record", {"n": 1})
    project.spawn_worker("fast")
    assert project.client.wait(good.id, timeout_s=15).status == "done"
    c = project.client
    recs = {i: c.wait(i, timeout_s=10).as_dict() for i in ("foreign1", "foreign2", "foreign3", "foreign4")}
    assert recs["foreign1"]["reason"] == "invalid payload"
    assert recs["foreign1"]["last_error"]["errors"] == [{"path": "$.n", "message": '"x" is not of type "integer"'}]
    assert recs["foreign2"]["reason"] == "unknown type"
    assert recs["foreign3"]["reason"] == "unknown version"
    assert recs["foreign4"]["reason"] == "malformed record"
    for rec in recs.values():
        assert rec["status"] == "dead" and rec["attempt"] == 0
        assert project.runs(rec["id"]) == []


def test_requeue_validates_edited_payload(project: Project) -> None:
    c = project.client
    job = c.enqueue("record", {"n": 1, "fail_times": 99})
    project.spawn_worker("fast")
    assert c.wait(job.id, timeout_s=15).status == "dead"
    with pytest.raises(ValidationFailed):
        c.requeue("fast", job.id, payload={"n": "bad"})
    assert c.get(job.id).status == "dead"
    c.requeue("fast", job.id, payload={"n": 2})
    rec = c.wait(job.id, timeout_s=15).as_dict()
    assert rec["status"] == "done" and rec["result"] == {"n": 2, "attempt": 1}
    wait_for(lambda: c.stats()["fast"]["dead"] == 0)


def test_standard_formats_are_asserted_at_enqueue_and_at_claim(project: Project) -> None:
    """`"format": "email"` (and every standard format: uri, date-time, uuid, ...) is a
    check, not a note: a bad address is refused at enqueue, over the CLI and the client,
    and a job carrying one that another producer wrote dies at claim as "invalid payload"."""
    import subprocess
    import sys

    use_examples(project)
    shutil.copy(REPO / "schemas" / "send_email" / "v2.json", project.root / "schemas" / "send_email")
    bad = {"user_id": 5, "to": ["not-an-email"], "name": "Ann", "template": "welcome"}
    refused = subprocess.run([sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"),
                              "enqueue", "send_email", json.dumps(bad)],
                             env=project.env, capture_output=True, text=True, timeout=30)
    assert refused.returncode == 1
    assert '$.to[0]: "not-an-email" is not a "email"' in refused.stderr
    with pytest.raises(ValidationFailed):
        project.client.enqueue("send_email", bad)
    assert redis_keys(project) == []

    r, k = project.runtime.redis, project.keys()
    r.set(k.job("foreign-email"), records.encode({"type": "send_email", "version": 2, "payload": json.dumps(bad),
                                                 "max_attempts": 3}))
    r.lpush(k.ready, "foreign-email")
    project.spawn_worker("fast")
    rec = project.client.wait("foreign-email", timeout_s=15).as_dict()
    assert rec["status"] == "dead" and rec["reason"] == "invalid payload"
    assert rec["last_error"]["errors"] == [{"path": "$.to[0]", "message": '"not-an-email" is not a "email"'}]
    assert not (project.root / "outbox").exists()
