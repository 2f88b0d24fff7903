"""Producers on Redis Cluster while one master is in trouble (all local, real servers):
its WAIT falls short of replicas, it stalls (SIGSTOP), or it is demoted while a WAIT
blocks. A caller whose job goes to a healthy master is answered as if nothing happened
(docs/partitions.md, "Durability": a slow master delays only its own calls), and a
demoted master is an outage (RedisUnavailable, an HTTP 503), at once."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from clusterkit import cluster_url, local_cluster, replicas_connected

from runner.client import Client, Enqueued, Request
from runner.errors import NotReplicated, RedisUnavailable
from runner.store import routing
from runner.store.embedded import Server

from conftest import Endpoint, Project, make_project, wait_for

PARTITIONS = 6


def _project(root: Path, servers: list[Server], wait_replicas: int, wait_timeout_s: float) -> Project:
    p = make_project(root, Endpoint(cluster_url(servers)))  # type: ignore[arg-type]
    p.write_config(fast=f"partitions = {PARTITIONS}")
    if wait_replicas:
        path = p.root / "runner.toml"
        path.write_text(path.read_text().replace(
            "[redis]\n", f"[redis]\nwait_replicas = {wait_replicas}\nwait_timeout = {wait_timeout_s}\n", 1))
    p._runtime = None
    return p


def _close(p: Project) -> None:
    p.stop_all()
    if p._runtime is not None:
        p._runtime.close()


def _keys(c: Client, port: int, on: bool, tag: str) -> Iterator[str]:
    """Idempotency keys of ``record`` jobs whose partition's master is (``on``) or is not
    the server on ``port``."""
    rt = c.runtime
    ports = [rt.redis.get_node_from_key(k.ready).port for k in rt.parts["fast"][:PARTITIONS]]
    assert (port in ports) if on else any(p != port for p in ports), (port, ports)
    n = 0
    while True:
        n += 1
        key = f"{tag}{n}"
        if (ports[routing.partition_of(f"i:record:{key}", PARTITIONS)] == port) == on:
            yield key


def _master_of_partition_0(c: Client, fresh: bool = False) -> int:
    if fresh:  # the layout read again (the client's is learnt after a failed call)
        c.runtime.redis.nodes_manager.initialize()
    return int(c.runtime.redis.get_node_from_key(c.runtime.parts["fast"][0].ready).port)


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


def test_a_master_demoted_while_an_enqueue_waits_for_replicas_is_an_outage(tmp_path: Path) -> None:
    """A master taken over by its replica (CLUSTER FAILOVER TAKEOVER) while an enqueue's
    WAIT blocks answers it UNBLOCKED: ``enqueue``, ``enqueue_many`` and ``aenqueue`` (the
    HTTP route's) raise RedisUnavailable (retry; a 503) at once, not a raw ResponseError
    (a 500) nor after a read timeout."""
    with local_cluster(tmp_path / "c", masters=3, replicas=1, node_timeout_ms=2000) as servers:
        wait_for(lambda: replicas_connected(servers[:3]), timeout=30, interval=0.1, what="every replica")
        # Two replicas wanted, one there: every WAIT blocks for its 20 s.
        p = _project(tmp_path / "p", servers, wait_replicas=2, wait_timeout_s=20)
        try:
            c = p.client
            for call in ("enqueue", "enqueue_many", "aenqueue"):
                key = next(_keys(c, _master_of_partition_0(c), True, call))
                got: list[BaseException] = []

                def send(call: str = call, key: str = key, got: list[BaseException] = got) -> None:
                    try:
                        if call == "enqueue":
                            c.enqueue("record", {"n": 1}, idempotency_key=key)
                        elif call == "enqueue_many":
                            c.enqueue_many([Request("record", {"n": 1}, idempotency_key=key)])
                        else:
                            asyncio.run(c.aenqueue("record", {"n": 1}, idempotency_key=key))
                    except BaseException as exc:  # (what the producer sees is the point)
                        got.append(exc)

                master = _master_of_partition_0(c)
                t = threading.Thread(target=send)
                t.start()
                m = redis.Redis(port=master, decode_responses=True)
                wait_for(lambda m=m: any(cl.get("cmd") == "wait" for cl in m.client_list()), timeout=15,
                         what="the WAIT to block")
                m.close()
                heir = redis.Redis(port=_replica_of(servers, master).port)
                heir.execute_command("CLUSTER", "FAILOVER", "TAKEOVER")
                heir.close()
                t0 = time.monotonic()
                t.join(30)
                took = time.monotonic() - t0
                assert len(got) == 1, (call, got)
                assert isinstance(got[0], RedisUnavailable), (call, repr(got[0]))
                assert took < 5.0, f"{call}: answered {took:.1f} s after the takeover"
                wait_for(lambda master=master: _master_of_partition_0(c, fresh=True) != master
                         and replicas_connected([s for s in servers if s.port == _master_of_partition_0(c)]),
                         timeout=30, interval=0.1, what="the heir to serve with a replica")
        finally:
            _close(p)


@pytest.fixture(scope="module")
def short_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[Server], int]]:
    """3 masters with a replica each, one master's replica stopped (as just after a
    failover: the promoted master has no replica yet): the servers and that master's port."""
    root = tmp_path_factory.mktemp("short")
    with local_cluster(root, masters=3, replicas=1, node_timeout_ms=5000,
                       extra=["--cluster-require-full-coverage", "no"]) as servers:
        wait_for(lambda: replicas_connected(servers[:3]), timeout=30, interval=0.1, what="every replica")
        lone = servers[0].port
        _replica_of(servers, lone).stop(kill=True)
        yield servers, lone


def test_a_wait_short_on_one_master_leaves_the_jobs_of_another_confirmed(
        tmp_path: Path, short_cluster: tuple[list[Server], int]) -> None:
    """One round trip holding a job for a master short of its replica and one for a master
    whose replica holds it: only the first is answered NotReplicated; the second is
    answered with its job (it was confirmed by its own master's WAIT)."""
    servers, lone = short_cluster
    p = _project(tmp_path / "p", servers, wait_replicas=1, wait_timeout_s=0.3)
    try:
        c = p.client
        short_key = next(_keys(c, lone, True, "s"))
        fine_key = next(_keys(c, lone, False, "f"))
        answers = c._send_prepared([c.prepare(Request("record", {"n": 1}, idempotency_key=fine_key)),
                                    c.prepare(Request("record", {"n": 2}, idempotency_key=short_key))])
        assert isinstance(answers[0], Enqueued), answers[0]
        assert isinstance(answers[1], NotReplicated), answers[1]
        assert (answers[1].acked, answers[1].wanted) == (0, 1)
        assert c.get(answers[0].id).status == "queued"
    finally:
        _close(p)
