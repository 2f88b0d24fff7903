"""Changing a queue's ``partitions`` on a live deployment (docs/partitions.md, "Changing
N"): a count that drops tags (6 -> 4 on a cluster, 3 -> 1 on one server) strands no job,
whether it was queued, delayed, retrying or running on a worker that died; producers still
on the old count keep writing; `runner check` says what the change implies; a drained
partition's tag leaves the recorded set after a retention."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from clusterkit import cluster, cproject  # noqa: F401  (a project on the local cluster)

from runner.client import Client, Request
from runner.store.embedded import Server
from runner.store.keys import QueueKeys, partition_tags

from conftest import Project, make_project, wait_for


def _client_on(p: Project, partitions: int, done_s: int = 3600, idem_s: int = 3600) -> Client:
    """A client of its own on ``partitions``: a process that has not been restarted."""
    p.write_config(vt=2, fast=f"partitions = {partitions}")
    cfg = p.root / "runner.toml"
    cfg.write_text(cfg.read_text().replace("done = 3600", f"done = {done_s}")
                   .replace("idempotency = 3600", f"idempotency = {idem_s}"))
    return p.client


def _check(p: Project) -> dict:  # type: ignore[type-arg]
    out = subprocess.run([sys.executable, "-m", "runner.cli", "--config", str(p.root / "runner.toml"),
                          "check", "--json"], cwd=p.root, env=p.env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_six_partitions_to_four_strands_nothing(cproject: Project) -> None:  # noqa: F811
    """On 6 partitions: queued, delayed, retrying and locked jobs, and jobs running on a
    worker that is then SIGKILLed. The config goes to 4 (which drops two of the 6 tags);
    only workers on 4 run from then on, and a producer still on 6 keeps writing: every
    accepted job ends done, and the plain ones ran once."""
    p = cproject
    assert set(partition_tags("fast", 6)) - set(partition_tags("fast", 4)), "the change must drop a tag"
    old = _client_on(p, 6)
    old_rt = p._runtime
    running = [old.enqueue("record", {"n": i, "sleep": 1.0}).id for i in range(12)]
    doomed = p.spawn_worker("fast")
    wait_for(lambda: all(p.runs(i) for i in running), timeout=20, what="the sleepers to start")
    doomed.send_signal(signal.SIGKILL)
    doomed.wait()
    once = [j.id for j in old.enqueue_many([Request("record", {"n": i}) for i in range(300)])
            if not isinstance(j, Exception)]
    once += [old.enqueue("record", {"n": i}, delay=1.5).id for i in range(20)]
    once += [old.enqueue("resource", {"r": f"r{i % 5}", "hold": 0.01}).id for i in range(20)]
    retried = [old.enqueue("record", {"n": i, "fail_times": 1}).id for i in range(20)]
    p._runtime = None
    new = _client_on(p, 4)
    p.spawn_worker("fast")
    p.spawn_worker("fast")
    for i in range(20):  # the old producer keeps writing to its tags, the new one to its own
        once.append(old.enqueue("record", {"n": 1000 + i}).id)
        once.append(new.enqueue("record", {"n": 2000 + i}).id)
    for job_id in once + retried + running:
        assert new.wait(job_id, timeout_s=40).status == "done", job_id
    assert all(len(p.runs(i)) == 1 for i in once)
    assert all(len(p.runs(i)) == 2 for i in retried)
    from runner.store import tagset

    draining = [k for k in new.runtime.parts["fast"] if k.draining]
    assert {k.tag for k in draining} == set(partition_tags("fast", 6)) - set(partition_tags("fast", 4))
    wait_for(lambda: all(tagset.drained(new.runtime.redis, k) for k in draining), timeout=20,
             what="the dropped partitions to drain")
    if old_rt is not None:
        old_rt.close()


def test_three_partitions_to_one_is_checked_drained_and_forgotten(project: Project) -> None:
    """3 -> 1 on one server: `runner check` names the partitions the change drains and the
    jobs they hold; a worker on 1 runs every job of the dropped tags (and GET-style lookups
    find them meanwhile); once they held nothing for the retention, their tags leave the
    recorded set and `runner check` has nothing to drain."""
    from runner.store.keys import partition_set

    p = project
    old = _client_on(p, 3, done_s=1, idem_s=1)
    # Three calls: each call's keyless jobs go to the next partition, so every partition
    # holds some, the dropped ones included (one call's 90 went to one partition, at times
    # the one the change keeps).
    ids = [j.id for n in range(0, 90, 30) for j in old.enqueue_many([Request("record", {"n": i})
                                                                     for i in range(n, n + 30)])
           if not isinstance(j, Exception)]
    p._runtime = None
    new = _client_on(p, 1, done_s=1, idem_s=1)
    assert new.get(ids[0]).status == "queued"  # found in a tag this count lacks
    report = _check(p)
    (change,) = [c for c in report["partitions"] if c["queue"] == "fast"]
    dropped = sorted(set(partition_tags("fast", 3)) - {"fast"})
    assert sorted(change["draining"]) == dropped and change["partitions"] == 1
    held = sum(new.runtime.redis.llen(QueueKeys(p.prefix, "fast", tag=t).ready) for t in dropped)
    assert change["draining_jobs"] == held > 0
    # The figures show each partition, the draining ones marked, and sum them all.
    st = new.stats()["fast"]
    assert st["ready"] == 90
    from prometheus_client import CollectorRegistry, generate_latest

    from runner.web.exposition import RunnerCollector

    metrics = CollectorRegistry()
    metrics.register(RunnerCollector(new.runtime))
    text = generate_latest(metrics).decode()
    for t in dropped:
        (line,) = [x for x in text.splitlines() if x.startswith("runner_partition_ready_jobs{") and f'tag="{t}"' in x]
        assert 'draining="1"' in line and float(line.rsplit(" ", 1)[1]) == new.runtime.redis.llen(
            QueueKeys(p.prefix, "fast", tag=t).ready)
    assert 'runner_queue_ready_jobs{queue="fast"} 90.0' in text
    p.spawn_worker("fast")
    for job_id in ids:
        assert new.wait(job_id, timeout_s=30).status == "done"
        assert len(p.runs(job_id)) == 1
    r = new.runtime.redis
    key = partition_set(p.prefix, "fast")
    wait_for(lambda: r.smembers(key) == {"fast"}, timeout=30, interval=0.2,
             what="the drained tags to leave the recorded set")
    time.sleep(0.2)
    p._runtime = None
    assert not [c for c in _check(p)["partitions"] if c["draining"]]


def test_a_drained_partition_is_kept_while_its_idempotency_keys_live(project: Project) -> None:
    """3 -> 1 with [retention] done = 1 s and idempotency an hour: the dropped partitions
    run empty, yet their tags stay recorded while their jobs' idempotency keys live, so a
    re-send through a process started later on 1 is still the first job (before: retired
    a second after it drained, and the re-send ran again)."""
    import contextlib

    from runner.store import routing
    from runner.store.keys import partition_set

    p = project
    keys = [f"o{i}" for i in range(40) if partition_tags("fast", 3)[routing.partition_of(f"i:idem:o{i}", 3)] != "fast"]
    assert len(keys) >= 10
    old = _client_on(p, 3, done_s=1)
    first = {k: old.enqueue("idem", {"k": k}).id for k in keys}
    p._runtime = None
    new = _client_on(p, 1, done_s=1)
    new.enqueue("record", {"n": 0})  # (records count 1)
    p.spawn_worker("fast")
    for k in keys:
        assert new.wait(first[k], timeout_s=30).status == "done"
    r = new.runtime.redis
    with contextlib.suppress(AssertionError):  # (the bug: retired about a second after it drained)
        wait_for(lambda: r.smembers(partition_set(p.prefix, "fast")) == {"fast"}, timeout=6, interval=0.2)
    p._runtime = None
    later = _client_on(p, 1, done_s=1)
    again = [later.enqueue("idem", {"k": k}) for k in keys]
    wrong = [k for k, a in zip(keys, again, strict=True) if not a.duplicate or a.id != first[k]]
    assert not wrong, f"{len(wrong)} of {len(keys)} re-sends were new jobs"


def test_the_recorded_tags_are_looked_for_once_a_second_while_redis_is_away(tmp_path: Path) -> None:
    """With Redis away, a producer's enqueues do not each try the recorded set first (that
    would double every failing call's wait); it tries again a second later, and once Redis
    answers its tags are recorded."""
    from runner.errors import RedisUnavailable
    from runner.store.keys import partition_set

    own = Server(tmp_path / "own").start()  # this test stops it
    p = make_project(tmp_path / "p", own)
    p.write_config(fast="partitions = 3")
    rt = p.runtime
    tries = []
    real = rt.redis.pipeline

    def counted(*a: object, **kw: object) -> object:
        tries.append(time.monotonic())
        return real(*a, **kw)

    rt.redis.pipeline = counted  # type: ignore[method-assign]
    p.server.stop()
    try:
        for _ in range(20):
            with pytest.raises(RedisUnavailable):
                p.client.enqueue("record", {"n": 1})
        assert len(tries) <= 2, tries  # the first enqueue's look, at most one more a second on
    finally:
        p.server.start()
    wait_for(lambda: p.runtime.redis.ping(), timeout=10)
    time.sleep(1.1)
    p.client.enqueue("record", {"n": 2})
    assert rt.redis.smembers(partition_set(p.prefix, "fast")) == set(partition_tags("fast", 3))
    rt.close()
    own.stop(kill=True)


def test_a_long_lived_reader_learns_of_a_draining_partition(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """A web process started before the change (one that only serves /metrics, say) counts
    the jobs of tags another process recorded later, once it looks again."""
    from runner import runtime as runtime_mod
    from runner.observe.figures import read_queues
    from runner.store import records

    p = project
    p.write_config(fast="partitions = 1")
    reader = p.runtime
    p._runtime = None
    other = _client_on(p, 3)
    other.enqueue_many([Request("record", {"n": i}) for i in range(30)])
    monkeypatch.setattr(runtime_mod, "READ_EVERY_S", 0.0)  # the next read looks again (a second in production)
    (fast,) = [q for q in read_queues(reader, records.now_ms()) if q.name == "fast"]
    assert fast.ready == 30 and len(fast.partitions) == 3
    reader.close()
