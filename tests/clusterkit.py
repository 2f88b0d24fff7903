"""A real local Redis Cluster (Debian's redis-server, created with ``redis-cli --cluster
create``), with replicas when a test needs them: the integration tests' 3 masters and the
failover tests' 3 masters with a replica each; and a project on one (the fixtures
``cluster`` and ``cproject``, imported by each test module that uses them)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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


def _node_lines_clean(c: redis.Redis) -> bool:
    """Every node this one knows is connected, past its handshake, and flagged neither
    failing nor suspected (cluster_state alone stays ok with a shard down when full
    coverage is off)."""
    lines = [line.split() for line in str(c.execute_command("CLUSTER", "NODES")).splitlines() if line.strip()]
    return all(not {"fail", "fail?", "handshake", "noaddr"} & set(f[2].split(",")) and f[7] == "connected"
               for f in lines)


class ShardSet:
    """A module's local Cluster of 3 masters for its tests that stop or kill one of them
    (full coverage off: the live shards keep serving their slots while one is stalled or
    down), made healthy again before each test. Starting a cluster per test was about
    2 s a test (3 servers, ``redis-cli --cluster create``, its gossip settling); each test
    has a prefix of its own, so none reads another's keys."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.made = 0
        self.servers: list[Server] = []
        self._stack = contextlib.ExitStack()

    def _fresh(self) -> list[Server]:
        self.close()
        self.made += 1
        self._stack = contextlib.ExitStack()
        self.servers = self._stack.enter_context(local_cluster(
            self.root / f"set{self.made}", masters=3, node_timeout_ms=1000,
            extra=["--cluster-require-full-coverage", "no"]))
        return list(self.servers)

    def healthy(self) -> list[Server]:
        """The set with every master up and answering (one a test killed is started again on
        its port and data, one it stalled is continued) and every node's view of the others
        clean; made afresh when that does not come about."""
        if not self.servers:
            return self._fresh()
        try:
            for s in self.servers:
                if s.proc is None or s.proc.poll() is not None:
                    s.stop()
                    s.start()  # same port, same nodes.conf: it rejoins with its slots
                else:
                    os.kill(s.proc.pid, signal.SIGCONT)
            wait_for(lambda: cluster_ok(self.servers) and _every(self.servers, _node_lines_clean), timeout=20,
                     interval=0.05, what="the shared cluster to be whole again")
        except (RuntimeError, AssertionError):
            return self._fresh()
        return list(self.servers)

    def close(self) -> None:
        self._stack.close()
        self.servers = []


@pytest.fixture(scope="module")
def shard_set(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardSet]:
    """One ShardSet per module (import it beside ``shards_fixture``)."""
    s = ShardSet(tmp_path_factory.mktemp("shards"))
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(name="shards")  # (imported as shards_fixture: test parameters named shards then shadow nothing)
def shards_fixture(shard_set: ShardSet) -> list[Server]:
    """A local Redis Cluster of 3 masters for a test that stops or kills one of them: the
    module's ShardSet, healthy (see there)."""
    return shard_set.healthy()


def shard_project(root: Path, servers: list[Server], partitions: int, vt: float) -> Project:
    """A project on ``servers`` whose fast queue has ``partitions`` partitions, with room
    for 16 jobs at once per worker."""
    p = cluster_project(root, servers)
    p.write_config(vt=vt, fast=f"partitions = {partitions}", concurrency=16, prefetch=16)
    return p


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


# --- a live but slow master -------------------------------------------------------------


class _Delayer:
    """A TCP proxy on a thread of its own that forwards every chunk, each way, ``delay_s``
    after it came (in order): through it a node answers every call, ``2 * delay_s`` late."""

    def __init__(self, target: int, delay_s: float) -> None:
        import asyncio
        import threading

        self.target, self.delay_s = target, delay_s
        self.writers: set[Any] = set()
        self.loop = asyncio.new_event_loop()
        self.port = 0
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), daemon=True, name="delayer")
        self.thread.start()
        ready.wait(10)

    def _run(self, ready: Any) -> None:
        import asyncio

        async def serve() -> None:
            self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
            self.port = self.server.sockets[0].getsockname()[1]
            ready.set()
            with contextlib.suppress(asyncio.CancelledError):
                await self.server.serve_forever()
            for w in list(self.writers):  # every connection's pumps end at their EOF
                w.close()
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            await asyncio.gather(*rest, return_exceptions=True)

        self.loop.run_until_complete(serve())
        self.loop.close()

    async def _pump(self, reader: Any, writer: Any) -> None:
        import asyncio

        q: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue()

        async def out() -> None:
            while True:
                due, data = await q.get()
                if data is None:
                    break
                await asyncio.sleep(max(0.0, due - self.loop.time()))
                writer.write(data)
                await writer.drain()
            writer.close()

        task = asyncio.ensure_future(out())
        with contextlib.suppress(Exception):
            while data := await reader.read(65536):
                q.put_nowait((self.loop.time() + self.delay_s, data))
        q.put_nowait((0.0, None))
        with contextlib.suppress(Exception):
            await task

    async def _handle(self, cr: Any, cw: Any) -> None:
        import asyncio

        try:
            sr, sw = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            cw.close()
            return
        self.writers |= {cw, sw}
        await asyncio.gather(self._pump(cr, sw), self._pump(sr, cw), return_exceptions=True)
        self.writers -= {cw, sw}

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.server.close)
        self.thread.join(5)


@contextmanager
def slow_master(servers: list[Server], slow: Server, delay_s: float) -> Iterator[int]:
    """``slow`` (a master of ``servers``) announces a proxy that delays each chunk by
    ``delay_s`` each way (CONFIG SET cluster-announce-port): every client that learns the
    layout from then on reaches it through the proxy, its every call ``2 * delay_s`` late,
    while the node itself runs at full speed. Yields the proxy's port."""
    proxy = _Delayer(slow.port, delay_s)
    direct = redis.Redis(port=slow.port)
    try:
        direct.config_set("cluster-announce-port", proxy.port)

        def announced(c: redis.Redis) -> bool:
            return any(int(n[1]) == proxy.port for sl in c.cluster("slots") for n in sl[2:3])

        wait_for(lambda: _every([s for s in servers if s is not slow], announced), timeout=30, interval=0.1,
                 what="the slow master's proxy announced")
        yield proxy.port
    finally:
        with contextlib.suppress(redis.RedisError):
            direct.config_set("cluster-announce-port", 0)
        direct.close()
        proxy.close()


def slot_master(port: int, slot: int) -> int:
    """The port of the master of ``slot`` in the CLUSTER SLOTS of the node on ``port`` (0
    when it does not answer within a second: a stalled node is asked once, not retried)."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    c = redis.Redis(port=port, decode_responses=True, socket_timeout=1, retry=Retry(NoBackoff(), 0))
    try:
        return next((int(r[2][1]) for r in c.cluster("slots") if r[0] <= slot <= r[1]), 0)
    except redis.RedisError:
        return 0
    finally:
        c.close()
