"""What a no-op job costs a thread executor, counted rather than timed (a count holds on a
loaded host): the Python calls its run makes, and what it builds that it never uses. A
worker's CPU per no-op job grew by about half over a month of features (durable steps,
job logs, batches) that such a job does not use; the step log and its hooks were built
for every job."""

from __future__ import annotations

import collections
import queue as stdqueue
import sys
import types
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest
from durable_helpers import ISOLATION_IDS, ISOLATIONS

from runner.worker.execute import Claimed
from runner.worker.executors import Executors
from runner.worker.ledger import Ledger, Run

from conftest import Project

NOOP = '''QUEUE = "fast"

SEEN = []


def handle(payload, ctx):
    SEEN.append(ctx)
'''
DURABLE = '''import threading

QUEUE = "fast"
{isolation}


def handle(payload, ctx):
    got = ctx.step("one", lambda: 41) + 1
    refused = []

    def other():
        try:
            ctx.step("two", lambda: 2)
        except Exception as exc:
            refused.append(type(exc).__name__)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    return {{"got": got, "refused": refused, "step_key_after": ctx.step_key}}
'''
SCHEMA = '{"type": "object", "properties": {"t": {"type": "number"}}, "additionalProperties": false}'
# Python calls per no-op job through Executors._loop (take, resolve, validate, the ctx,
# the run, the outcome): 44 when every job built its step log and ran the payload's depth
# and long-integer checks, 36 with the log built at first use and a short payload's checks
# skipped (a worker of early December made about 35); 29 with the loaded functions read
# once per run (they were read four times: loop, admission, run, after the run) and a None
# result taken as done with no encode or group look-up.
BUDGET = 31


def _runs(n: int, fn: str, start: int = 0) -> list[Run]:
    return [Run(Claimed(f"j{i}", f"t{i}", 1, fn, "1", '{"t": 1.5}', 5, "", "", 1, 1, "", "fast", 1000, True,
                        steps=0)) for i in range(start, start + n)]


def _loop(project: Any, runs: list[Run]) -> list[Any]:
    """The runs through one executor's loop, on this thread; their settlements."""
    rt = project.runtime
    q = rt.config.queues["fast"]
    inbox: stdqueue.SimpleQueue[Any] = stdqueue.SimpleQueue()
    outcomes: stdqueue.SimpleQueue[Any] = stdqueue.SimpleQueue()
    ledger = Ledger(q.concurrency, len(runs) + 16, 16)
    ex = Executors(rt, q, ledger, inbox, outcomes, lambda job: True)
    ledger.claimed(runs)
    for r in runs:
        inbox.put(r)
    inbox.put(None)
    ex._loop(0)
    out = []
    while not outcomes.empty():
        out.append(outcomes.get())
    return out


@pytest.fixture
def noop_project(project: Any) -> Iterator[Any]:
    project.add_function("noop_cost", NOOP, SCHEMA)
    yield project


def _calls_per_job(project: Any, n: int) -> float:
    _loop(project, _runs(20, "noop_cost", 10_000))  # (imports and first-use work out of the count)
    counts: collections.Counter[str] = collections.Counter()

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            counts[frame.f_code.co_qualname] += 1

    runs = _runs(n, "noop_cost")
    sys.setprofile(hook)
    try:
        _loop(project, runs)
    finally:
        sys.setprofile(None)
    counts.pop("_loop", None)  # (this test's own, and the loop's one call)
    return sum(counts.values()) / n


def test_a_no_op_job_makes_no_more_python_calls_than_its_budget(noop_project: Any) -> None:
    per_job = _calls_per_job(noop_project, 200)
    assert per_job <= BUDGET, f"{per_job:.1f} Python calls per no-op job (budget {BUDGET})"


def test_a_job_that_makes_no_durable_call_builds_no_step_log(noop_project: Any) -> None:
    seen = noop_project.runtime.registry.functions["noop_cost"].handle.__globals__["SEEN"]
    settled = _loop(noop_project, _runs(3, "noop_cost"))
    assert [type(s.outcome).__name__ for s in settled] == ["Done"] * 3
    assert len(seen) == 3
    assert all(ctx._journal is None for ctx in seen)  # never asked for: never built
    assert all(ctx.step_key is None for ctx in seen)


def test_a_no_op_jobs_ctx_holds_one_hooks_object_and_no_closures(noop_project: Any) -> None:
    """What a ctx calls back (checkpoint, lease, progress, enqueue, groups, its logger and
    step log, the timeout guard) is one object per run: a closure per call was a function
    and its cells built for every job, most never called."""
    seen = noop_project.runtime.registry.functions["noop_cost"].handle.__globals__["SEEN"]
    _loop(noop_project, _runs(2, "noop_cost"))
    for ctx in seen[-2:]:
        held = {name: getattr(ctx, name) for name in type(ctx).__slots__}
        assert not [name for name, v in held.items() if isinstance(v, types.FunctionType | types.MethodType)], held
        assert type(ctx._hooks).__name__ == "_ThreadHooks" and ctx._hooks.run.job.id == ctx.job_id


@pytest.mark.parametrize("isolation", ISOLATIONS, ids=ISOLATION_IDS)
def test_a_step_log_built_at_the_first_durable_call_keeps_the_handlers_thread_as_its_owner(
        project: Project, isolation: str) -> None:
    """Built at the first durable call, it still belongs to the thread that runs the
    handler: the step lands, and a step from a thread the handler started is refused."""
    project.write_config(concurrency=1)  # one job: one child, not eight
    project.add_function("durable_cost", DURABLE.format(isolation=isolation), SCHEMA)
    c = project.client
    project.spawn_worker("fast")
    job = c.enqueue("durable_cost", {"t": 1.0}).id
    done = c.wait(job, 30).as_dict()
    assert done["status"] == "done", done
    assert done["result"] == {"got": 42, "refused": ["PermanentFailure"], "step_key_after": None}
