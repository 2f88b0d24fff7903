"""Redis going away, as producers and the retry loop see it: a clear RedisUnavailable
(CLI exit 3, HTTP 503 with a problem body), nothing half-written, and a backoff with
jitter and a ceiling, logged once when the outage starts and once when it ends."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.client import Request
from runner.errors import RedisUnavailable
from runner.store.embedded import Server
from runner.store.outage import Outage

from conftest import PROTECTED_CONFIGS, REPO, Project, make_project, refuse_writes, take_writes_again


class _Recorder(threading.Event):
    """A stop event that records how long each backoff would have slept."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(float(timeout or 0))
        return False


def test_outage_backoff_is_exponential_jittered_and_capped(caplog: pytest.LogCaptureFixture) -> None:
    """Twenty failures: each wait lies in [ceiling/2, ceiling] of a doubling ceiling capped
    at 5 s; waits differ between two loops (jitter); one warning at the start, one at the
    end of the outage, nothing in between."""
    log = logging.getLogger("test.outage")
    runs = []
    with caplog.at_level(logging.WARNING, logger="test.outage"):
        for _ in range(2):
            o, ev = Outage("fetcher", log), _Recorder()
            for _ in range(20):
                o.failed(ConnectionError("down"), ev)
            o.ok()
            runs.append(ev.waits)
    for waits in runs:
        for i, w in enumerate(waits, start=1):
            ceiling = min(5.0, 0.05 * 2 ** min(i, 10))
            assert ceiling / 2 <= w <= ceiling, (i, w)
        assert max(waits) <= 5.0 and sum(waits) > 20  # capped, and not a busy loop
    assert runs[0] != runs[1], "no jitter: two loops slept the same"
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 4
    assert "Redis unavailable" in msgs[0] and "reachable again after 20 failed tries" in msgs[1]


@pytest.fixture
def down_project(tmp_path: Path) -> Iterator[Project]:
    """A project whose Redis has been stopped."""
    srv = Server(tmp_path / "redis", appendonly=True).start()
    p = make_project(tmp_path / "p", srv)
    p.client.enqueue("record", {"n": 1})  # connect once while it is up
    srv.stop()
    yield p
    p.stop_all()


def test_client_raises_redis_unavailable(down_project: Project) -> None:
    """Every client call that needs Redis raises RedisUnavailable (never a raw socket
    error); validation errors still come first and need no Redis."""
    c = down_project.client
    with pytest.raises(RedisUnavailable):
        c.enqueue("record", {"n": 2})
    with pytest.raises(RedisUnavailable):
        c.enqueue_many([Request("record", {"n": i}) for i in range(3)])
    with pytest.raises(RedisUnavailable):
        c.get("0123456789abcdef")
    with pytest.raises(RedisUnavailable):
        c.stats()
    with pytest.raises(RedisUnavailable):
        c.dead("fast")
    assert c.ping() is False
    from runner.errors import ValidationFailed

    with pytest.raises(ValidationFailed):
        c.enqueue("record", {"n": "not an int"})


