"""SIGKILL a real worker at each named fault point (runner/worker/faults.py) and check that
the job is never lost, never left in two structures, and runs again only where the
contract allows it (killed after the handler returned, before the ack)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from crashkit import assert_quiet, configure, outcomes, rec, wait_exit, wait_final

from conftest import Project, assert_no_job_in_two_structures, structures

# point -> (state right after the kill, handler runs in the end, history outcomes in the end)
SINGLE = {
    "before_claim": ("queued", 1, ["done"]),
    "after_claim": ("processing", 1, ["worker lost", "done"]),
    "mid_handler": ("processing", 1, ["worker lost", "done"]),
    "after_handler": ("processing", 2, ["worker lost", "done"]),
    "after_ack": ("done", 1, ["done"]),
}


@pytest.mark.parametrize("point", list(SINGLE))
def test_kill_at_fault_point_single_job(project: Project, point: str) -> None:
    """One job, one worker killed at ``point``, then a healthy worker: the job ends done
    with the exact run count and history the contract gives for that instant."""
    configure(project, vt=1, concurrency=1)
    c = project.client
    job = c.enqueue("record", {"n": 1})

    w1 = project.spawn_worker("fast", env={"RUNNER_FAULT": point})
    assert wait_exit(w1, 20) == -9, "the fault point did not kill the worker"
    state, runs, history = SINGLE[point]
    after_kill = rec(project, job.id)
    assert after_kill["status"] == state
    where = structures(project)
    if state == "queued":
        assert where["ready"] == [job.id] and after_kill["attempt"] == 0
    elif state == "processing":
        # Claimed, owned by a dead worker: it sits in leases until the lease lapses.
        assert where["leases"] == [job.id] and after_kill["attempt"] == 1
    assert_no_job_in_two_structures(project)

    project.spawn_worker("fast")
    final = wait_final(project, [job.id], timeout=20)[job.id]
    assert final["status"] == "done"
    assert outcomes(final) == history
    assert len(project.runs(job.id)) == runs
    assert final["result"]["attempt"] == len(history)
    assert_quiet(project)
    assert_no_job_in_two_structures(project)


@pytest.mark.parametrize("point", list(SINGLE))
def test_kill_at_fault_point_under_load(project: Project, point: str) -> None:
    """Forty jobs, four handlers at a time, the worker killed at ``point`` after a random
    number of passes: every job ends done, with exactly one successful attempt; a handler
    ran again only for an attempt the history shows as "worker lost"."""
    rnd = random.Random(point)
    configure(project, vt=1, concurrency=4, batch=8, prefetch=4)
    c = project.client
    ids = [c.enqueue("record", {"n": i, "sleep": 0.02}).id for i in range(40)]
    after = str(rnd.randint(1, 6))
    w1 = project.spawn_worker("fast", env={"RUNNER_FAULT": point, "RUNNER_FAULT_AFTER": after})
    assert wait_exit(w1, 30) == -9
    assert_no_job_in_two_structures(project)
    project.spawn_worker("fast")
    final = wait_final(project, ids, timeout=40)
    lost = 0
    for job_id, r in final.items():
        hist = outcomes(r)
        runs = len(project.runs(job_id))
        assert r["status"] == "done", (job_id, r)
        assert hist.count("done") == 1 and hist[-1] == "done"
        # "lost unstarted": claimed ahead of a free thread, its start mark not in Redis when
        # the worker died; it may have run, and spent no attempt (once per job).
        assert set(hist[:-1]) <= {"worker lost", "lost unstarted"}
        assert hist.count("lost unstarted") <= 1
        assert r["attempt"] == len(hist) - hist.count("lost unstarted")
        assert 1 <= runs <= len(hist), (job_id, runs, hist)
        assert runs <= 2
        lost += hist.count("worker lost") + hist.count("lost unstarted")
    if point in ("after_claim", "mid_handler", "after_handler"):
        assert lost >= 1, "the kill should have orphaned at least one claimed job"
    assert_quiet(project)
    assert_no_job_in_two_structures(project)


def test_fault_points_are_known() -> None:
    """The points this file covers are exactly the ones the worker calls."""
    from runner.worker.faults import POINTS

    assert set(SINGLE) == set(POINTS)
    src = "".join(f.read_text() for f in (Path(__file__).parents[2] / "runner" / "worker").glob("*.py"))
    for p in POINTS:
        assert f'fault("{p}")' in src
