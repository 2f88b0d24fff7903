"""A worker whose settler, lease renewer or executor dies of an unexpected error (a bug, or an
OSError from the platform) exits at once with status 70, saying which thread died, so a
supervisor restarts it: a dead settler would otherwise leave its finished jobs leased
and renewed for ever, never acknowledged, and a dead renewer would let the leases of
running jobs lapse while their handlers run on, so another worker runs them a second time
at once. The error is injected at a named point (RUNNER_FAULT_MODE=raise)."""

from __future__ import annotations

import itertools

import pytest
from crashkit import assert_quiet, configure, outcomes, wait_exit, wait_final

from conftest import Project


@pytest.mark.parametrize(("point", "thread"), [("settle_loop", "fast-settle"), ("renew_loop", "fast-renew"),
                                               ("exec_loop", "fast-exec-0")])
def test_a_worker_whose_settler_or_renewer_dies_exits_and_its_job_is_reclaimed(
        project: Project, point: str, thread: str) -> None:
    configure(project, vt=1, concurrency=1)
    c = project.client
    job = c.enqueue("record", {"n": 1, "sleep": 0.6}).id
    w = project.spawn_worker("fast", env={"RUNNER_FAULT": point, "RUNNER_FAULT_MODE": "raise"})
    assert wait_exit(w, 20) == 70, "the worker outlived its dead thread"
    log = (project.root / "worker-0.log").read_text()
    assert f"the {thread} thread died" in log and "injected fault at " + point in log, log[-2000:]
    project.spawn_worker("fast")
    final = wait_final(project, [job], timeout=30)[job]
    assert final["status"] == "done" and outcomes(final)[-1] == "done", final["history"]
    starts = sorted(float(line.split()[2]) for line in project.runs(job))
    # Never two runs at once: each later run began after the one before had ended.
    assert all(b - a >= 0.6 for a, b in itertools.pairwise(starts)), starts
    assert_quiet(project)
