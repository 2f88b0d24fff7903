"""Producers on Redis Cluster while one master is in trouble (all local, real servers):
its WAIT falls short of replicas, it stalls (SIGSTOP), or it is demoted while a WAIT
blocks. A caller whose job goes to a healthy master is answered as if nothing happened
(docs/partitions.md, "Durability": a slow master delays only its own calls), and a
demoted master is an outage (RedisUnavailable, an HTTP 503), at once."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import falcon.testing
import pytest
import redis
from click.testing import CliRunner
from clusterkit import cluster_url, local_cluster, replicas_connected

from runner.cli import cli as main
from runner.client import Client, Enqueued, Request
from runner.errors import NotReplicated, RedisUnavailable
from runner.store import keys, routing, tagset
from runner.store.embedded import Server
from runner.web import create_app

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


class _Producer(threading.Thread):
    """Enqueues ``record`` jobs one at a time with keys from ``keys`` until stopped: each
    call's (start, seconds taken, answer or the exception's class name)."""

    def __init__(self, c: Client, keys: Iterator[str], stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.c, self.keys, self.stop = c, keys, stop
        self.calls: list[tuple[float, float, str]] = []

    def run(self) -> None:
        while not self.stop.is_set():
            t = time.monotonic()
            try:
                self.c.enqueue("record", {"n": 1}, idempotency_key=next(self.keys))
                what = "ok"
            except (NotReplicated, RedisUnavailable) as exc:
                what = type(exc).__name__
            self.calls.append((t, time.monotonic() - t, what))


def test_producers_to_healthy_masters_do_not_wait_behind_a_short_one(
        tmp_path: Path, short_cluster: tuple[list[Server], int]) -> None:
    """Threads of one process enqueue concurrently, two to the master short of its replica
    (each call waits out its 1 s WAIT) and two to the healthy masters: the healthy ones'
    calls are never refused and never wait for the short master's WAIT."""
    servers, lone = short_cluster
    p = _project(tmp_path / "p", servers, wait_replicas=1, wait_timeout_s=1.0)
    try:
        c = p.client
        stop = threading.Event()
        short = [_Producer(c, _keys(c, lone, True, f"s{i}-"), stop) for i in range(2)]
        fine = [_Producer(c, _keys(c, lone, False, f"f{i}-"), stop) for i in range(2)]
        for t in (*short, *fine):
            t.start()
        time.sleep(3.0)  # the load itself: 3 WAIT timeouts of the short master
        stop.set()
        for t in (*short, *fine):
            t.join(10)
        healthy = [x for t in fine for x in t.calls]
        assert sum(1 for t in short for x in t.calls if x[2] == "NotReplicated") >= 2
        assert len(healthy) > 50, len(healthy)
        refused = [x for x in healthy if x[2] != "ok"]
        assert not refused, f"{len(refused)} of {len(healthy)} healthy calls refused: {refused[:3]}"
        slowest = max(x[1] for x in healthy)
        assert slowest < 0.5, f"a healthy call took {slowest:.2f} s (the short master's WAIT is 1 s)"
    finally:
        _close(p)


