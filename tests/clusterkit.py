"""A real local Redis Cluster (Debian's redis-server, created with ``redis-cli --cluster
create``), with replicas when a test needs them: the integration tests' 3 masters and the
failover tests' 3 masters with a replica each; and a project on one (the fixtures
``cluster`` and ``cproject``, imported by each test module that uses them)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis

from runner.store.embedded import Server, debian_binary

from conftest import Endpoint, Project, make_project, wait_for


def tools() -> tuple[str, str]:
    binary, cli = debian_binary(), shutil.which("redis-cli")
    if binary is None or cli is None:
        if os.environ.get("CI"):
            raise RuntimeError("CI must install redis-server and redis-tools (redis-cli)")
        pytest.skip("Debian's redis-server and redis-cli are not installed here "
                    "(apt-get install redis-server redis-tools runs these)")
    return binary, cli


def cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


def _every(servers: list[Server], holds: Callable[[redis.Redis], bool]) -> bool:
    """Whether ``holds`` is true of every running server (an error: not yet)."""
    for s in servers:
        if s.proc is None or s.proc.poll() is not None:
            continue
        c = redis.Redis(port=s.port, decode_responses=True, socket_timeout=2)
        try:
            if not holds(c):
                return False
        except redis.RedisError:
            return False
        finally:
            c.close()
    return True


def cluster_ok(servers: list[Server]) -> bool:
    return _every(servers, lambda c: c.cluster("info").get("cluster_state") == "ok")


def replicas_connected(masters: list[Server]) -> bool:
    """Every master has a replica connected."""
    return _every(masters, lambda c: int(c.info("replication").get("connected_slaves", 0)) >= 1)


@contextmanager
def local_cluster(root: Path, masters: int = 3, replicas: int = 0, node_timeout_ms: int = 2000,
                  extra: Sequence[str] = ()) -> Iterator[list[Server]]:
    """``masters`` masters with ``replicas`` replicas each, every slot covered; the servers
    in the order ``redis-cli`` was given them (masters first). ``extra``: more arguments
    for every node (``--cluster-require-full-coverage no`` keeps the other shards serving
    while one is down)."""
    binary, cli = tools()
    servers: list[Server] = []
    try:
        for i in range(masters * (1 + replicas)):
            d = root / f"node{i}"
            servers.append(Server(d, port=cluster_port(), binary=binary, extra=[
                "--cluster-enabled", "yes", "--cluster-config-file", str(d / "nodes.conf"),
                "--cluster-node-timeout", str(node_timeout_ms),
                "--repl-diskless-sync-delay", "0", *extra,
            ]).start())
        subprocess.run(
            [cli, "--cluster", "create", *[f"127.0.0.1:{s.port}" for s in servers],
             "--cluster-replicas", str(replicas), "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )
        wait_for(lambda: cluster_ok(servers), timeout=30, interval=0.1, what="cluster_state:ok")
        yield servers
    finally:
        for s in servers:
            s.stop(kill=True)


# --- a project on a local cluster (import the fixtures into the test module) ----------

CLUSTER_MASTERS = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Server]]:
    """A local Redis Cluster of 3 masters for the module's tests."""
    with local_cluster(tmp_path_factory.mktemp("cluster"), masters=CLUSTER_MASTERS) as servers:
        yield servers


def cluster_url(servers: list[Server]) -> str:
    return "redis+cluster://" + ",".join(f"127.0.0.1:{s.port}" for s in servers)


def cluster_project(root: Path, servers: list[Server]) -> Project:
    """A project whose Redis is the cluster of ``servers`` (each one a seed)."""
    return make_project(root, Endpoint(cluster_url(servers)))  # type: ignore[arg-type]


def close_project(p: Project) -> None:
    p.stop_all()
    if p._runtime is not None:
        p._runtime.close()


@pytest.fixture
def cproject(tmp_path: Path, cluster: list[Server]) -> Iterator[Project]:
    """A project on the module's cluster, seeded with two of its masters."""
    p = cluster_project(tmp_path / "p", cluster[:2])
    yield p
    close_project(p)
