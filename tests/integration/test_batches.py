"""BATCH functions: many claimed jobs in one handle_batch call, each job settled on its
own (result, attempts, dead letter); partial failures retry exactly the failed items; a
batch never mixes rendered keys or schema versions; both isolations."""

from __future__ import annotations

import json
import textwrap
from typing import Any

import pytest

from runner.client import Request

from conftest import Project, wait_for

# Each call appends one line to calls.jsonl: the items' ids, attempts and payloads.
BATCHED = '''
import json, os, runner
QUEUE = "fast"
ISOLATION = "{isolation}"
BATCH = {{"size": {size}, "wait": {wait}{key}}}

def handle_batch(payloads, ctx):
    with open(os.path.join(os.environ["RECORD_DIR"], "calls.jsonl"), "a") as f:
        f.write(json.dumps({{"ids": [j.id for j in ctx.jobs], "attempts": [j.attempt for j in ctx.jobs],
                             "payloads": payloads, "version": ctx.version}}) + "\\n")
    failures = {{i: (runner.PermanentFailure("bury " + str(i)) if p.get("bury") else ValueError("flaky " + str(i)))
                for i, p in enumerate(payloads)
                if p.get("bury") or p.get("fail_until", 0) >= ctx.jobs[i].attempt}}
    results = [{{"n": p.get("n"), "size": len(payloads)}} for p in payloads]
    if failures:
        raise runner.BatchFailures(failures, results=results)
    return results
'''


def calls(project: Project) -> list[dict[str, Any]]:
    p = project.records / "calls.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def add(project: Project, *, isolation: str = "thread", size: int = 10, wait: float = 0.3, key: str = "",
        schema: str = '{"type": "object"}') -> None:
    project.add_function("bulk", textwrap.dedent(BATCHED.format(
        isolation=isolation, size=size, wait=wait, key=f', "key": "{key}"' if key else "")), schema)


def finished(project: Project, ids: list[str]) -> dict[str, dict[str, Any]]:
    client = project.client
    views = {i: client.get(i).as_dict() for i in ids}
    return views if all(v["status"] in ("done", "dead") for v in views.values()) else {}


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_one_call_per_batch_and_each_job_settled_on_its_own(project: Project, isolation: str) -> None:
    """25 jobs enqueued before the worker starts, BATCH size 10: calls of at most 10, every
    job done with its own result (its item's), one call holding it."""
    add(project, isolation=isolation)
    client = project.client
    ids = [e.id for e in client.enqueue_many([Request("bulk", {"n": i}) for i in range(25)])]
    project.spawn_worker("fast")
    views = wait_for(lambda: finished(project, ids), timeout=30, what="every job settled")
    got = calls(project)
    assert all(len(c["ids"]) <= 10 for c in got)
    assert sorted(i for c in got for i in c["ids"]) == sorted(ids), "each job in exactly one call"
    assert len(got) <= 6, [len(c["ids"]) for c in got]
    for n, i in enumerate(ids):
        assert views[i]["status"] == "done"
        assert views[i]["result"]["n"] == n
