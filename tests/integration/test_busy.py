"""Redis busy running a long script (BUSY, past busy-reply-threshold) is an outage like
any other: a producer gets RedisUnavailable, the web answers 503, never a raw BUSY error
or a 500."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import redis

from runner.errors import RedisUnavailable

from conftest import Project, wait_for

SPIN = """
local t = redis.call('TIME')
local start = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now = start
while now - start < tonumber(ARGV[1]) do
  t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
return 1
"""


@contextmanager
def busy(project: Project, threshold_ms: int = 100) -> Iterator[None]:
    """Redis runs a read-only script for up to 20 s, answering BUSY after ``threshold_ms``
    (every other client waits until then); killed (SCRIPT KILL) on the way out."""
    r = project.runtime.redis
    was = r.config_get("busy-reply-threshold")["busy-reply-threshold"]
    r.config_set("busy-reply-threshold", threshold_ms)
    side = redis.Redis(**{k: v for k, v in r.connection_pool.connection_kwargs.items()
                          if k in ("host", "port", "db", "password", "username")})
    spinner = threading.Thread(target=lambda: _swallow(side.eval, SPIN, 0, 20_000), daemon=True)
    spinner.start()
    probe = redis.Redis(**{k: v for k, v in r.connection_pool.connection_kwargs.items()
                           if k in ("host", "port", "db", "password", "username")})
    wait_for(lambda: _is_busy(probe), timeout=10, what="Redis to answer BUSY")
    try:
        yield
    finally:
        wait_for(lambda: _kill(probe), timeout=10, what="the script to be killed")
        spinner.join(timeout=10)
        r.config_set("busy-reply-threshold", was)


def _swallow(fn: object, *args: object) -> None:
    with contextlib.suppress(redis.RedisError):  # the script killed: its caller's error
        fn(*args)  # type: ignore[operator]


def _is_busy(probe: redis.Redis) -> bool:
    try:
        probe.ping()
    except redis.exceptions.ResponseError as exc:
        return str(exc).startswith("BUSY")
    return False


def _kill(probe: redis.Redis) -> bool:
    try:
        probe.script_kill()
    except redis.exceptions.ResponseError as exc:
        return "No scripts in execution" in str(exc)
    return True


def test_a_busy_redis_is_an_outage_to_producers_and_the_web(project: Project) -> None:
    from test_web_support import gunicorn

    c = project.client
    first = c.enqueue("record", {"n": 0}).id  # loaded and connected before
    with gunicorn(project) as web:
        assert web.post("/jobs/record", json={"n": 1}).status_code == 202
        with busy(project):
            with pytest.raises(RedisUnavailable) as caught:
                c.enqueue("record", {"n": 2})
            assert "BUSY" in str(caught.value) or "busy" in str(caught.value)
            answer = web.post("/jobs/record", json={"n": 3})
            assert answer.status_code == 503, answer.text
            # The one helper's words for BUSY (store/connection.py unreachable), as the
            # client's: Redis refused before running, so nothing was written; not an
            # unreachable Redis whose enqueue "may have been written".
            said = answer.json()
            assert answer.headers["Retry-After"] == "1" and said["refusal"] == "BUSY", said
            assert "busy" in said["detail"] and "SCRIPT KILL" in said["detail"], said
            assert "nothing was written" in said["detail"] and "unreachable" not in said["detail"], said
            read = web.get(f"/jobs/{first}")
            assert read.status_code == 503 and read.headers["Retry-After"] == "1", read.text
            assert "busy" in read.json()["detail"] and "unreachable" not in read.json()["detail"], read.text
        assert web.post("/jobs/record", json={"n": 4}).status_code == 202


def test_a_worker_blocked_on_a_busy_redis_blames_no_handler(project: Project) -> None:
    """Redis blocked 3 s by a script (every call waits, then BUSY) while a job runs: the
    worker's lease renewal is late because Redis was, and its log does not blame a
    handler holding the GIL; the job still ends done."""
    c = project.client
    job = c.enqueue("slow", {"seconds": 6}).id
    worker = project.spawn_worker("slow", log_name="busy-worker.log")
    wait_for(lambda: c.get(job).status == "processing", timeout=20, what="the job to start")
    log_file = project.root / "busy-worker.log"
    with busy(project, threshold_ms=3000):
        wait_for(lambda: "renewer: Redis unavailable" in log_file.read_text(), timeout=15,
                 what="the renewal to meet the busy Redis")
    assert c.result(job, 30) is not None or c.get(job).status == "done"
    worker.terminate()
    worker.wait(timeout=20)
    log = log_file.read_text()
    assert "GIL" not in log, log[-2000:]



def test_a_busy_redis_is_an_outage_to_every_read_not_a_missing_group_or_a_500(project: Project) -> None:
    """While Redis answers BUSY, a group that exists and its then-job are not "not found"
    (GET /groups/{id} and its ?wait=, GET /jobs/{then}?wait=, client.result(then_id)), and
    the dashboard's figures (GET /queues, GET /throughput) and lists are not a 500: each
    is a 503 (RedisUnavailable in Python), as every other read; /metrics answers with
    runner_redis_up 0."""
    from test_web_support import gunicorn

    from runner.client import Request

    c = project.client
    group = c.group([Request("record", {"n": 1})], Request("record", {"n": 2}))
    then_id = group.then_id
    paths = [f"/groups/{group.id}", f"/groups/{group.id}?wait=1", f"/jobs/{then_id}?wait=1", "/queues",
             "/throughput", "/jobs?status=queued", "/jobs?status=deferred", "/jobs?status=processing"]
    with gunicorn(project) as web:
        assert web.get(f"/groups/{group.id}").status_code == 200
        with busy(project):
            answers = {path: web.get(path).status_code for path in paths}
            scrape = web.get("/metrics")
            with pytest.raises(RedisUnavailable):
                c.get_group(group.id)
            with pytest.raises(RedisUnavailable):
                c.result(then_id, timeout=1)
    assert answers == {path: 503 for path in paths}, answers
    # The scrape answers, saying Redis is not up (an alert's input), never a 500.
    assert scrape.status_code == 200 and "\nrunner_redis_up 0" in scrape.text, scrape.text[-2000:]
