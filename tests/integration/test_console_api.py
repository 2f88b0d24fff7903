"""The operations console's routes, through the real ASGI app with scoped tokens, real
worker processes and a partitioned queue: GET /workers (and `runner workers`) lists the
workers alive with the jobs they run, one that stops leaves at once and one SIGKILLed
after its entry's time to live; POST /jobs/{id}/run-now runs a delayed, retrying or
sleeping job now without spending an attempt (409 otherwise); POST
/schedules/{name}/trigger runs a schedule now; the search by idempotency key finds
dead and cancelled jobs in every partition; a read token gets a 403 on every action."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import time
from typing import Any

import falcon.testing

from runner.client.inspecting import find
from runner.web import create_app

from conftest import Project, wait_for

SECRETS = {"ops": "ops-secret", "viewer": "viewer-secret"}
SCOPES = {"ops": ["read", "operate", "enqueue"], "viewer": ["read"]}
TOKENS = "".join(f'\n[api.tokens.{name}]\nhash = "sha256:{hashlib.sha256(secret.encode()).hexdigest()}"\n'
                 f"scopes = {json.dumps(SCOPES[name])}\n" for name, secret in SECRETS.items())
OPS = {"Authorization": f"Bearer {SECRETS['ops']}"}
VIEWER = {"Authorization": f"Bearer {SECRETS['viewer']}"}

BLOCKS = '''"""Runs until its release file appears."""
import os
import time

QUEUE = "slow"
TIMEOUT = 120
ISOLATION = "process"


def handle(payload, ctx):
    release = os.path.join(os.environ["RECORD_DIR"], "release")
    while not os.path.exists(release):
        time.sleep(0.02)
    return {"released": True}
'''
LATER = '''"""Fails its first attempt, then retries in ten minutes."""
QUEUE = "fast"
MAX_ATTEMPTS = 2
BACKOFF = {"base": 600, "cap": 600, "jitter": "none"}


def handle(payload, ctx):
    if ctx.attempt == 1:
        raise RuntimeError("not yet")
    return {"attempt": ctx.attempt}
'''
NAPS = '''"""A durable function that sleeps an hour between two steps."""
QUEUE = "fast"


def handle(payload, ctx):
    first = ctx.step("first", lambda: 1)
    ctx.sleep("nap", 3600)
    return {"first": first, "woke": True}
'''
DOOMED = '''"""Keyed by payload field k; always fails for good."""
from runner import PermanentFailure

QUEUE = "fast"
IDEMPOTENCY_KEY = "{k}"


def handle(payload, ctx):
    raise PermanentFailure("never")
'''
REPORT = '''"""A schedule far from now: only a trigger runs it."""
QUEUE = "fast"
SCHEDULE = "0 0 1 1 *"


def handle(payload, ctx):
    return {"reported": True}
'''


def app(project: Project) -> falcon.testing.TestClient:
    return falcon.testing.TestClient(create_app(project.runtime))


def cli(project: Project, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"), *args],
                          env=project.env, capture_output=True, text=True, timeout=60)


def workers(web: falcon.testing.TestClient) -> list[dict[str, Any]]:
    r = web.simulate_get("/workers", headers=VIEWER)
    assert r.status_code == 200, r.text
    return r.json["workers"]  # type: ignore[no-any-return]


def test_workers_list_what_they_run_and_leave_on_stop_or_after_their_ttl(project: Project) -> None:
    """A worker's entry says its queues, concurrency, isolation and version, and the job its
    handler runs (within a heartbeat; in a child process here). A worker stopped with SIGTERM is gone at once, though
    its entry would live a minute; a SIGKILLed one is still listed just after its death and
    gone once its entry's 3 s time to live passed. `runner workers` shows the same."""
    project.add_function("blocks", BLOCKS)
    project.write_config(extra=TOKENS)
    web = app(project)
    assert workers(web) == []
    assert web.simulate_get("/workers").status_code == 401
    stays = project.spawn_worker("slow", env={"RUNNER_TEST_ROSTER": "0.2,60", "RUNNER_RELEASE": "v42"})
    dies = project.spawn_worker("fast", env={"RUNNER_TEST_ROSTER": "0.2,3"})
    wait_for(lambda: len(workers(web)) == 2, timeout=30, what="both workers to register")
    job = project.client.enqueue("blocks", {}).id

    def running() -> list[dict[str, Any]]:
        return [r for w in workers(web) for r in w["running"]]

    wait_for(lambda: [r["id"] for r in running()] == [job], timeout=15, what="the job to show as running")
    by_pid = {w["pid"]: w for w in workers(web)}
    slow, fast = by_pid[stays.pid], by_pid[dies.pid]
    assert slow["queues"] == ["slow"] and slow["concurrency"] == 2 and slow["isolation"] == "mixed"
    assert slow["release"] == "v42" and slow["version"] and fast["release"] is None
    assert slow["running"][0]["type"] == "blocks" and slow["running"][0]["started"] >= slow["started_at"] > 0
    assert slow["last_seen"] >= slow["started_at"] and fast["queues"] == ["fast"] and fast["running"] == []
    assert fast["concurrency"] == 8 and fast["isolation"] == "thread"
    shown = cli(project, "workers", "--json")
    assert shown.returncode == 0, shown.stderr
    assert {w["pid"] for w in json.loads(shown.stdout)["workers"]} == {stays.pid, dies.pid}
    table = cli(project, "workers")
    assert table.returncode == 0 and f"{job} blocks since" in table.stdout, table.stdout

    dies.send_signal(signal.SIGKILL)
    dies.wait(10)
    killed_at = time.monotonic()
    assert dies.pid in {w["pid"] for w in workers(web)}  # its entry lives on until its ttl
    wait_for(lambda: dies.pid not in {w["pid"] for w in workers(web)}, timeout=20, what="the dead worker to go")
    assert time.monotonic() - killed_at > 1.5

    (project.records / "release").write_text("")
    wait_for(lambda: running() == [], timeout=15, what="the job to end")
    stays.send_signal(signal.SIGTERM)
    stays.wait(15)
    assert workers(web) == []  # gone at once, not in a minute


