"""Waits against what may go wrong around them: a Redis Cluster master stopped while a
process's waits cannot subscribe (docs/partitions.md, "A shard down"), an event loop
closed under a pending ``await_job``, a worker whose Redis user may not publish the ends
(docs/security.md), and a Redis that stops answering during an event loop's wait
(docs/http.md, ``?wait=``). Each wait answers within its bound, never out its timeout."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from clusterkit import (  # noqa: F401  (the shards fixtures)
    close_project,
    cluster_url,
    shard_project,
    shard_set,
    shards_fixture,
)

from runner.client.inspecting import find
from runner.errors import RedisUnavailable
from runner.store import waiter
from runner.store.embedded import Server

from conftest import Endpoint, Project, make_project, wait_for


def _deaf_user(server_url: str) -> str:
    """A user with every command and key and no channel (Redis 7's default for a new
    user); its name."""
    user = f"nochan{uuid.uuid4().hex[:8]}"
    admin = redis.Redis.from_url(server_url)
    admin.acl_setuser(user, enabled=True, passwords=["+pw"], keys=["~*"], commands=["+@all"], reset_channels=True)
    admin.close()
    return user


@pytest.fixture
def nochan(tmp_path: Path, server: Server) -> Iterator[Project]:
    user = _deaf_user(server.url)
    project = make_project(tmp_path / "p", Endpoint(server.url.replace("redis://", f"redis://{user}:pw@")))  # type: ignore[arg-type]
    yield project
    project.close()


def _hold(c: object, ids: list[str], timeout_s: float) -> tuple[list[threading.Thread], dict[str, tuple[float, str]]]:
    """A thread per id waiting for it; each one's answer time and status once answered."""
    out: dict[str, tuple[float, str]] = {}

    def one(job_id: str) -> None:
        job = c.wait(job_id, timeout_s)  # type: ignore[attr-defined]
        out[job_id] = (time.monotonic(), job.status)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in ids]
    for t in threads:
        t.start()
    return threads, out


def test_deaf_waits_on_live_masters_answer_while_another_master_is_stopped(tmp_path: Path,
                                                                         shards: list[Server]) -> None:
    """Redis Cluster, a queue of 6 partitions on 3 masters, a Redis user without channels:
    the process's waits read their jobs' statuses on the subscriber's timer, one call per
    partition. One master stopped (SIGSTOP: its sockets stay open, a call to it waits out
    the socket timeout): the waits on the jobs of the two live masters still answer within
    about a second of their end, not at their timeout (the timer's one batch raised the
    stopped master's failure, and poked nobody)."""
    user = ""
    for s in shards:  # (ACL users are each node's own)
        admin = redis.Redis(port=s.port)
        user = user or f"nochan{uuid.uuid4().hex[:8]}"
        admin.acl_setuser(user, enabled=True, passwords=["+pw"], keys=["~*"], commands=["+@all"],
                          reset_channels=True)
        admin.close()
    p = shard_project(tmp_path / "p", shards, partitions=6, vt=10)
    p.server = Endpoint(cluster_url(shards).replace("redis+cluster://", f"redis+cluster://{user}:pw@"))  # type: ignore[assignment]
    try:
        c = p.client
        rt = c.runtime
        ids = [c.enqueue("noop", {"i": i}, delay=120).id for i in range(24)]
        where = {i: rt.redis.get_node_from_key(find(c, i)[0].ready).port for i in ids}
        stopped = shards[0]
        live = [i for i in ids if where[i] != stopped.port]
        assert live and len(live) < len(ids), where
        threads, out = _hold(c, ids, 20)
        wait_for(lambda: rt.waiter.deaf and len(rt.waiter._probes) == len(ids), timeout=10,
                 what="every wait placed with the deaf timer")
        assert stopped.proc is not None
        os.kill(stopped.proc.pid, signal.SIGSTOP)
        try:
            time.sleep(1.0)
            for i in live:
                c.cancel(i)
            cancelled = time.monotonic()
            wait_for(lambda: all(i in out for i in live), timeout=25, what="the live partitions' waits")
            late = max(out[i][0] for i in live) - cancelled
            assert {out[i][1] for i in live} == {"cancelled"}, out
            # (a tick's bound on the stopped master, READ_WAIT_S, and the back-off's second)
            assert late < waiter.DEAF_POLL_MAX_S + 4.0, f"the last live wait answered {late:.1f} s after its end"
        finally:
            os.kill(stopped.proc.pid, signal.SIGCONT)
        for t in threads:
            t.join(timeout=25)
    finally:
        close_project(p)


