"""Durable functions where a step fails or a run is given up: a step recorded on an error
path (a ``finally:`` cleanup after a transient error) never takes the failed step's place
in the log, so the retry runs the failed step again instead of dying as non-deterministic;
a sleep after such a step ends the attempt (retried)."""

from __future__ import annotations

import pytest

from conftest import Project, assert_no_job_in_two_structures

ISOLATIONS = ["", 'ISOLATION = "process"']

CLEANUP = '''
import os
QUEUE = "fast"
MAX_ATTEMPTS = 4
{isolation}

def mark(name, ctx):
    with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id + "-" + name), "a") as f:
        f.write(str(ctx.attempt) + "\\n")
    return name

def charge(ctx):
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
'''

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


def _runs(project: Project, job_id: str, name: str) -> list[str]:
    p = project.records / f"{job_id}-{name}"
    return p.read_text().splitlines() if p.exists() else []


@pytest.mark.parametrize("isolation", ISOLATIONS, ids=["thread", "process"])
def test_a_cleanup_step_after_a_transient_error_never_takes_the_failed_step_s_place(
        project: Project, isolation: str) -> None:
    """``try: step charge`` (raises a transient error on attempt 1) ``finally: step
    release``: the release runs on attempt 1 unrecorded, the retry replays reserve, runs
    charge again and release after it, and the job ends done."""
    project.add_function("pay", CLEANUP.format(isolation=isolation))
    c = project.client
    project.spawn_worker("fast")
    job = c.enqueue("pay", {}).id
    done = c.wait(job, 60).as_dict()
    assert done["status"] == "done", done
    assert done["result"] == "charged"
    assert _runs(project, job, "reserve") == ["1"]
    assert _runs(project, job, "charge") == ["1", "2"]
    assert _runs(project, job, "release") == ["1", "2"]
    assert_no_job_in_two_structures(project)


@pytest.mark.parametrize("isolation", ISOLATIONS, ids=["thread", "process"])
def test_a_sleep_after_a_step_that_failed_unrecorded_ends_the_attempt(project: Project, isolation: str) -> None:
    """A handler that catches a step's transient error and sleeps: the sleep cannot take
    the failed step's position, so it raises AfterUnrecordedStep (transient); the retry
    runs the step again, which succeeds, and the job ends done on attempt 2."""
    project.add_function("nap", SLEEP_AFTER.format(isolation=isolation))
    c = project.client
    project.spawn_worker("fast")
    job = c.enqueue("nap", {}).id
    done = c.wait(job, 60).as_dict()
    assert done["status"] == "done", done
    assert done["result"] == 2
    assert done["history"][0]["error"]["type"] == "AfterUnrecordedStep", done["history"]


SWALLOW = '''
import os, time
QUEUE = "fast"
TIMEOUT = 1
MAX_ATTEMPTS = 3
{isolation}

def mark(name, ctx):
    with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id + "-" + name), "a") as f:
        f.write(str(ctx.attempt) + "\\n")
    return name

def handle(payload, ctx):
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
'''


@pytest.mark.parametrize("isolation", ISOLATIONS, ids=["thread", "process"])
def test_a_run_past_its_timeout_makes_no_durable_call(project: Project, isolation: str) -> None:
    """A handler that catches JobTimeout and goes on to a step: the step is refused
    (JobTimeout again) without running its function or writing the log; what the handler
    does with that is its own (here it returns)."""
    project.write_config(worker="timeout_grace = 5")
    project.add_function("swallow", SWALLOW.format(isolation=isolation))
    c = project.client
    project.spawn_worker("fast")
    job = c.enqueue("swallow", {}).id
    done = c.wait(job, 60).as_dict()
    assert done["status"] == "done" and done["result"] == "swallowed", done
    assert _runs(project, job, "caught-JobTimeout") == ["1"]
    assert _runs(project, job, "refused-JobTimeout") == ["1"]
    assert _runs(project, job, "two") == []
