"""One Client shared by many threads, as in a web process: overlapping enqueues share
round trips (group commit), and every caller still gets exactly its own answer, with
idempotency keys decided as if the calls had come one by one."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from runner.client import Client, Enqueued, Request
from runner.errors import IdempotencyConflict, ValidationFailed

from conftest import Project, structures


def test_shared_client_under_threads_answers_each_caller_and_loses_nothing(project: Project) -> None:
    """24 threads x 40 calls on one Client, across two queues, with keys that repeat
    (same payload: a duplicate of the first job) and clash (other payload: a conflict).
    Every plain job lands once in its queue; each key holds exactly one job; and calls
    really were batched (fewer enqueue script calls than jobs)."""
    client = Client(project.runtime.__class__.create(project.config()))
    redis = project.runtime.redis
    redis.config_resetstat()
    barrier = threading.Barrier(24)
    answers: dict[tuple[int, int], Any] = {}

    def run(t: int) -> None:
        barrier.wait()
        for i in range(40):
            try:
                if i % 10 == 0:  # a key shared by every thread, same payload
                    answers[(t, i)] = client.enqueue("noop", {"k": i}, idempotency_key=f"shared-{i}")
                elif i % 10 == 1:  # a key shared by every thread, each with its own payload
                    answers[(t, i)] = client.enqueue("noop", {"t": t}, idempotency_key=f"clash-{i}")
                elif i % 10 == 2:
                    answers[(t, i)] = client.enqueue("slow", {"seconds": 0})
                else:
                    answers[(t, i)] = client.enqueue("noop", {"t": t, "i": i})
            except IdempotencyConflict as exc:
                answers[(t, i)] = exc

    threads = [threading.Thread(target=run, args=(t,)) for t in range(24)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
        assert not th.is_alive()
    assert len(answers) == 24 * 40

    for i in (0, 10, 20, 30):  # same key, same payload: one job, the rest duplicates of it
        got = [answers[(t, i)] for t in range(24)]
        assert all(isinstance(a, Enqueued) for a in got)
        assert len({a.id for a in got}) == 1
        assert sum(not a.duplicate for a in got) == 1
    for i in (1, 11, 21, 31):  # same key, other payloads: one winner, 23 conflicts
        got = [answers[(t, i)] for t in range(24)]
        winners = [a for a in got if isinstance(a, Enqueued)]
        assert len(winners) == 1 and not winners[0].duplicate
        assert all(isinstance(a, IdempotencyConflict) for a in got if a is not winners[0])

    created = [a for a in answers.values() if isinstance(a, Enqueued) and not a.duplicate]
    fast_ids = {a.id for a in created if a.queue == "fast"}
    slow_ids = {a.id for a in created if a.queue == "slow"}
    assert len(slow_ids) == 24 * 4
    assert len(fast_ids) == 24 * 28 + 4 + 4
    assert sorted(structures(project, "fast")["ready"]) == sorted(fast_ids)
    assert sorted(structures(project, "slow")["ready"]) == sorted(slow_ids)
    calls = redis.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    assert 0 < calls < len(answers), calls


def test_aenqueue_from_many_tasks_shares_round_trips_and_answers_each(project: Project) -> None:
    """``Client.aenqueue``: 400 tasks on one event loop, across two queues, with a key
    that repeats (one job, the rest duplicates) and one that clashes (one winner, the
    rest conflicts). Every plain job lands once; the calls shared round trips; and an
    invalid payload is refused before anything is sent."""
    client = Client(project.runtime.__class__.create(project.config()))
    redis = project.runtime.redis
    redis.config_resetstat()

    async def one(i: int) -> Any:
        try:
            if i % 10 == 0:
                return await client.aenqueue("noop", {"k": 1}, idempotency_key="shared")
            if i % 10 == 1:
                return await client.aenqueue("noop", {"i": i}, idempotency_key="clash")
            if i % 10 == 2:
                return await client.aenqueue("slow", {"seconds": 0})
            return await client.aenqueue("noop", {"i": i})
        except IdempotencyConflict as exc:
            return exc

    async def main() -> list[Any]:
        return await asyncio.gather(*(one(i) for i in range(400)))

    answers = asyncio.run(main())
    shared = [answers[i] for i in range(0, 400, 10)]
    assert len({a.id for a in shared}) == 1 and sum(not a.duplicate for a in shared) == 1
    clash = [answers[i] for i in range(1, 400, 10)]
    assert sum(isinstance(a, Enqueued) for a in clash) == 1
    assert sum(isinstance(a, IdempotencyConflict) for a in clash) == 39
    created = [a for a in answers if isinstance(a, Enqueued) and not a.duplicate]
    assert sorted(structures(project, "slow")["ready"]) == sorted(a.id for a in created if a.queue == "slow")
    assert sorted(structures(project, "fast")["ready"]) == sorted(a.id for a in created if a.queue == "fast")
    assert len(created) == 400 - 39 - 39
    calls = redis.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    assert 0 < calls < 100, calls

    with pytest.raises(ValidationFailed):
        asyncio.run(client.aenqueue("slow", {"seconds": "no"}))
    assert len(structures(project, "slow")["ready"]) == 40


def test_each_caller_of_a_shared_round_trip_is_answered_by_its_own_script_call(project: Project) -> None:
    """A group-commit round trip holding jobs of two queues (callers on many threads), the
    second queue's ready list damaged (a string where a list belongs): only that call's
    callers get its error; the other queue's jobs were written and their callers get
    their jobs, not an error that would make them enqueue again."""
    client = project.client
    redis = project.runtime.redis
    redis.set(project.keys("slow").ready, "not a list")
    fast = [client.prepare(Request("noop", {"i": i})) for i in range(3)]
    slow = [client.prepare(Request("slow", {"seconds": 0}))]
    answers = client._send_prepared([*fast, *slow])  # the round trip the overlapping callers share
    assert all(isinstance(a, Enqueued) for a in answers[:3]), answers
    assert sorted(structures(project)["ready"]) == sorted(a.id for a in answers[:3])  # type: ignore[union-attr]
    assert isinstance(answers[3], Exception) and "WRONGTYPE" in str(answers[3])
