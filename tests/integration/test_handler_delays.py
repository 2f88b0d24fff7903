"""Every delay a handler gives is bounded as HTTP's ?delay= is (a year and a day) and
refused at the call that gives it, under both isolations and in run_inline: a finite but
huge ``Retry(delay=...)`` or ``RateLimited(retry_after=...)`` fails its own attempt saying
so, and a ``ctx.enqueue(delay=...)`` past the bound fails its job for good, naming it.

A ``RateLimited(retry_after=1e308)`` used to pass the ">= 0" check, then fail the settle
round converting to milliseconds, holding every job settled with it, its own job looping;
``ctx.enqueue(delay=1e308)`` raised a raw "cannot convert float infinity to integer", and
``delay=1e30`` left a follow-up scheduled with no due time, for ever."""

from __future__ import annotations

import pytest

from runner.errors import RateLimited, Retry
from runner.testing import run_inline

from conftest import Project

MAX_DELAY_S = 366 * 86_400.0  # a year and a day, HTTP's ?delay= bound

HUGE = '''"""Asks for a retry far past any sensible delay, or succeeds."""
import time
import runner

QUEUE = "fast"
ISOLATION = "{isolation}"
MAX_ATTEMPTS = 2


def handle(payload, ctx):
    time.sleep(0.3)  # so the good jobs settle in the same round as the bad ones
    how = payload["how"]
    if how == "rate":
        raise runner.RateLimited(retry_after=1e308)
    if how == "retry":
        raise runner.Retry(delay=1e308)
    if how == "eons":
        raise runner.Retry(delay=1e15)
    return {{"ok": 1}}
'''

CHAIN = '''"""Enqueues a follow-up with the delay its payload gives."""
QUEUE = "fast"
ISOLATION = "{isolation}"
MAX_ATTEMPTS = 3


def handle(payload, ctx):
    ctx.enqueue("noop", {{}}, delay=payload["delay"])
    return {{"ok": 1}}
'''


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_huge_retry_delay_fails_its_own_attempt_and_never_the_settle_round(
        project: Project, isolation: str) -> None:
    """RateLimited(retry_after=1e308), Retry(delay=1e308) and Retry(delay=1e15) fail their
    attempts with a message naming the bound, and die after MAX_ATTEMPTS like any failing
    job; the good jobs run beside them are done, and no settle round fails."""
    project.write_config(concurrency=2)  # two children under process isolation, not eight
    project.add_function("huge", HUGE.format(isolation=isolation))
    c = project.client
    bad = {how: c.enqueue("huge", {"how": how}).id for how in ("rate", "retry", "eons")}
    good = [c.enqueue("huge", {"how": "ok"}).id for _ in range(3)]
    project.spawn_worker("fast")
    for how, job_id in bad.items():
        rec = c.wait(job_id, timeout_s=30).as_dict()
        assert rec["status"] == "dead" and rec["reason"] == "max attempts reached", (how, rec)
        assert "a number of seconds from 0 to 31622400 (a year and a day)" in rec["last_error"]["message"], rec
    for job_id in good:
        rec = c.wait(job_id, timeout_s=10).as_dict()
        assert rec["status"] == "done" and rec["attempt"] == 1, rec
    log = (project.root / "worker-0.log").read_text()
    assert "settler: settling" not in log, log


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_ctx_enqueue_refuses_a_delay_past_a_year_at_the_call(project: Project, isolation: str) -> None:
    """ctx.enqueue(delay=1e308) or delay=1e30 raises FollowUpDelay at the call, naming the
    delay and its range, and the job fails for good at its first attempt (every retry
    would ask for the same delay); a year and a day is taken."""
    project.write_config(concurrency=2)  # two children under process isolation, not eight
    project.add_function("chain", CHAIN.format(isolation=isolation))
    c = project.client
    jobs = {d: c.enqueue("chain", {"delay": d}).id for d in (1e308, 1e30, MAX_DELAY_S)}
    project.spawn_worker("fast")
    for d, job_id in jobs.items():
        rec = c.wait(job_id, timeout_s=30).as_dict()
        if d == MAX_DELAY_S:
            assert rec["status"] == "done", rec
            assert c.get(job_id + ".0").status == "scheduled"
            continue
        assert rec["status"] == "dead" and rec["reason"] == "permanent failure" and rec["attempt"] == 1, rec
        error = rec["last_error"]
        assert error["type"] == "FollowUpDelay", error
        assert f"ctx.enqueue('noop', delay={d!r}): it must be a number of seconds from 0 to 31622400" \
            in error["message"], error


