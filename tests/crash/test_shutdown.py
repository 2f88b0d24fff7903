"""Graceful shutdown: SIGTERM stops claiming, lets running jobs finish within the grace
period, returns what cannot finish without spending an attempt, however many SIGTERMs
come; a second SIGINT or a SIGQUIT exits at once and the lease brings the job back."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest
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

from runner.client import Enqueued, Request

from conftest import Project, assert_no_job_in_two_structures, structures, wait_for

# A process-isolated function that, asked to, holds its child's GIL in one C call (a
# backtracking regex: each extra "a" doubles it) or sleeps; each start is recorded.
BEHIND = '''
import os, re, time
QUEUE = "fast"
ISOLATION = "process"
TIMEOUT = 120

def handle(payload, ctx):
    with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id), "a") as f:
        f.write(f"{os.getpid()} {time.monotonic()}\\n")
    if payload.get("n"):
        re.match(r"(a+)+$", "a" * payload["n"] + "b")
    time.sleep(payload.get("s", 0))
    return {}
'''


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


def _quick(project: Project, ids: list[str]) -> None:
    assert all(r["status"] == "done" for r in wait_final(project, ids, timeout=120).values())


@pytest.mark.parametrize("how", ["gil", "sigstop", "every process"])
def test_a_stop_hands_back_the_jobs_waiting_behind_a_child_that_cannot_answer(project: Project, how: str) -> None:
    """Five jobs wait in a child's queue behind a job whose child cannot answer the stop's
    recall: its handler holds the GIL in one C call, or the child is SIGSTOPped. Past the
    grace period the child is killed; when the worker has exited, the job it ran and the
    five behind it are queued again at once, no attempt spent and none started (not
    left processing until their lease lapsed, then back "lost unstarted", their one
    unspent loss used up). Also when the stop's SIGTERM reaches every process."""
    project.add_function("behind", BEHIND)
    project.write_config(vt=60, grace=1, concurrency=1, prefetch=16)
    client, r, k = project.client, project.runtime.redis, project.keys()
    w = project.spawn_worker("fast")
    warm = [e.id for e in client.enqueue_many([Request("behind", {}) for _ in range(40)]) if isinstance(e, Enqueued)]
    _quick(project, warm)  # the function's pace is known: a batch takes the six at once
    head: dict[str, Any] = {"n": 40} if how != "sigstop" else {"s": 60}
    made = client.enqueue_many([Request("behind", head)] + [Request("behind", {}) for _ in range(5)])
    ids = [e.id for e in made if isinstance(e, Enqueued)]
    first, behind = ids[0], ids[1:]
    wait_for(lambda: project.runs(first), timeout=30, what="the job ahead to start")
    wait_for(lambda: all(r.hget(k.claims, i) for i in ids), timeout=10, what="every job's claim")
    child = int(project.runs(first)[0].split()[0])
    if how == "sigstop":
        os.kill(child, signal.SIGSTOP)
    time.sleep(0.2)
    assert not any(project.runs(i) for i in behind)
    w.send_signal(signal.SIGTERM)
    if how == "every process":
        os.kill(child, signal.SIGTERM)
    assert wait_exit(w, 30) == 0
    for i in ids:
        got = rec(project, i)
        assert (got["status"], got["attempt"]) == ("queued", 0), (i == first, got["status"], outcomes(got))
    assert not any(project.runs(i) for i in behind)
    s = structures(project)
    assert s["leases"] == [] and sorted(s["ready"]) == sorted(ids)
    assert outcomes(rec(project, first)) == ["interrupted"]
    assert_no_job_in_two_structures(project)
