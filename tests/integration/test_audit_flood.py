"""The audit trail against a flood of single actions: one ``operate`` token repeating the
same action (a schedule's trigger, a cancel, a purge, a pause) within an hour is one
entry that says how many times, from when to when, so thousands of them cannot push the
caller's own earlier actions off the trail; and a pause or resume that changes nothing
writes no entry at all."""

from __future__ import annotations

import json

import falcon.testing
import pytest
from test_console_api import OPS, REPORT, TOKENS, VIEWER
from test_dead_bulk import bury_many

from runner.store import audit
from runner.web import create_app

from conftest import Project


def test_a_flood_of_triggers_and_cancels_is_one_entry_each_and_the_earlier_purge_stays(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """2,000 triggers of one schedule, each job cancelled at once by the same caller
    (interleaved: trigger, cancel, trigger...), past a trail bound of 500: before, they
    pushed the caller's earlier purge off GET /audit (500 entries, all trigger and
    cancel). Now each is one entry with its count, its first and last time and its
    first ids, newest first by its last action (the triggers': the last three came by
    HTTP), and the purge stays."""
    monkeypatch.setattr(audit, "MAX_ENTRIES", 500)
    project.add_function("report", REPORT)
    project.write_config(extra=TOKENS)
    c = project.client
    bury_many(project, 3)
    assert c.purge_dead("fast", by="ops") == 3
    jobs = []
    for _ in range(2000):
        jobs.append(c.trigger("report", by="ops").id)
        assert c.cancel(jobs[-1], by="ops") == "cancelled"
    web = falcon.testing.TestClient(create_app(project.runtime))
    for _ in range(3):  # through HTTP as well: the same entry
        r = web.simulate_post("/schedules/report/trigger", headers=OPS)
        assert r.status_code == 202, r.text
        jobs.append(r.json["id"])
    page = web.simulate_get("/audit", query_string="limit=500", headers=VIEWER).json
    assert page["total"] == 3, (page["total"], [e["action"] for e in page["entries"][:5]])
    trigger, cancel, purge = page["entries"]
    assert (purge["action"], purge["by"], purge["count"]) == ("purge", "ops", 3)
    assert (trigger["action"], trigger["by"], trigger["schedule"]) == ("trigger", "ops", "report")
    assert (trigger["repeats"], trigger["count"]) == (2003, 2003), trigger
    assert trigger["ids"] == jobs[:audit.MAX_IDS] and "job_id" not in trigger
    assert trigger["at"] <= cancel["at"] <= cancel["last_at"] <= trigger["last_at"]
    assert (cancel["action"], cancel["repeats"], cancel["count"]) == ("cancel", 2000, 2000), cancel
    assert cancel["ids"] == jobs[:audit.MAX_IDS]
    assert all(len(json.dumps(e)) < 10_000 for e in page["entries"])


def test_only_the_same_caller_and_target_within_the_window_fold(project: Project) -> None:
    """Another caller, another queue or function, or an entry older than the fold window
    is an entry of its own; a bulk action still running is not folded into."""
    project.write_config(extra=TOKENS)
    c = project.client
    r, key = project.runtime.redis, f"{project.runtime.config.redis.prefix}:audit"
    (sec, _) = r.time()
    r.lpush(key, json.dumps({"at_ms": int(sec) * 1000 - audit.FOLD_MS - 1000, "by": "ops", "action": "delete",
                             "queue": "fast", "job_id": "old"}))
    ids = bury_many(project, 6)
    c.delete_dead("fast", ids[0], by="ops")  # not into the entry past the window
    c.delete_dead("fast", ids[1], by="ops")  # into the one just before
    c.delete_dead("fast", ids[2], by="other")
    audit.record(project.runtime.scripts, key, {"by": "ops", "action": "delete", "queue": "slow", "job_id": "s1"})
    running = {"by": "ops", "action": "purge", "queue": "fast", "bulk": "b1", "state": "running", "expected": 9,
               **audit.bulk(ids[3:4])}
    audit.record(project.runtime.scripts, key, running)
    audit.record(project.runtime.scripts, key, {**running, "bulk": "b2", **audit.bulk(ids[4:5])})
    total, entries = c.audit(limit=20)
    shown = [(e["by"], e["action"], e["queue"], e.get("repeats", 1), e.get("state")) for e in entries]
    assert shown == [("ops", "purge", "fast", 1, "running"), ("ops", "purge", "fast", 1, "running"),
                     ("ops", "delete", "slow", 1, None), ("other", "delete", "fast", 1, None),
                     ("ops", "delete", "fast", 2, None), ("ops", "delete", "fast", 1, None)], shown
    assert entries[4]["ids"] == ids[:2] and entries[4]["count"] == 2 and total == 6
    # Both bulk actions end: the later folds into the earlier, their counts summed.
    audit.record(project.runtime.scripts, key, {**running, "state": "done"})
    audit.record(project.runtime.scripts, key, {**running, "bulk": "b2", "state": "done", **audit.bulk(ids[4:5])})
    total, entries = c.audit(limit=20)
    assert total == 5, entries
    bulk = entries[0]
    assert (bulk["action"], bulk["state"], bulk["repeats"], bulk["count"], bulk["expected"]) == \
        ("purge", "done", 2, 2, 18), bulk
    assert bulk["ids"] == ids[3:5]
    # A name JSON may write another way (a '/', a letter past ASCII) folds as well.
    for job in ("x1", "x2"):
        audit.record(project.runtime.scripts, key, {"by": "cli:zoë/x", "action": "delete", "queue": "fast",
                                                    "job_id": job})
    total, entries = c.audit(limit=20)
    assert total == 6 and (entries[0]["by"], entries[0]["repeats"], entries[0]["ids"]) == ("cli:zoë/x", 2,
                                                                                          ["x1", "x2"])


def test_a_pause_or_resume_that_changes_nothing_writes_no_entry(project: Project,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Pausing a paused queue or function and resuming a running one act on nothing: no
    entry (before, each was one, and 300 no-op pauses pushed an earlier real pause off a
    trail of 200). A real pause keeps its first time. Real pauses and resumes repeated
    by one caller fold as other actions do, each entry on top after its last repeat."""
    monkeypatch.setattr(audit, "MAX_ENTRIES", 200)
    c = project.client
    c.pause("fast", by="ops")
    r, k = project.runtime.redis, project.keys()
    since = r.hget(k.paused, "queue")
    for _ in range(300):
        c.pause("fast", by="ops")
        assert c.resume("slow", by="ops") == 0
    total, entries = c.audit(limit=300)
    assert total == 1 and entries[0]["action"] == "pause" and "repeats" not in entries[0], (total, entries[-3:])
    assert r.hget(k.paused, "queue") == since
    c.pause("fast", function="record", by="ops")
    c.pause("fast", function="record", by="ops")
    assert c.resume("fast", function="record", by="ops") == 0
    assert c.resume("fast", function="record", by="ops") == 0
    total, entries = c.audit(limit=300)
    assert [(e["action"], e.get("function")) for e in entries] == [("resume", "record"), ("pause", "record"),
                                                                   ("pause", None)], entries
    for _ in range(50):
        c.resume("fast", by="ops")
        c.pause("fast", by="ops")
    total, entries = c.audit(limit=300)
    assert total == 4, entries
    assert [(e["action"], e.get("function"), e.get("repeats", 1)) for e in entries] == [
        ("pause", None, 51), ("resume", None, 50), ("resume", "record", 1), ("pause", "record", 1)], entries


def test_the_action_just_made_is_on_top_when_it_folds_into_an_older_entry(project: Project) -> None:
    """A cancel, then a pause and a resume (the pauses' trail) and a delete by the same
    caller, then a second cancel of the same type: folded into the first cancel's entry,
    that entry stands for the action just made and is the newest, on top of GET /audit
    (by cursor and by offset) with its first and last time; it kept its old place, below
    the three between (the action just made was 4th, and past a page of them, off it)."""
    c = project.client
    a = c.enqueue("record", {"n": 1}, delay=3600).id
    b = c.enqueue("record", {"n": 2}, delay=3600).id
    (dead,) = bury_many(project, 1)
    assert c.cancel(a, by="ops") == "cancelled"
    c.pause("fast", function="record", by="ops")
    c.resume("fast", function="record", by="ops")
    c.delete_dead("fast", dead, by="ops")
    assert c.cancel(b, by="ops") == "cancelled"
    web = falcon.testing.TestClient(create_app(project.runtime))
    for query in ("limit=10", "limit=10&offset=0", "limit=1"):
        page = web.simulate_get("/audit", query_string=query).json
        top = page["entries"][0]
        assert (top["action"], top.get("repeats"), top.get("ids")) == ("cancel", 2, [a, b]), (query, page)
    entries = web.simulate_get("/audit", query_string="limit=10").json["entries"]
    assert [(e["action"], e.get("repeats", 1)) for e in entries] == [
        ("cancel", 2), ("delete", 1), ("resume", 1), ("pause", 1)], entries
    assert entries[0]["at"] <= entries[3]["at"] <= entries[1]["at"] <= entries[0]["last_at"], entries
    total, trail = c.audit(limit=10)
    assert total == 4 and trail[0]["action"] == "cancel"
