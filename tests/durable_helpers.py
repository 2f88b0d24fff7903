"""What the durable-function and event-wait tests share (the cluster tests too, with the
cluster and its project from clusterkit.py): the two isolations a handler runs under, the
source of a durable handler file around its ``mark`` step function, reading what
``mark`` recorded, the registry of an event's waiters, and waiting for a job to wait."""

from __future__ import annotations

from typing import Any

from runner.store import listeners
from runner.store.keys import EventKeys

from conftest import Project, wait_for

# A handler file's isolation line, for ``.format(isolation=...)``: threads, then child processes.
ISOLATIONS = ["", 'ISOLATION = "process"']
ISOLATION_IDS = ["thread", "process"]


def marked(body: str, *, imports: str = "import os\n", options: str = "", writes: str = '"x"',
           returns: str = "name") -> str:
    """A durable handler file's source, to fill with ``.format(isolation=...)`` (so
    ``body`` doubles its braces): ``imports``, QUEUE "fast", the ``options`` lines, the
    isolation line, then ``mark(name, ctx)``, the step function the tests record runs
    with (it appends ``writes``, an expression, as one line of RECORD_DIR/<job id>-<name>
    and returns ``returns``), then ``body``."""
    return (f'\n{imports}QUEUE = "fast"\n{options}{{isolation}}\n\n'
            "def mark(name, ctx):\n"
            '    with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id + "-" + name), "a") as f:\n'
            f'        f.write({writes} + "\\n")\n'
            f"    return {returns}\n\n{body}")


# A durable job that waits for "order.paid" with its payload's order_id, between two
# marked steps (and an optional ctx.sleep "nap" before the wait): returns {"event": ...}.
ORDER_PAID_WAITER = marked('''def handle(payload, ctx):
    ctx.step("before", mark, "before", ctx)
    if payload.get("nap"):
        ctx.sleep("nap", payload["nap"])
    event = ctx.wait_for_event("order.paid", match={{"order_id": payload["order_id"]}},
                               timeout=payload.get("timeout"))
    ctx.step("after", mark, "after", ctx)
    return {{"event": event}}
''')


def runs(project: Project, job_id: str, name: str) -> list[str]:
    """The lines ``mark`` wrote for step ``name`` of job ``job_id``, one per run."""
    p = project.records / f"{job_id}-{name}"
    return p.read_text().splitlines() if p.exists() else []


def registered(project: Project, name: str = "order.paid") -> int:
    """How many jobs wait for event ``name`` (its waiters' registry)."""
    return listeners.waiting(project.runtime.redis, EventKeys(project.runtime.config.redis.prefix, name))


def until_waiting(c: Any, job: str) -> None:
    """Wait for ``job`` to be waiting, saying what it is instead when it does not."""
    try:
        wait_for(lambda: c.get(job).status == "waiting", timeout=60, what=f"job {job} to wait")
    except AssertionError:
        raise AssertionError(f"job {job} did not wait: {c.get(job).as_dict()}") from None
