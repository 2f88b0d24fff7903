"""Durable functions where a step fails or a run is given up: a step recorded on an error
path (a ``finally:`` cleanup after a transient error) never takes the failed step's place
in the log, so the retry runs the failed step again instead of dying as non-deterministic;
a sleep after such a step ends the attempt (retried); a run past its TIMEOUT makes no
durable call; a cancel reaches a child's parent at once and cascades to the children a
cancelled parent waits for."""

from __future__ import annotations

import time

import pytest
from durable_helpers import ISOLATION_IDS, ISOLATIONS, marked, runs

from conftest import Project, assert_no_job_in_two_structures, wait_for

CLEANUP = marked('''def charge(ctx):
    mark("charge", ctx)
    if ctx.attempt == 1:
        raise ConnectionError("payment API flaked")
    return "charged"

def handle(payload, ctx):
    ctx.step("reserve", mark, "reserve", ctx)
    try:
        got = ctx.step("charge", charge, ctx)
    finally:
        ctx.step("release", mark, "release", ctx)
    return got
''', options='MAX_ATTEMPTS = 4\n', writes='str(ctx.attempt)')

SLEEP_AFTER = '''
QUEUE = "fast"
MAX_ATTEMPTS = 4
{isolation}

def handle(payload, ctx):
    try:
        ctx.step("call", lambda: 1 / (ctx.attempt - 1))
    except ZeroDivisionError:
        ctx.sleep("backoff", 0.1)
    return ctx.attempt
'''


@pytest.mark.parametrize("isolation", ISOLATIONS, ids=ISOLATION_IDS)
def test_a_cleanup_step_after_a_transient_error_never_takes_the_failed_step_s_place(
        project: Project, isolation: str) -> None:
    """``try: step charge`` (raises a transient error on attempt 1) ``finally: step
    release``: the release runs on attempt 1 unrecorded, the retry replays reserve, runs
    charge again and release after it, and the job ends done."""
    project.write_config(concurrency=1)  # one job: one child, not eight
    project.add_function("pay", CLEANUP.format(isolation=isolation))
    c = project.client
    project.spawn_worker("fast")
    job = c.enqueue("pay", {}).id
    done = c.wait(job, 60).as_dict()
    assert done["status"] == "done", done
    assert done["result"] == "charged"
    assert runs(project, job, "reserve") == ["1"]
    assert runs(project, job, "charge") == ["1", "2"]
    assert runs(project, job, "release") == ["1", "2"]
    assert_no_job_in_two_structures(project)


@pytest.mark.parametrize("isolation", ISOLATIONS, ids=ISOLATION_IDS)
def test_a_sleep_after_a_step_that_failed_unrecorded_ends_the_attempt(project: Project, isolation: str) -> None:
    """A handler that catches a step's transient error and sleeps: the sleep cannot take
    the failed step's position, so it raises AfterUnrecordedStep (transient); the retry
    runs the step again, which succeeds, and the job ends done on attempt 2."""
    project.write_config(concurrency=1)  # one job: one child, not eight
    project.add_function("nap", SLEEP_AFTER.format(isolation=isolation))
    c = project.client
    project.spawn_worker("fast")
    job = c.enqueue("nap", {}).id
    done = c.wait(job, 60).as_dict()
    assert done["status"] == "done", done
    assert done["result"] == 2
    assert done["history"][0]["error"]["type"] == "AfterUnrecordedStep", done["history"]


SWALLOW = marked('''def handle(payload, ctx):
    if ctx.attempt == 1:
        try:
            while True:
                time.sleep(0.05)
        except BaseException as exc:
            mark("caught-" + type(exc).__name__, ctx)
        try:
            ctx.step("two", mark, "two", ctx)
        except BaseException as exc:
            mark("refused-" + type(exc).__name__, ctx)
        return "swallowed"
    return ctx.step("two", mark, "two", ctx)
''', imports='import os, time\n', options='TIMEOUT = 1\nMAX_ATTEMPTS = 3\n', writes='str(ctx.attempt)')


@pytest.mark.parametrize("isolation", ISOLATIONS, ids=ISOLATION_IDS)
def test_a_run_past_its_timeout_makes_no_durable_call(project: Project, isolation: str) -> None:
    """A handler that catches JobTimeout and goes on to a step: the step is refused
    (JobTimeout again) without running its function or writing the log; what the handler
    does with that is its own (here it returns)."""
    project.write_config(worker="timeout_grace = 5", concurrency=1)  # one job: one child, not eight
    project.add_function("swallow", SWALLOW.format(isolation=isolation))
    c = project.client
    project.spawn_worker("fast")
    job = c.enqueue("swallow", {}).id
    done = c.wait(job, 60).as_dict()
    assert done["status"] == "done" and done["result"] == "swallowed", done
    assert runs(project, job, "caught-JobTimeout") == ["1"]
    assert runs(project, job, "refused-JobTimeout") == ["1"]
    assert runs(project, job, "two") == []


PARENT = '''
import runner
QUEUE = "fast"

def handle(payload, ctx):
    try:
        options = {"delay": payload["delay"]} if "delay" in payload else {}
        return ctx.invoke("kid", {}, **options)
    except runner.JobFailed as exc:
        return {"failed": exc.reason}
'''

KID = '''
import os, time
QUEUE = "fast"
TIMEOUT = 20

def handle(payload, ctx):
    open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id + "-started"), "w").close()
    for _ in range(400):
        ctx.raise_if_cancelled()
        time.sleep(0.05)
    open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id + "-shipped"), "w").close()
    return "shipped"
'''


def test_cancelling_a_child_that_has_not_started_resumes_its_parent_at_once(project: Project) -> None:
    """A child delayed 300 s (no worker will settle it) is cancelled: its parent is sent
    its end at once and ends with JobFailed (cancelled), well before its 30 s poll."""
    project.add_function("par", PARENT)
    project.add_function("kid", KID)
    c = project.client
    project.spawn_worker("fast")
    job = c.enqueue("par", {"delay": 300}).id
    wait_for(lambda: c.get(job).status == "waiting", timeout=20, what="the parent to wait")
    t0 = time.monotonic()
    assert c.cancel(f"{job}.c0") == "cancelled"
    done = c.wait(job, 25).as_dict()
    assert done["status"] == "done" and done["result"] == {"failed": "cancelled"}, done
    assert time.monotonic() - t0 < 15


def test_cancelling_a_parent_cancels_the_child_it_waits_for(project: Project) -> None:
    """A parent waiting on a running child is cancelled: the child is cancelled too (its
    handler sees ctx.cancelled) and never reaches its side effect."""
    project.add_function("par", PARENT)
    project.add_function("kid", KID)
    c = project.client
    project.spawn_worker("fast")
    job = c.enqueue("par", {}).id
    kid = f"{job}.c0"
    wait_for(lambda: (project.records / f"{kid}-started").exists(), timeout=20, what="the child to start")
    assert c.cancel(job) == "cancelled"
    t0 = time.monotonic()
    assert c.wait(kid, 20).as_dict()["status"] == "cancelled"
    # (client.wait ends at any end: it waited a cancelled job out to its timeout)
    assert time.monotonic() - t0 < 10, "the wait missed the child's end"
    assert not (project.records / f"{kid}-shipped").exists()
    assert_no_job_in_two_structures(project)
