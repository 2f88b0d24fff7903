"""An ACL user who may not use pub/sub channels: Redis 7 gives a new user none
(`acl-pubsub-default resetchannels`), so a user made as docs/security.md lists (commands,
keys) has none unless granted. The jobs must still run, end, and be cancelled; a wait
that cannot subscribe reads its job on a timer instead (with one warning saying how to
grant the channels), not out its whole timeout with a traceback every 0.2 s."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from runner.store import waiter
from runner.store.embedded import Server

from conftest import Endpoint, Project, make_project, wait_for


@pytest.fixture
def nochan(tmp_path: Path, server: Server) -> Iterator[Project]:
    user = f"nochan{uuid.uuid4().hex[:8]}"
    admin = redis.Redis.from_url(server.url)
    admin.acl_setuser(user, enabled=True, passwords=["+pw"], keys=["~*"], commands=["+@all"], reset_channels=True)
    admin.close()
    project = make_project(tmp_path / "p", Endpoint(server.url.replace("redis://", f"redis://{user}:pw@")))  # type: ignore[arg-type]
    yield project
    project.close()


def test_a_user_without_channels_waits_for_its_jobs_on_a_timer(nochan: Project,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    c = nochan.client
    w = nochan.spawn_worker("fast")
    job_id = c.enqueue("noop", {"n": 1}).id
    with caplog.at_level(logging.WARNING, logger="runner"):
        t0 = time.monotonic()
        job = c.wait(job_id, 20)
        took = time.monotonic() - t0
    assert job.status == "done", job.as_dict()
    # (the worker's start, seconds on a loaded host, and an end seen up to a second late)
    assert took < 10, f"the wait took {took:.1f} s: it ran out its timeout instead of reading the job"
    # A second wait of the same process, on an end that comes later, is as quick.
    slow = c.enqueue("sleepy", {"sleep": 0.3}).id
    t0 = time.monotonic()
    assert c.wait(slow, 20).status == "done"
    assert time.monotonic() - t0 < 3
    # And an asyncio wait.
    later = c.enqueue("sleepy", {"sleep": 0.3}).id
    t0 = time.monotonic()
    assert asyncio.run(c.asettle(later, 20)).status == "done"
    assert time.monotonic() - t0 < 3
    told = [r.getMessage() for r in caplog.records if "channel" in r.getMessage()]
    assert len(told) == 1 and "ACL SETUSER" in told[0], told
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]
    # The worker ran it without an error of its own: its scripts' notices are no part of it.
    assert w.poll() is None
    log = (nochan.root / "worker-0.log").read_text()
    assert "Traceback" not in log and "NOPERM" not in log and "no permissions" not in log, log[-3000:]


def test_a_user_without_channels_cancels_a_job_claimed_ahead(nochan: Project) -> None:
    """A cancel publishes to the queue's cancels channel (a job a worker claimed ahead):
    refused, the cancel must still land, and the worker learn of it at its next lease
    renewal (vt 2 s: within a second), before it starts the job."""
    nochan.write_config(concurrency=1, prefetch=4)
    c = nochan.client
    nochan.spawn_worker("fast")
    busy = c.enqueue("record", {"n": -1, "sleep": 1.5}).id
    ahead = [c.enqueue("noop", {"n": i}).id for i in range(3)]
    wait_for(lambda: c.get(busy).as_dict()["status"] == "processing", timeout=20, what="the busy job")
    c.cancel(ahead[0])
    assert c.wait(ahead[0], 20).status == "cancelled"
    assert all(c.wait(i, 20).status == "done" for i in ahead[1:])
    ended = c.wait(busy, 20)
    assert ended.status == "done", (ended.as_dict()["history"], ended.as_dict().get("last_error"))


def test_a_user_without_channels_pauses_and_resumes(nochan: Project, caplog: pytest.LogCaptureFixture) -> None:
    """A pause tells workers on the cancels channel: refused, it pauses all the same, and
    says what the user lacks."""
    c = nochan.client
    with caplog.at_level(logging.WARNING, logger="runner"):
        c.pause("fast")
    assert c.paused()["fast"]["paused"] is True
    assert any("ACL SETUSER" in r.getMessage() for r in caplog.records)
    job_id = c.enqueue("noop", {}).id
    nochan.spawn_worker("fast")
    time.sleep(1.0)
    assert c.get(job_id).as_dict()["status"] == "queued"
    c.resume("fast")
    assert c.wait(job_id, 20).status == "done"


def _calls(r: redis.Redis) -> Counter[str]:
    """Calls per command since the last CONFIG RESETSTAT (INFO counts those a script runs),
    the reads of the counts themselves left out."""
    got = Counter({k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in r.info("commandstats").items()})
    for own in ("info", "config|resetstat"):
        got.pop(own, None)
    return got


def test_waits_without_channels_read_their_jobs_statuses_together_and_ever_less_often(tmp_path: Path) -> None:
    """A process's waits that cannot subscribe read only their jobs' statuses, all of them
    in one round trip a tick, and ever less often while nothing changes (0.25 s, then up to
    waiter.DEAF_POLL_MAX_S); a job is read whole only once its status says it ended. Before,
    each wait read its job whole (a lookup per queue) every 0.25 s: about 80 commands a
    second a wait (1,282 a second for these 16), 15,400 a second for 200 held waits of one
    process. Counted on a server of its own (INFO commandstats), 16 waits held: 8 on
    threads, 8 on an event loop (as a web process holds GET ?wait=)."""
    s = Server(tmp_path / "own").start()
    admin = redis.Redis.from_url(s.url)
    admin.acl_setuser("deaf", enabled=True, passwords=["+pw"], keys=["~*"], commands=["+@all"], reset_channels=True)
    project = make_project(tmp_path / "p", Endpoint(s.url.replace("redis://", "redis://deaf:pw@")))  # type: ignore[arg-type]
    c = project.client
    ids = [c.enqueue("noop", {"n": i}).id for i in range(16)]  # no worker: they stay queued
    ended: dict[str, str] = {}

    def hold(job_id: str) -> None:
        ended[job_id] = c.wait(job_id, 30).status

    async def hold_all(some: list[str]) -> None:
        for job in await asyncio.gather(*(c.await_job(i, 30) for i in some)):
            ended[job.id] = job.status

    threads = [threading.Thread(target=hold, args=(i,)) for i in ids[:8]]
    threads.append(threading.Thread(target=lambda: asyncio.run(hold_all(ids[8:]))))
    try:
        for t in threads:
            t.start()
        time.sleep(2.5)  # every wait deaf and backed off to its longest pause by now
        assert c.runtime.waiter.deaf
        admin.config_resetstat()
        t0 = time.monotonic()
        time.sleep(3.0)
        got = _calls(admin)
        took = time.monotonic() - t0
        # Two commands a wait (its status: HGET, EXISTS) about once a second, and one
        # script call a tick for all of them (at most four ticks a second).
        assert sum(got.values()) / took <= 3 * len(ids), got
        assert got["evalsha"] / took <= 4.5, got
        assert got["hlen"] == 0, got  # (lookup.lua's, a whole read: none while nothing changed)
        # An end is still seen: each wait answers within its bound once its job ends.
        gone = time.monotonic()
        for i in ids:
            c.cancel(i)
        for t in threads:
            t.join(timeout=10)
        assert ended == {i: "cancelled" for i in ids}, ended
        assert time.monotonic() - gone < waiter.DEAF_POLL_MAX_S + 2.0
    finally:
        for i in ids:  # (a failed test's waits end too)
            with contextlib.suppress(Exception):
                c.cancel(i)
        for t in threads:
            t.join(timeout=10)
        project.close()
        admin.close()
        s.stop()


def test_a_wait_without_channels_answers_within_its_bound_after_a_long_job_ends(nochan: Project) -> None:
    """The longest pause between two reads of a wait that cannot subscribe is
    waiter.DEAF_POLL_MAX_S: a job that ends after the wait backed off all the way is
    answered within it (and a read's round trip) of its end, on a thread and on an event
    loop alike (docs/security.md)."""
    c = nochan.client
    nochan.spawn_worker("slow")
    jobs = [c.enqueue("slow", {"seconds": 3.0}).id for _ in range(2)]
    answered: dict[str, float] = {}

    def hold() -> None:
        assert c.wait(jobs[0], 30).status == "done"
        answered[jobs[0]] = time.time()

    async def ahold() -> None:
        assert (await c.await_job(jobs[1], 30)).status == "done"
        answered[jobs[1]] = time.time()

    threads = [threading.Thread(target=hold), threading.Thread(target=lambda: asyncio.run(ahold()))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=40)
    assert c.runtime.waiter.deaf
    for job_id in jobs:
        finished = int(c.get(job_id).fields["finished_ms"]) / 1000  # the server's clock, on this host
        late = answered[job_id] - finished
        assert late < waiter.DEAF_POLL_MAX_S + 0.75, f"answered {late:.2f} s after the job ended"


def test_a_deaf_read_backs_off_while_nothing_changes_and_pokes_once_on_an_end(project: Project) -> None:
    """The subscriber's timer (one tick at a time, each forced due): a placed job whose
    status stays the same is read at pauses doubling up to DEAF_POLL_MAX_S, without a
    poke; once it ended, its waits are poked once, and it is read every DEAF_POLL_S again
    (something changed); an end read again pokes nobody."""
    rt, c = project.runtime, project.client
    w = waiter.Waiter(rt.redis, [], scripts=lambda: rt.scripts)
    pokes: list[int] = []
    job_id = c.enqueue("noop", {}).id

    def poke() -> None:
        pokes.append(1)

    w.add(job_id, poke)
    w.place(job_id, project.keys())
    probe = w._probes[job_id]

    def tick() -> None:
        probe.due = 0.0
        w._tick(rt.scripts)

    pauses = []
    for _ in range(4):
        tick()
        pauses.append(probe.pause)
    assert pauses == [0.5, 1.0, 1.0, 1.0] and waiter.DEAF_POLL_MAX_S == 1.0 and not pokes
    c.cancel(job_id)
    tick()
    assert pokes == [1] and probe.pause == waiter.DEAF_POLL_S
    tick()
    assert pokes == [1] and probe.pause == 2 * waiter.DEAF_POLL_S
    w.discard(job_id, poke)  # its last wait over: no longer read
    assert job_id not in w._probes
    w.place(job_id, project.keys())  # (a late place of a wait that is over places nothing)
    assert job_id not in w._probes
