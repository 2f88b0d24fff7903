"""POST /bulk: the dashboard's bulk runs go through one route that acts on up to 500 jobs
a request and puts each request on the audit trail once per queue (its count and first
ids), so a bulk run of the dashboard no longer writes one entry per job and pushes the
earlier operator actions out of the trail."""

from __future__ import annotations

from typing import Any

from test_access import SECRETS, call, serving
from test_dead_bulk import bury_many
from test_web_api import assert_problem

from runner.store import audit
from runner.web.bulk import MAX_BULK_JOBS

from conftest import Project


def chunks(jobs: list[dict[str, str]]) -> list[list[dict[str, str]]]:
    return [jobs[i:i + MAX_BULK_JOBS] for i in range(0, len(jobs), MAX_BULK_JOBS)]


def test_a_bulk_run_of_1200_jobs_is_one_audit_entry_per_request(project: Project) -> None:
    """1,200 dead jobs requeued, 1,200 more deleted, then the 1,200 requeued cancelled, as
    the dashboard sends them (chunks of 500): each action is one entry naming the token,
    its count and at most audit.MAX_IDS ids (a request's entry, the next ones folded into
    it), and an earlier single action stays on the trail. Each job gets its outcome, in the
    order sent; a chunk sent again finds them gone."""
    first = bury_many(project, 1)[0]
    requeue = [{"queue": "fast", "id": i} for i in bury_many(project, 1200)]
    delete = [{"queue": "fast", "id": i} for i in bury_many(project, 1200)]
    with serving(project, "bulk") as web:
        assert call(web, SECRETS["ops"], "POST", f"/dead/fast/{first}/requeue").status_code == 200
        for action, jobs, outcome in (("requeue", requeue, "requeued"), ("delete", delete, "deleted"),
                                      ("cancel", requeue, "cancelled")):
            for chunk in chunks(jobs):
                r = call(web, SECRETS["ops"], "POST", "/bulk", json={"action": action, "jobs": chunk})
                assert r.status_code == 200, r.text
                body = r.json()
                assert body["action"] == action and body["done"] == len(chunk)
                assert [(j["id"], j["outcome"]) for j in body["jobs"]] == [(j["id"], outcome) for j in chunk]
        trail = call(web, SECRETS["support"], "GET", "/audit?limit=500").json()
        again = call(web, SECRETS["ops"], "POST", "/bulk", json={"action": "delete", "jobs": delete[:3]}).json()
        assert again["done"] == 0 and [j["outcome"] for j in again["jobs"]] == ["gone"] * 3

    c = project.client
    assert all(c.get(j["id"]).status == "cancelled" for j in requeue[::97])
    entries: list[dict[str, Any]] = trail["entries"]
    # One entry per action (its 3 requests folded: one caller, one queue, within the
    # hour), and the single requeue.
    assert trail["total"] == 1 + 3, entries
    assert entries[-1]["job_id"] == first and entries[-1]["action"] == "requeue"
    for action, jobs in (("requeue", requeue), ("delete", delete), ("cancel", requeue)):
        (mine,) = [e for e in entries if e["action"] == action and "count" in e]
        assert (mine["count"], mine["repeats"]) == (1200, 3), mine
        assert mine["by"] == "ops" and mine["queue"] == "fast" and len(mine["ids"]) == audit.MAX_IDS
        assert set(mine["ids"]) <= {j["id"] for j in jobs}


