"""Groups through a real worker and the HTTP API: the members run, the then-job runs once
after the last one finished and sees every outcome in member order (inline, or read from
Redis for a big group); GET /groups/{id} shows the progress; a group that cannot run is
refused whole, with every problem, before anything is written."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import falcon.testing
import pytest

from runner import groups
from runner.client import Client, Request
from runner.errors import InvalidGroup, JobNotFound
from runner.web import create_app

from conftest import Project, wait_for

PART = '''
import runner
QUEUE = "fast"

def handle(payload, ctx):
    if payload.get("fail"):
        raise runner.PermanentFailure("no " + str(payload["n"]))
    return {"n": payload["n"]}
'''

MERGE = '''
import json, os
QUEUE = "{queue}"

def handle(payload, ctx):
    group = payload["group"]
    outcomes = group["outcomes"] if group["outcomes"] is not None else ctx.group_outcomes(group["id"])
    with open(os.path.join(os.environ["RECORD_DIR"], "merge-" + ctx.job_id), "a") as f:
        f.write(json.dumps({{"payload": payload, "outcomes": outcomes}}) + "\\n")
'''

STRICT = '{"type": "object", "properties": {"label": {"type": "string"}}, "additionalProperties": false}'


def write(project: Project, name: str, src: str, schema: str = '{"type": "object"}') -> None:
    (project.root / "functions" / f"{name}.py").write_text(textwrap.dedent(src))
    (project.root / "schemas" / name).mkdir(exist_ok=True)
    (project.root / "schemas" / name / "v1.json").write_text(schema)
    project._runtime = None


def runs(project: Project, then_id: str) -> list[dict]:
    p: Path = project.records / f"merge-{then_id}"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


@pytest.fixture
def fns(project: Project) -> Project:
    write(project, "part", PART)
    write(project, "merge", MERGE.format(queue="fast"))
    write(project, "merge_slow", MERGE.format(queue="slow"))
    write(project, "strict", MERGE.format(queue="fast"), STRICT)
    return project


def test_then_runs_once_after_every_member_with_their_outcomes(fns: Project) -> None:
    """Five members (one dies), the then-job on another queue (through the outbox): it runs
    once, with its own fields and the five outcomes in member order; the members and the
    then-job show their group."""
    c = fns.client
    members = [Request("part", {"n": i, "fail": i == 2}) for i in range(5)]
    g = c.group(members, then=Request("merge_slow", {"label": "x"}))
    assert g.then_id == f"{g.id}.then" and len(g.members) == 5 and g.queue == "fast"
    view = c.get_group(g.id)
    assert (view["total"], view["pending"], view["complete"]) == (5, 5, False)
    assert view["then"] == {"id": g.then_id, "type": "merge_slow", "queue": "slow", "status": "waiting"}
    fns.spawn_worker("fast", "slow")
    wait_for(lambda: runs(fns, g.then_id), timeout=30, what="the then-job")
    [run] = runs(fns, g.then_id)
    assert run["payload"]["label"] == "x"
    assert [o["id"] for o in run["outcomes"]] == list(g.members)
    assert [o["status"] for o in run["outcomes"]] == ["done", "done", "dead", "done", "done"]
    assert run["outcomes"][3]["result"] == {"n": 3}
    assert run["outcomes"][2]["error"] == {"type": "PermanentFailure", "message": "no 2"}
    assert run["outcomes"][2]["reason"] == "permanent failure"
    assert c.wait(g.then_id, 10).status == "done"
    view = c.get_group(g.id)
    assert (view["done"], view["dead"], view["pending"], view["complete"]) == (4, 1, 0, True)
    assert view["then"]["status"] == "done"
    assert c.get(g.members[0]).as_dict()["group"] == g.id
    assert c.get(g.then_id).as_dict()["group"] == g.id
    assert c.group_outcomes(g.id) == run["outcomes"]


def test_a_big_groups_outcomes_are_read_by_the_handler(fns: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the inline bound the payload carries no outcomes; ctx.group_outcomes reads them."""
    monkeypatch.setattr(groups, "INLINE_BYTES", 10)
    c = fns.client
    g = c.group([Request("part", {"n": i}) for i in range(30)], then=Request("merge", {}))
    fns.spawn_worker("fast")
    wait_for(lambda: runs(fns, g.then_id), timeout=30, what="the then-job")
    [run] = runs(fns, g.then_id)
    assert run["payload"]["group"]["outcomes"] is None
    assert [o["result"]["n"] for o in run["outcomes"]] == list(range(30))