def test_cli_enqueue_exits_3_when_redis_is_down(down_project: Project) -> None:
    p = down_project
    out = subprocess.run(
        [sys.executable, "-m", "runner.cli", "--config", str(p.root / "runner.toml"), "enqueue", "record", '{"n": 1}'],
        cwd=p.root, env={**p.env, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")},
        capture_output=True, timeout=60,
    )
    assert out.returncode == 3, out.stderr
    assert b"Redis unavailable" in out.stderr


def test_http_enqueue_is_503_when_redis_is_down(down_project: Project) -> None:
    """POST /jobs/{type} and its batch route answer 503 with a problem body; /healthz
    says why."""
    falcon_testing = pytest.importorskip("falcon.testing")
    from runner.web import create_app

    app = create_app(down_project.runtime)
    client = falcon_testing.TestClient(app)
    r = client.simulate_post("/jobs/record", json={"n": 1})
    assert r.status_code == 503, r.text
    assert "unreachable" in r.json.get("detail", r.text)
    batch = client.simulate_post("/jobs/record/batch", json=[{"n": 1}, {"n": 2}])
    assert batch.status_code == 503, batch.text
    assert batch.headers["Retry-After"] == "1"
    h = client.simulate_get("/healthz")
    assert h.status_code == 503


def test_redis_refusing_writes_it_cannot_persist_is_an_outage(tmp_path: Path) -> None:
    """MISCONF (Redis cannot persist, so it refuses every write) is an outage, not a bug:
    the client raises RedisUnavailable, HTTP answers 503 saying Redis refuses writes, and
    once Redis can persist again the same client enqueues without a restart."""
    falcon_testing = pytest.importorskip("falcon.testing")
    from runner.web import create_app

    srv = Server(tmp_path / "redis", extra=PROTECTED_CONFIGS).start()
    p = make_project(tmp_path / "p", srv)
    try:
        r, c = p.runtime.redis, p.client
        c.enqueue("record", {"n": 1})
        refuse_writes(r, tmp_path)
        with pytest.raises(RedisUnavailable, match="persist"):
            c.enqueue("record", {"n": 2})
        web = falcon_testing.TestClient(create_app(p.runtime))
        resp = web.simulate_post("/jobs/record", json={"n": 3})
        assert resp.status_code == 503, resp.text
        assert "refuses writes" in resp.json["detail"] and resp.headers["Retry-After"] == "1"
        take_writes_again(r, tmp_path)
        assert c.enqueue("record", {"n": 4}).status == "queued"
        assert r.llen(p.keys().ready) == 2
    finally:
        p.stop_all()
        srv.stop()


def test_http_words_a_refusal_as_the_client_does_and_says_nothing_was_written(tmp_path: Path) -> None:
    """Redis made a read-only replica (of a master that is not there): the client and
    HTTP say the same thing, in the one helper's words for READONLY (store/connection.py
    unreachable), and HTTP adds that nothing was written, as Redis refused before running
    the enqueue: a 503 with Retry-After and the kind named. Before, HTTP answered as for a
    server that is down ("unreachable ... may have been written")."""
    import socket

    falcon_testing = pytest.importorskip("falcon.testing")
    from runner.web import create_app

    srv = Server(tmp_path / "redis").start()
    p = make_project(tmp_path / "p", srv)
    try:
        r, c = p.runtime.redis, p.client
        job = c.enqueue("record", {"n": 1}).id
        web = falcon_testing.TestClient(create_app(p.runtime))
        with socket.socket() as s:  # a port nothing listens on: the master never answers
            s.bind(("127.0.0.1", 0))
            nowhere = s.getsockname()[1]
        r.replicaof("127.0.0.1", nowhere)
        try:
            with pytest.raises(RedisUnavailable) as caught:
                c.enqueue("record", {"n": 2})
            resp = web.simulate_post("/jobs/record", json={"n": 3})
            assert resp.status_code == 503 and resp.headers["Retry-After"] == "1", resp.text
            said = resp.json
            assert said["type"] == "urn:runner:problem:redis-unavailable" and said["refusal"] == "READONLY", said
            assert "read-only replica" in said["detail"] and "at the master" in said["detail"], said
            assert "nothing was written" in said["detail"], said
            assert "unreachable" not in said["detail"] and "may have been" not in said["detail"], said
            assert "read-only replica" in str(caught.value)
            assert web.simulate_get(f"/jobs/{job}").status_code == 200  # reads are served
        finally:
            r.replicaof("NO", "ONE")
        assert r.llen(p.keys().ready) == 1  # nothing was written
    finally:
        p.stop_all()
        srv.stop()


def test_an_action_that_landed_before_its_audit_entry_was_refused_says_it_was_done(tmp_path: Path) -> None:
    """Under maxmemory, run-now moves a scheduled job (a move Redis takes past the limit),
    then its audit entry, a second call, is refused. The answer, from the client and over
    HTTP, says the action was done and its entry not written, never "nothing was
    written" (it said so while the job had moved)."""
    falcon_testing = pytest.importorskip("falcon.testing")
    from runner.web import create_app

    srv = Server(tmp_path / "redis").start()
    p = make_project(tmp_path / "p", srv)
    try:
        r, c = p.runtime.redis, p.client
        first, second = (c.enqueue("record", {"n": i}, delay=3600).id for i in range(2))
        web = falcon_testing.TestClient(create_app(p.runtime))
        r.config_set("maxmemory", "1")
        try:
            with pytest.raises(RedisUnavailable) as caught:
                c.run_now(first, by="ops")
            resp = web.simulate_post(f"/jobs/{second}/run-now")
        finally:
            r.config_set("maxmemory", "0")
        assert "the action was done" in str(caught.value) and "nothing was written" not in str(caught.value)
        said = resp.json
        assert resp.status_code == 503 and said["refusal"] == "OOM", said
        assert "the action was done" in said["detail"] and "nothing was written" not in said["detail"], said
        assert c.get(first).status == "queued" and c.get(second).status == "queued"  # both moved
    finally:
        p.stop_all()
        srv.stop()