def shown_by(trail: list[dict[str, Any]]) -> str:
    """The CLI's name on the trail (cli:<user>)."""
    return next(e["by"] for e in trail if e["by"].startswith("cli:"))


def test_run_now_on_a_partitioned_queue(project: Project) -> None:
    """On a queue of 4 partitions, delayed jobs (spread over the partitions), a retrying
    one and a sleeping durable one each run at once after POST /jobs/{id}/run-now, keeping
    their ids and spending no attempt, with the operator in their history and on the
    audit trail. Anything else is a 409 naming its status, an unknown id a 404, and a read
    token a 403 that changes nothing. `runner run-now` does the same."""
    project.add_function("later", LATER)
    project.add_function("naps", NAPS)
    project.write_config(extra=TOKENS, fast="partitions = 4")
    c = project.client
    web = app(project)
    delayed = [c.enqueue("record", {"n": i}, delay=3600).id for i in range(8)]
    assert len({find(c, i)[0].tag for i in delayed}) > 1  # several partitions
    retrying, sleeping = c.enqueue("later", {}).id, c.enqueue("naps", {}).id
    project.spawn_worker("fast")
    wait_for(lambda: c.get(retrying).status == "retrying" and c.get(sleeping).status == "sleeping", timeout=30,
             what="a retrying and a sleeping job")

    r = web.simulate_post(f"/jobs/{delayed[0]}/run-now", headers=VIEWER)
    assert r.status_code == 403 and r.json["scope"] == "operate"
    assert c.get(delayed[0]).status == "scheduled"
    for job_id, was in [(delayed[0], "scheduled"), (retrying, "retrying"), (sleeping, "sleeping")]:
        r = web.simulate_post(f"/jobs/{job_id}/run-now", headers=OPS)
        assert r.status_code == 200, r.text
        assert r.json == {"id": job_id, "run_now": "queued", "was": was}
    shown = cli(project, "run-now", delayed[1], "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == {"id": delayed[1], "run_now": "queued", "was": "scheduled"}
    moved = [delayed[0], delayed[1], retrying, sleeping]
    wait_for(lambda: all(c.get(i).status == "done" for i in moved), timeout=30, what="the jobs to run now")
    assert [c.get(i).as_dict()["attempt"] for i in moved] == [1, 1, 2, 1]
    assert c.get(sleeping).as_dict()["result"] == {"first": 1, "woke": True}
    entry = c.get(retrying).as_dict()["history"][-2]
    assert entry["outcome"] == "run now" and entry["by"] == "ops" and entry["at_ms"] > 0
    assert all(c.get(i).status == "scheduled" for i in delayed[2:])

    r = web.simulate_post(f"/jobs/{delayed[0]}/run-now", headers=OPS)
    assert r.status_code == 409 and r.json["job_status"] == "done", r.text
    again = cli(project, "run-now", delayed[0])
    assert again.returncode == 1 and "is done" in again.stderr
    assert web.simulate_post("/jobs/no-such-job/run-now", headers=OPS).status_code == 404
    queued = c.enqueue("record", {"n": 99}).id
    wait_for(lambda: c.get(queued).status == "done", what="a plain job to run")

    trail = web.simulate_get("/audit", headers=VIEWER).json["entries"]
    # The token's three are one entry (one caller, one action on one queue within the hour).
    assert [(e["action"], e["by"], e.get("job_id") or e["ids"]) for e in trail if e["action"] == "run now"] == [
        ("run now", shown_by(trail), delayed[1]), ("run now", "ops", [delayed[0], retrying, sleeping])]

    # Call and wait (the invoke form): the end state in the answer, bounded by api.max_wait.
    r = web.simulate_post("/jobs/record", json={"n": 7}, query_string="wait=10", headers=OPS)
    assert r.status_code == 200 and r.json["status"] == "done" and r.json["result"] == {"n": 7, "attempt": 1}
    assert web.simulate_post("/jobs/record", json={"n": 8}, query_string="wait=31", headers=OPS).status_code == 400


def test_a_schedule_triggered_now_runs_once_and_leaves_its_next_tick(project: Project) -> None:
    """POST /schedules/{name}/trigger enqueues one run now (trigger "manual"), on the audit
    trail; the schedule's next tick stays where it was. An unknown schedule is a 404, a
    read token a 403."""
    project.add_function("report", REPORT)
    project.write_config(extra=TOKENS)
    web = app(project)
    before = web.simulate_get("/schedules", headers=VIEWER).json["schedules"][0]
    r = web.simulate_post("/schedules/report/trigger", headers=VIEWER)
    assert r.status_code == 403 and r.json["scope"] == "operate"
    r = web.simulate_post("/schedules/report/trigger", headers=OPS)
    assert r.status_code == 202, r.text
    assert r.json["schedule"] == "report" and r.json["type"] == "report" and r.headers["location"] == \
        f"/jobs/{r.json['id']}"
    job = project.client.get(r.json["id"]).as_dict()
    assert job["schedule"] == "report" and job["trigger"] == "manual"
    after = web.simulate_get("/schedules", headers=VIEWER).json["schedules"][0]
    assert after["next"] == before["next"] and after["counts"]["manual"] == 1
    assert after["last_job"]["id"] == r.json["id"]
    nope = web.simulate_post("/schedules/nope/trigger", headers=OPS)
    assert nope.status_code == 404 and "report" in nope.json["detail"]
    (entry,) = web.simulate_get("/audit", headers=VIEWER).json["entries"]
    assert (entry["action"], entry["by"], entry["schedule"], entry["job_id"]) == ("trigger", "ops", "report",
                                                                                  r.json["id"])


def test_the_search_by_idempotency_key_finds_dead_and_cancelled_jobs_in_every_partition(project: Project) -> None:
    """GET /jobs?idempotency_key= on a queue of 4 partitions finds a job that died (its key
    freed for a new request) and one that was cancelled, whichever partition holds them,
    and both the new holder of a freed key and the dead job that held it before."""
    project.add_function("doomed", DOOMED, (project.root / "schemas" / "idem" / "v1.json").read_text())
    project.write_config(extra=TOKENS, fast="partitions = 4")
    c = project.client
    web = app(project)
    dead = {k: c.enqueue("doomed", {"k": k}).id for k in "abcdefgh"}
    assert len({find(c, i)[0].tag for i in dead.values()}) > 1
    cancelled = c.enqueue("idem", {"k": "z"}, delay=3600).id
    assert c.cancel(cancelled) == "cancelled"
    project.spawn_worker("fast")
    wait_for(lambda: all(c.get(i).status == "dead" for i in dead.values()), timeout=30, what="the jobs to die")

    def search(key: str, **params: str) -> list[tuple[str, str]]:
        r = web.simulate_get("/jobs", params={"idempotency_key": key, **params}, headers=VIEWER)
        assert r.status_code == 200, r.text
        return [(j["id"], j["status"]) for j in r.json["jobs"]]

    for k, job_id in dead.items():
        assert search(k) == [(job_id, "dead")]
    assert search("z") == [(cancelled, "cancelled")]
    assert search("z", type="doomed") == []
    # The freed key taken by a new request: both are found, the holder first.
    again = c.enqueue("doomed", {"k": "a"}, delay=3600).id
    assert again != dead["a"]
    assert search("a") == [(again, "scheduled"), (dead["a"], "dead")]
    # A dead letter deleted is found no more.
    c.delete_dead("fast", dead["b"])
    assert search("b") == []


def test_a_worker_of_the_release_before_is_listed_and_a_stale_entry_is_not(project: Project) -> None:
    """An entry written by the release before (no running jobs, no time to live) is listed
    with none running, under the default time to live; an entry not refreshed within its
    own time to live is left out, and the next beat of any worker deletes it."""
    from runner.store import roster

    r, prefix = project.runtime.redis, project.runtime.config.redis.prefix
    now = roster.server_ms(r)
    old = {"id": "old:1:aa", "host": "h", "pid": 1, "queues": ["fast"], "functions": {"record": 1},
           "started_ms": now - 5_000, "seen_ms": now - 1_000}
    stale = {**old, "id": "gone:2:bb", "pid": 2, "seen_ms": now - 10_000, "ttl_ms": 5_000}
    r.hset(roster.key(prefix), mapping={"old:1:aa": json.dumps(old), "gone:2:bb": json.dumps(stale)})
    (shown,) = project.client.workers()
    assert shown["id"] == "old:1:aa" and shown["running"] == [] and shown["concurrency"] == 0
    assert shown["started_at"] == (now - 5_000) / 1000
    roster.beat(project.runtime.scripts, prefix, roster.Member(id="new:3:cc", host="h", pid=3, queues=("fast",),
                                                               functions={}, started_ms=0, seen_ms=0))
    assert set(r.hkeys(roster.key(prefix))) == {"old:1:aa", "new:3:cc"}
    new = next(w for w in project.client.workers() if w["id"] == "new:3:cc")
    assert new["started_at"] == new["last_seen"]  # stamped by the server at its first beat


def test_a_worker_beating_again_is_never_pruned_by_another(project: Project) -> None:
    """Workers whose entries went stale (a paused host) beat again while another worker's
    beat prunes the roster: each one that beat is on the roster afterwards. The pruning
    deletes an entry only while it still holds the stale value it read, so a beat that
    lands between the read and the delete is kept (before, it vanished until the worker's
    next beat, up to HEARTBEAT_S later)."""
    import threading

    from runner.store import roster

    r, prefix = project.runtime.redis, project.runtime.config.redis.prefix
    ids = [f"h:{i}:aa" for i in range(40)]

    def member(i: str) -> roster.Member:
        return roster.Member(id=i, host="h", pid=1, queues=("fast",), functions={"record": 1},
                             started_ms=1, seen_ms=0)

    for _ in range(30):
        now = roster.server_ms(r)
        stale = {i: json.dumps({**member(i).as_dict(), "seen_ms": now - 60_000, "ttl_ms": 1_000}) for i in ids}
        r.hset(roster.key(prefix), mapping=stale)
        r.delete(roster.key(prefix) + ":pruner")  # the next beat is the pruner's
        go = threading.Barrier(len(ids) + 1)

        def beat(m: roster.Member, go: threading.Barrier) -> None:
            go.wait()
            roster.beat(project.runtime.scripts, prefix, m)

        threads = [threading.Thread(target=beat, args=(member(i), go)) for i in [*ids, "pruner:1:aa"]]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        missing = set(ids) - set(r.hkeys(roster.key(prefix)))
        assert not missing, f"live workers pruned: {sorted(missing)}"


def test_a_beat_reads_nothing_of_the_fleet_and_one_prunes_a_page(project: Project) -> None:
    """A beat costs the same with 300 workers on the roster as with one: it writes its
    entry and bids for the pruning, and reads no other entry. The one beat per
    HEARTBEAT_S that wins the bid reads one page (HSCAN) and deletes the stale entries on
    it, and no live one."""
    from runner.store import roster

    r, prefix = project.runtime.redis, project.runtime.config.redis.prefix
    now = roster.server_ms(r)
    live = {f"live:{i}:aa": roster.Member(id=f"live:{i}:aa", host="h", pid=i, queues=("fast",), functions={},
                                          started_ms=now, seen_ms=0).as_dict() for i in range(150)}
    dead = {f"dead:{i}:aa": {**v, "id": f"dead:{i}:aa", "seen_ms": now - 60_000, "ttl_ms": 1_000}
            for i, v in enumerate(live.values())}
    for v in live.values():
        v["seen_ms"] = now
    r.hset(roster.key(prefix), mapping={k: json.dumps(v) for k, v in {**live, **dead}.items()})
    me = roster.Member(id="me:1:aa", host="h", pid=1, queues=("fast",), functions={}, started_ms=0, seen_ms=0)

    def calls() -> dict[str, int]:
        return {k.removeprefix("cmdstat_"): v["calls"] for k, v in r.info("commandstats").items()}

    r.set(roster.pruner_key(prefix), "another", px=60_000)  # another worker prunes this beat
    r.config_resetstat()
    roster.beat(project.runtime.scripts, prefix, me)
    used = calls()
    assert not {"hvals", "hgetall", "hscan", "hdel", "eval", "evalsha"} & set(used), used
    assert used.get("hset") == 1
    r.delete(roster.pruner_key(prefix))
    pulse = roster.Pulse()
    roster.beat(project.runtime.scripts, prefix, me, pulse)
    assert set(live) | {"me:1:aa"} <= set(r.hkeys(roster.key(prefix)))
    # HSCAN pages through with the cursor the pulse keeps, until every dead entry is gone.
    for _ in range(50):
        if not any(k.startswith("dead:") for k in r.hkeys(roster.key(prefix))):
            break
        r.delete(roster.pruner_key(prefix))
        roster.beat(project.runtime.scripts, prefix, me, pulse)
    assert set(r.hkeys(roster.key(prefix))) == set(live) | {"me:1:aa"}
