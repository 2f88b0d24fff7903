"""Enqueues from asyncio code (the web process's event loop, ``Client.aenqueue``) on the
loop's own connection (store/aiolink.py): no thread hand-off, calls that overlap share a
round trip, and every failure is the one the thread's path gives: Redis gone is
RedisUnavailable at once, its return is served, a lost script cache is loaded again, a
caller that goes away costs nobody else their answer."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from runner.client import Client, Enqueued
from runner.errors import RedisUnavailable
from runner.runtime import Runtime
from runner.store.embedded import Server
from runner.store.sources import SHAS

from conftest import LoopTicks, Project, make_project, structures, wait_for


def _client(project: Project) -> Client:
    """A producer's client whose partition tags are recorded already: its asyncio
    enqueues take the loop's path from the first (the thread's records them when due)."""
    return Client(Runtime.create(project.config(), record=True))


def _threads() -> set[str]:
    return {t.name for t in threading.enumerate()}


def test_asyncio_enqueues_share_round_trips_on_the_loop_with_no_thread(project: Project) -> None:
    """200 tasks on one loop: every job lands once, the calls shared round trips, and no
    sender thread was started for them."""
    client = _client(project)
    redis = project.runtime.redis
    redis.config_resetstat()
    before = _threads()

    async def main() -> list[Enqueued]:
        return await asyncio.gather(*(client.aenqueue("noop", {"i": i}) for i in range(200)))

    got = asyncio.run(main())
    assert sorted(structures(project)["ready"]) == sorted(e.id for e in got)
    assert not any(name.startswith("runner-commit") for name in _threads() - before)
    calls = redis.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    assert 0 < calls < 100, calls


def test_redis_going_away_is_unavailable_at_once_and_its_return_is_served(tmp_path: Path) -> None:
    """The server killed under a client that enqueued: the next asyncio enqueue raises
    RedisUnavailable (nothing hangs); the server back on its port, the next one connects
    again and its job is in Redis."""
    server = Server(tmp_path / "own", appendonly=False).start()
    project = make_project(tmp_path / "project", server)
    try:
        client = _client(project)

        async def one(i: int) -> Enqueued:
            return await asyncio.wait_for(client.aenqueue("noop", {"i": i}), 10)

        async def main() -> tuple[Enqueued, BaseException, Enqueued]:
            first = await one(1)
            server.stop(kill=True)
            try:
                await one(2)
            except RedisUnavailable as exc:
                failed: BaseException = exc
            else:
                pytest.fail("an enqueue succeeded with Redis down")
            server.start()
            return first, failed, await one(3)

        first, failed, third = asyncio.run(main())
        assert str(failed).startswith("Redis is unreachable")
        assert first.id != third.id
        assert structures(project)["ready"] == [third.id]  # the server kept nothing on disk
    finally:
        project.stop_all()
        server.stop(kill=True)


def test_a_flushed_script_cache_is_loaded_again(project: Project) -> None:
    """SCRIPT FLUSH between two asyncio enqueues (a restarted Redis): the second is
    answered NOSCRIPT, loads the script and runs once."""
    client = _client(project)
    redis = project.runtime.redis

    async def main() -> list[Enqueued]:
        a = await client.aenqueue("noop", {"i": 1})
        redis.script_flush()
        return [a, await client.aenqueue("noop", {"i": 2})]

    got = asyncio.run(main())
    assert redis.script_exists(SHAS["enqueue"]) == [True]
    assert sorted(structures(project)["ready"]) == sorted(e.id for e in got)


def test_a_caller_that_goes_away_costs_the_others_nothing(project: Project) -> None:
    """Of 50 overlapping enqueues, 10 are cancelled while in flight (their requests went
    away): the other 40 are answered and in Redis; a cancelled one may have been written
    (it was sent) but is never written twice; the path serves later calls as before."""
    client = _client(project)

    async def main() -> tuple[list[Any], Enqueued]:
        tasks = [asyncio.ensure_future(client.aenqueue("noop", {"i": i})) for i in range(50)]
        await asyncio.sleep(0)  # every task has submitted its job
        for t in tasks[::5]:
            t.cancel()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        return done, await client.aenqueue("noop", {"i": 99})

    done, later = asyncio.run(main())
    answered = [d for d in done if isinstance(d, Enqueued)]
    assert len(answered) == 40 and all(isinstance(d, asyncio.CancelledError) for d in done[::5])
    ready = structures(project)["ready"]
    assert {e.id for e in answered} | {later.id} <= set(ready)
    assert len(ready) == len(set(ready)) <= 51


def test_a_client_serves_one_event_loop_after_another(project: Project) -> None:
    """Ten asyncio.run in turn with one client (scripts, tests, async_to_sync): each is
    answered, the later ones on the thread's path (the loop's connection stays with the
    first loop), and no connection is opened per loop."""
    client = _client(project)
    redis = project.runtime.redis
    before = len(redis.client_list())
    ids = [asyncio.run(client.aenqueue("noop", {"i": i})).id for i in range(10)]
    assert sorted(structures(project)["ready"]) == sorted(ids)
    assert len(redis.client_list()) - before <= 4  # the first loop's, the thread's: not one per loop


def test_two_live_event_loops_in_two_threads_are_each_answered(project: Project) -> None:
    """Loop A has submitted an enqueue and is busy before its batch goes out; loop B, in
    another thread, enqueues meanwhile (async_to_sync in a threaded web server). Both are
    answered and both jobs are in Redis: B never takes or drops A's waiting job."""
    client = _client(project)
    a_submitted, b_answered = threading.Event(), threading.Event()
    out: dict[str, Any] = {}

    def thread_a() -> None:
        async def main() -> Any:
            task = asyncio.ensure_future(client.aenqueue("noop", {"who": "A"}))
            await asyncio.sleep(0)  # A's item waits; its batch has not gone out yet
            a_submitted.set()
            b_answered.wait(10)  # loop A busy for a moment
            return await asyncio.wait_for(task, 10)

        out["A"] = asyncio.run(main())

    def thread_b() -> None:
        a_submitted.wait(10)
        try:
            out["B"] = asyncio.run(asyncio.wait_for(client.aenqueue("noop", {"who": "B"}), 10))
        finally:
            b_answered.set()

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert isinstance(out.get("A"), Enqueued) and isinstance(out.get("B"), Enqueued), out
    assert sorted(structures(project)["ready"]) == sorted([out["A"].id, out["B"].id])


