"""The error of a job buried as expired says what happened whether or not its handler
ran before: a run stopped at the end of a deploy's grace period and claimed again past
MAX_AGE was told "not started within MAX_AGE", although it had started."""

from __future__ import annotations

from runner.worker.execute import EXPIRED, Claimed, expired


def test_an_expired_jobs_message_fits_a_job_that_ran_before() -> None:
    job = Claimed("j1", "t", 0, "f", "1", "{}", 3, "", "", 0, 1_000, "", "fast", 12_700)
    dead = expired(job, 4.0)
    message = dead.error["message"] if dead.error else ""
    assert dead.reason == EXPIRED and dead.refund
    assert "not started" not in message
    assert message.startswith("MAX_AGE 4 s passed before it could run (again, ")
    assert "11.7 s since its enqueue" in message
