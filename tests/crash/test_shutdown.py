"""Graceful shutdown: SIGTERM stops claiming, lets running jobs finish within the grace
period, returns what cannot finish without spending an attempt, however many SIGTERMs
come; a second SIGINT or a SIGQUIT exits at once and the lease brings the job back."""

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


def test_a_repeated_sigterm_keeps_the_grace_period(project: Project) -> None:
    """SIGTERM, then SIGTERM again while a process-isolated handler runs (a stop that
    signals every process under honcho or foreman: the platform's SIGTERM, then the
    manager's): SIGTERM means "stop gracefully" however often it comes. The handler
    finishes within the grace period, the job is done on its first attempt, the worker
    exits 0. (A second SIGTERM used to exit at once: the job was left processing, its
    attempt spent, and came back "worker lost".)"""
    configure(project, vt=3, concurrency=1, grace=25, isolation="process")
    c = project.client
    job = c.enqueue("record", {"n": 1, "sleep": 2.5})
    w = project.spawn_worker("fast")
    wait_for(lambda: project.runs(job.id), timeout=30, what="the handler to start")
    w.send_signal(signal.SIGTERM)
    wait_log(worker_log(project, w), "stopping gracefully", timeout=5)
    w.send_signal(signal.SIGTERM)
    assert wait_exit(w, 20) == 0
    r = rec(project, job.id)
    assert r["status"] == "done" and r["attempt"] == 1 and outcomes(r) == ["done"], r
    assert len(project.runs(job.id)) == 1
    assert any("already stopping" in str(x.get("msg")) for x in log_records(worker_log(project, w)))
    assert structures(project)["leases"] == []
    assert_quiet(project)


def test_a_second_sigint_exits_at_once_and_the_lease_brings_the_job_back(project: Project) -> None:
    """Ctrl-C, then Ctrl-C again while a long handler runs (SIGINT twice): the worker
    exits at once (code 1); the job is not lost: it keeps its lease and is reclaimed
    once it lapses."""
    configure(project, vt=3, concurrency=1, grace=25)
    c = project.client
    job = c.enqueue("record", {"n": 1, "sleep": 2.5})
    w = project.spawn_worker("fast")
    wait_for(lambda: project.runs(job.id), timeout=15, what="the handler to start")
    w.send_signal(signal.SIGINT)
    wait_log(worker_log(project, w), "stopping gracefully", timeout=5)
    t0 = time.monotonic()
    w.send_signal(signal.SIGINT)
    assert wait_exit(w, 5) == 1
    assert time.monotonic() - t0 < 1.5
    assert rec(project, job.id)["status"] == "processing"
    assert structures(project)["leases"] == [job.id]
    project.spawn_worker("fast")
    final = wait_final(project, [job.id], timeout=20)[job.id]
    assert final["status"] == "done" and outcomes(final) == ["worker lost", "done"]
    assert_quiet(project)


def test_sigquit_exits_at_once_after_a_sigterm(project: Project) -> None:
    """SIGQUIT is the explicit "stop now", also during a graceful stop a SIGTERM began:
    the worker exits at once (code 1), saying so, and the job keeps its lease."""
    configure(project, vt=3, concurrency=1, grace=25)
    job = project.client.enqueue("record", {"n": 1, "sleep": 2.5})
    w = project.spawn_worker("fast")
    wait_for(lambda: project.runs(job.id), timeout=15, what="the handler to start")
    w.send_signal(signal.SIGTERM)
    wait_log(worker_log(project, w), "stopping gracefully", timeout=5)
    w.send_signal(signal.SIGQUIT)
    assert wait_exit(w, 5) == 1
    assert any("SIGQUIT" in str(x.get("msg")) for x in log_records(worker_log(project, w)))
    assert rec(project, job.id)["status"] == "processing"
    assert structures(project)["leases"] == [job.id]
