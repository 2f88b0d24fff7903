"""An ACL user who may not use pub/sub channels: Redis 7 gives a new user none
(`acl-pubsub-default resetchannels`), so a user made as docs/security.md lists (commands,
keys) has none unless granted. The jobs must still run, end, and be cancelled; a wait
that cannot subscribe reads its job on a timer instead (with one warning saying how to
grant the channels), not out its whole timeout with a traceback every 0.2 s."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

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
    assert took < 5, f"the wait took {took:.1f} s: it ran out its timeout instead of reading the job"
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
