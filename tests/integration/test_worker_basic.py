"""A subprocess worker runs jobs end to end: success, retry, dead, async, timeout."""

from __future__ import annotations

import pytest

from runner.errors import JobNotFound

from conftest import Project, assert_no_job_in_two_structures, wait_for


def test_job_runs_to_done_with_result(any_project: Project) -> None:
    """A valid job is run once by a real worker and its result is kept."""
    c = any_project.client
    job = c.enqueue("record", {"n": 7})
    any_project.spawn_worker("fast")
    rec = c.wait(job.id, timeout_s=15).as_dict()
    assert rec["status"] == "done"
    assert rec["result"] == {"n": 7, "attempt": 1}
    assert len(any_project.runs(job.id)) == 1
    assert [h["outcome"] for h in rec["history"]] == ["done"]
    assert_no_job_in_two_structures(any_project)


def test_transient_failures_retry_then_succeed(project: Project) -> None:
    """Two planned failures are retried with backoff; the third attempt succeeds."""
    c = project.client
    job = c.enqueue("record", {"n": 1, "fail_times": 2})
    project.spawn_worker("fast")
    rec = c.wait(job.id, timeout_s=15).as_dict()
    assert rec["status"] == "done"
    assert rec["attempt"] == 3
    assert [h["outcome"] for h in rec["history"]] == ["retry", "retry", "done"]
    assert rec["history"][0]["error"]["message"] == "planned failure on attempt 1"


def test_exhausted_attempts_go_dead_with_last_error(project: Project) -> None:
    """After MAX_ATTEMPTS failures the job is dead with its last error and full history."""
    c = project.client
    job = c.enqueue("record", {"n": 1, "fail_times": 99})
    project.spawn_worker("fast")
    rec = c.wait(job.id, timeout_s=15).as_dict()
    assert rec["status"] == "dead"
    assert rec["reason"] == "max attempts reached"
    assert rec["attempt"] == 4
    assert rec["last_error"]["type"] == "RuntimeError"
    assert "planned failure on attempt 4" in rec["last_error"]["traceback"]
    assert len(rec["history"]) == 4
    total, page = c.dead("fast")
    assert total == 1 and page[0].id == job.id


def test_permanent_failure_skips_retries(project: Project) -> None:
    c = project.client
    job = c.enqueue("perm", {})
    project.spawn_worker("fast")
    rec = c.wait(job.id, timeout_s=15).as_dict()
    assert rec["status"] == "dead"
    assert rec["reason"] == "permanent failure"
    assert rec["attempt"] == 1


def test_async_handler_and_timeout(project: Project) -> None:
    """An async handler runs; a sync handler past TIMEOUT is interrupted and retried."""
    c = project.client
    a = c.enqueue("asyncfn", {"sleep": 0.01})
    t = c.enqueue("sleepy", {"sleep": 1.5})  # three times its TIMEOUT
    project.spawn_worker("fast")
    assert c.wait(a.id, timeout_s=15).as_dict()["result"] == {"async": True, "attempt": 1}
    rec = c.wait(t.id, timeout_s=20).as_dict()
    assert rec["status"] == "dead"
    assert rec["last_error"]["type"] == "JobTimeout"
    assert rec["attempt"] == 2


def test_delayed_job_waits(project: Project) -> None:
    """A delayed job is scheduled, then runs once due."""
    import time

    c = project.client
    t0 = time.time()
    job = c.enqueue("record", {"n": 2}, delay=1.0)
    assert job.status == "scheduled"
    project.spawn_worker("fast")
    rec = c.wait(job.id, timeout_s=15).as_dict()
    assert rec["status"] == "done"
    assert rec["started_at"] >= t0 + 0.95


def test_routing_slow_worker_runs_only_slow(project: Project) -> None:
    c = project.client
    fast = c.enqueue("record", {"n": 3})
    slow = c.enqueue("slow", {"seconds": 0.01})
    project.spawn_worker("slow")
    assert c.wait(slow.id, timeout_s=15).status == "done"
    assert c.get(fast.id).status == "queued"
    wait_for(lambda: True)


def test_done_jobs_are_deleted_after_the_done_retention(project: Project) -> None:
    """A success deletes the record at once and keeps a short outcome, which goes with its
    done generation once the done retention has passed, while a dead job (its own
    retention) stays."""
    toml = project.root / "runner.toml"
    toml.write_text(toml.read_text().replace("done = 3600", "done = 1"))
    if project._runtime is not None:  # the file was rewritten in place: read it again
        project._runtime.close()
        project._runtime = None
    c = project.client
    ok = [c.enqueue("record", {"n": i}).id for i in range(5)]
    bad = c.enqueue("record", {"n": 9, "fail_times": 99}).id
    project.spawn_worker("fast")
    assert all(c.wait(i, timeout_s=15).status == "done" for i in ok)
    assert c.wait(bad, timeout_s=15).status == "dead"
    k, r = project.keys("fast"), project.runtime.redis
    assert not any(r.exists(k.job(i)) or r.exists(k.state(i)) for i in ok), "a done job keeps its record"

    def gone() -> bool:
        try:
            c.get(ok[0])
        except JobNotFound:
            return True
        return False

    wait_for(gone, timeout=10, what="the done outcomes to go past the retention")
    assert c.get(bad).status == "dead"
    with pytest.raises(JobNotFound):
        c.get(ok[0])


BAD_DELAYS = '''"""Asks for a retry with a delay that is no number of seconds."""
import runner
QUEUE = "fast"
MAX_ATTEMPTS = 2


def handle(payload, ctx):
    if payload["how"] == "negative":
        raise runner.RateLimited(retry_after=-5)
    if payload["how"] == "text":
        raise runner.Retry(delay="soon")
    raise runner.RateLimited(retry_after=float("nan"))
'''


@pytest.mark.parametrize("how", ["negative", "text", "nan"])
def test_a_retry_delay_that_is_no_number_of_seconds_fails_the_attempt_saying_so(project: Project, how: str) -> None:
    """RateLimited(retry_after=-5), Retry(delay="soon") or a NaN delay is a mistake in the
    handler: each attempt fails with an error that names the argument and what it takes
    (not a silent retry at once, not a worker that cannot settle the job), and the job
    dies after its attempts like any failing job."""
    (project.root / "functions" / "bad_delays.py").write_text(BAD_DELAYS)
    (project.root / "schemas" / "bad_delays").mkdir()
    (project.root / "schemas" / "bad_delays" / "v1.json").write_text('{"type": "object"}')
    project._runtime = None
    c = project.client
    job = c.enqueue("bad_delays", {"how": how})
    project.spawn_worker("fast")
    rec = c.wait(job.id, timeout_s=30).as_dict()
    assert rec["status"] == "dead" and rec["reason"] == "max attempts reached", rec
    assert rec["attempt"] == 2, rec
    message = rec["last_error"]["message"]
    assert "must be a number of seconds from 0 to 31622400" in message, message