def test_each_caller_of_a_round_trip_is_answered_by_its_own_script_call(project: Project) -> None:
    """Two jobs of two queues in one round trip, the second queue's ready list damaged
    (a string where a list belongs): its call fails, and only its caller hears of it; the
    other job was written and its caller gets its 202's answer, not an error that would
    make a client retry a job already in Redis."""
    client = _client(project)
    redis = project.runtime.redis
    redis.set(project.keys("slow").ready, "not a list")

    async def main() -> list[Any]:
        return await asyncio.gather(client.aenqueue("noop", {"i": 1}), client.aenqueue("slow", {"seconds": 0}),
                                    return_exceptions=True)

    fast, slow = asyncio.run(main())
    assert isinstance(fast, Enqueued), fast
    assert structures(project)["ready"] == [fast.id]
    assert isinstance(slow, Exception) and not isinstance(slow, Enqueued)
    assert "WRONGTYPE" in str(slow)


def test_a_stalled_redis_fails_the_waiting_enqueues_within_the_timeout(tmp_path: Path) -> None:
    """Redis stopped (SIGSTOP: the socket stays open, nothing answers) under asyncio
    enqueues: each fails with RedisUnavailable within about the URL's socket_timeout
    instead of waiting for ever, the loop serves other work meanwhile, and once Redis
    resumes the next enqueue is written."""
    server = Server(tmp_path / "own", appendonly=False).start()
    project = make_project(tmp_path / "project", server)
    assert server.proc is not None
    pid = server.proc.pid
    try:
        cfg = project.config()
        url = cfg.redis.url + ("&" if "?" in cfg.redis.url else "?") + "socket_timeout=0.5"
        client = Client(Runtime.create(replace(cfg, redis=replace(cfg.redis, url=url)), record=True))

        async def main() -> tuple[list[BaseException | Enqueued], float, int, Enqueued]:
            await client.aenqueue("noop", {"i": 0})  # connected
            os.kill(pid, signal.SIGSTOP)
            async with LoopTicks() as ticks:
                t0 = time.monotonic()
                stalled = await asyncio.wait_for(asyncio.gather(
                    *(client.aenqueue("noop", {"i": i}) for i in range(1, 6)), return_exceptions=True), 10)
                took = time.monotonic() - t0
            os.kill(pid, signal.SIGCONT)
            return stalled, took, ticks.count, await asyncio.wait_for(client.aenqueue("noop", {"i": 9}), 10)

        stalled, took, ticks, after = asyncio.run(main())
        assert all(isinstance(e, RedisUnavailable) for e in stalled), stalled
        assert took < 3.0, took  # the timeout (0.5 s), for the call in flight and the one behind it
        assert ticks >= 10  # the event loop went on meanwhile
        assert after.id in structures(project)["ready"]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        project.stop_all()
        server.stop(kill=True)


def test_a_client_closes_after_its_event_loop_has_ended(project: Project) -> None:
    """`close()` after an aenqueue under asyncio.run (the loop that made the client's event-
    loop connection has ended): it raises nothing, and the server holds none of the
    client's connections after it, the event loop's nor redis-py's. Before, close() raised
    "Event loop is closed" and left both open; a `with` block ended the same way."""
    r = project.runtime.redis
    mine = {c["id"] for c in r.client_list()}

    def theirs() -> int:
        return sum(1 for c in r.client_list() if c["id"] not in mine and c.get("cmd") != "client|list")

    client = _client(project)
    client.enqueue("noop", {"sync": 1})  # a connection of redis-py's too
    assert asyncio.run(client.aenqueue("noop", {"a": 1})).id
    assert theirs() >= 2
    client.close()
    wait_for(lambda: theirs() == 0, timeout=5, what="the client's connections closed")

    mine = {c["id"] for c in r.client_list()}
    with _client(project) as c:
        c.enqueue("noop", {"b": 1})
        asyncio.run(c.aenqueue("noop", {"b": 2}))
    wait_for(lambda: theirs() == 0, timeout=5, what="the with block's connections closed")
