"""BATCH functions: many claimed jobs in one handle_batch call, each job settled on its
own (result, attempts, dead letter); partial failures retry exactly the failed items; a
batch never mixes rendered keys or schema versions; both isolations."""

from __future__ import annotations

import itertools
import json
import textwrap
import time
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
                             "payloads": payloads, "version": ctx.version, "pid": os.getpid()}}) + "\\n")
    failures = {{i: (runner.PermanentFailure("bury " + str(p.get("n"))) if p.get("bury")
                     else ValueError("flaky " + str(i)))
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
    project.write_config(concurrency=2)  # (two children to start, not eight)
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


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_partial_failures_retry_exactly_the_failed_items(project: Project, isolation: str) -> None:
    """BatchFailures: the items it names fail on their own (a ValueError retried, a
    PermanentFailure buried at once, in the dead letters with its own error); the others
    are done with the results given, and run exactly once (counted per item)."""
    project.write_config(concurrency=2)
    add(project, isolation=isolation)
    client = project.client
    payloads = [{"n": 0}, {"n": 1, "fail_until": 1}, {"n": 2}, {"n": 3, "bury": True}, {"n": 4, "fail_until": 2}]
    ids = [e.id for e in client.enqueue_many([Request("bulk", p) for p in payloads])]
    project.spawn_worker("fast")
    views = wait_for(lambda: finished(project, ids), timeout=30, what="every job settled")
    per_item = {i: sum(c["ids"].count(i) for c in calls(project)) for i in ids}
    assert [per_item[i] for i in ids] == [1, 2, 1, 1, 3], per_item
    assert [views[i]["status"] for i in ids] == ["done", "done", "done", "dead", "done"]
    assert [views[i]["attempt"] for i in ids] == [1, 2, 1, 1, 3]
    assert views[ids[3]]["last_error"]["message"] == "bury 3"
    assert views[ids[1]]["result"]["n"] == 1
    dead = client.dead("fast")[1]
    assert [d.id for d in dead] == [ids[3]]


def test_a_batch_never_mixes_rendered_keys(project: Project) -> None:
    """BATCH key "tenant:{tenant}": every call holds one tenant's jobs only."""
    add(project, key="tenant:{tenant}",
        schema='{"type": "object", "properties": {"tenant": {"type": "string"}}, "required": ["tenant"]}')
    client = project.client
    ids = [e.id for e in client.enqueue_many([Request("bulk", {"n": i, "tenant": "ab"[i % 2]}) for i in range(30)])]
    project.spawn_worker("fast")
    wait_for(lambda: finished(project, ids), timeout=30, what="every job settled")
    got = calls(project)
    assert sorted(i for c in got for i in c["ids"]) == sorted(ids)
    for c in got:
        assert len({p["tenant"] for p in c["payloads"]}) == 1, c["payloads"]
    assert max(len(c["ids"]) for c in got) > 1


def test_payloads_are_upgraded_to_the_newest_version_before_a_batch(project: Project) -> None:
    """v1 and v2 jobs of one function: every call sees v2 payloads only (upgrade() ran on
    each v1 payload first), and version 2 in ctx.version."""
    source = textwrap.dedent(BATCHED.format(isolation="thread", size=10, wait=0.3, key="")) + textwrap.dedent('''
        def upgrade(payload, from_version):
            return {"n": payload["old_n"], "upgraded": True}
        ''')
    project.add_function("bulk", source, '{"type": "object", "required": ["old_n"]}')
    (project.root / "schemas" / "bulk" / "v2.json").write_text('{"type": "object", "required": ["n"]}')
    client = project.client
    reqs = [Request("bulk", {"old_n": i}, version=1) if i % 2 else Request("bulk", {"n": i}, version=2)
            for i in range(12)]
    ids = [e.id for e in client.enqueue_many(reqs)]
    project.spawn_worker("fast")
    views = wait_for(lambda: finished(project, ids), timeout=30, what="every job settled")
    got = calls(project)
    assert {c["version"] for c in got} == {2}
    assert all("n" in p and "old_n" not in p for c in got for p in c["payloads"])
    assert [views[i]["result"]["n"] for i in ids] == list(range(12))


SHORT = '''
QUEUE = "fast"
BATCH = {"size": 5, "wait": 0.2}

def handle_batch(payloads, ctx):
    return [1]
'''


def test_a_wrong_length_result_fails_the_batch_with_a_clear_error(project: Project) -> None:
    project.add_function("short", SHORT)
    ids = [e.id for e in project.client.enqueue_many([Request("short", {"n": i}) for i in range(3)])]
    project.spawn_worker("fast")
    views = wait_for(lambda: finished(project, ids), timeout=30, what="every job settled")
    for i in ids:
        assert views[i]["status"] == "dead"
        assert "returned a list of 1 for a batch of" in views[i]["last_error"]["message"]


STUCK = '''
import time
QUEUE = "fast"
ISOLATION = "{isolation}"
TIMEOUT = 1
MAX_ATTEMPTS = 1
BATCH = {{"size": 4, "wait": 0.2}}

def handle_batch(payloads, ctx):
    for _ in range(3000):  # (short sleeps: a thread's timeout lands between two C calls)
        time.sleep(0.01)
'''


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_timeout_bounds_the_whole_batch_call(project: Project, isolation: str) -> None:
    """TIMEOUT 1 s, a call that would take 30: every member fails as a timeout, each on
    its own attempts (here MAX_ATTEMPTS 1: each in the dead letters), within seconds."""
    project.write_config(concurrency=2)
    project.add_function("stuck", STUCK.format(isolation=isolation))
    ids = [e.id for e in project.client.enqueue_many([Request("stuck", {"n": i}) for i in range(3)])]
    project.spawn_worker("fast")
    views = wait_for(lambda: finished(project, ids), timeout=20, what="every job settled")
    for i in ids:
        assert views[i]["status"] == "dead"
        err = views[i]["last_error"]
        assert err["type"] == "JobTimeout" and "ran past" in err["message"] and "TIMEOUT" in err["message"], err


PLAIN = '''
QUEUE = "fast"
ISOLATION = "{isolation}"

def handle(payload, ctx):
    return {{"plain": payload["n"]}}
'''


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_batch_and_plain_functions_share_a_queue(project: Project, isolation: str) -> None:
    """Jobs of a plain function and of a BATCH function interleaved on one queue: each
    goes through its own handler (a plain job never lands in a batch, nor a batch's job
    in a child's run of single jobs), and a batch holds only its function's jobs."""
    project.write_config(concurrency=2)
    add(project, isolation=isolation)
    project.add_function("plain", PLAIN.format(isolation=isolation))
    reqs = [Request("bulk" if i % 2 else "plain", {"n": i}) for i in range(30)]
    ids = [e.id for e in project.client.enqueue_many(reqs)]
    project.spawn_worker("fast")
    views = wait_for(lambda: finished(project, ids), timeout=60, what="every job settled")
    for i, job_id in enumerate(ids):
        assert views[job_id]["status"] == "done", views[job_id]
        assert views[job_id]["result"] == ({"n": i, "size": views[job_id]["result"]["size"]} if i % 2
                                           else {"plain": i})
    assert sorted(j for c in calls(project) for j in c["ids"]) == sorted(ids[1::2])


def test_many_keys_spread_over_the_executors(project: Project) -> None:
    """24 tenants' jobs interleaved, BATCH wait 1 s, four executors: a batch gathering
    one tenant hands the other tenants' jobs on (to their own batch, or to an idle
    executor) rather than keeping them, so the 24 batches do not wait their 1 s one
    after another on one executor; every call holds one tenant's jobs."""
    project.write_config(concurrency=4)
    add(project, key="tenant:{tenant}", wait=1.0,
        schema='{"type": "object", "properties": {"tenant": {"type": "string"}}, "required": ["tenant"]}')
    reqs = [Request("bulk", {"n": i, "tenant": f"t{i % 24}"}) for i in range(72)]
    ids = [e.id for e in project.client.enqueue_many(reqs)]
    project.spawn_worker("fast")
    wait_for(lambda: calls(project), timeout=30, what="the first call")
    t0 = time.monotonic()
    wait_for(lambda: finished(project, ids), timeout=60, what="every job settled")
    took = time.monotonic() - t0
    got = calls(project)
    assert sorted(i for c in got for i in c["ids"]) == sorted(ids)
    for c in got:
        assert len({p["tenant"] for p in c["payloads"]}) == 1, c["payloads"]
    assert took < 16, f"{took:.1f} s for 24 keys of 1 s wait on 4 executors: batches waited one after another"


EXITING = '''
import asyncio
QUEUE = "fast"
MAX_ATTEMPTS = 2
BATCH = {"size": 4, "wait": 0.2}

class Boom(BaseException):
    pass

async def handle_batch(payloads, ctx):
    if payloads[0].get("how") == "cancelled":
        raise asyncio.CancelledError()
    if payloads[0].get("how") == "exit":
        raise SystemExit(3)
    if payloads[0].get("how") == "boom":
        raise Boom("hostile")
    return [p["n"] for p in payloads]
'''


def test_a_base_exception_from_handle_batch_fails_the_batch_not_the_worker(project: Project) -> None:
    """SystemExit, an async CancelledError or any BaseException out of handle_batch (thread
    isolation) fails the batch's items, each on its own attempts, as a single handler's
    would; the worker lives on and runs the next jobs."""
    project.add_function("exiting", EXITING)
    client = project.client
    worker = project.spawn_worker("fast")
    for how, kind in (("cancelled", "CancelledError"), ("exit", "SystemExit"), ("boom", "Boom")):
        bad = [e.id for e in client.enqueue_many([Request("exiting", {"how": how, "n": i}) for i in range(2)])]
        views = wait_for(lambda bad=bad: finished(project, bad), timeout=60, what=f"every {how} item settled")
        assert all(v["status"] == "dead" and v["reason"] == "max attempts reached" for v in views.values()), views
        assert {v["last_error"]["type"] for v in views.values()} == {kind}
        assert worker.poll() is None
    good = [e.id for e in client.enqueue_many([Request("exiting", {"n": i}) for i in range(3)])]
    views = wait_for(lambda: finished(project, good), timeout=30, what="the next jobs")
    assert [views[i]["result"] for i in good] == [0, 1, 2] and worker.poll() is None, views


def test_an_async_batch_that_exits_leaves_no_stale_task_for_the_next_call(project: Project) -> None:
    """One executor thread: SystemExit out of an async handle_batch escapes its event loop
    and leaves the call's outer task pending there; the next batch on that thread runs on a
    clean loop, not into the old call's SystemExit."""
    project.write_config(concurrency=1)
    project.add_function("exiting", EXITING)
    client = project.client
    worker = project.spawn_worker("fast")
    bad = [e.id for e in client.enqueue_many([Request("exiting", {"how": "exit", "n": i}) for i in range(2)])]
    wait_for(lambda: finished(project, bad), timeout=60, what="the exiting items settled")
    good = [e.id for e in client.enqueue_many([Request("exiting", {"n": i}) for i in range(3)])]
    views = wait_for(lambda: finished(project, good), timeout=30, what="the next jobs")
    assert [views[i]["result"] for i in good] == [0, 1, 2], [v.get("last_error") for v in views.values()]
    assert worker.poll() is None


LOGGING = '''
QUEUE = "fast"
ISOLATION = "{isolation}"
BATCH = {{"size": 5, "wait": 0.3}}

def handle_batch(payloads, ctx):
    ctx.logger.info("a batch of %d", len(payloads))
    for p, job in zip(payloads, ctx.jobs):
        job.logger.info("item %d", p["n"])
    return [p["n"] for p in payloads]
'''


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_each_items_lines_go_to_its_own_jobs_log(project: Project, isolation: str) -> None:
    """ctx.jobs[i].logger writes to that item's job log only; ctx.logger's lines (the
    batch's, shared) go to the log of every item of the call, before the item's own."""
    project.write_config(concurrency=2)
    project.add_function("chatty", textwrap.dedent(LOGGING.format(isolation=isolation)))
    client = project.client
    ids = [e.id for e in client.enqueue_many([Request("chatty", {"n": i}) for i in range(8)])]
    project.spawn_worker("fast")
    wait_for(lambda: finished(project, ids), timeout=30, what="every job settled")
    for n, i in enumerate(ids):
        msgs = [line["msg"] for line in client.logs(i)["lines"] if line["src"] == "log"]
        assert len(msgs) == 2 and msgs[0].startswith("a batch of ") and msgs[1] == f"item {n}", (n, msgs)


CLAIMS_SEEN = '''
import json, os, redis
QUEUE = "fast"
BATCH = {{"size": 10, "wait": 0.3}}

def handle_batch(payloads, ctx):
    r = redis.Redis.from_url(os.environ["REDIS_URL"], decode_responses=True)
    claims = r.hmget("{prefix}:{{fast}}:claims", [j.id for j in ctx.jobs])
    with open(os.path.join(os.environ["RECORD_DIR"], "calls.jsonl"), "a") as f:
        f.write(json.dumps({{"ids": [j.id for j in ctx.jobs], "claims": claims}}) + "\\n")
    return None
'''


def test_a_thread_batchs_members_count_their_attempts_from_the_call(project: Project) -> None:
    """Under threads the call starts in the thread that hands the members off: when
    handle_batch runs, every member's claim is marked started in Redis (no 'p', no 'h'),
    so a worker lost in the call spends each member's attempt, as a single job's is
    spent when its handler starts, and no start mark per member follows."""
    project.add_function("seen", textwrap.dedent(CLAIMS_SEEN.format(prefix=project.prefix)))
    client = project.client
    ids = [e.id for e in client.enqueue_many([Request("seen", {"n": i}) for i in range(25)])]
    project.spawn_worker("fast")
    views = wait_for(lambda: finished(project, ids), timeout=30, what="every job settled")
    assert all(v["status"] == "done" for v in views.values())
    got = calls(project)
    assert sorted(i for c in got for i in c["ids"]) == sorted(ids)
    for c in got:
        for job_id, claim in zip(c["ids"], c["claims"], strict=True):
            assert claim is not None, job_id
            flags = claim.split()[3]
            assert "p" not in flags and "h" not in flags, (job_id, claim)


# Each call appends one line when it ends: its items' ids, and when it started and ended.
LIMITED = '''
import json, os, time
QUEUE = "fast"
ISOLATION = "{isolation}"
CONCURRENCY = {limit}
TIMEOUT = 15
BATCH = {{"size": 4, "wait": 1.0}}

def handle_batch(payloads, ctx):
    began = time.time()
    with open(os.path.join(os.environ["RECORD_DIR"], "began"), "a") as f:
        f.write("began\\n")
    time.sleep({sleep})
    with open(os.path.join(os.environ["RECORD_DIR"], "calls.jsonl"), "a") as f:
        f.write(json.dumps({{"ids": [j.id for j in ctx.jobs], "began": began, "ended": time.time()}}) + "\\n")
'''


def _done_calls(project: Project, ids: list[str]) -> list[dict[str, Any]]:
    """The batch calls that ran ``ids``, in the order they began, once every job is done."""
    views = wait_for(lambda: finished(project, ids), timeout=60, what="every job settled")
    assert all(v["status"] == "done" for v in views.values()), views
    return sorted(calls(project), key=lambda c: c["began"])


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_limit_far_from_full_leaves_no_executor_idle(project: Project, isolation: str) -> None:
    """A BATCH function with CONCURRENCY 8, far from full: eight jobs on two executors run
    in two calls of four side by side. Before, every job under a limit needed an executor
    of its own at its claim, and a batch of them filled every executor's count: two jobs
    went into one call, the other executor stayed idle, and the rest waited for that call's
    end (four calls of two, one after another)."""
    project.write_config(concurrency=2, prefetch=0)
    project.add_function("limited", LIMITED.format(isolation=isolation, limit=8, sleep=3))
    ids = [e.id for e in project.client.enqueue_many([Request("limited", {"n": i}) for i in range(8)])]
    project.spawn_worker("fast")
    got = _done_calls(project, ids)
    assert sorted(i for c in got for i in c["ids"]) == sorted(ids), "each job in exactly one call"
    assert [len(c["ids"]) for c in got] == [4, 4], got
    assert got[1]["began"] < got[0]["ended"], "the second call waited for the first: an executor stayed idle"


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_jobs_under_a_limit_that_come_during_a_batch_go_to_the_idle_executor(project: Project,
                                                                             isolation: str) -> None:
    """Four jobs of a BATCH function with CONCURRENCY 8 run in one call on one of two
    executors; four more enqueued while it runs go to the other executor's call at once.
    Before, the four running members counted as four busy executors: the worker claimed
    no job under a limit until the call ended."""
    project.write_config(concurrency=2, prefetch=0)
    project.add_function("limited", LIMITED.format(isolation=isolation, limit=8, sleep=3))
    client = project.client
    ids = [e.id for e in client.enqueue_many([Request("limited", {"n": i}) for i in range(4)])]
    project.spawn_worker("fast")
    wait_for(lambda: project.runs("began"), timeout=30, what="the first call")
    ids += [e.id for e in client.enqueue_many([Request("limited", {"n": i}) for i in range(4, 8)])]
    got = _done_calls(project, ids)
    assert [sorted(c["ids"]) for c in got] == [sorted(ids[:4]), sorted(ids[4:])], got
    assert got[1]["began"] < got[0]["ended"], "the second call waited for the first: an executor stayed idle"


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_full_limit_still_caps_the_jobs_in_batches(project: Project, isolation: str) -> None:
    """CONCURRENCY 4 and BATCH size 4 on two executors: one call of four runs at a time,
    the next starting only after it ends, though an executor is free (each member holds
    its own slot of the limit)."""
    project.write_config(concurrency=2, prefetch=0)
    # (1.5 s calls: two calls the limit did not cap would start together, and overlap by all of it)
    project.add_function("limited", LIMITED.format(isolation=isolation, limit=4, sleep=1.5))
    ids = [e.id for e in project.client.enqueue_many([Request("limited", {"n": i}) for i in range(8)])]
    project.spawn_worker("fast")
    got = _done_calls(project, ids)
    assert sorted(i for c in got for i in c["ids"]) == sorted(ids), "each job in exactly one call"
    for a, b in itertools.pairwise(got):
        assert b["began"] >= a["ended"] - 0.05, f"two calls of a limit of 4 overlapped: {got}"
