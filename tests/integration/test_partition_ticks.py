"""Schedule ticks on a partitioned queue (docs/partitions.md, "Routing"): a tick's job
goes where its keys route it, as every other job of its function does, so RESOURCE_KEY
and CONCURRENCY hold between the ticks and the jobs enqueued by hand; each tick still
fires once, and OVERLAP and the schedules' listing see the job where it went."""

from __future__ import annotations

import json

import pytest
from clusterkit import cluster, cproject  # noqa: F401  (a project on the local cluster)
from schedulekit import LONG, TEST_ENV, add_function, jobs_of, log_has, ms, set_clock, ticks

from runner.store import routing
from runner.store.keys import partition_tags

from conftest import Project, wait_for

# Holds its key for payload["hold"] seconds; records when it held it.
HOLDER = '''"""Holds a key (a schedule's ticks and enqueued jobs alike); records each run."""
import os
import time

QUEUE = "fast"
{options}


def handle(payload, ctx):
    start = time.time()
    time.sleep(payload.get("hold", 0.01))
    end = time.time()
    with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id), "a") as f:
        f.write(f"{{start}} {{end}} {{ctx.attempt}}\\n")
    return payload
'''

B = "2030-01-01T00:00"  # a base time for the tests that move the schedules' clock


@pytest.fixture(autouse=True)
def _seconds_field(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process loads the functions too (its client): their 6-field expressions need
    the tests' switch."""
    monkeypatch.setenv("RUNNER_TEST_SCHEDULES", "1")


SCHEMA = {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
          "properties": {"r": {"type": "string"}, "hold": {"type": "number"}}}

KEYS = {
    "resource": ('RESOURCE_KEY = "res:{r}"', "r:res:{r}"),
    "concurrency": ('CONCURRENCY = {"key": "acct:{r}", "limit": 1}', "ck:acct:{r}"),
}


def away(project: Project, route: str, n: int) -> str:
    """A value of ``r`` whose rendered key routes to a partition other than the queue's
    home one (where the schedule's state lives)."""
    home = project.runtime.keys["fast"].partition
    return next(f"x{i}" for i in range(100) if routing.partition_of(route.format(r=f"x{i}"), n) != home)


def overlaps(project: Project) -> int:
    """How many runs started while another run (of any job: they all hold one key) was
    inside."""
    spans = sorted(tuple(map(float, line.split()[:2])) for p in project.records.iterdir()
                   if p.is_file() for line in p.read_text().splitlines())
    count, end = 0, 0.0
    for start, stop in spans:
        count += start < end
        end = max(end, stop)
    return count


def holder(project: Project, kind: str, n: int, extra: str = "") -> str:
    """A function ``holder`` ticking every second that holds one key routed away from the
    home partition; returns the key's ``r``."""
    option, route = KEYS[kind]
    r = away(project, route, n)
    payload = json.dumps({"r": r, "hold": 0.3})
    add_function(project, "holder", f'{option}\nSCHEDULE = "* * * * * *"\nSCHEDULE_PAYLOAD = {payload}{extra}',
                 HOLDER, SCHEMA)
    return r


def run_side_by_side(p: Project, r: str) -> None:
    """Two workers; once the ticks run, 8 jobs of the same key sent by hand; waits for
    them and for 4 ticks' runs."""
    for _ in range(2):
        p.spawn_worker("fast", env=TEST_ENV)
    wait_for(lambda: any(p.records.iterdir()), timeout=30, what="the first tick's run")
    plain = [p.client.enqueue("holder", {"r": r, "hold": 0.3}).id for _ in range(8)]
    wait_for(lambda: all(p.runs(i) for i in plain), timeout=60, what="the jobs sent by hand")
    wait_for(lambda: len([t for t in jobs_of(p) if t["status"] == "done"]) >= 4, timeout=30,
             what="four ticks' runs")


@pytest.mark.parametrize("kind", list(KEYS))
def test_a_ticks_job_and_the_jobs_of_its_key_never_run_at_once(project: Project, kind: str) -> None:
    """4 partitions; a schedule every second whose job holds a key (RESOURCE_KEY, or a
    CONCURRENCY key of limit 1) routed away from the home partition, and 8 jobs of the
    same function and key sent by hand, on 2 workers of 8 threads: never two runs of the
    key at once, and every tick's job lands in the key's partition (before: the ticks'
    jobs went to the home partition and ran beside the others)."""
    project.write_config(concurrency=8, prefetch=0, fast="partitions = 4")
    r = holder(project, kind, 4)
    run_side_by_side(project, r)
    assert overlaps(project) == 0, "two runs of one key overlapped"
    route = KEYS[kind][1].format(r=r)
    where = project.runtime.parts["fast"][routing.partition_of(route, 4)].tag
    assert {j["tag"] for j in jobs_of(project)} == {where}
    got = ticks(project, "holder")
    assert len(got) == len(set(got)), f"a tick was enqueued twice: {got}"


def test_ticks_on_the_partitions_of_a_cluster_meet_the_jobs_of_their_key(cproject: Project) -> None:  # noqa: F811
    """On a real 3-master Cluster, 6 partitions: the same as above with a RESOURCE_KEY, the
    key's partition in another slot than the schedule's state (the tick's job cannot be
    written by the tick's own script there)."""
    p = cproject
    p.write_config(concurrency=8, prefetch=0, fast="partitions = 6")
    r = holder(p, "resource", 6)
    run_side_by_side(p, r)
    assert overlaps(p) == 0, "two runs of one resource overlapped"
    got = ticks(p, "holder")
    assert len(got) == len(set(got)), f"a tick was enqueued twice: {got}"


def test_two_live_counts_send_the_ticks_where_the_key_was_placed(project: Project) -> None:
    """A rolling deploy from 4 to 6 partitions: a worker on 4 and a worker on 6 both fire
    the ticks, and a producer on 6 sends 8 jobs of the key by hand. The key's partition
    differs between the counts; whichever worker fires a tick, its job goes where the
    first jobs placed the key, with the others: never two runs at once, each tick once."""
    project.write_config(concurrency=8, prefetch=0, fast="partitions = 4")
    option, route = KEYS["resource"]
    t4, t6 = partition_tags("fast", 4), partition_tags("fast", 6)
    r = next(f"x{i}" for i in range(200)
             if "fast" != t4[routing.partition_of(route.format(r=f"x{i}"), 4)]
             != t6[routing.partition_of(route.format(r=f"x{i}"), 6)] != "fast")
    placed = t4[routing.partition_of(route.format(r=r), 4)]
    payload = json.dumps({"r": r, "hold": 0.3})
    add_function(project, "holder", f'{option}\nSCHEDULE = "* * * * * *"\nSCHEDULE_PAYLOAD = {payload}',
                 HOLDER, SCHEMA)
    project.spawn_worker("fast", env=TEST_ENV, log_name="four.log")
    wait_for(lambda: any(project.records.iterdir()), timeout=30, what="the first tick's run on 4")
    project.write_config(concurrency=8, prefetch=0, fast="partitions = 6")
    project.spawn_worker("fast", env=TEST_ENV, log_name="six.log")
    wait_for(lambda: log_has(project, "schedules: 1 active", "six.log"), timeout=30, what="the worker on 6")
    assert "fast" in project.runtime.placements, "the producer on 6 should know of 4"
    plain = [project.client.enqueue("holder", {"r": r, "hold": 0.3}).id for _ in range(8)]
    n = len(jobs_of(project))
    wait_for(lambda: all(project.runs(i) for i in plain), timeout=60, what="the jobs sent by hand")
    wait_for(lambda: len([j for j in jobs_of(project) if j["status"] == "done"]) >= n + 3, timeout=30,
             what="three more ticks' runs")
    assert overlaps(project) == 0, "two runs of one resource overlapped"
    tags = {project.client._find(i)[0].tag for i in plain} | {j["tag"] for j in jobs_of(project)}
    assert tags == {placed}, tags
    got = ticks(project, "holder")
    assert len(got) == len(set(got)), f"a tick was enqueued twice: {got}"


def test_overlap_skip_sees_the_last_job_in_its_keys_partition(project: Project) -> None:
    """OVERLAP = "skip" on 4 partitions, the job's key routed away from the schedule's
    state: the +60 tick finds the +30 job still running in its key's partition and is
    skipped; the listing shows that job running; once it finished, +90 runs."""
    project.write_config(fast="partitions = 4")
    r = away(project, "r:res:{r}", 4)
    add_function(project, "long_skip", f'RESOURCE_KEY = "res:{{r}}"\nSCHEDULE = "*/30 * * * * *"\n'
                 f'SCHEDULE_PAYLOAD = {{"r": "{r}"}}\nOVERLAP = "skip"', LONG, SCHEMA)
    set_clock(project, ms(B) + 20_000)
    project.spawn_worker("fast", env=TEST_ENV, log_name="worker.log")
    wait_for(lambda: log_has(project, "schedules: 1 active"), timeout=30, what="the worker to adopt")
    set_clock(project, ms(B) + 29_700)
    wait_for(lambda: [j["status"] for j in jobs_of(project)] == ["processing"], timeout=15,
             what="the +30 job to be running")
    (row,) = project.client.schedules()
    assert row["last_job"] == {"id": jobs_of(project)[0]["id"], "status": "processing"}
    set_clock(project, ms(B) + 59_700)
    rd, k = project.runtime.redis, project.keys()
    wait_for(lambda: rd.hget(k.schedule("long_skip"), "n_overlap") == "1", timeout=15, what="the overlap skip")
    assert ticks(project, "long_skip") == [at(30)]
    (project.records / "release").write_text("")
    wait_for(lambda: [j["status"] for j in jobs_of(project)] == ["done"], timeout=30, what="the job to finish")
    set_clock(project, ms(B) + 89_700)
    wait_for(lambda: ticks(project, "long_skip") == [at(30), at(90)], timeout=15, what="+90 to run")


def test_a_manual_run_goes_to_its_keys_partition(project: Project) -> None:
    """`runner schedules trigger` on 4 partitions: the manual run's job is in its key's
    partition at once, found by its id, and the schedule's listing shows it queued."""
    project.write_config(fast="partitions = 4")
    r = holder(project, "resource", 4)
    job = project.client.trigger("holder")
    k, _ = project.client._find(job.id)
    assert k.partition == routing.partition_of(f"r:res:{r}", 4)
    assert project.client.get(job.id).status == "queued"
    (row,) = project.client.schedules()
    assert row["last_job"] == {"id": job.id, "status": "queued"}


def at(seconds: int) -> str:
    from schedulekit import at as text

    return text(f"2030-01-01T00:{seconds // 60:02d}:{seconds % 60:02d}")


def test_a_last_job_sent_away_is_read_where_it_is_on_a_cluster(cproject: Project) -> None:  # noqa: F811
    """On a real Cluster, 6 partitions: a tick whose job goes to another slot's partition
    is read (OVERLAP's reading, the listing) as on its way while its entry is in the
    outbox, also once placed, and from its partition once the entry is gone; the tick
    script then fires the next tick only on a reading of it."""
    from runner import outbox
    from runner.store import codec
    from runner.store.schedules import last_jobs
    from runner.store.scripts import NewJob, job_entry

    p = cproject
    p.write_config(fast="partitions = 6")
    r = holder(p, "resource", 6)
    rt, home = p.runtime, p.runtime.keys["fast"]
    there = rt.parts["fast"][routing.partition_of(f"r:res:{r}", 6)]
    assert rt.redis.keyslot(there.ready) != rt.redis.keyslot(home.ready)
    (s,) = rt.registry.schedules()

    def fire(job_id: str, tick: int, seen: str) -> list[object]:
        job = NewJob(id=job_id, type="holder", version=1, payload=s.payload_json, max_attempts=3, run_at_ms=0,
                     delay_ms=0, idem_key="", payload_hash="-", resource_key=s.resource_key, limits=s.limits)
        return list(rt.scripts.tick(home, s.id, job, mode="fire", tick_ms=tick, digest=s.digest, born_ms=1,
                                    overlap="skip", missed=0, late_ms=0, now_ms=tick,
                                    away=codec.dumps(job_entry("fast", job)), seen=seen))

    def reading() -> str:
        (seen,) = last_jobs(rt.redis, rt.scripts, [(home, s.id)], rt.parts)
        return seen

    assert fire("j1", 1_000, reading()) == [1, "j1", "queued"]
    entry = rt.redis.lrange(home.outbox, 0, -1)[0]
    assert reading() == "j1 relaying"
    assert fire("j2", 2_000, reading()) == [3, "j1", "queued"]
    outbox.place(rt, [entry])
    assert reading() == "j1 relaying" and rt.redis.lrange(there.ready, 0, -1) == ["j1"]
    outbox.remove(rt, home, [entry])
    assert reading() == "j1 queued"
    (row,) = p.client.schedules()
    assert row["last_job"] == {"id": "j1", "status": "queued"}
    assert fire("j3", 3_000, "-") == [-4, "j1", "look"]
    rt.redis.delete(there.job("j1"))  # (as if done and forgotten)
    assert reading() == "j1 here"
    assert fire("j3", 3_000, reading()) == [1, "j3", "queued"]