def test_bulk_needs_operate_and_a_well_formed_body(project: Project) -> None:
    """A read token and an enqueue token get a 403 naming ``operate``; a body that is not a
    bulk request is a 400, one with a bad member a 422 naming it, and nothing is done."""
    ids = bury_many(project, 2)
    jobs = [{"queue": "fast", "id": i} for i in ids]
    good = {"action": "requeue", "jobs": jobs}
    with serving(project, "bulk-bad") as web:
        for name in ("support", "producer"):
            body = assert_problem(call(web, SECRETS[name], "POST", "/bulk", json=good), 403, "forbidden")
            assert body["scope"] == "operate"
        for bad in ([], {}, {"action": "requeue"}, {"action": "requeue", "jobs": []},
                    {"action": "requeue", "jobs": jobs * 251}):
            assert_problem(call(web, SECRETS["ops"], "POST", "/bulk", json=bad), 400, "invalid-bulk")
        for bad, path in (({"action": "purge", "jobs": jobs}, "$.action"),
                          ({**good, "why": 1}, "$.why"),
                          ({"action": "delete", "jobs": [jobs[0], {"queue": "nope", "id": ids[1]}]}, "$.jobs[1].queue"),
                          ({"action": "delete", "jobs": [{"queue": "fast", "id": ""}]}, "$.jobs[0].id"),
                          ({"action": "delete", "jobs": [{"queue": "fast", "id": ids[0], "x": 1}]}, "$.jobs[0]"),
                          ({"action": "delete", "jobs": ["x"]}, "$.jobs[0]")):
            body = assert_problem(call(web, SECRETS["ops"], "POST", "/bulk", json=bad), 422, "invalid-payload")
            assert path in [e["path"] for e in body["errors"]], body
        assert call(web, SECRETS["support"], "GET", "/audit").json()["total"] == 0
    assert all(project.client.get(i).status == "dead" for i in ids)


def test_a_bulk_cancel_acts_only_on_the_queue_named_and_once_per_job(project: Project) -> None:
    """A job named under another queue is "gone" (it stays as it was, and the trail never
    says a queue it was not in); a job named twice is cancelled once, its second mention
    answers "duplicate", and ``done`` counts it once."""
    c = project.client
    a, b = (c.enqueue("record", {"n": n}, delay=600).id for n in (1, 2))
    with serving(project, "bulk-queues") as web:
        jobs = [{"queue": "slow", "id": a}, {"queue": "fast", "id": b}, {"queue": "fast", "id": b}]
        r = call(web, SECRETS["ops"], "POST", "/bulk", json={"action": "cancel", "jobs": jobs})
        assert r.status_code == 200, r.text
        body = r.json()
        assert [j["outcome"] for j in body["jobs"]] == ["gone", "cancelled", "duplicate"] and body["done"] == 1
        trail = call(web, SECRETS["support"], "GET", "/audit?limit=50").json()["entries"]
    assert c.get(a).status != "cancelled" and c.get(b).status == "cancelled"
    cancels = [e for e in trail if e["action"] == "cancel"]
    assert [e["ids"] for e in cancels if e["queue"] == "fast"] == [[b]], cancels
    assert all(a not in e.get("ids", []) for e in cancels), cancels


def test_bulk_actions_on_5000_ids_that_do_not_exist_leave_the_audit_trail_as_it_was(project: Project) -> None:
    """Requeue, delete and cancel of 5,000 ids that name no job, sent as the dashboard
    sends them (10 requests each): each answers "gone" and acts on nothing, and an action
    that touched nothing writes no entry. Each request wrote one (30 here), so a caller
    could push the real operator actions off the trail (it keeps MAX_ENTRIES) with
    requests that did nothing; the earlier requeue stays, and the trail grows by at most one."""
    first = bury_many(project, 1)[0]
    ghosts = [{"queue": "fast", "id": f"nosuch{n:05d}"} for n in range(5000)]
    with serving(project, "bulk-ghosts") as web:
        assert call(web, SECRETS["ops"], "POST", f"/dead/fast/{first}/requeue").status_code == 200
        before = call(web, SECRETS["support"], "GET", "/audit").json()["total"]
        for action in ("requeue", "delete", "cancel"):
            for chunk in chunks(ghosts):
                r = call(web, SECRETS["ops"], "POST", "/bulk", json={"action": action, "jobs": chunk})
                assert r.status_code == 200, r.text
                assert r.json()["done"] == 0 and {j["outcome"] for j in r.json()["jobs"]} == {"gone"}
        trail = call(web, SECRETS["support"], "GET", "/audit?limit=100").json()
    assert trail["total"] <= before + 1, trail["entries"][:3]
    assert trail["entries"][-1]["job_id"] == first and trail["entries"][-1]["action"] == "requeue"
