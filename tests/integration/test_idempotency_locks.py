"""Idempotency keys and resource locks under real concurrency: threads, processes, kills."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

from runner import config as config_mod
from runner.client import Client
from runner.errors import IdempotencyConflict
from runner.runtime import Runtime
from runner.store import records

from conftest import Project, wait_for


def _enqueue_in_process(cfg_path: str, env: dict[str, str], key: str, out: multiprocessing.Queue) -> None:
    c = Client(Runtime.create(config_mod.load(cfg_path, env=env)))
    out.put(c.enqueue("record", {"n": 1}, idempotency_key=key).id)


def test_concurrent_enqueues_with_one_key_create_one_job(project: Project) -> None:
    """16 threads and 4 processes enqueue with one key at once: exactly one job exists."""
    ids: list[str] = []
    barrier = threading.Barrier(16)

    def go() -> None:
        c = Client(Runtime.create(project.config()))
        # Seen once under heavy load: 'record' missing from a registry loaded in a thread;
        # name what kept it out, should it happen again.
        assert "record" in c.runtime.registry.functions, dict(c.runtime.registry.errors)
        barrier.wait()
        ids.append(c.enqueue("record", {"n": 1}, idempotency_key="order-42").id)

    threads = [threading.Thread(target=go) for _ in range(16)]
    for t in threads:
        t.start()
    ctx = multiprocessing.get_context("spawn")
    q: multiprocessing.Queue = ctx.Queue()
    procs = [ctx.Process(target=_enqueue_in_process,
                         args=(str(project.root / "runner.toml"), project.env, "order-42", q)) for _ in range(4)]
    for p in procs:
        p.start()
    for t in threads:
        t.join()
    for p in procs:
        p.join(30)
        ids.append(q.get(timeout=30))
    assert len(ids) == 20 and len(set(ids)) == 1
    r = project.runtime.redis
    assert r.llen(project.keys().ready) == 1
    assert int(r.hget(project.keys().stats, "enqueued|record")) == 1


def test_same_key_other_payload_is_a_conflict_naming_the_job(project: Project) -> None:
    c = project.client
    first = c.enqueue("idem", {"k": "a", "v": 1})
    assert c.enqueue("idem", {"k": "a", "v": 1}).duplicate
    try:
        c.enqueue("idem", {"k": "a", "v": 2})
        raise AssertionError("expected a conflict")
    except IdempotencyConflict as exc:
        assert exc.job_id == first.id


def intervals(project: Project, ids: list[str]) -> list[tuple[float, float, int]]:
    out = []
    for i in ids:
        for line in project.runs(i):
            a, b, attempt = line.split()
            out.append((float(a), float(b), int(attempt)))
    return sorted(out)


def test_jobs_on_one_resource_never_overlap(project: Project) -> None:
    """30 jobs on one resource across 3 workers x 8 threads: never two inside at once,
    all complete, no attempt burned by waiting, deferrals recorded."""
    c = project.client
    ids = [c.enqueue("resource", {"r": "shared", "hold": 0.01}).id for _ in range(30)]
    for _ in range(3):
        project.spawn_worker("fast")
    for i in ids:
        assert c.wait(i, timeout_s=60).status == "done"
    spans = intervals(project, ids)
    assert len(spans) == 30
    for (_, end, _), (start, _, _) in itertools.pairwise(spans):
        assert start >= end, "two handlers were inside the resource at once"
    recs = [c.get(i).as_dict() for i in ids]
    assert all(r["attempt"] == 1 for r in recs)
    # A finished job keeps no deferral count (a compact outcome); the counter has them.
    assert int(project.runtime.redis.hget(project.keys().stats, "deferred|resource") or 0) > 0


def test_lock_of_a_killed_holder_is_taken_over_after_its_ttl_not_before(project: Project) -> None:
    project.write_config(vt=2)
    c = project.client
    a = c.enqueue("resource", {"r": "x", "hold": 30})
    w1 = project.spawn_worker("fast")
    wait_for(lambda: c.get(a.id).status == "processing", what="A started")
    lock = project.keys().limit("r:res:x")
    holder = project.runtime.redis.zrange(lock, 0, -1)
    assert holder
    b = c.enqueue("resource", {"r": "x", "hold": 0.01})
    project.spawn_worker("fast")
    time.sleep(0.3)  # let B be deferred at least once while A holds the lock (not a sync point)
    os.kill(w1.pid, signal.SIGKILL)
    killed_at = time.time()
    rec_b = c.wait(b.id, timeout_s=20).as_dict()
    assert rec_b["status"] == "done"
    # The lock lived until A's lease lapsed: at least vt minus one renewal period after the kill.
    assert rec_b["started_at"] >= killed_at + 2 * (2 / 3) - 0.1
    assert rec_b["attempt"] == 1
    assert int(project.runtime.redis.hget(project.keys().stats, "deferred|resource") or 0) >= 1


def test_crash_after_handler_before_ack_reruns_at_most_once(project: Project) -> None:
    """Killed between the handler's return and the ack: one more run, then done."""
    project.write_config(vt=1)
    c = project.client
    job = c.enqueue("idem", {"k": "once"})
    w = project.spawn_worker("fast", env={"RUNNER_FAULT": "after_handler"})
    w.wait(timeout=20)
    assert w.returncode == -signal.SIGKILL
    project.spawn_worker("fast")
    rec = c.wait(job.id, timeout_s=20).as_dict()
    assert rec["status"] == "done" and rec["attempt"] == 2
    runs = (project.records / "idem-once").read_text().splitlines()
    assert len(runs) == 2


def test_job_whose_key_already_completed_is_acknowledged_without_running(project: Project) -> None:
    """Another producer pushes a job with a completed key: done as a duplicate, handler not
    run; a wait for it returns at that end (its end was not published: the wait ran out
    its whole timeout and then read the job done)."""
    c = project.client
    first = c.enqueue("idem", {"k": "k1"})
    project.spawn_worker("fast")
    assert c.wait(first.id, timeout_s=15).status == "done"
    r = project.runtime.redis
    k = project.keys()
    r.set(k.job("dup1"), records.encode({"type": "idem", "version": 1, "payload": '{"k": "k1"}',
                                         "max_attempts": 3, "idem_key": "k1"}))
    r.lpush(k.ready, "dup1")
    t0 = time.monotonic()
    rec = c.wait("dup1", timeout_s=60).as_dict()
    assert time.monotonic() - t0 < 30, "the wait ran out its timeout: the duplicate's end was not published"
    assert rec["status"] == "done" and rec["duplicate_of"] == first.id
    assert len(Path(project.records / "idem-k1").read_text().splitlines()) == 1
    assert int(r.hget(k.stats, "duplicates|idem")) == 1
