"""Job lists: every status, newest first, cursor-paginated, each page bounded in time
whatever the depth."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from runner.cli import cli
from runner.client import Request
from runner.errors import JobNotFound, UnknownQueue
from runner.observe.figures import read_queues
from runner.store import records

from conftest import Project, wait_for


def _calls(project: Project) -> dict[str, int]:
    """Calls of the commands a page of queued jobs makes, as the server counts them (a
    script call refused with NOSCRIPT, sent again after its load, counts once)."""
    stats = project.runtime.redis.info("commandstats")
    return {name: int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))
            - int(stats.get(f"cmdstat_{name}", {}).get("failed_calls", 0)) for name in ("lrange", "evalsha", "eval")}


def test_10000_queued_jobs_page_correctly_newest_first(project: Project) -> None:
    """10,000 queued jobs list in pages of 500: every id once, newest first; each page's
    Redis work is bounded by the page, not the depth (one range read and one lookup per
    job shown, counted by the server); the last page has no cursor."""
    client = project.client
    made = client.enqueue_many([Request("record", {"n": i}) for i in range(10_000)])
    ids = [m.id for m in made]  # type: ignore[union-attr]
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        before = _calls(project)
        page = client.jobs("queued", queue="fast", limit=500, cursor=cursor)
        after = _calls(project)
        assert after["lrange"] - before["lrange"] <= 1
        assert after["evalsha"] + after["eval"] - before["evalsha"] - before["eval"] <= len(page.jobs) + 1
        seen += [j.id for j in page.jobs]
        pages += 1
        cursor = page.cursor
        if cursor is None:
            break
    assert len(seen) == len(set(seen)) == 10_000 and set(seen) == set(ids)
    # Newest first is the order they went in (a streamed enqueue's first calls may run
    # after later ones when Redis first loads the script, so not quite the request order).
    assert seen == project.runtime.redis.lrange(project.keys().ready, 0, -1)
    assert pages in (20, 21)
    first = client.jobs("queued", limit=3).jobs
    assert [j.as_dict()["status"] for j in first] == ["queued"] * 3


def test_every_status_lists_with_a_type_filter_and_the_cli(project: Project) -> None:
    """done, dead, scheduled and cancelled jobs each list under their status, newest
    first (and the queue figures count the cancelled ones); a type filter keeps only that
    type; `runner jobs --json` pages the same way."""
    client = project.client
    later = client.enqueue("record", {"n": 1}, delay=600).id
    gone = client.enqueue("record", {"n": 2}).id
    client.cancel(gone)
    done = [client.enqueue("noop", {"i": i}).id for i in range(5)]
    dead = client.enqueue("perm", {}).id
    project.spawn_worker("fast")
    wait_for(lambda: all(client.get(i).status == "done" for i in done) and client.get(dead).status == "dead",
             timeout=20, what="the jobs to end")
    assert [j.id for j in client.jobs("scheduled").jobs] == [later]
    assert [j.id for j in client.jobs("cancelled").jobs] == [gone]
    figures = {q.name: q for q in read_queues(project.runtime, records.now_ms())}
    assert (figures["fast"].cancelled, figures["slow"].cancelled) == (1, 0)  # the queue figures count them
    assert [j.id for j in client.jobs("dead").jobs] == [dead]
    got = client.jobs("done", type="noop", limit=100).jobs
    assert sorted(j.id for j in got) == sorted(done)
    assert client.jobs("done", type="record").jobs == []
    two = client.jobs("done", limit=2)
    rest = client.jobs("done", limit=100, cursor=two.cursor)
    assert len(two.jobs) == 2 and {j.id for j in two.jobs} | {j.id for j in rest.jobs} == set(done)
    out = CliRunner().invoke(cli, ["--config", str(project.root / "runner.toml"), "jobs", "--status", "done",
                                   "--type", "noop", "--json"], env=project.env, catch_exceptions=False)
    assert out.exit_code == 0, out.output
    assert sorted(j["id"] for j in json.loads(out.stdout)["jobs"]) == sorted(done)
    # A typo in a filter is refused with what there is, not an empty page.
    base = ["--config", str(project.root / "runner.toml"), "jobs"]
    typo = CliRunner().invoke(cli, [*base, "--type", "nop"], env=project.env)
    assert typo.exit_code == 1 and "unknown function 'nop'" in typo.output and "noop" in typo.output, typo.output
    queue = CliRunner().invoke(cli, [*base, "--queue", "fats"], env=project.env)
    assert queue.exit_code == 1 and "no queue 'fats' (queues: fast, slow)" in queue.output, queue.output
    # The same words wherever a queue is named: an UnknownQueue, still a JobNotFound.
    for call in (lambda: client.dead_ids("fats"), lambda: client.pause("fats"),
                 lambda: client.jobs("dead", queue="fats")):
        with pytest.raises(UnknownQueue, match=r"^no queue 'fats' \(queues: fast, slow\)$"):
            call()
    assert issubclass(UnknownQueue, JobNotFound)


def test_get_jobs_over_http_pages_and_refuses_bad_parameters(project: Project) -> None:
    """GET /jobs?status=queued&limit=2 pages with its cursor; an unknown status, a bad
    cursor or an unknown queue are problems, not pages."""
    from test_web_support import gunicorn

    ids = [project.client.enqueue("record", {"n": i}).id for i in range(3)]
    with gunicorn(project) as web:
        first = web.get("/jobs?status=queued&limit=2").json()
        assert [j["id"] for j in first["jobs"]] == ids[::-1][:2]
        rest = web.get(f"/jobs?status=queued&limit=2&cursor={first['cursor']}").json()
        assert [j["id"] for j in rest["jobs"]] == ids[:1]
        assert rest["cursor"] is None
        assert web.get("/jobs?status=nope").status_code == 400
        assert web.get("/jobs?status=").status_code == 400  # an empty status is none of the listed
        assert web.get("/jobs").json()["jobs"] == web.get("/jobs?status=queued").json()["jobs"]
        assert web.get("/jobs?status=queued&cursor=zzz").status_code == 400
        assert web.get("/jobs?status=queued&queue=nope").status_code == 404


def test_jobs_are_found_by_idempotency_key_over_http(project: Project) -> None:
    """GET /jobs?idempotency_key=K finds the jobs holding K (a key is per function: two
    types may hold the same one), ?type= narrows it to one function, and the key still
    finds its job once done. A key held by nobody finds nothing; a status, queue or
    cursor alongside, an unknown type or an oversized key are problems."""
    from test_web_support import gunicorn

    from runner.catalog.templates import MAX_KEY_BYTES

    keyed = project.client.enqueue("idem", {"k": "order-7"}).id
    other = project.client.enqueue("record", {"n": 1}, idempotency_key="order-7").id
    with gunicorn(project) as web:
        both = web.get("/jobs?idempotency_key=order-7").json()
        assert sorted(j["id"] for j in both["jobs"]) == sorted([keyed, other]) and both["cursor"] is None
        one = web.get("/jobs?idempotency_key=order-7&type=idem").json()["jobs"]
        assert [(j["id"], j["status"], j["idempotency_key"]) for j in one] == [(keyed, "queued", "order-7")]
        assert web.get("/jobs?idempotency_key=order-8").json() == {"jobs": [], "cursor": None}
        for extra in ("status=queued", "queue=fast", "cursor=x", "limit=5"):
            r = web.get(f"/jobs?idempotency_key=order-7&{extra}")
            assert r.status_code == 400 and r.json()["parameter"] == extra.split("=")[0], r.text
        assert web.get("/jobs?idempotency_key=order-7&type=nope").status_code == 400
        assert web.get("/jobs?idempotency_key=" + "k" * (MAX_KEY_BYTES + 1)).status_code == 400

        project.spawn_worker("fast")
        wait_for(lambda: project.client.get(keyed).status == "done", timeout=20, what="the keyed job to run")
        done = web.get("/jobs?idempotency_key=order-7&type=idem").json()["jobs"]
        assert [(j["id"], j["status"]) for j in done] == [(keyed, "done")]


def test_processing_jobs_list_their_worker_and_lease(project: Project) -> None:
    """A running job, listed under processing, names the worker holding it (as the
    worker roster names it) and when its lease runs out; GET /jobs/{id} names the worker."""
    from runner.store import roster

    job = project.client.enqueue("slow", {"seconds": 5}).id
    project.spawn_worker("slow")
    listed = wait_for(lambda: project.client.jobs("processing", queue="slow").jobs, timeout=20,
                      what="the job to start")
    view = listed[0].as_dict()
    members = roster.read(project.runtime.redis, project.runtime.config.redis.prefix)
    assert view["id"] == job and view["worker"] in {m.id for m in members}
    assert time.time() < view["lease_expires_at"] < time.time() + 11  # the slow queue's 10 s lease
    assert project.client.get(job).as_dict()["worker"] == view["worker"]
    project.stop_all()


ONE_AT_A_TIME = '''
import time

QUEUE = "fast"
CONCURRENCY = 1


def handle(payload, ctx):
    time.sleep(payload.get("sleep", 0))
'''


def test_priority_jobs_list_as_queued_and_held_back_jobs_as_deferred(project: Project) -> None:
    """Every job waiting to run is in some list: a queued job of priority 1-9 (it waits in
    the priority set, not in ready) lists as queued, ahead of the plain ones it will run
    before; jobs held back by CONCURRENCY and a paused function's jobs list as deferred,
    in `GET /jobs`, `runner jobs --status deferred`, and `runner cancel --all`."""
    (project.root / "functions" / "one_at_a_time.py").write_text(ONE_AT_A_TIME)
    (project.root / "schemas" / "one_at_a_time").mkdir()
    (project.root / "schemas" / "one_at_a_time" / "v1.json").write_text(json.dumps({"type": "object"}))
    c = project.client
    plain = [c.enqueue("record", {"n": i}).id for i in range(3)]
    urgent = c.enqueue("record", {"n": 9}, priority=9).id
    queued = [j.id for j in c.jobs("queued", queue="fast").jobs]
    assert queued == [urgent, *plain[::-1]], queued
    for job_id in [*plain, urgent]:
        c.cancel(job_id)

    c.pause(function="noop")
    held = [c.enqueue("noop", {"i": i}).id for i in range(2)]
    slow = [c.enqueue("one_at_a_time", {"sleep": 30 if i == 0 else 0}).id for i in range(3)]
    worker = project.spawn_worker("fast")
    wait_for(lambda: {c.get(i).status for i in held + slow[1:]} == {"deferred"}, timeout=20,
             what="the held-back jobs to be deferred")
    # The server counts every client's calls: the worker's own (lease renewals, ticks) would
    # blur the page's count below. Killed, it leaves the held-back jobs where they wait.
    worker.kill()
    worker.wait(timeout=10)
    deferred = {j.id for j in c.jobs("deferred").jobs}
    assert deferred == set(held + slow[1:]), deferred
    assert {j.id for j in c.jobs("deferred", type="noop").jobs} == set(held)
    # Delayed jobs wait in the scheduled set: a page of deferred ones does not wade through them.
    for i in range(5):
        c.enqueue("record", {"n": i}, delay=600)
    before = _calls(project)
    page = c.jobs("deferred", limit=3)
    looked_up = _calls(project)["evalsha"] - before["evalsha"]
    assert {j.id for j in page.jobs} <= deferred and len(page.jobs) == 3 and looked_up <= 3, looked_up
    first = c.jobs("deferred", limit=1)
    rest = c.jobs("deferred", limit=10, cursor=first.cursor)
    assert len(first.jobs) == 1 and {j.id for j in first.jobs + rest.jobs} == deferred

    base = ["--config", str(project.root / "runner.toml")]
    shown = CliRunner().invoke(cli, [*base, "jobs", "--status", "deferred", "--json"], env=project.env)
    assert shown.exit_code == 0, shown.output
    assert {j["id"] for j in json.loads(shown.stdout)["jobs"]} == deferred
    gone = CliRunner().invoke(cli, [*base, "cancel", "--all", "--status", "deferred", "--type", "noop"],
                              env=project.env)
    assert gone.exit_code == 0 and "cancelled 2 job(s)" in gone.stdout, gone.output
    assert {c.get(i).status for i in held} == {"cancelled"}
