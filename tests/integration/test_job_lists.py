"""Job lists: every status, newest first, cursor-paginated, each page bounded in time
whatever the depth."""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

import pytest
from click.testing import CliRunner

from runner.cli import cli
from runner.client import Request
from runner.errors import JobNotFound, UnknownQueue
from runner.observe.figures import read_queues
from runner.store import records
from runner.store.scripts import Ack

from conftest import Project, size, wait_for


def _calls(project: Project) -> dict[str, int]:
    """Calls of the commands a page of queued jobs makes, as the server counts them (a
    script call refused with NOSCRIPT, sent again after its load, counts once)."""
    stats = project.runtime.redis.info("commandstats")
    return {name: int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))
            - int(stats.get(f"cmdstat_{name}", {}).get("failed_calls", 0)) for name in ("lrange", "evalsha", "eval")}


QUEUED = int(size("LIST_QUEUED_JOBS", 3_000, 10_000))  # queued jobs, listed in pages of 500


def test_thousands_of_queued_jobs_page_correctly_newest_first(project: Project) -> None:
    """QUEUED jobs (10,000 at full size) list in pages of 500: every id once, newest first; each page's
    Redis work is bounded by the page, not the depth (a read of the priority set, one of
    ready, and one lookup per job shown, counted by the server); the last page has no cursor."""
    client = project.client
    made = client.enqueue_many([Request("record", {"n": i}) for i in range(QUEUED)])
    ids = [m.id for m in made]  # type: ignore[union-attr]
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        before = _calls(project)
        page = client.jobs("queued", queue="fast", limit=500, cursor=cursor)
        after = _calls(project)
        assert after["lrange"] - before["lrange"] <= 1
        assert after["evalsha"] + after["eval"] - before["evalsha"] - before["eval"] <= len(page.jobs) + 2
        seen += [j.id for j in page.jobs]
        pages += 1
        cursor = page.cursor
        if cursor is None:
            break
    assert len(seen) == len(set(seen)) == QUEUED and set(seen) == set(ids)
    # Newest first is the order they went in (a streamed enqueue's first calls may run
    # after later ones when Redis first loads the script, so not quite the request order).
    assert seen == project.runtime.redis.lrange(project.keys().ready, 0, -1)
    assert pages in (QUEUED // 500, QUEUED // 500 + 1)
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
    assert queue.exit_code == 1, queue.output
    assert "no queue 'fats'; did you mean fast? (queues: fast, slow)" in queue.output, queue.output
    # The same words wherever a queue is named: an UnknownQueue, still a JobNotFound.
    for call in (lambda: client.dead_ids("fats"), lambda: client.pause("fats"),
                 lambda: client.jobs("dead", queue="fats")):
        with pytest.raises(UnknownQueue, match=r"^no queue 'fats'; did you mean fast\? \(queues: fast, slow\)$"):
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
    assert view["id"] == job
    # (the roster's first heartbeat goes out beside the worker's start: it may follow the claim)
    wait_for(lambda: view["worker"] in {m.id for m in roster.read(project.runtime.redis,
                                                                   project.runtime.config.redis.prefix)},
             timeout=10, what="the worker in the roster")
    assert time.time() < view["lease_expires_at"] < time.time() + 11  # the slow queue's 10 s lease
    assert project.client.get(job).as_dict()["worker"] == view["worker"]
    project.stop_all()


ONE_AT_A_TIME = '''
import time
from typing import Any

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
    after = _calls(project)
    # One read per list it may look at (each function's held list, each queue's one limit's
    # waiters), one lookup per job shown.
    lists = len(project.runtime.registry.functions) + len(project.runtime.keys)
    calls = sum(after[name] - before[name] for name in ("evalsha", "lrange"))
    assert {j.id for j in page.jobs} <= deferred and len(page.jobs) == 3 and calls <= 3 + lists, calls
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


def _follow(page_of: Any, between: Any = None, most: int = 100) -> list[str]:
    """Every id a client following the cursor sees, calling ``between(page number)``
    after each page; fails if the cursor has not ended after ``most`` pages (a loop)."""
    seen: list[str] = []
    cursor = None
    for n in range(most):
        page = page_of(cursor)
        seen += [j.id for j in page.jobs]
        cursor = page.cursor
        if cursor is None:
            return seen
        if between is not None:
            between(n)
    raise AssertionError(f"the cursor went on past {most} pages: {len(seen)} ids, {len(set(seen))} distinct")


def test_the_processing_list_pages_through_every_running_job_while_leases_renew(project: Project) -> None:
    """48 jobs claimed at once share one lease deadline: the processing list pages through
    all of them in pages of 10, each once, and its cursor ends. Renewing every lease
    between pages (which moves every deadline) neither repeats a job nor skips one."""
    from runner.worker.fetcher import CLAIM_FIELDS

    c, rt = project.client, project.runtime
    ids = {m.id for m in c.enqueue_many([Request("record", {"n": i}) for i in range(48)])}  # type: ignore[union-attr]
    k = project.keys()
    reply = list(rt.scripts.claim(k, n=48, start=48, lease_ms=60_000, token_base="w.1",
                                  dead_ttl_ms=10_000_000, done_ttl_ms=10_000_000))
    owned = [(reply[i], reply[i + 1]) for i in range(2, len(reply), CLAIM_FIELDS)]
    assert {i for i, _ in owned} == ids
    assert len(set(rt.redis.zrange(k.leases, 0, -1, withscores=True)[i][1] for i in range(48))) == 1

    def page(cursor: str | None) -> Any:
        return c.jobs("processing", queue="fast", limit=10, cursor=cursor)

    still = _follow(page)
    assert len(still) == len(set(still)) == 48 and set(still) == ids

    def renew_all(n: int) -> None:
        # Half of them first, then the rest: the deadlines now differ and moved past every cursor.
        rt.scripts.renew(k, owned[: 24 if n % 2 else 48], 60_000 + 1000 * n)

    moving = _follow(page, renew_all)
    assert len(moving) == len(set(moving)) == 48 and set(moving) == ids


def test_the_deferred_list_shows_every_job_that_stays_deferred_while_limits_wake_others(project: Project) -> None:
    """Jobs parked on a CONCURRENCY limit list as deferred in pages of 5 while the limit
    wakes one of them (from the oldest end) between every two pages, and a job of another
    limit is parked meanwhile: every job deferred from the first page to the last is
    shown, none twice, and the cursor ends."""
    from runner.worker.fetcher import CLAIM_FIELDS

    (project.root / "functions" / "one_at_a_time.py").write_text(ONE_AT_A_TIME)
    (project.root / "schemas" / "one_at_a_time").mkdir()
    (project.root / "schemas" / "one_at_a_time" / "v1.json").write_text(json.dumps({"type": "object"}))
    c, rt, k = project.client, project.runtime, project.keys()
    parked = [c.enqueue("one_at_a_time", {"i": i}).id for i in range(40)]

    def claim() -> list[tuple[str, str]]:
        reply = list(rt.scripts.claim(k, n=40, start=40, lease_ms=60_000, token_base="w.1",
                                      dead_ttl_ms=10_000_000, done_ttl_ms=10_000_000))
        return [(reply[i], reply[i + 1]) for i in range(2, len(reply), CLAIM_FIELDS)]

    running = claim()
    assert len(running) == 1 and {c.get(i).status for i in parked if i != running[0][0]} == {"deferred"}

    def wake_one(n: int) -> None:
        # The running job ends: its slot wakes the oldest waiter, which the next claim runs.
        job_id, token = running.pop()
        rt.scripts.ack(k, [Ack(job_id, token, "null", "one_at_a_time|1", "")], 60_000)
        running.extend(claim())

    seen = _follow(lambda cursor: c.jobs("deferred", queue="fast", limit=5, cursor=cursor), wake_one)
    stayed = [i for i in parked if c.get(i).status == "deferred"]
    assert len(seen) == len(set(seen)), "a job was shown twice"
    assert len(stayed) >= 20 and not set(stayed) - set(seen), f"never shown: {set(stayed) - set(seen)}"


def test_the_deferred_list_ends_while_jobs_are_parked_faster_than_it_is_paged(project: Project) -> None:
    """Jobs parked on a CONCURRENCY limit list as deferred in pages of 5 while, between
    every two pages, 6 more jobs are parked (at the end the list is read from) and the
    limit wakes one from the other end: the cursor ends, no job is shown twice, and every
    job deferred from the first page to the last is shown. (A cursor that counted places
    from the tail re-read the jobs each park pushed along, and never ended.)"""
    from runner.worker.fetcher import CLAIM_FIELDS

    (project.root / "functions" / "one_at_a_time.py").write_text(ONE_AT_A_TIME)
    (project.root / "schemas" / "one_at_a_time").mkdir()
    (project.root / "schemas" / "one_at_a_time" / "v1.json").write_text(json.dumps({"type": "object"}))
    c, rt, k = project.client, project.runtime, project.keys()

    def claim() -> list[tuple[str, str]]:
        reply = list(rt.scripts.claim(k, n=40, start=40, lease_ms=60_000, token_base="w.1",
                                      dead_ttl_ms=10_000_000, done_ttl_ms=10_000_000))
        return [(reply[i], reply[i + 1]) for i in range(2, len(reply), CLAIM_FIELDS)]

    parked = [c.enqueue("one_at_a_time", {"i": i}).id for i in range(30)]
    running = claim()
    assert len(running) == 1

    def park_and_wake(n: int) -> None:
        for i in range(6):  # parked at the tail: claimed while the one slot is taken
            c.enqueue("one_at_a_time", {"i": 1000 * (n + 1) + i})
        running.extend(claim())
        job_id, token = running.pop(0)  # the slot's job ends: the oldest waiter is woken and runs
        rt.scripts.ack(k, [Ack(job_id, token, "null", "one_at_a_time|1", "")], 60_000)
        running.extend(claim())

    seen = _follow(lambda cursor: c.jobs("deferred", queue="fast", limit=5, cursor=cursor), park_and_wake)
    stayed = [i for i in parked if c.get(i).status == "deferred"]
    assert len(seen) == len(set(seen)), f"{len(seen) - len(set(seen))} repeats"
    assert len(stayed) >= 15 and not set(stayed) - set(seen), f"never shown: {set(stayed) - set(seen)}"


def test_the_deferred_list_ends_under_a_real_worker_while_jobs_are_parked_and_woken(project: Project) -> None:
    """A real worker runs a CONCURRENCY = 1 function, waking its oldest waiter each time a
    run ends, while a client pages the deferred list in pages of 5 and enqueues 10 more
    jobs after each page (the worker parks them at the tail, faster than the client
    pages): the cursor ends, no job is shown twice, and every job deferred from the first
    page to the last (parked no more often in between) is shown."""
    (project.root / "functions" / "one_at_a_time.py").write_text(ONE_AT_A_TIME)
    (project.root / "schemas" / "one_at_a_time").mkdir()
    (project.root / "schemas" / "one_at_a_time" / "v1.json").write_text(json.dumps({"type": "object"}))
    c = project.client

    def deferred() -> dict[str, str]:
        return {j.id: j.fields.get("deferrals", "") for j in c.jobs("deferred", queue="fast", limit=1000).jobs}

    c.enqueue_many([Request("one_at_a_time", {"sleep": 0.005}) for _ in range(80)])
    worker = project.spawn_worker("fast")
    wait_for(lambda: len(deferred()) >= 60, timeout=20, what="jobs parked on the limit")
    before = deferred()

    def park_more(n: int) -> None:
        c.enqueue_many([Request("one_at_a_time", {"sleep": 0.005}) for _ in range(10)])

    seen = _follow(lambda cursor: c.jobs("deferred", queue="fast", limit=5, cursor=cursor), park_more, most=400)
    worker.kill()
    worker.wait(timeout=10)
    after = deferred()
    stayed = {i for i, n in before.items() if after.get(i) == n}
    assert len(seen) == len(set(seen)), f"{len(seen) - len(set(seen))} repeats"
    assert len(stayed) >= 20 and not stayed - set(seen), f"{len(stayed)} stayed, never shown: {stayed - set(seen)}"


def _park_on_a_limit(project: Project) -> tuple[list[str], set[str]]:
    """31 jobs of a CONCURRENCY=1 function, one claimed: the id of each, and the running one's."""
    from runner.worker.fetcher import CLAIM_FIELDS

    (project.root / "functions" / "one_at_a_time.py").write_text(ONE_AT_A_TIME)
    (project.root / "schemas" / "one_at_a_time").mkdir()
    (project.root / "schemas" / "one_at_a_time" / "v1.json").write_text(json.dumps({"type": "object"}))
    c, rt, k = project.client, project.runtime, project.keys()
    parked = [c.enqueue("one_at_a_time", {"i": i}).id for i in range(31)]
    reply = list(rt.scripts.claim(k, n=40, start=40, lease_ms=60_000, token_base="w.1",
                                  dead_ttl_ms=10_000_000, done_ttl_ms=10_000_000))
    running = {reply[i] for i in range(2, len(reply), CLAIM_FIELDS)}
    assert len(running) == 1
    return parked, running


def test_the_deferred_list_goes_on_when_the_last_job_shown_is_cancelled(project: Project) -> None:
    """30 jobs parked on a CONCURRENCY limit, paged in 4s while the last job of every page
    is cancelled and taken out of the list before the next: the next page
    starts at the first job not yet shown, so each job that stays is shown once."""
    parked, running = _park_on_a_limit(project)
    c, rt, k = project.client, project.runtime, project.keys()
    shown: list[str] = []

    def page(cursor: str | None) -> Any:
        got = c.jobs("deferred", queue="fast", limit=4, cursor=cursor)
        shown[:] = [j.id for j in got.jobs]
        return got

    def cancel_last(n: int) -> None:
        # Out of the list as well, as a batch cancel takes it (a single cancel leaves its
        # id for the wake-up to drop).
        c.cancel(shown[-1])
        assert rt.redis.lrem(k.waiters(rt.redis.zrange(k.limwait, 0, -1)[0]), 1, shown[-1]) == 1

    seen = _follow(page, cancel_last)
    stayed = [i for i in parked if c.get(i).status == "deferred"]
    assert len(seen) == len(set(seen)) and len(stayed) >= 20
    assert set(stayed) <= set(seen) and set(seen) <= set(parked) - running


def test_the_dead_list_pages_past_ties_while_the_jobs_it_showed_are_requeued(project: Project) -> None:
    """30 jobs buried in one call share their time of death: the dead list pages through
    them in pages of 7, each once, even when the last job of every page is requeued before
    the next (the cursor's anchor leaves the index: the next page starts after its
    position, not back at the first job of its score)."""
    from test_dead_bulk import bury_many

    c = project.client
    ids = bury_many(project, 30, type_="noop")
    assert len({s for _, s in project.runtime.redis.zrange(project.keys().dead, 0, -1, withscores=True)}) == 1
    shown: list[str] = []

    def page(cursor: str | None) -> Any:
        got = c.jobs("dead", queue="fast", limit=7, cursor=cursor)
        shown[:] = [j.id for j in got.jobs]
        return got

    seen = _follow(page, lambda n: c.requeue("fast", shown[-1]))
    assert len(seen) == len(set(seen)) == 30 and set(seen) == set(ids)


def test_the_processing_list_shows_every_job_that_stays_running_while_other_jobs_are_claimed(
        project: Project) -> None:
    """48 jobs stay running while a thread claims (and ends) other jobs one by one as fast as it
    can (each claim lands at the head of the processing list, newest first): every traversal
    in pages of 7 shows each of the 48 once. The page is read from the cursor's position
    by the same script call that finds it, so a claim cannot land between the two."""
    import threading

    from runner.worker.fetcher import CLAIM_FIELDS

    c, rt, k = project.client, project.runtime, project.keys()
    stayers = {m.id for m in c.enqueue_many([Request("record", {"n": i}) for i in range(48)])}  # type: ignore[union-attr]
    reply = list(rt.scripts.claim(k, n=48, start=48, lease_ms=600_000, token_base="w.1",
                                  dead_ttl_ms=10_000_000, done_ttl_ms=10_000_000))
    assert {reply[i] for i in range(2, len(reply), CLAIM_FIELDS)} == stayers
    stop = threading.Event()

    def churn() -> None:
        # Claims land at the head; each run ends at the next claim, so the list stays short.
        running: list[tuple[str, str]] = []
        n = 0
        while not stop.is_set():
            if not n % 200:
                c.enqueue_many([Request("record", {"n": i}) for i in range(200)])
            got = list(rt.scripts.claim(k, n=1, start=1, lease_ms=600_000, token_base=f"c.{n}",
                                        dead_ttl_ms=10_000_000, done_ttl_ms=10_000_000))
            running += [(got[i], got[i + 1]) for i in range(2, len(got), CLAIM_FIELDS)]
            if len(running) > 1:
                job_id, token = running.pop(0)
                rt.scripts.ack(k, [Ack(job_id, token, "null", "record|1", "")], 60_000)
            n += 1

    claimer = threading.Thread(target=churn)
    claimer.start()
    try:
        for _ in range(40):
            seen = set(_follow(lambda cursor: c.jobs("processing", queue="fast", limit=7, cursor=cursor)))
            assert stayers <= seen, f"{len(stayers - seen)} running jobs never shown"
    finally:
        stop.set()
        claimer.join()


NAPPER = '''
QUEUE = "fast"

def handle(payload, ctx):
    ctx.sleep("nap", 3600)
    return None
'''


def test_the_scheduled_list_behind_many_sleeping_jobs(project: Project, monkeypatch: Any) -> None:
    """Scheduled jobs due before more sleeping jobs than one stretch of the index reads
    (SCAN_MAX, made small here) are on the scheduled list's first page."""
    from runner.store import listing

    monkeypatch.setattr(listing, "SCAN_MAX", 20)
    project.add_function("napper", NAPPER)
    c = project.client
    scheduled = [e.id for e in c.enqueue_many([Request("record", {"n": i}, delay_s=60) for i in range(5)])]
    naps = [e.id for e in c.enqueue_many([Request("napper", {"i": i}) for i in range(30)])]
    project.spawn_worker("fast")
    wait_for(lambda: all(c.get(i).status == "sleeping" for i in naps), timeout=30, what="the naps asleep")
    page = c.jobs("scheduled", queue="fast", limit=50)
    assert sorted(j.id for j in page.jobs) == sorted(scheduled)


def test_jobs_delayed_before_the_scheduled_index_are_listed_once_a_worker_starts(project: Project) -> None:
    """A worker's scheduler walks the scheduled set at its start, so jobs that a release
    before the scheduled list's index delayed (in the scheduled set only) come on the
    list."""
    c = project.client
    delayed = [e.id for e in c.enqueue_many([Request("record", {"n": i}, delay_s=600) for i in range(7)])]
    project.runtime.redis.delete(project.keys("fast").delayed)  # as the release before left it
    assert c.jobs("scheduled", queue="fast").jobs == []
    project.spawn_worker("fast")
    wait_for(lambda: sorted(j.id for j in c.jobs("scheduled", queue="fast").jobs) == sorted(delayed),
             timeout=30, what="the delayed jobs listed")


@pytest.mark.parametrize("partitions", [1, 4])
def test_the_queued_list_skips_no_job_when_jobs_it_showed_are_cancelled(project: Project, partitions: int) -> None:
    """400 queued jobs paged in 50s while three jobs of every page (the first and the
    last among them) are cancelled before the next: a cancel takes an id out of the middle
    of ready and every older job moves one place toward the head, yet the next page starts
    after the last job shown, so each job that stayed queued is shown once."""
    if partitions > 1:
        project.write_config(fast=f"partitions = {partitions}")
    c = project.client
    ids = [m.id for m in c.enqueue_many([Request("record", {"n": i}) for i in range(400)])]  # type: ignore[union-attr]
    shown: list[str] = []

    def page(cursor: str | None) -> Any:
        got = c.jobs("queued", queue="fast", limit=50, cursor=cursor)
        shown[:] = [j.id for j in got.jobs]
        return got

    def cancel_some(n: int) -> None:
        for job_id in {shown[0], shown[1], shown[-1]}:
            c.cancel(job_id)

    seen = _follow(page, cancel_some)
    stayed = [i for i in ids if c.get(i).status == "queued"]
    assert len(seen) == len(set(seen)), f"{len(seen) - len(set(seen))} repeats"
    assert len(stayed) >= 370 and not set(stayed) - set(seen), f"never shown: {len(set(stayed) - set(seen))}"


@pytest.mark.parametrize("drained", [9, 25])
def test_the_queued_list_repeats_no_job_while_a_worker_drains_it(project: Project, drained: int) -> None:
    """120 queued jobs paged in 10s while claims take ``drained`` of the oldest between
    every two pages (a worker draining the queue, from the end the pages go toward): no
    job is shown twice, and every job still queued at the end was shown. (Where the last
    job shown and the first not yet shown were both claimed, the next page started at the
    second one's old distance from the tail, which the claims had moved: it showed again
    jobs of the page before.)"""
    from runner.worker.fetcher import CLAIM_FIELDS

    c, rt, k = project.client, project.runtime, project.keys()
    ids = [m.id for m in c.enqueue_many([Request("record", {"n": i}) for i in range(120)])]  # type: ignore[union-attr]
    claimed: list[str] = []

    def drain(n: int) -> None:
        reply = list(rt.scripts.claim(k, n=drained, start=drained, lease_ms=600_000, token_base=f"w.{n}",
                                      dead_ttl_ms=10_000_000, done_ttl_ms=10_000_000))
        claimed.extend(reply[i] for i in range(2, len(reply), CLAIM_FIELDS))

    seen = _follow(lambda cursor: c.jobs("queued", queue="fast", limit=10, cursor=cursor), drain)
    stayed = [i for i in ids if i not in claimed]
    assert claimed and len(seen) == len(set(seen)), f"{len(seen) - len(set(seen))} repeats"
    assert not set(stayed) - set(seen), f"never shown: {len(set(stayed) - set(seen))}"


def test_the_queued_list_goes_on_when_every_id_its_cursor_keeps_is_cancelled(project: Project) -> None:
    """200 queued jobs paged in 20s; between two pages every job the page showed and the
    next job not yet shown are cancelled (a bulk cancel: every id the cursor keeps leaves
    ready). The list is not read yet, and the traversal shows every job that stayed queued,
    once each. (The next page took the list for read, as if workers had claimed past those
    ids: 0 of the 179 jobs still queued were listed.)"""
    c = project.client
    ids = [m.id for m in c.enqueue_many([Request("record", {"n": i}) for i in range(200)])]  # type: ignore[union-attr]
    newest_first = list(reversed(ids))
    shown: list[str] = []

    def page(cursor: str | None) -> Any:
        got = c.jobs("queued", queue="fast", limit=20, cursor=cursor)
        shown[:] = [j.id for j in got.jobs]
        return got

    def cancel_page_and_next(n: int) -> None:
        if n == 0:
            nxt = newest_first[newest_first.index(shown[-1]) + 1]
            for job_id in [*shown, nxt]:
                c.cancel(job_id)

    seen = _follow(page, cancel_page_and_next)
    stayed = [i for i in ids if c.get(i).status == "queued"]
    assert len(stayed) == 179
    assert len(seen) == len(set(seen)), f"{len(seen) - len(set(seen))} repeats"
    assert not set(stayed) - set(seen), f"never shown: {len(set(stayed) - set(seen))} of {len(stayed)}"


def test_the_deferred_list_goes_on_when_a_batch_cancel_takes_the_ids_its_cursor_keeps(project: Project) -> None:
    """30 jobs parked on a CONCURRENCY limit, paged in 4s while a batch cancel takes the
    last job shown and the first not yet shown out of the waiters list before every next
    page: the list is not read yet, and every job that stays deferred is shown once.
    (With both ids gone the list counted as read, as if the limit had woken them.)"""
    parked, _ = _park_on_a_limit(project)
    c, rt, k = project.client, project.runtime, project.keys()
    limit = rt.redis.zrange(k.limwait, 0, -1)[0]
    shown: list[str] = []

    def page(cursor: str | None) -> Any:
        got = c.jobs("deferred", queue="fast", limit=4, cursor=cursor)
        shown[:] = [j.id for j in got.jobs]
        return got

    def cancel_last_and_next(n: int) -> None:
        waiters = rt.redis.lrange(k.waiters(limit), 0, -1)  # oldest first: the pages go toward the head
        at = waiters.index(shown[-1])
        if at >= 2:
            _, _, gone = rt.scripts.cancel_deferred(k, k.waiters(limit), limit, 2, "", waiters[at - 2], 60_000)
            assert gone == [waiters[at - 1], shown[-1]]

    seen = _follow(page, cancel_last_and_next)
    stayed = [i for i in parked if c.get(i).status == "deferred"]
    assert len(seen) == len(set(seen)) and len(stayed) >= 14
    assert not set(stayed) - set(seen), f"never shown: {len(set(stayed) - set(seen))} of {len(stayed)}"


def _finish(project: Project, n: int, tag: str) -> list[str]:
    """Claim and ack ``n`` queued jobs at once (a worker finishing them): their ids, in
    the order they finished."""
    from runner.worker.fetcher import CLAIM_FIELDS

    rt, k = project.runtime, project.keys()
    reply = list(rt.scripts.claim(k, n=n, start=n, lease_ms=600_000, token_base=tag, dead_ttl_ms=10_000_000,
                                  done_ttl_ms=10_000_000))
    claimed = [(reply[i], reply[i + 1]) for i in range(2, len(reply), CLAIM_FIELDS)]
    rt.scripts.ack(k, [Ack(job_id, token, "null", "record|1", "") for job_id, token in claimed], 60_000)
    return [job_id for job_id, _ in claimed]


def test_a_done_cursor_whose_generation_rolled_out_ends_the_list(project: Project) -> None:
    """A done cursor kept while its generation falls out of the kept ones (finishes roll
    them every done_max / 4 jobs): the next page ends the traversal at once, as every
    traversal ends. (The cursor counted from its generation's tail, and a generation gone
    gave no ids, the same cursor and "not exhausted": page() read it again for ever, and a
    web process's threads spun on it.)"""
    import threading

    c, rt, k = project.client, project.runtime, project.keys()

    def finish(n: int, tag: str) -> None:  # generations of 10 jobs (done_max 40)
        c.enqueue_many([Request("record", {"t": tag, "i": i}) for i in range(n)])
        reply = list(rt.scripts.claim(k, n=n, start=n, lease_ms=600_000, token_base=tag, dead_ttl_ms=10_000_000,
                                      done_ttl_ms=10_000_000))
        from runner.worker.fetcher import CLAIM_FIELDS
        claimed = [(reply[i], reply[i + 1]) for i in range(2, len(reply), CLAIM_FIELDS)]
        rt.scripts.ack(k, [Ack(job_id, token, "null", "record|1", "") for job_id, token in claimed], 60_000,
                       done_max=40)

    for i in range(6):
        finish(5, f"a{i}")
    got = c.jobs("done", queue="fast", limit=5)
    for _ in range(2):
        got = c.jobs("done", queue="fast", limit=5, cursor=got.cursor)
    assert got.cursor is not None
    for i in range(12):  # six generations more: the cursor's is gone
        finish(5, f"b{i}")
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(c.jobs("done", queue="fast", limit=5, cursor=got.cursor)),
                         daemon=True)
    t.start()
    t.join(timeout=10)
    assert out, "the page past a rolled generation never came back"
    assert out[0].cursor is None and out[0].jobs == []


def test_the_queued_list_keeps_its_place_when_a_resume_puts_many_jobs_at_the_consumer_end(
        project: Project) -> None:
    """300 queued jobs paged in 50s; after the first page, resuming a paused function puts
    its 1,200 held jobs back at the consumer end of ready (the end the cursor counts from),
    more than a page's search looked past. Every job queued throughout is still shown,
    once. (The next page found none of the cursor's ids within its reach and ended the
    list: 250 of the 300 were never shown.)"""
    c, rt, k = project.client, project.runtime, project.keys()
    c.pause(function="noop")
    held = [m.id for m in c.enqueue_many([Request("noop", {"i": i}) for i in range(1_200)])]  # type: ignore[union-attr]
    while rt.redis.llen(k.held("noop")) < len(held):  # claims move a paused function's jobs to its held list
        rt.scripts.claim(k, n=500, start=500, lease_ms=600_000, token_base="h", dead_ttl_ms=10_000_000,
                         done_ttl_ms=10_000_000)
    assert {c.get(i).status for i in held[:5]} == {"deferred"}
    ids = [m.id for m in c.enqueue_many([Request("record", {"n": i}) for i in range(300)])]  # type: ignore[union-attr]

    def resume(n: int) -> None:
        if n == 0:
            c.resume(function="noop")

    seen = _follow(lambda cursor: c.jobs("queued", queue="fast", limit=50, cursor=cursor), resume, most=200)
    assert rt.redis.llen(k.ready) == 1_500
    assert len(seen) == len(set(seen)), f"{len(seen) - len(set(seen))} repeats"
    assert not set(ids) - set(seen), f"never shown: {len(set(ids) - set(seen))} of {len(ids)}"


def test_the_done_list_goes_on_to_older_jobs_while_more_than_a_page_finish_between_pages(
        project: Project) -> None:
    """120 done jobs paged in 10s while 30 more finish between every two pages (more than
    a page): each next page holds only jobs that finished before the last one shown, the
    traversal ends, and it shows each of the 120 once. (The cursor counted places from
    the newest: each next page showed jobs newer than the page before, and the older
    jobs were never reached.)"""
    c = project.client
    c.enqueue_many([Request("record", {"n": i}) for i in range(120)])
    before = _finish(project, 120, "b")
    order = {job_id: n for n, job_id in enumerate(before)}  # finish order: a later one is newer

    def more(n: int) -> None:
        c.enqueue_many([Request("record", {"m": n, "i": i}) for i in range(30)])
        for job_id in _finish(project, 30, f"m{n}"):
            order[job_id] = len(order)

    pages: list[list[str]] = []

    def page(cursor: str | None) -> Any:
        got = c.jobs("done", queue="fast", limit=10, cursor=cursor)
        pages.append([j.id for j in got.jobs])
        return got

    seen = _follow(page, more, most=40)
    for earlier, later in itertools.pairwise(pages):
        if earlier and later:
            assert max(order[i] for i in later) < min(order[i] for i in earlier), "a next page held newer jobs"
    assert len(seen) == len(set(seen)) and set(seen) == set(before), f"{len(set(before) - set(seen))} never shown"
