"""Leases: a live handler keeps its job however long it runs; a dead worker's job is
taken back once its lease lapses (not before); a job that kills its worker every time
ends dead as "worker lost" instead of crash-looping."""

from __future__ import annotations

import subprocess

from crashkit import add_crash_fixtures, assert_quiet, configure, kill, outcomes, rec, wait_final

from conftest import Project, assert_no_job_in_two_structures, structures, wait_for


def test_lease_renewal_keeps_a_long_handler_from_being_taken(project: Project) -> None:
    """A handler three times longer than the slow queue's 1 s visibility timeout, with two
    workers competing: it runs once, on one worker, in one attempt."""
    configure(project, slow_vt=1)
    c = project.client
    job = c.enqueue("slow", {"seconds": 3.2})
    project.spawn_worker("slow")
    project.spawn_worker("slow")
    final = wait_final(project, [job.id], timeout=30)[job.id]
    assert final["status"] == "done"
    assert final["attempt"] == 1
    assert outcomes(final) == ["done"]
    assert len(project.runs(job.id)) == 1
    assert c.stats()["slow"]["counters"].get("lost|slow", 0) == 0
    assert_quiet(project, "slow")


def test_killed_workers_job_is_reclaimed_after_the_lease_not_before(project: Project) -> None:
    """Two workers; the one running the job is SIGKILLed. The other starts the job only
    once the lease deadline has passed, and soon after it."""
    configure(project, slow_vt=2)
    c = project.client
    job = c.enqueue("slow", {"seconds": 0.8})
    workers = [project.spawn_worker("slow"), project.spawn_worker("slow")]
    wait_for(lambda: project.runs(job.id), timeout=15, what="the first run")
    pid = int(project.runs(job.id)[0].split()[1])
    victim = next(w for w in workers if w.pid == pid)
    kill(victim)
    k = project.keys("slow")
    deadline_ms = project.runtime.redis.zscore(k.leases, job.id)
    assert deadline_ms is not None, "the killed worker's job must still hold its lease"
    final = wait_final(project, [job.id], timeout=20)[job.id]
    assert final["status"] == "done"
    assert outcomes(final) == ["worker lost", "done"]
    second_start = float(project.runs(job.id)[1].split()[2])
    assert second_start >= deadline_ms / 1000, "reclaimed before the lease lapsed"
    assert second_start <= deadline_ms / 1000 + 2.0, "reclaimed too long after the lease lapsed"
    assert_quiet(project, "slow")


def test_poison_job_ends_dead_as_worker_lost(project: Project) -> None:
    """A job whose handler SIGKILLs its worker on every run: a supervisor keeps one worker
    alive (as a PaaS would). After MAX_ATTEMPTS (3) lost workers the job is dead with
    reason "worker lost"; the jobs queued around it complete, each run once more only
    when a lost worker took its ack along; the last worker stays up."""
    add_crash_fixtures(project)
    configure(project, vt=1, concurrency=1, batch=1)
    c = project.client
    before = [c.enqueue("record", {"n": i}).id for i in range(3)]
    poison = c.enqueue("poison", {})
    after = [c.enqueue("record", {"n": i}).id for i in range(3, 6)]

    deaths = 0
    current: list[subprocess.Popen[bytes]] = [project.spawn_worker("fast")]

    def poison_dead() -> bool:
        nonlocal deaths
        if current[0].poll() is not None:
            deaths += 1
            assert deaths <= 3, "the poison job crash-loops past MAX_ATTEMPTS"
            current[0] = project.spawn_worker("fast")
        return rec(project, poison.id)["status"] == "dead"

    wait_for(poison_dead, timeout=45, interval=0.05, what="the poison job to be buried")
    final = rec(project, poison.id)
    assert final["reason"] == "worker lost"
    assert final["attempt"] == 3
    assert outcomes(final) == ["worker lost"] * 3
    assert final["last_error"]["type"] == "WorkerLost"
    assert deaths == 3
    others = wait_final(project, before + after, timeout=20)
    assert all(r["status"] == "done" for r in others.values())
    # A job that finished just before the poison killed its worker may have lost its ack
    # with it (acks go out in batches): it then ran once more after its lease lapsed, and
    # its history says so. No other job runs twice.
    for i in before + after:
        assert len(project.runs(i)) == 1 + outcomes(others[i]).count("worker lost"), (i, others[i])
    assert current[0].poll() is None, "the worker serving after the burial must stay up"
    assert structures(project)["dead"] == [poison.id]
    assert_quiet(project)
    assert_no_job_in_two_structures(project)