def test_a_wait_left_on_a_closed_event_loop_keeps_no_other_wait_from_its_end(nochan: Project,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    """An ``await_job`` left pending on an event loop that was then closed (run_until_complete
    and close, not asyncio.run) leaves a poke that raises "Event loop is closed". Its job
    ending in the same tick as others' must not keep the others' waits from their poke
    (each recorded as seen before the raise, and never poked again: answered at their
    timeout); the dead wait is dropped, with a warning."""
    c = nochan.client
    orphan = c.enqueue("noop", {}, delay=120).id
    ids = [c.enqueue("noop", {"i": i}, delay=120).id for i in range(4)]
    loop = asyncio.new_event_loop()
    task = loop.create_task(c.await_job(orphan, 60))
    loop.run_until_complete(asyncio.sleep(1.0))  # the wait placed, the process deaf
    assert not task.done() and c.runtime.waiter.deaf
    loop.close()  # (the task left pending)
    threads, out = _hold(c, ids, 20)
    wait_for(lambda: all(i in c.runtime.waiter._probes for i in ids), timeout=10, what="the waits placed")
    time.sleep(1.5)  # every probe at its longest pause: they come due in the same tick
    with caplog.at_level("WARNING", logger="runner"):
        for i in [orphan, *ids]:
            c.cancel(i)
        gone = time.monotonic()
        for t in threads:
            t.join(timeout=25)
    assert {i: s for i, (_, s) in out.items()} == dict.fromkeys(ids, "cancelled"), out
    late = max(t for t, _ in out.values()) - gone
    assert late < waiter.DEAF_POLL_MAX_S + 2.0, f"answered {late:.1f} s after their end"
    # (Its own probe may come due a tick later than the others' on a loaded host.)
    wait_for(lambda: orphan not in c.runtime.waiter._probes, timeout=waiter.DEAF_POLL_MAX_S + 2.0,
             what="the dead wait dropped")
    assert any("dropped" in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_a_closed_event_loop_poked_on_the_first_refusal_keeps_the_subscriber_alive(nochan: Project) -> None:
    """The subscriber pokes every wait when it first hears it may not subscribe: a poke
    onto a closed event loop then raised in its handler, the thread died, and every later
    wait of the process ran out its timeout (they leave their reads to the thread)."""
    c = nochan.client
    w = c.runtime.waiter
    closed = asyncio.new_event_loop()
    closed.close()
    orphan = c.enqueue("noop", {}, delay=120).id
    w.add(orphan, lambda: closed.call_soon_threadsafe(lambda: None))  # as await_job's poke
    w.start()
    wait_for(lambda: w.deaf, timeout=10, what="the refusal")
    job_id = c.enqueue("noop", {}, delay=120).id
    threads, out = _hold(c, [job_id], 20)
    time.sleep(1.5)
    assert w._thread is not None and w._thread.is_alive()
    c.cancel(job_id)
    gone = time.monotonic()
    threads[0].join(timeout=25)
    assert out[job_id][1] == "cancelled"
    assert out[job_id][0] - gone < waiter.DEAF_POLL_MAX_S + 2.0, f"answered {out[job_id][0] - gone:.1f} s late"


def test_a_wait_hears_an_end_its_worker_could_not_publish(tmp_path: Path, server: Server, project: Project) -> None:
    """The waiting process may subscribe, but the worker's Redis user has no channels: its
    end's PUBLISH is refused in silence (the scripts publish under pcall), and the wait,
    not deaf, heard nothing and ran out its timeout. A held wait's job is read on a slow
    timer all the same: it answers within about waiter.PUSHED_POLL_S of the end."""
    user = _deaf_user(server.url)
    project.spawn_worker("fast", "slow", env={"REDIS_URL": server.url.replace("redis://", f"redis://{user}:pw@")})
    c = project.client
    job_id = c.enqueue("sleepy", {"sleep": 0.2}).id
    assert c.runtime.waiter.ready(5) and not c.runtime.waiter.deaf
    job = c.wait(job_id, 20)
    assert job.status == "done", job.as_dict()
    late = time.time() - int(job.fields["finished_ms"]) / 1000
    assert late < waiter.PUSHED_POLL_S + 1.5, f"answered {late:.1f} s after the job ended"
    # (and a job ended while the wait was not yet held that long: read at PUSHED_POLL_S)
    slow = c.enqueue("slow", {"seconds": 4.0}).id
    job = c.wait(slow, 20)
    assert job.status == "done"
    assert time.time() - int(job.fields["finished_ms"]) / 1000 < waiter.PUSHED_POLL_S + 1.5


def test_an_event_loop_wait_answers_near_its_deadline_while_redis_is_stopped(tmp_path: Path) -> None:
    """Redis stopped (SIGSTOP: it takes connections and answers nothing, so a read waits
    out the 15 s socket timeout): each event loop wait (HTTP's ?wait=) answers within
    waiting.READ_GRACE_S of its deadline, RedisUnavailable (a 503 naming Redis), not 15 to
    40 s late with the status it read before (its reads queued on the loop's few threads)."""
    from runner.client.waiting import READ_GRACE_S

    s = Server(tmp_path / "own").start()
    p = make_project(tmp_path / "p", s)
    try:
        c = p.client
        ids = [c.enqueue("noop", {"i": i}, delay=120).id for i in range(16)]
        took: list[float] = []
        raised: list[BaseException] = []

        async def one(job_id: str) -> None:
            t0 = time.monotonic()
            try:
                await c.await_job(job_id, 4)
            except RedisUnavailable as exc:
                raised.append(exc)
            took.append(time.monotonic() - t0)

        async def every() -> None:
            waits = asyncio.gather(*(one(i) for i in ids))
            await asyncio.sleep(1.0)
            assert s.proc is not None
            os.kill(s.proc.pid, signal.SIGSTOP)
            await waits

        try:
            asyncio.run(every())
        finally:
            assert s.proc is not None
            os.kill(s.proc.pid, signal.SIGCONT)
        assert len(took) == len(ids)
        assert max(took) < 4 + READ_GRACE_S + 1.0, sorted(round(t, 1) for t in took)
        assert len(raised) == len(ids) and "Redis" in str(raised[0]), raised[:1]
    finally:
        with contextlib.suppress(Exception):
            p.close()
        s.stop()


def test_event_loop_waits_that_share_a_deadline_are_not_given_up_while_their_reads_queue(project: Project) -> None:
    """Many event loop waits with one deadline read their jobs once more at it, queued on
    the loop's threads (one here): a read that waits its turn while the others answer is
    not a Redis that stopped answering; every wait answers its job's status, none raises
    RedisUnavailable (a 2 s bound counted from the deadline gave the queue's tail up)."""
    from concurrent.futures import ThreadPoolExecutor

    c = project.client
    job_id = c.enqueue("noop", {}, delay=120).id
    got: list[str] = []
    raised: list[BaseException] = []

    async def one() -> None:
        try:
            got.append((await c.await_job(job_id, 1.0)).status)
        except RedisUnavailable as exc:
            raised.append(exc)

    async def every() -> None:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))
        await asyncio.gather(*(one() for _ in range(1500)))

    t0 = time.monotonic()
    asyncio.run(every())
    took = time.monotonic() - t0
    assert not raised, (len(raised), took, raised[:1])
    assert got == ["scheduled"] * 1500
