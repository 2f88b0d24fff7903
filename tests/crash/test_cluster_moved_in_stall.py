"""A slot that moves while another master is stalled (Redis Cluster, 3 masters with a
replica each, all local): master A stops answering (SIGSTOP), and master B's replica takes
over (CLUSTER FAILOVER TAKEOVER). A producer's enqueues to B's partitions learn the new
layout from the masters that answer and go to B's heir within the enqueue's bound; none
raises a raw Redis error (docs/partitions.md, "A shard down")."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from clusterkit import cluster_url, local_cluster, replicas_connected

from runner.client import Client
from runner.errors import NotReplicated, RedisUnavailable
from runner.store import routing
from runner.store.embedded import Server

from conftest import Endpoint, Project, make_project, wait_for

PARTITIONS = 6


def _project(root: Path, servers: list[Server], wait_replicas: int) -> Project:
    p = make_project(root, Endpoint(cluster_url(servers)))  # type: ignore[arg-type]
    p.write_config(fast=f"partitions = {PARTITIONS}")
    path = p.root / "runner.toml"
    path.write_text(path.read_text().replace(
        "[redis]\n", f"[redis]\nwait_replicas = {wait_replicas}\nwait_timeout = 1\n", 1))
    p._runtime = None
    return p


def _keys(c: Client, port: int, tag: str) -> Iterator[str]:
    """Idempotency keys of ``record`` jobs whose partition's master is the server on ``port``
    (in the layout the client knows now)."""
    rt = c.runtime
    ports = [rt.redis.get_node_from_key(k.ready).port for k in rt.parts["fast"][:PARTITIONS]]
    assert port in ports, (port, ports)
    n = 0
    while True:
        n += 1
        key = f"{tag}{n}"
        if ports[routing.partition_of(f"i:record:{key}", PARTITIONS)] == port:
            yield key


def _role(port: int) -> str:
    r = redis.Redis(port=port, decode_responses=True, socket_timeout=2)
    try:
        return str(r.info("replication")["role"])
    finally:
        r.close()


def _replica_of(servers: list[Server], master: int) -> Server:
    for s in servers:
        r = redis.Redis(port=s.port, decode_responses=True, socket_timeout=2)
        try:
            info = r.info("replication")
            if info["role"] == "slave" and int(info["master_port"]) == master:
                return s
        finally:
            r.close()
    raise AssertionError(f"no replica of {master}")


@pytest.mark.parametrize("wait_replicas", [0, 1])
def test_enqueues_follow_a_slot_moved_while_another_master_is_stalled(tmp_path: Path, wait_replicas: int) -> None:
    """A (the URL's first seed) is stopped; 0.5 s later B's replica takes over B's slots.
    Keyed enqueues to B's partitions (``enqueue`` and ``aenqueue``, the HTTP route's, in
    turn), one at a time for 2.5 s: each is written or refused
    as an outage (RedisUnavailable, a 503), never a raw ResponseError, and from 1.5 s after
    the takeover every one is written (the layout learnt from the old B, which answered
    MOVED, not asked of the stalled seed first). Before, with ``wait_replicas = 1`` the
    old B's answer to WAIT ("WAIT cannot be used with replica instances") was raised
    before its MOVED was seen, so the layout was never learnt again and every enqueue to
    B failed so for good; with ``wait_replicas = 0`` they were refused "kept moving"
    until A answered again."""
    with local_cluster(tmp_path / "c", masters=3, replicas=1, node_timeout_ms=15000,
                       extra=["--cluster-require-full-coverage", "no"]) as servers:
        wait_for(lambda: replicas_connected(servers[:3]), timeout=30, interval=0.1, what="every replica")
        p = _project(tmp_path / "p", servers[:3], wait_replicas)
        stalled, moved = servers[0], servers[1]
        try:
            c = p.client
            keys = _keys(c, moved.port, "b")
            c.enqueue("record", {"n": 0}, idempotency_key=next(keys))  # (a kept connection to B)
            heir = _replica_of(servers, moved.port)
            assert stalled.proc is not None
            os.kill(stalled.proc.pid, signal.SIGSTOP)
            try:
                time.sleep(0.5)
                h = redis.Redis(port=heir.port)
                h.execute_command("CLUSTER", "FAILOVER", "TAKEOVER")
                h.close()
                wait_for(lambda: _role(heir.port) == "master", timeout=10, interval=0.05, what="the takeover")
                took_over = time.monotonic()
                calls: list[tuple[float, float, str]] = []
                while time.monotonic() - took_over < 2.5:  # (1 s of calls past the 1.5 s below)
                    t = time.monotonic()
                    try:
                        if len(calls) % 2:  # (the HTTP route's call)
                            asyncio.run(c.aenqueue("record", {"n": 1}, idempotency_key=next(keys)))
                        else:
                            c.enqueue("record", {"n": 1}, idempotency_key=next(keys))
                        what = "ok"
                    except (NotReplicated, RedisUnavailable) as exc:
                        what = f"{type(exc).__name__}: {str(exc)[:80]}"
                    except redis.RedisError as exc:  # (what the producer sees is the point)
                        what = f"raw {type(exc).__name__}: {str(exc)[:80]}"
                    calls.append((t - took_over, time.monotonic() - t, what))
                    time.sleep(0.02)
            finally:
                os.kill(stalled.proc.pid, signal.SIGCONT)
            print(f"{len(calls)} enqueues to B after the takeover: "
                  f"{sum(1 for x in calls if x[2] == 'ok')} written; the others: "
                  f"{sorted({x[2] for x in calls if x[2] != 'ok'})}")
            raw = [x for x in calls if x[2].startswith("raw")]
            assert not raw, f"{len(raw)} raw errors, first {raw[0]}"
            late = [x for x in calls if x[0] > 1.5]
            assert late, calls
            refused = [x for x in late if x[2] != "ok"]
            assert not refused, f"{len(refused)} of {len(late)} refused from 1.5 s after the takeover: {refused[:3]}"
            assert max(x[1] for x in calls) < 2.0 + wait_replicas + 0.5
        finally:
            p.stop_all()
            if p._runtime is not None:
                p._runtime.close()
