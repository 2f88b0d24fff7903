"""A producer's batch that Redis refuses part-way (POST /jobs/{type}/batch, runner
enqueue --jsonl): the answer says what was written, never more nor less."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import redis
import requests
from test_web_support import runner_web

from runner.store.embedded import Server

from conftest import make_project, structures


def test_a_batch_refused_part_way_says_which_jobs_were_written(tmp_path: Path) -> None:
    """POST /jobs/{type}/batch meeting maxmemory (noeviction) part-way: the 503 lists per
    job what became of it (its id where written), and does not claim nothing was written."""
    srv = Server(tmp_path / "redis").start()  # its own: maxmemory is turned below
    try:
        p = make_project(tmp_path / "p", srv)
        admin = redis.Redis(port=srv.port, decode_responses=True)
        with runner_web(p, "web", workers=1) as web:
            admin.config_set("maxmemory", int(admin.info("memory")["used_memory"]) + 600_000)
            body = [{"n": i, "pad": "x" * 300} for i in range(1000)]
            r = requests.post(web.url + "/jobs/record/batch", json=body,
                              headers={"Authorization": "Bearer t"}, timeout=30)
            admin.config_set("maxmemory", 0)
            held = set(structures(p)["ready"])
            assert 0 < len(held) < len(body), len(held)  # the set-up refused it part-way
            assert r.status_code == 503, r.text
            assert r.headers["Retry-After"] == "1"
            answer = r.json()
            assert "nothing was written" not in answer["detail"]
            assert f"{len(held)} of {len(body)} job(s) written" in answer["detail"], answer["detail"]
            jobs = answer["jobs"]
            assert len(jobs) == len(body)
            assert {j["id"] for j in jobs if j["outcome"] == "written"} == held
            assert {j["outcome"] for j in jobs} == {"written", "not_written"}
            assert answer["undetermined"] == []
            # Redis's refusal named as a single enqueue's 503 names it: its kind, and the
            # next step for maxmemory
            assert answer["refusal"] == "OOM", answer
            assert "maxmemory" in answer["detail"] and "raise maxmemory" in answer["detail"], answer["detail"]
    finally:
        srv.stop(kill=True)


def test_a_jsonl_backfill_refused_part_way_says_which_lines_were_enqueued(tmp_path: Path) -> None:
    """runner enqueue --jsonl meeting maxmemory inside one of its batches: exit 3, and the
    JSON report names the lines enqueued, those not enqueued, and where to resume."""
    srv = Server(tmp_path / "redis").start()
    try:
        p = make_project(tmp_path / "p", srv)
        admin = redis.Redis(port=srv.port, decode_responses=True)
        src = tmp_path / "backfill.jsonl"
        src.write_text("".join(json.dumps({"n": i, "pad": "x" * 300}) + "\n" for i in range(3000)))
        admin.config_set("maxmemory", int(admin.info("memory")["used_memory"]) + 1_000_000)
        r = subprocess.run([sys.executable, "-m", "runner.cli", "--config", str(p.root / "runner.toml"),
                            "enqueue", "record", "--jsonl", str(src), "--json"],
                           cwd=p.root, env=p.env, capture_output=True, text=True, timeout=60)
        admin.config_set("maxmemory", 0)
        held = len(structures(p)["ready"])
        # Refused part-way (inside a batch or at its edge: where maxmemory bites depends on the
        # server's allocations); either way every line must be accounted for below.
        assert 0 < held < 3000, held
        assert r.returncode == 3, r.stderr
        report = json.loads(r.stdout)
        assert report["enqueued"] == held
        assert report["unknown_lines"] == []
        missing = report["not_enqueued_lines"]
        assert missing and report["resume_from_line"] == min(missing)
        # Every line read is accounted for: enqueued or listed; the rest were not read.
        assert held + len(missing) == report["unread_from_line"] - 1
        assert f"{held} line(s) were enqueued" in r.stderr, r.stderr
    finally:
        srv.stop(kill=True)


def test_a_group_refused_part_way_says_which_members_were_written(tmp_path: Path) -> None:
    """POST /groups of 3,000 members (written 500 a call) meeting maxmemory part-way: the
    members written will run, the group is never sealed (its then-job never runs): the
    503 says so, member by member, and does not claim nothing was written."""
    srv = Server(tmp_path / "redis").start()
    try:
        p = make_project(tmp_path / "p", srv)
        admin = redis.Redis(port=srv.port, decode_responses=True)
        with runner_web(p, "web", workers=1) as web:
            admin.config_set("maxmemory", int(admin.info("memory")["used_memory"]) + 1_200_000)
            body = {"members": [{"type": "record", "payload": {"n": i, "pad": "x" * 100}} for i in range(3000)],
                    "then": {"type": "record", "payload": {}}}
            r = requests.post(web.url + "/groups", json=body, headers={"Authorization": "Bearer t"}, timeout=30)
            admin.config_set("maxmemory", 0)
            held = set(structures(p)["ready"])
            assert 0 < len(held) < 3000, (len(held), r.text[:300])  # the set-up refused it part-way
            assert r.status_code == 503, r.text
            answer = r.json()
            assert "nothing was written" not in answer["detail"]
            assert f"{len(held)} of 3000 member(s) written" in answer["detail"], answer["detail"]
            members = answer["members"]
            assert len(members) == 3000
            assert {m["id"] for m in members if m["outcome"] == "written"} == held
            assert {m["outcome"] for m in members} == {"written", "not_written"}
            assert answer["refusal"] == "OOM", answer
            assert "raise maxmemory" in answer["detail"], answer["detail"]
    finally:
        srv.stop(kill=True)
