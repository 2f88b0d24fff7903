"""Partitioned queues on a real local 3-master Redis Cluster (docs/partitions.md): a queue
with 6 partitions puts 2 on every master; enqueues are routed by key (idempotency and
resource exclusion hold across partitions) and keyless jobs spread; one worker claims
from every partition, blocking on all of them when idle; nothing is lost or doubled, and
moving from 3 partitions to 6 under load loses nothing."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from clusterkit import cluster  # noqa: F401  (the cluster fixture)

from runner.client import Request
from runner.errors import IdempotencyConflict
from runner.store import routing
from runner.store.embedded import Server

from conftest import Endpoint, Project, assert_no_job_in_two_structures, make_project, wait_for

# The drain's size: 2,000 by default, PARTITION_JOBS=20000 for the full run.
JOBS = int(os.environ.get("PARTITION_JOBS", 2000))


@pytest.fixture
def pproject(tmp_path: Path, cluster: list[Server]) -> Iterator[Project]:  # noqa: F811
    url = "redis+cluster://" + ",".join(f"127.0.0.1:{s.port}" for s in cluster[:2])
    p = make_project(tmp_path / "p", Endpoint(url))  # type: ignore[arg-type]
    p.write_config(vt=2, fast="partitions = 6", concurrency=16, prefetch=16)
    yield p
    p.stop_all()
    if p._runtime is not None:
        p._runtime.close()


def _partition_of(p: Project, job_id: str) -> int:
    for k in p.runtime.parts["fast"]:
        if p.runtime.redis.exists(k.job(job_id)) or p.runtime.redis.exists(k.state(job_id)):
            return k.partition
    raise AssertionError(f"job {job_id} is in no partition")


def _succeeded(stats: dict[str, Any]) -> int:
    return sum(v for name, v in stats["counters"].items() if name.startswith("succeeded|"))


def _all_structures(p: Project) -> dict[str, int]:
    """Jobs per structure summed over the partitions, each partition checked for a job in
    two structures."""
    total: Counter[str] = Counter()
    real = p.runtime.keys
    try:
        for k in p.runtime.parts["fast"]:
            p.runtime.keys = {**real, "fast": k}
            assert_no_job_in_two_structures(p)
            from conftest import structures

            total.update({name: len(ids) for name, ids in structures(p).items()})
    finally:
        p.runtime.keys = real
    return dict(total)


def test_six_partitions_spread_over_every_master(pproject: Project) -> None:
    """Each partition's keys sit in one slot; the 6 slots are on the 3 masters, 2 each; the
    slow queue (1 partition) keeps its one tag, as before."""
    r = pproject.runtime.redis
    parts = pproject.runtime.parts["fast"]
    assert len(parts) == 6 and parts[[k.tag for k in parts].index("fast")] is pproject.runtime.keys["fast"]
    nodes = Counter()
    for k in parts:
        assert len({r.keyslot(x) for x in (k.ready, k.leases, k.job("a"), k.idem("t", "x"), k.limit("r:1"))}) == 1
        nodes[r.get_node_from_key(k.ready).name] += 1
    assert sorted(nodes.values()) == [2, 2, 2], nodes
    assert [k.tag for k in pproject.runtime.parts["slow"]] == ["slow"]


def test_enqueues_are_routed_and_spread_and_read_back(pproject: Project) -> None:
    """Keyless jobs fill every partition (each round trip's to the next); a job is found by
    id in whichever partition holds it; stats and the deploy gate's census sum the
    partitions, and stats list each."""
    c = pproject.client
    ids = [c.enqueue("record", {"n": i}).id for i in range(60)]
    ids += [j.id for j in c.enqueue_many([Request("record", {"n": i}) for i in range(600)])
            if not isinstance(j, Exception)]
    where = Counter(_partition_of(pproject, i) for i in ids)
    assert len(where) == 6 and min(where.values()) >= 60, where
    assert c.get(ids[-1]).status == "queued" and c.get(ids[0]).queue == "fast"
    st = c.stats()["fast"]
    assert st["ready"] == 660 and sum(x["ready"] for x in st["partitions"]) == 660
    assert sorted(x["partition"] for x in st["partitions"]) == list(range(6))
    # The deploy gate (`runner check`) counts every partition's census.
    from runner.store.census import counts

    every = [k for parts in pproject.runtime.parts.values() for k in parts]
    assert counts(pproject.runtime.redis, every)[0] == 660


def test_idempotency_holds_across_partitions(pproject: Project) -> None:
    """The same key reaches the same partition from any path: a second enqueue (single,
    batch or HTTP-style enqueue_all) is the first job, another payload is a conflict; the
    keys themselves land on several partitions."""
    c = pproject.client
    first = {f"k{i}": c.enqueue("idem", {"k": f"k{i}", "v": 1}).id for i in range(40)}
    assert len({_partition_of(pproject, j) for j in first.values()}) >= 4
    again = c.enqueue_many([Request("idem", {"k": f"k{i}", "v": 1}) for i in range(40)])
    assert all(not isinstance(a, Exception) and a.duplicate and a.id == first[f"k{i}"]
               for i, a in enumerate(again))
    single = c.enqueue("idem", {"k": "k7", "v": 1})
    assert single.duplicate and single.id == first["k7"]
    with pytest.raises(IdempotencyConflict):
        c.enqueue("idem", {"k": "k7", "v": 2})
    clash = c.enqueue_all([Request("idem", {"k": "k3", "v": 9})])
    assert isinstance(clash[0], IdempotencyConflict) and clash[0].job_id == first["k3"]
    # Found by its key (the dashboard's search) in whichever partition holds it.
    for i in (3, 7, 11, 19):
        (held,) = c.by_idempotency_key(f"k{i}", type="idem")
        assert held.id == first[f"k{i}"]
    assert {j.id for j in c.by_idempotency_key("k5")} == {first["k5"]}
    # An explicit key routes as a template's does.
    a = c.enqueue("record", {"n": 1}, idempotency_key="order-1")
    b = c.enqueue("record", {"n": 1}, idempotency_key="order-1")
    assert b.duplicate and b.id == a.id
    assert _partition_of(pproject, a.id) == routing.partition_of("i:record:order-1", 6)


def test_a_worker_drains_every_partition_once_each_with_keys_and_locks(pproject: Project) -> None:
    """JOBS jobs (keyless, idempotency-keyed with repeats, resource-locked on 20 resources)
    over 6 partitions, one worker: each job runs once and ends done; a resource is never
    held by two runs at once, though its jobs were enqueued from many round trips; every
    partition ends empty with no job in two structures."""
    p = pproject
    c = p.client
    n_idem, n_res = JOBS // 4, JOBS // 4
    reqs = ([Request("record", {"n": i}) for i in range(JOBS - n_idem - n_res)]
            + [Request("idem", {"k": f"d{i % (n_idem // 2)}"}) for i in range(n_idem)]
            + [Request("resource", {"r": f"r{i % 20}", "hold": 0.002}) for i in range(n_res)])
    answers = c.enqueue_many(reqs)
    assert not [a for a in answers if isinstance(a, Exception)]
    unique = {a.id for a in answers if not isinstance(a, Exception)}
    assert len(unique) == JOBS - n_idem // 2
    t0 = time.monotonic()
    p.spawn_worker("fast")
    wait_for(lambda: _succeeded(c.stats()["fast"]) >= len(unique), timeout=60 + JOBS / 100,
             interval=0.2, what="the drain")
    took = time.monotonic() - t0
    st = c.stats()["fast"]
    assert st["ready"] == st["processing"] == st["scheduled"] == st["dead"] == 0, st
    assert _succeeded(st) == len(unique)
    assert min(_succeeded(x) for x in st["partitions"]) > 0
    by_res: dict[str, list[tuple[float, float]]] = {}
    for a, req in zip(answers, reqs, strict=True):
        assert not isinstance(a, Exception)
        if req.type == "idem":
            continue  # recorded by key, below
        (line,) = p.runs(a.id)  # ran exactly once
        if req.type == "resource":
            start, end, _ = line.split()
            by_res.setdefault(req.payload["r"], []).append((float(start), float(end)))
    for res, spans in by_res.items():
        spans.sort()
        assert all(spans[i][1] <= spans[i + 1][0] for i in range(len(spans) - 1)), f"{res} held twice at once"
    idem_runs = Counter(line.split()[0] for f in p.records.glob("idem-*") for line in f.read_text().splitlines())
    assert all(v == 1 for v in idem_runs.values()) and len(idem_runs) == n_idem // 2
    totals = _all_structures(p)
    assert totals["ready"] == totals["leases"] == totals["scheduled"] == 0
    assert totals["done"] == len(unique)
    print(f"\n{JOBS} jobs over 6 partitions drained in {took:.1f} s")


def test_an_idle_worker_wakes_for_any_partition(pproject: Project) -> None:
    """An idle worker blocks on all six partitions (a waiting connection each on a
    cluster): a job landing in any of them runs at once, not after a poll's round."""
    p = pproject
    c = p.client
    p.spawn_worker("fast")
    wait_for(lambda: c.wait(c.enqueue("record", {"n": 0}).id, timeout_s=20).status == "done", timeout=30)
    seen = set()
    for i in range(12):  # keyless: each enqueue's round trip goes to the next partition
        time.sleep(0.05)  # the worker is idle again, blocked
        t0 = time.monotonic()
        job = c.enqueue("record", {"n": i})
        assert c.wait(job.id, timeout_s=5).status == "done"
        # (A poll's round is bell.BELL_S, 1 s; a wake on a loaded host took 0.65 s once.)
        assert time.monotonic() - t0 < 0.9, f"job {i} waited a poll"
        seen.add(_done_partition(p, job.id))
    assert len(seen) == 6


def _done_partition(p: Project, job_id: str) -> int:
    from conftest import done_ids

    for k in p.runtime.parts["fast"]:
        if job_id in done_ids(p.runtime.redis, k):
            return k.partition
    raise AssertionError(job_id)


def test_three_partitions_to_six_under_load_loses_nothing(pproject: Project) -> None:
    """Producers on 3 partitions, then the config goes to 6 (doubling keeps the 3 tags) with
    a worker already on 6 and producers still on 3: every job accepted runs once."""
    p = pproject
    p.write_config(vt=2, fast="partitions = 3")
    old = p.client
    assert {k.tag for k in old.runtime.parts["fast"]} <= {k.tag for k in p.runtime.parts["fast"]}
    ids = [j.id for j in old.enqueue_many([Request("record", {"n": i}) for i in range(500)])
           if not isinstance(j, Exception)]
    old_rt = p._runtime
    p._runtime = None
    p.write_config(vt=2, fast="partitions = 6")
    p.spawn_worker("fast")
    new = p.client
    for i in range(10):
        ids += [j.id for j in new.enqueue_many([Request("record", {"n": i}) for i in range(50)])
                if not isinstance(j, Exception)]
        ids += [old.enqueue("record", {"n": i}).id]  # a producer not yet restarted
    for job_id in ids:
        assert new.wait(job_id, timeout_s=30).status == "done", job_id
        assert len(p.runs(job_id)) == 1
    if old_rt is not None:
        old_rt.close()


def test_operations_cover_every_partition(pproject: Project) -> None:
    """A pause holds every partition; resume lifts it everywhere; a queued job in any
    partition can be cancelled and is listed; dead letters of all partitions are one
    newest-first list, and requeue and delete find the job's partition; the figures
    (`runner stats`, /metrics) sum the partitions."""
    from runner.observe.figures import read_queues
    from runner.store import records

    p = pproject
    c = p.client
    c.pause("fast")
    queued = [c.enqueue("record", {"n": i}).id for i in range(12)]
    perm = [c.enqueue("perm", {}).id for _ in range(12)]
    assert len({_partition_of(p, i) for i in queued}) == 6
    assert all(p.runtime.redis.hexists(k.paused, "queue") for k in p.runtime.parts["fast"])
    (fig,) = [q for q in read_queues(p.runtime, records.now_ms()) if q.name == "fast"]
    assert fig.ready == 24 and fig.paused
    listed = c.jobs("queued", queue="fast", limit=100)
    assert {j.id for j in listed.jobs} == set(queued + perm)
    away = next(i for i in queued if _partition_of(p, i) != p.runtime.keys["fast"].partition)
    assert c.cancel(away) == "cancelled"
    p.spawn_worker("fast")
    time.sleep(1.0)  # paused: nothing may run, in any partition
    assert not any(p.runs(i) for i in queued)
    c.resume("fast")
    for job_id in queued:
        assert c.wait(job_id, timeout_s=20, statuses=("done", "cancelled")).status == (
            "cancelled" if job_id == away else "done")
    for job_id in perm:
        assert c.wait(job_id, timeout_s=20).status == "dead"
    total, page = c.dead("fast", limit=5)
    assert total == 12 and len(page) == 5
    whole = c.dead("fast", limit=50)[1]
    assert {j.id for j in whole} == set(perm)
    deaths = [int(j.as_dict().get("ended_ms") or 0) for j in whole]
    assert deaths == sorted(deaths, reverse=True) or not any(deaths)
    again = [i for i in perm if _partition_of(p, i) != p.runtime.keys["fast"].partition][:2]
    assert c.requeue("fast", again[0]).status in ("queued", "processing", "dead")
    c.delete_dead("fast", again[1])
    assert c.wait(again[0], timeout_s=20).status == "dead"
    assert c.dead("fast", limit=50)[0] == 11
