"""A success's figures (succeeded, latency and run-time buckets and sums, follow-ups) are
summed in the worker and added to the stats hash at most metrics.FLUSH_S after its ack
lands, in one round trip for every success of that second (issue 53: five HINCRBY per
job inside the ack were a fifth of runner's Redis commands at light load). What must hold:
only landed acks count, nothing is counted twice, a stop adds what is pending, and a
SIGKILL loses at most the last second's."""

from __future__ import annotations

import os
import queue as stdqueue
import signal
import time

from runner.observe import metrics
from runner.worker.entries import AckFigures
from runner.worker.ledger import Ledger
from runner.worker.settler import Settler

from conftest import Project, wait_for


def _succeeded(project: Project, fn: str = "record") -> int:
    return int(project.runtime.redis.hget(project.keys("fast").stats, f"succeeded|{fn}") or 0)


def test_only_landed_acks_count_and_a_failed_add_is_kept(project: Project) -> None:
    rt = project.runtime
    q = rt.config.queues["fast"]
    settler = Settler(rt, q, Ledger(q.concurrency, 64, 1), stdqueue.SimpleQueue())
    key = project.keys("fast").stats
    totals = metrics.Totals()
    fields = [metrics.succeeded("record", 3, 1, totals) for _ in range(3)]

    settler._count(AckFigures(key, totals, fields), [1, 2, 1])  # all landed: the batch's sum
    settler._count(AckFigures(key, totals, fields), [1, -1, -1])  # one landed: its own fields
    assert settler.figures.due_in(time.monotonic()) is not None
    settler.flush_figures()  # not due yet: nothing sent
    assert _succeeded(project) == 0

    settler.flush_figures(final=True)
    got = rt.redis.hgetall(key)
    assert got["succeeded|record"] == "4"
    assert got["lat_sum|record"] == "12" and got["run|record|1"] == "4"
    assert settler.figures.due_in(time.monotonic()) is None  # taken: never added twice
    settler.flush_figures(final=True)
    assert rt.redis.hget(key, "succeeded|record") == "4"

    # A stats hash damaged to another type loses its counts, never the others'.
    settler.figures.add("elsewhere", {"x": 1}, time.monotonic())
    rt.redis.set("elsewhere", "a string")
    settler.figures.add(key, {"succeeded|record": 1}, time.monotonic())
    settler.flush_figures(final=True)
    assert rt.redis.hget(key, "succeeded|record") == "5"


def test_a_success_is_counted_within_a_second_and_a_stop_adds_what_is_pending(project: Project) -> None:
    worker = project.spawn_worker("fast")
    first = project.client.enqueue("record", {"n": 1})
    project.client.wait(first.id, timeout_s=15)
    t = time.monotonic()
    wait_for(lambda: _succeeded(project) == 1, timeout=metrics.FLUSH_S + 1.0, what="the figure within a second")
    assert time.monotonic() - t <= metrics.FLUSH_S + 0.5

    second = project.client.enqueue("record", {"n": 2})
    project.client.wait(second.id, timeout_s=15)
    worker.send_signal(signal.SIGTERM)  # at once: the stop adds the pending figure
    assert worker.wait(timeout=30) == 0
    assert _succeeded(project) == 2


def test_a_sigkill_loses_at_most_the_last_second(project: Project) -> None:
    worker = project.spawn_worker("fast")
    ids = [project.client.enqueue("record", {"n": i}).id for i in range(5)]
    for job_id in ids:
        project.client.wait(job_id, timeout_s=15)
    time.sleep(metrics.FLUSH_S + 0.5)  # past the flush: these are in Redis
    last = project.client.enqueue("record", {"n": 99})
    project.client.wait(last.id, timeout_s=15)
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(timeout=10)
    assert _succeeded(project) in (5, 6)  # the last success's second may be lost, no more


def _done_in_minutes(project: Project, t0_ms: int, t1_ms: int) -> int:
    r, k = project.runtime.redis, project.keys("fast")
    return sum(int(r.hget(k.throughput(m), "done") or 0) for m in range(t0_ms // 60_000, t1_ms // 60_000 + 1))


def test_the_throughput_minute_is_counted_by_the_worker_on_the_servers_clock(project: Project) -> None:
    """The per-minute "done" count (the dashboard's and `runner stats`' throughput) is
    summed in the worker with the other figures, not written by each ack: its minute is
    the server's (the claim's server time plus this host's monotonic clock since), the
    count lands within a second, the hash keeps its 6 h expiry, and a SIGKILL loses at
    most the last second's, as of the other figures."""
    from runner.store.stats import server_ms

    r, k = project.runtime.redis, project.keys("fast")
    worker = project.spawn_worker("fast")
    t0 = server_ms(r)
    ids = [project.client.enqueue("record", {"n": i}).id for i in range(3)]
    for job_id in ids:
        project.client.wait(job_id, timeout_s=15)
    wait_for(lambda: _done_in_minutes(project, t0, server_ms(r)) == 3, timeout=metrics.FLUSH_S + 1.0,
             what="the minute's count within a second")
    minutes = [m for m in range(t0 // 60_000, server_ms(r) // 60_000 + 1) if r.exists(k.throughput(m))]
    assert minutes and all(0 < r.pttl(k.throughput(m)) <= 6 * 3600 * 1000 for m in minutes)
    time.sleep(metrics.FLUSH_S + 0.5)
    last = project.client.enqueue("record", {"n": 99})
    project.client.wait(last.id, timeout_s=15)
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(timeout=10)
    assert _done_in_minutes(project, t0, server_ms(r)) in (3, 4)  # the last second's may be lost, no more