def test_client_enqueue_refuses_a_delay_or_run_at_that_cannot_be_kept(project: Project) -> None:
    """An enqueue's delay past a year and a day, or a run_at that is not finite epoch
    seconds, is a ValidationFailed naming it, as HTTP's 400, never a raw OverflowError."""
    from runner.errors import ValidationFailed

    c = project.client
    for options in ({"delay": 1e308}, {"delay": MAX_DELAY_S + 1}, {"delay": float("nan")},
                    {"run_at": 1e308}, {"run_at": float("inf")}):
        with pytest.raises(ValidationFailed) as info:
            c.enqueue("noop", {}, **options)
        assert next(iter(options)) + " must be" in str(info.value), info.value


def test_run_inline_refuses_what_a_worker_refuses(project: Project) -> None:
    """run_inline applies the same bounds: Retry or RateLimited past a year and a day
    fails its attempt naming the bound (the exception says why: ``refused``; raising at
    construction would fail every item of a batch's BatchFailures), and ctx.enqueue's
    delay past it fails the job for good."""
    for made in (Retry(delay=1e308), RateLimited(retry_after=1e15), Retry(delay=MAX_DELAY_S + 1)):
        assert made.refused is not None and "a year and a day" in made.refused, made
    assert Retry(delay=MAX_DELAY_S).delay == MAX_DELAY_S and Retry(delay=MAX_DELAY_S).refused is None
    project.add_function("huge", HUGE.format(isolation="thread"))
    out = run_inline("huge", {"how": "rate"}, project=project.root)
    assert out.status == "retry" and "a year and a day" in out.error["message"], out
    project.add_function("chain", CHAIN.format(isolation="thread"))
    for d in (1e308, 1e30, MAX_DELAY_S + 1):
        out = run_inline("chain", {"delay": d}, project=project.root)
        assert out.status == "dead" and out.reason == "permanent failure", (d, out)
        assert "it must be a number of seconds from 0 to 31622400" in out.error["message"], (d, out)
    assert run_inline("chain", {"delay": MAX_DELAY_S}, project=project.root).status == "done"


BATCH_RETRY = '''
import runner
QUEUE = "fast"
MAX_ATTEMPTS = 2
BATCH = {"size": 4, "wait": 0.3}

def handle_batch(payloads, ctx):
    failures = {i: runner.Retry(delay=1e308) for i, p in enumerate(payloads) if p.get("bad")}
    if failures:
        raise runner.BatchFailures(failures, results=[{"n": p["n"]} for p in payloads])
    return [{"n": p["n"]} for p in payloads]
'''


def test_one_items_bad_retry_delay_in_a_batch_fails_that_item_only(project: Project) -> None:
    """BatchFailures({0: Retry(delay=1e308)}): item 0 fails its attempt naming the bound,
    and the batch's other items are done (the constructor raised inside handle_batch, and
    every item failed with item 0's error)."""
    from runner.client import Request

    project.add_function("bulk", BATCH_RETRY)
    c = project.client
    ids = [e.id for e in c.enqueue_many([Request("bulk", {"n": i, "bad": i == 0}) for i in range(4)])]
    project.spawn_worker("fast")
    views = [c.wait(i, timeout_s=30).as_dict() for i in ids]
    assert views[0]["status"] == "dead" and "a year and a day" in views[0]["last_error"]["message"], views[0]
    assert [v["status"] for v in views[1:]] == ["done"] * 3, views