def test_a_stalled_master_delays_only_its_own_producers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One master of three is stopped (SIGSTOP) for 3 s while threads of one process
    enqueue to it and to the other two: the calls to the others go on, each answered
    quickly; the calls to the stalled one wait at most the node wait (then are refused as
    perhaps written) and are answered once it resumes. The
    producers' record of their partition tags falls due in the stall (its sets live on
    every master, the stalled one's too) and holds up none of the others' calls."""
    monkeypatch.setattr(tagset, "RECORD_EVERY_S", 0.5)  # (10 s in production)
    with local_cluster(tmp_path / "c", masters=3, node_timeout_ms=20000,
                       extra=["--cluster-require-full-coverage", "no"]) as servers:
        p = _project(tmp_path / "p", servers, wait_replicas=0, wait_timeout_s=0)
        try:
            c = p.client
            # The master that holds the queue's recorded partition tags, and partitions of it.
            home = c.runtime.redis.get_node_from_key(keys.partition_set(c.runtime.config.redis.prefix, "fast")).port
            stalled = next(s for s in servers if s.port == home)
            stop = threading.Event()
            slow = [_Producer(c, _keys(c, stalled.port, True, f"s{i}-"), stop) for i in range(2)]
            fine = [_Producer(c, _keys(c, stalled.port, False, f"f{i}-"), stop) for i in range(2)]
            for t in (*slow, *fine):
                t.start()
            wait_for(lambda: all(len(t.calls) > 20 for t in (*slow, *fine)), timeout=10, what="the warm-up")
            assert stalled.proc is not None
            os.kill(stalled.proc.pid, signal.SIGSTOP)
            t0 = time.monotonic()
            try:
                time.sleep(3.0)  # the stall itself
            finally:
                os.kill(stalled.proc.pid, signal.SIGCONT)
            t1 = time.monotonic()
            wait_for(lambda: all(t.calls and t.calls[-1][0] > t1 + 0.5 for t in slow), timeout=10,
                     what="the stalled master's producers to go on")
            stop.set()
            for t in (*slow, *fine):
                t.join(10)
            during = [x for t in fine for x in t.calls if t0 + 0.2 < x[0] < t1 - 0.5]
            assert len(during) > 50, f"{len(during)} healthy calls answered in the stall"
            assert all(x[2] == "ok" for x in during), [x for x in during if x[2] != "ok"][:3]
            slowest = max(x[1] for t in fine for x in t.calls)
            assert slowest < 1.0, f"a healthy call took {slowest:.2f} s (the stall was 3 s)"
            # A call to the stalled master waits at most the node wait (2 s), then is refused
            # as "may have been written"; once the master answers again its calls are answered.
            stalled_calls = [x for t in slow for x in t.calls]
            assert {x[2] for x in stalled_calls} <= {"ok", "RedisUnavailable"}, stalled_calls[-5:]
            longest = max(x[1] for x in stalled_calls)
            assert longest < 3.0, f"a call to the stalled master waited {longest:.2f} s (the node wait is 2 s)"
            after = [x for x in stalled_calls if x[0] > t1 + 0.5]
            assert after and all(x[2] == "ok" for x in after), after[:5]
        finally:
            _close(p)


def test_a_partition_held_for_its_replica_is_named_where_an_operator_looks(
        tmp_path: Path, short_cluster: tuple[list[Server], int]) -> None:
    """``wait_replicas = 1`` and one master without its replica (as just after a failover):
    its partitions run nothing until a replica is back (a claim's WAIT falls short, and
    its jobs are handed back). GET /queues and `runner stats --json` name those partitions
    held (and only those), /metrics has runner_partition_held 1 for each and 0 for the
    others, `runner stats` and `runner check` say so in words."""
    servers, lone = short_cluster
    p = _project(tmp_path / "p", servers, wait_replicas=1, wait_timeout_s=0.3)
    try:
        rt = p.runtime
        every = [k for parts in rt.parts.values() for k in parts]
        on_lone = {k.tag for k in every if rt.redis.get_node_from_key(k.ready).port == lone}
        fast_held = sorted(k.tag for k in rt.parts["fast"] if k.tag in on_lone)
        assert fast_held and len(fast_held) < PARTITIONS, fast_held
        web = falcon.testing.TestClient(create_app(rt))
        queues = {q["name"]: q for q in web.simulate_get("/queues").json["queues"]}
        assert sorted(queues["fast"]["held"]) == fast_held
        assert sorted(x["tag"] for x in queues["fast"]["partitions"] if x["held"]) == fast_held
        for name, q in queues.items():
            assert sorted(q["held"]) == sorted(k.tag for k in rt.parts[name] if k.tag in on_lone), name
        shown = {}
        for line in web.simulate_get("/metrics").text.splitlines():
            m = re.match(r'runner_partition_held\{(.*)\} (\S+)$', line)
            if m:
                labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
                shown[labels["tag"]] = (labels["queue"], float(m.group(2)))
        assert shown == {k.tag: (k.queue, 1.0 if k.tag in on_lone else 0.0) for k in every}

        def cli(*args: str) -> Any:
            return CliRunner().invoke(main, ["--config", str(p.root / "runner.toml"), *args], env=p.env,
                                      catch_exceptions=False)

        stats = cli("stats", "--json")
        assert stats.exit_code == 0, stats.output
        fast = next(q for q in json.loads(stats.stdout)["queues"] if q["name"] == "fast")
        assert sorted(fast["held"]) == fast_held
        words = cli("stats").stdout
        assert all(f"{{{tag}}}" in words for tag in fast_held) and "held" in words, words
        check = cli("check").output
        assert "held" in check and all(tag in check for tag in fast_held), check
    finally:
        _close(p)
