"""Graceful shutdown: SIGTERM stops claiming, lets running jobs finish within the grace
period, returns what cannot finish without spending an attempt; a second signal exits
at once and the lease brings the job back."""

from __future__ import annotations

import signal
import time

from crashkit import (
    assert_quiet,
    configure,
    log_records,
    outcomes,
    rec,
    wait_exit,
    wait_final,
    wait_log,
    worker_log,
)

from conftest import Project, assert_no_job_in_two_structures, structures, wait_for


def test_sigterm_finishes_running_jobs_and_leaves_the_rest_untouched(project: Project) -> None:
    """Two handlers running, four jobs waiting: on SIGTERM the two finish (well within the
    grace period), the worker exits 0, and the four wait in ready with no attempt spent."""
    configure(project, vt=5, concurrency=2, grace=10)
    c = project.client
    running = [c.enqueue("record", {"n": i, "sleep": 1.0}).id for i in range(2)]
    waiting = [c.enqueue("record", {"n": i}).id for i in range(2, 6)]
    w = project.spawn_worker("fast")
    wait_for(lambda: all(project.runs(i) for i in running), timeout=15, what="both handlers to start")
    t0 = time.monotonic()
    w.send_signal(signal.SIGTERM)
    assert wait_exit(w, 10) == 0
    assert time.monotonic() - t0 < 5, "shutdown took longer than the running jobs need"
    for i in running:
        r = rec(project, i)
        assert r["status"] == "done" and outcomes(r) == ["done"] and len(project.runs(i)) == 1
    for i in waiting:
        r = rec(project, i)
        assert r["status"] == "queued" and r["attempt"] == 0 and not project.runs(i)
    assert sorted(structures(project)["ready"]) == sorted(waiting)
    assert structures(project)["leases"] == []
    # A new worker picks them up.
    project.spawn_worker("fast")
    assert all(r["status"] == "done" for r in wait_final(project, waiting, timeout=15).values())
    assert_quiet(project)


def test_job_past_the_grace_period_is_released_without_an_attempt(project: Project) -> None:
    """A handler (in a thread) that outlives a 1 s grace period: the worker exits soon after
    it; the job keeps its lease until it lapses (its handler may have been running until the
    exit), then goes back to ready with its attempt given back and "interrupted" on record."""
    configure(project, vt=2, concurrency=2, grace=1)
    c = project.client
    job = c.enqueue("record", {"n": 1, "sleep": 6})
    w = project.spawn_worker("fast")
    wait_for(lambda: project.runs(job.id), timeout=15, what="the handler to start")
    t0 = time.monotonic()
    w.send_signal(signal.SIGTERM)
    wait_exit(w, 10)
    assert time.monotonic() - t0 < 4
    assert structures(project)["leases"] == [job.id], "handed back while its handler could still run"
    assert any("grace period" in str(x.get("msg")) for x in log_records(worker_log(project, w)))
    k = project.keys()
    project.runtime.scripts.reclaim(k, 100, 10**7, now_ms=int(time.time() * 1000) + 10_000)
    r = rec(project, job.id)
    assert r["status"] == "queued" and r["attempt"] == 0 and outcomes(r) == ["interrupted"]
    assert structures(project)["ready"] == [job.id]
    assert_no_job_in_two_structures(project)


def test_second_signal_exits_at_once_and_the_lease_brings_the_job_back(project: Project) -> None:
    """SIGTERM, then SIGTERM again while a long handler runs: the worker exits at once
    (code 1); the job is not lost: it keeps its lease and is reclaimed once it lapses."""
    configure(project, vt=3, concurrency=1, grace=25)
    c = project.client
    job = c.enqueue("record", {"n": 1, "sleep": 2.5})
    w = project.spawn_worker("fast")
    wait_for(lambda: project.runs(job.id), timeout=15, what="the handler to start")
    w.send_signal(signal.SIGTERM)
    wait_log(worker_log(project, w), "stopping gracefully", timeout=5)
    t0 = time.monotonic()
    w.send_signal(signal.SIGTERM)
    assert wait_exit(w, 5) == 1
    assert time.monotonic() - t0 < 1.5
    assert rec(project, job.id)["status"] == "processing"
    assert structures(project)["leases"] == [job.id]
    project.spawn_worker("fast")
    final = wait_final(project, [job.id], timeout=20)[job.id]
    assert final["status"] == "done" and outcomes(final) == ["worker lost", "done"]
    assert_quiet(project)

