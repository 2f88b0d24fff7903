"""The Redis guard: a worker started against a Redis that could evict or lose jobs logs a
loud warning naming the exact setting to change; against a safe Redis it says nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from runner.store.embedded import Server
from runner.store.guard import redis_risks

from conftest import Project, make_project, wait_for


@pytest.fixture
def risky(tmp_path: Path) -> Iterator[Server]:
    s = Server(tmp_path / "risky", appendonly=False,
               extra=["--maxmemory-policy", "allkeys-lru", "--maxmemory", "64mb"]).start()
    yield s
    s.stop(kill=True)


def _worker_lines(p: Project, name: str) -> list[dict[str, object]]:
    w = p.spawn_worker("fast", log_name=name)
    log = p.root / name
    wait_for(lambda: b"serving" in log.read_bytes(), timeout=15, what="the worker to start")
    w.terminate()
    w.wait(timeout=15)
    out = []
    for line in log.read_bytes().splitlines():
        try:
            out.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            continue
    return out


def test_risky_redis_gets_a_loud_warning_naming_each_setting(tmp_path: Path, risky: Server) -> None:
    p = make_project(tmp_path / "p", risky)
    risks = redis_risks(p.runtime.redis)
    assert len(risks) == 2
    assert "maxmemory-policy is allkeys-lru" in risks[0] and "maxmemory-policy noeviction" in risks[0]
    assert "persistence is off" in risks[1] and "appendonly yes" in risks[1]
    lines = [r for r in _worker_lines(p, "risky.log") if "REDIS RISK" in str(r.get("msg"))]
    assert len(lines) == 2
    assert all(r["level"] == "warning" for r in lines)
    text = " ".join(str(r["msg"]) for r in lines)
    assert "set `maxmemory-policy noeviction`" in text and "set `appendonly yes`" in text


def test_safe_redis_gets_no_warning(project: Project) -> None:
    """The suite's server runs appendonly yes and noeviction."""
    assert redis_risks(project.runtime.redis) == []
    assert not [r for r in _worker_lines(project, "safe.log") if "REDIS RISK" in str(r.get("msg"))]


def test_snapshots_alone_count_as_persistence(tmp_path: Path) -> None:
    s = Server(tmp_path / "rdb", appendonly=False, extra=["--save", "60 1"]).start()
    try:
        p = make_project(tmp_path / "p", s)
        assert redis_risks(p.runtime.redis) == []
    finally:
        s.stop(kill=True)


def test_wait_replicas_without_replicas_is_a_risk(project: Project) -> None:
    """wait_replicas above the replicas connected now: every enqueue would be refused, so
    the guard (worker start, `runner check`) says so and what to change."""
    assert redis_risks(project.runtime.redis, wait_replicas=0) == []
    (risk,) = redis_risks(project.runtime.redis, wait_replicas=1)
    assert "wait_replicas is 1 but the master has 0 connected replica(s)" in risk and "NotReplicated" in risk


def test_every_partition_of_a_master_without_its_replicas_is_shown_held(project: Project) -> None:
    """One server with wait_replicas = 1 and no replica (as a Sentinel master just
    promoted): every partition of every queue is held, and GET /queues, /metrics and
    `runner stats` say so; with wait_replicas = 0 none is."""
    import falcon.testing

    from runner.observe.figures import read_queues
    from runner.web import create_app

    project.write_config(fast="partitions = 3")
    assert all(not q.held for q in read_queues(project.runtime))
    path = project.root / "runner.toml"
    path.write_text(path.read_text().replace("[redis]\n", "[redis]\nwait_replicas = 1\nwait_timeout = 0.2\n", 1))
    project._runtime = None
    rt = project.runtime
    assert rt.config.redis.wait_replicas == 1
    queues = {q["name"]: q for q in falcon.testing.TestClient(create_app(rt)).simulate_get("/queues").json["queues"]}
    assert queues["fast"]["held"] == [k.tag for k in rt.parts["fast"]] and len(queues["fast"]["held"]) == 3
    assert all(p["held"] for p in queues["fast"]["partitions"]) and queues["slow"]["held"] == ["slow"]
    text = falcon.testing.TestClient(create_app(rt)).simulate_get("/metrics").text
    assert sum(1 for line in text.splitlines() if line.startswith("runner_partition_held{") and line.endswith(" 1.0")) \
        == sum(len(parts) for parts in rt.parts.values())