def test_an_isolated_then_handler_reads_the_outcomes_through_its_worker(fns: Project,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ISOLATION = "process" the child asks its parent for the outcomes."""
    monkeypatch.setattr(groups, "INLINE_BYTES", 10)
    fns.write_config(concurrency=2)  # two children (one then-job, three members), not eight
    write(fns, "merge_iso", 'ISOLATION = "process"\n' + MERGE.format(queue="fast"))
    c = fns.client
    g = c.group([Request("part", {"n": i}) for i in range(3)], then=Request("merge_iso", {}))
    fns.spawn_worker("fast")
    wait_for(lambda: runs(fns, g.then_id), timeout=30, what="the then-job")
    [run] = runs(fns, g.then_id)
    assert [o["result"]["n"] for o in run["outcomes"]] == [0, 1, 2]


BIG_PART = '''
QUEUE = "fast"

def handle(payload, ctx):
    return {"n": payload["n"], "pad": "x" * 900_000}
'''

READ_ALL = '''
import json, os
QUEUE = "fast"
{isolation}
def handle(payload, ctx):
    gid = payload["group"]["id"]
    whole = [o["result"]["n"] for o in ctx.group_outcomes(gid)]
    paged = [o["result"]["n"] for o in ctx.iter_group_outcomes(gid)]
    with open(os.path.join(os.environ["RECORD_DIR"], "merge-" + ctx.job_id), "a") as f:
        f.write(json.dumps({{"payload": payload, "outcomes": [whole, paged]}}) + "\\n")
'''


def ended(c: Client, job_id: str) -> bool:
    try:
        return c.get(job_id).status == "dead"
    except JobNotFound:
        return False


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_then_handler_reads_a_group_past_the_clients_bound(fns: Project, isolation: str) -> None:
    """The client's 64 MiB bound on one list (kept for a web process) refused a then-job's
    own ctx.group_outcomes, which offered no way around it: the then-job died on every
    attempt. A handler reads its group whole (ctx.group_outcomes) or a page at a time
    (ctx.iter_group_outcomes), under either isolation; the child asks its worker for one
    page at a time. Here 12 outcomes of 0.9 MB (two pages), the group's byte count past
    64 MiB."""
    fns.write_config(concurrency=2)  # two children (one then-job, twelve small members), not eight
    write(fns, "bigpart", BIG_PART)
    write(fns, "readall", READ_ALL.format(isolation='ISOLATION = "process"' if isolation == "process" else ""))
    c, r = fns.client, fns.runtime.redis
    g = c.group([Request("bigpart", {"n": i}) for i in range(12)], then=Request("readall", {}))
    r.hincrby(fns.keys().group(g.id), "bytes", 65 * 1024 * 1024)  # (the count the bound reads)
    r.config_resetstat()
    fns.spawn_worker("fast")
    wait_for(lambda: runs(fns, g.then_id) or ended(c, g.then_id), timeout=60, what="the then-job")
    [run] = runs(fns, g.then_id)
    assert run["outcomes"] == [list(range(12)), list(range(12))]
    calls = {name: v["calls"] for name, v in r.info("commandstats").items()}
    assert calls["cmdstat_hmget"] >= 4, calls  # (8 MiB a round trip: two pages a read)


def test_a_group_that_cannot_run_is_refused_whole(fns: Project) -> None:
    c = fns.client
    r = fns.runtime.redis
    before = r.dbsize()
    with pytest.raises(InvalidGroup) as exc:
        c.group([Request("part", {"n": 1}), Request("record", {}), Request("nope", {}),
                 Request("part", {"n": 1}, idempotency_key="k")], then=Request("merge", {"group": 1}))
    paths = {e.path: e.message for e in exc.value.errors}
    assert "$.members[2].type" in paths and "$.members[3]" in paths and "$.then.payload.group" in paths
    with pytest.raises(InvalidGroup) as exc:
        c.group([Request("part", {"n": 1}), Request("slow", {"seconds": 0})], then=Request("merge", {}))
    assert "share one queue" in exc.value.errors[0].message
    with pytest.raises(InvalidGroup) as exc:  # its schema cannot take the group field
        c.group([Request("part", {"n": 1})], then=Request("strict", {"label": "x"}))
    assert exc.value.errors[0].path.startswith("$.then.payload")
    assert r.dbsize() == before  # nothing written


def test_post_groups_and_get_its_progress(fns: Project) -> None:
    """POST /groups answers 202 with the group, member and then ids; GET /groups/{id}
    shows the progress; a bad body is a 422 naming each problem; an unknown id a 404."""
    client = falcon.testing.TestClient(create_app(fns.runtime))
    body = {"members": [{"type": "part", "payload": {"n": i}} for i in range(3)],
            "then": {"type": "merge", "payload": {"label": "y"}, "delay": 0}}
    r = client.simulate_post("/groups", json=body)
    assert r.status_code == 202, r.text
    g = r.json
    assert r.headers["Location"] == f"/groups/{g['id']}" and len(g["members"]) == 3
    assert g["then"] == {"id": f"{g['id']}.then", "type": "merge", "queue": "fast", "status": "waiting"}
    fns.spawn_worker("fast")
    wait_for(lambda: client.simulate_get(f"/groups/{g['id']}").json["then"]["status"] == "done", timeout=30,
             what="the group to complete")
    view = client.simulate_get(f"/groups/{g['id']}").json
    assert (view["total"], view["done"], view["dead"], view["pending"]) == (3, 3, 0, 0)
    job = client.simulate_get(f"/jobs/{g['members'][1]}").json
    assert job["group"] == g["id"]
    bad = client.simulate_post("/groups", json={"members": [{"type": "part"}, {"type": "part", "payload": {},
                                                             "idempotency_key": "k"}], "then": {}})
    assert bad.status_code == 422 and bad.json["type"] == "urn:runner:problem:invalid-group"
    assert {e["path"] for e in bad.json["errors"]} >= {"$.members[0].payload", "$.members[1].idempotency_key",
                                                       "$.then.type"}
    metrics = client.simulate_get("/metrics").text
    assert 'runner_groups_completed_total{queue="fast"} 1.0' in metrics
    missing = client.simulate_get("/groups/gnope")
    assert missing.status_code == 404 and missing.json["type"] == "urn:runner:problem:group-not-found"


def test_a_groups_outcomes_are_read_a_bounded_page_at_a_time(fns: Project) -> None:
    """A group's outcomes were read 1,000 per HMGET and gathered in one list: 1,000
    outcomes of 1 MiB were 1 GB in one reply and in the reader's memory. Each round trip
    reads at most 8 MiB of them; iter_group_outcomes holds one page at a time, and
    group_outcomes refuses a group past 64 MiB, naming iter_group_outcomes."""
    from runner.errors import RunnerError

    c, r = fns.client, fns.runtime.redis
    n, big = 66, "x" * (1024 * 1024)
    g = c.group([Request("part", {"n": i}) for i in range(n)], then=Request("merge", {}))
    k = fns.keys()
    for i in range(1, n + 1):
        r.hset(k.group_outcomes(g.id), str(i), json.dumps({"id": g.members[i - 1], "status": "done", "result": big}))
    r.hset(k.group(g.id), "bytes", sum(r.hstrlen(k.group_outcomes(g.id), str(i)) for i in range(1, n + 1)))
    with pytest.raises(RunnerError, match="iter_group_outcomes"):
        c.group_outcomes(g.id)
    r.config_resetstat()
    got = [o["id"] for o in c.iter_group_outcomes(g.id)]
    assert got == list(g.members)
    calls = {name: v["calls"] for name, v in r.info("commandstats").items()}
    assert calls["cmdstat_hmget"] >= n // 8, calls  # (8 MiB a round trip at most: 8 outcomes of 1 MiB)
    assert len(c.group_outcomes(g.id, max_bytes=100 * 1024 * 1024)) == n


ROUTED = '''
import runner
QUEUE = "fast"
RESOURCE_KEY = "res:{r}"

def handle(payload, ctx):
    if payload.get("fail"):
        raise runner.PermanentFailure("no " + str(payload["n"]))
    return {"n": payload["n"]}
'''


@pytest.mark.parametrize("partitions", [1, 4])
def test_a_groups_members_are_listed_a_page_at_a_time_with_their_outcome(project: Project, partitions: int) -> None:
    """GET /groups/{id}/members lists a group's members in member order, a bounded page at
    a time, each with the outcome the group counted for it (pending until then); ?status=
    lists those of one outcome only (the dead ones an operator looks for), found in the
    group's own record, never by reading every member. GET /groups/{id} gave counts only
    ("1 dead"), and nothing led to that member. On a partitioned queue too, where members
    are written where their keys route them."""
    write(project, "routed", ROUTED, '{"type": "object", "properties": {"r": {"type": "integer"}}}')
    write(project, "merge", MERGE.format(queue="fast"))
    project.write_config(fast=f"partitions = {partitions}" if partitions > 1 else "")
    client = falcon.testing.TestClient(create_app(project.runtime))
    dead = {2, 5}
    body = {"members": [{"type": "routed", "payload": {"n": i, "r": i % 3, "fail": i in dead}} for i in range(7)],
            "then": {"type": "merge", "payload": {}}}
    r = client.simulate_post("/groups", json=body)
    assert r.status_code == 202, r.text
    g = r.json
    members = g["members"]

    def listed(query: str = "") -> dict:
        r = client.simulate_get(f"/groups/{g['id']}/members", query_string=query)
        assert r.status_code == 200, r.text
        return r.json

    first = listed()
    assert [(m["member"], m["id"], m["status"]) for m in first["members"]] == [
        (i + 1, members[i], "pending") for i in range(7)]
    assert first["cursor"] is None and first["total"] == 7
    home = project.keys("fast")  # (the group's partition)
    away = [m for m in members if not project.runtime.redis.exists(home.job(m))]
    assert bool(away) == (partitions > 1), away  # members written in other partitions are listed too
    project.spawn_worker("fast")
    wait_for(lambda: client.simulate_get(f"/groups/{g['id']}").json["complete"], timeout=30, what="the group's end")
    outcome = ["dead" if i in dead else "done" for i in range(7)]
    seen, cursor, pages = [], None, 0
    while True:
        page = listed(f"limit=3{f'&cursor={cursor}' if cursor else ''}")
        assert len(page["members"]) <= 3
        seen += page["members"]
        pages += 1
        cursor = page["cursor"]
        if cursor is None:
            break
    assert pages == 3 and [(m["id"], m["status"]) for m in seen] == list(zip(members, outcome, strict=True))
    assert [m["id"] for m in listed("status=dead")["members"]] == [members[2], members[5]]
    one = listed("status=dead&limit=1")
    assert [m["member"] for m in one["members"]] == [3] and one["cursor"]
    rest = listed(f"status=dead&limit=1&cursor={one['cursor']}")
    assert [m["member"] for m in rest["members"]] == [6] and rest["cursor"] is None  # (none is left after it)
    assert len(listed("status=done")["members"]) == 5 and listed("status=pending")["members"] == []
    assert [m["member"] for m in listed("status=dead,cancelled")["members"]] == [3, 6]
    for query in ("status=lost", "limit=0", "limit=501", "cursor=x", "cursor=0", "page=2"):
        assert client.simulate_get(f"/groups/{g['id']}/members", query_string=query).status_code == 400, query
    assert client.simulate_get("/groups/gnope/members").status_code == 404


def test_a_groups_member_list_is_written_in_bounded_calls_and_lives_as_long_as_it(
        fns: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """The member ids go to the group's list over the group's calls, at most LISTED a call
    (calls of no member added for them), in member order; the list and the marks live while
    the group does: kept while it runs, then for the group's keep time, as its outcomes. A
    list or marks of another type (damage) list the members as pending, never fail."""
    monkeypatch.setattr(groups, "LISTED", 2)
    c, r, k = fns.client, fns.runtime.redis, fns.keys()
    g = c.group([Request("part", {"n": i, "fail": i == 3}) for i in range(5)], then=Request("merge", {}))
    listed = k.group(g.id) + ":m"
    assert r.lrange(listed, 0, -1) == list(g.members)
    assert r.pttl(listed) == -1 and r.pttl(k.group(g.id)) == -1  # sealed: kept until its members finish
    fns.spawn_worker("fast")
    wait_for(lambda: c.get_group(g.id)["complete"], timeout=30, what="the group's end")
    keep = r.pttl(k.group(g.id))
    assert keep > 0 and abs(r.pttl(listed) - keep) < 1000 and abs(r.pttl(k.group(g.id) + ":f") - keep) < 1000
    assert r.get(k.group(g.id) + ":f") == "dddxd"
    assert [m["status"] for m in c.group_members(g.id, limit=2, outcomes=["dead"])["members"]] == ["dead"]
    r.delete(k.group(g.id) + ":f")
    r.hset(k.group(g.id) + ":f", "x", "y")  # another writer's
    page = c.group_members(g.id)
    assert [m["status"] for m in page["members"]] == ["pending"] * 5 and page["listed"]
    r.delete(listed)
    assert c.group_members(g.id) == {"id": g.id, "total": 5, "members": [], "cursor": None, "listed": False}
