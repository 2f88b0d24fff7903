"""The pushed wait at its edges: Redis away when a wait starts, Redis restarted empty
under a wait, a status too short for a notice, a read-only replica, and the error each
kind of Redis trouble gives."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from runner import config as config_mod
from runner.client import Client, Request
from runner.errors import JobNotFound, RedisUnavailable
from runner.runtime import Runtime
from runner.store.embedded import Server

from conftest import Project, make_project, wait_for


def _quick(what: str, f: Any, within_s: float = 1.0) -> BaseException:
    """The error ``f()`` raises, asserting it came within ``within_s``."""
    t0 = time.monotonic()
    with pytest.raises((RedisUnavailable, JobNotFound)) as caught:
        f()
    took = time.monotonic() - t0
    assert took < within_s, f"{what} raised after {took:.1f} s"
    return caught.value


def test_every_wait_raises_at_once_when_redis_is_down(tmp_path: Path) -> None:
    """Redis down when a wait starts: wait, settle, result, call and asettle raise
    RedisUnavailable at once, as every other call does, not after their timeout."""
    with Server(tmp_path / "redis", appendonly=False) as own:
        project = make_project(tmp_path / "p", own)
        try:
            client = project.client
            job = client.enqueue("noop", {})
            client.wait(job.id, timeout_s=0.05)  # the scripts loaded, the subscriber started
            own.stop(kill=True)
            for what, f in (("wait", lambda: client.wait(job.id, 5.0)),
                            ("settle", lambda: client.settle(job.id, 5.0)),
                            ("result", lambda: client.result(job.id, 5.0)),
                            ("asettle", lambda: asyncio.run(client.asettle(job.id, 5.0)))):
                exc = _quick(what, f)
                assert isinstance(exc, RedisUnavailable), (what, exc)
                assert "Redis is unreachable" in str(exc)
        finally:
            project.stop_all()
            project.runtime.close()


def test_a_fresh_process_waiting_with_redis_down_raises_at_once(tmp_path: Path) -> None:
    """A process whose subscriber never connected (a CLI call, a script) learns at once
    that Redis is away, instead of waiting its timeout for the subscription."""
    with Server(tmp_path / "redis", appendonly=False) as own:
        project = make_project(tmp_path / "p", own)
        try:
            job = project.client.enqueue("noop", {})
            own.stop(kill=True)
            rt = Runtime.create(project.config())
            try:
                exc = _quick("wait", lambda: Client(rt).wait(job.id, 5.0))
                assert isinstance(exc, RedisUnavailable)
            finally:
                rt.close()
        finally:
            project.stop_all()
            project.runtime.close()


def test_a_job_gone_in_an_empty_restart_ends_its_wait_at_once(tmp_path: Path) -> None:
    """Redis restarts without its data under open waits: once it answers again, each
    wait reads its job again and raises JobNotFound then, not at its timeout."""
    with Server(tmp_path / "redis", appendonly=False) as own:
        project = make_project(tmp_path / "p", own)
        try:
            client = project.client
            ids = {name: client.enqueue("noop", {"n": name}).id for name in ("settle", "wait", "asettle")}
            got: dict[str, tuple[str, float]] = {}

            def run(name: str) -> None:
                t0 = time.monotonic()
                try:
                    if name == "asettle":
                        asyncio.run(client.asettle(ids[name], 20))
                    elif name == "wait":
                        client.wait(ids[name], 20)
                    else:
                        client.settle(ids[name], 20)
                    got[name] = ("returned", time.monotonic() - t0)
                except Exception as exc:  # what each wait raised is the point
                    got[name] = (type(exc).__name__, time.monotonic() - t0)

            threads = [threading.Thread(target=run, args=(n,)) for n in ids]
            for t in threads:
                t.start()
            time.sleep(0.3)  # the waits are open (no event to poll for: they block inside)
            own.stop(kill=True)
            time.sleep(0.3)
            own.start()
            for t in threads:
                t.join(timeout=30)
            for name in ids:
                kind, took = got[name]
                assert kind == "JobNotFound" and took < 8, (name, got[name])
        finally:
            project.stop_all()
            project.runtime.close()


def test_a_wait_for_a_short_status_sees_it(project: Project) -> None:
    """Client.wait for a status that is not an end (nothing publishes it) reads the job
    every 20 ms, as the polled wait did, so it sees a status that lasts a few tens of
    milliseconds; a wait for an end is pushed and reads only a few times."""
    client = project.client
    queued = client.enqueue("noop", {})
    client.wait(queued.id, 0.05)  # the scripts loaded, the subscriber started

    def script_calls() -> int:
        stats = project.runtime.redis.info("commandstats")
        return sum(int(v["calls"]) for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))

    before = script_calls()
    assert client.wait(queued.id, 1.0, statuses=("processing",)).status == "queued"
    polled = script_calls() - before
    # A read is a lookup script or two: every 0.1 s is some 25 calls, every 20 ms near 100.
    assert polled >= 50, f"{polled} script calls in 1 s: not polled every 20 ms"
    project.spawn_worker("fast")
    client.result(client.enqueue("sleepy", {"sleep": 0}).id, 20)  # the worker is up
    caught = 0
    for _ in range(8):
        job = client.enqueue("sleepy", {"sleep": 0.02}, delay=0.2)
        caught += client.wait(job.id, 1.0, statuses=("processing",)).status == "processing"
        client.result(job.id, 10)
    assert caught >= 5, f"saw 'processing' {caught} times of 8"


def test_a_wait_on_a_read_only_replica_reads_and_polls(tmp_path: Path) -> None:
    """A client pointed at a read-only replica can wait: a job already in a wanted status
    answers without a write, and a wait whose mark the replica refuses polls instead of
    raising."""
    # (no 5 s wait for more replicas before the full sync)
    with Server(tmp_path / "master", appendonly=False, extra=["--repl-diskless-sync-delay", "0"]) as master, \
            Server(tmp_path / "replica", appendonly=False) as replica:
        project = make_project(tmp_path / "p", master)
        r = redis.Redis(port=replica.port)
        rt = None
        try:
            r.replicaof("127.0.0.1", master.port)
            job = project.client.enqueue("noop", {})
            wait_for(lambda: r.exists(project.keys("fast").job(job.id)), what="the replica to copy the job")
            cfg = config_mod.load(project.root / "runner.toml", env={**project.env, "REDIS_URL": replica.url})
            rt = Runtime.create(cfg)
            reader = Client(rt)
            assert reader.wait(job.id, 1.0, statuses=("queued",)).status == "queued"
            t0 = time.monotonic()
            assert reader.wait(job.id, 0.5).status == "queued"  # its end: polled, as the mark is refused
            assert time.monotonic() - t0 >= 0.5
            project.spawn_worker("fast")
            assert reader.wait(job.id, 20).status == "done"
        finally:
            if rt is not None:
                rt.close()
            r.close()
            project.stop_all()
            project.runtime.close()


def test_a_group_cut_by_maxmemory_says_what_to_do(tmp_path: Path) -> None:
    """A group Redis refuses part-way at maxmemory says what happened in the wording of
    every other refusal (maxmemory, with its next step), and what became of the group."""
    with Server(tmp_path / "redis", appendonly=False) as own:
        project = make_project(tmp_path / "p", own)
        try:
            client = project.client
            client.enqueue("noop", {})
            client.group([Request("noop", {})], Request("noop", {}))  # scripts loaded
            r = project.runtime.redis
            r.config_set("maxmemory", str(int(r.info("memory")["used_memory"]) + 400_000))
            with pytest.raises(RedisUnavailable) as failed:
                client.group([Request("noop", {"i": i, "pad": "y" * 300}) for i in range(3000)],
                             Request("noop", {"t": 1}))
            text = str(failed.value)
            assert "maxmemory" in text and "raise maxmemory, then retry" in text, text
            assert "not sealed" in text and "unreachable" not in text, text
            with pytest.raises(RedisUnavailable) as many:
                client.enqueue_many([Request("noop", {"i": i, "pad": "y" * 300}) for i in range(5000)])
            assert "raise maxmemory, then retry" in str(many.value) and "REDIS_URL" not in str(many.value)
        finally:
            project.stop_all()
            project.runtime.close()


def test_a_wait_over_http_answers_503_at_once_when_redis_is_down(tmp_path: Path) -> None:
    """GET /jobs/{id}?wait= and POST /jobs/{type}?wait= with Redis down answer 503 at
    once, as every other request does, not after the wait."""
    import falcon.testing

    from runner.web import create_app

    with Server(tmp_path / "redis", appendonly=False) as own:
        project = make_project(tmp_path / "p", own)
        try:
            web = falcon.testing.TestClient(create_app(project.runtime))
            job = project.client.enqueue("noop", {})
            assert web.simulate_get(f"/jobs/{job.id}?wait=0.1").status_code == 200
            own.stop(kill=True)
            for what, call in (("GET", lambda: web.simulate_get(f"/jobs/{job.id}?wait=5")),
                               ("POST", lambda: web.simulate_post("/jobs/noop?wait=5", json={}))):
                t0 = time.monotonic()
                r = call()
                took = time.monotonic() - t0
                assert r.status_code == 503 and took < 1.5, (what, r.status_code, took, r.text)
        finally:
            project.stop_all()
            project.runtime.close()
