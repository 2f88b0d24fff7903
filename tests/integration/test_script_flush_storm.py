"""A SCRIPT FLUSH storm: another client empties Redis's script cache every few
milliseconds while every path that sends a script runs at once, on one server, on a
master with a replica (durable calls with their WAIT) and on Redis Cluster (with and
without replicas). A flush can
land between a reload and the call behind it, so a call answered NOSCRIPT must go again
by its source (EVAL cannot answer NOSCRIPT), never by SHA a second time, whichever path
sent it: redis-py's kept connections (a single call, a batch, a stream, a wake-up's claim
behind a BLPOP, the scheduler's look, a schedule's ticks), the raw link (a reader's
lookups), the event-loop link (aenqueue) and, on Cluster, the calls routed to each
master."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import clusterkit
import redis
from schedulekit import TEST_ENV, add_function

from runner.client import Enqueued, Request
from runner.runtime import Runtime
from runner.store import records
from runner.store.embedded import Server, bundled_binary

from conftest import Project, make_project, wait_for

cluster = clusterkit.cluster

FLUSH_EVERY_S = 0.003


@contextlib.contextmanager
def storm(urls: list[str]) -> Iterator[list[int]]:
    """SCRIPT FLUSH on each of ``urls`` (every master) every FLUSH_EVERY_S until the block
    ends; yields the count of flushes sent so far."""
    flushers = [redis.Redis.from_url(u) for u in urls]
    stop = threading.Event()
    flushes = [0]

    def flush() -> None:
        while not stop.wait(FLUSH_EVERY_S):
            for f in flushers:
                f.script_flush()
                flushes[0] += 1

    thread = threading.Thread(target=flush, daemon=True)
    thread.start()
    try:
        yield flushes
    finally:
        stop.set()
        thread.join(10)
        for f in flushers:
            f.close()


def _paths(project: Project, ids: list[str], errors: list[BaseException]) -> list[Callable[[], None]]:
    """Every enqueue path, each a thread's work: one by one (some delayed, for the
    scheduler's promote), enqueue_many and enqueue_all in tens, the shared round trip in
    tens (30 jobs a path: some hundreds of flushes land among them), aenqueue on an
    event loop, and groups of four with a then-job each. A job is counted once its id is
    answered; an error in a list's place or raised is kept."""
    client = project.client
    lock = threading.Lock()

    def keep(got: list[Any]) -> None:
        with lock:
            ids.extend(e.id for e in got if isinstance(e, Enqueued))
            errors.extend(e for e in got if not isinstance(e, Enqueued))

    def guarded(work: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                work()
            except BaseException as exc:  # kept, then asserted on
                with lock:
                    errors.append(exc)
        return run

    def single() -> None:
        for n in range(30):
            keep([client.enqueue("record", {"n": n}, delay=0.05 if n % 3 == 0 else None)])

    def tens(send: Callable[[list[Request]], list[Any]]) -> Callable[[], None]:
        def run() -> None:
            for _ in range(3):
                keep(send([Request("record", {"n": n}) for n in range(10)]))
        return run

    def on_loop() -> None:
        async def go() -> None:
            for n in range(30):
                keep([await client.aenqueue("record", {"n": n})])
        asyncio.run(go())

    def groups() -> None:  # (a group's members and, once they end, its then-job)
        for n in range(3):
            g = client.group([Request("record", {"n": m}) for m in range(4)], then=Request("record", {"n": n}))
            with lock:
                ids.extend([*g.members, g.then_id])

    shared = tens(lambda reqs: client._send_prepared([client.prepare(r) for r in reqs]))
    return [guarded(p) for p in (single, on_loop, tens(client.enqueue_many), tens(client.enqueue_all), shared,
                                 groups)]


def _ticks(project: Project, ids: list[str]) -> list[str]:
    """The schedule's jobs that ran: the records of ids not enqueued by the test."""
    enqueued = set(ids)
    return [p.name for p in project.records.iterdir() if p.name not in enqueued]


def _run_storm(project: Project, urls: list[str], queue_keys: list[Any]) -> None:
    """Enqueue on every path and look jobs up on a reader's raw link while a worker runs
    them and a schedule ticks every second, all inside a storm; then every accepted job
    and every tick's job ran once, the accepted ones are done, no call failed, and the
    worker logged no NOSCRIPT."""
    add_function(project, "tick", 'SCHEDULE = "* * * * * *"')  # (a tick a second: the ticker's calls)
    ids: list[str] = []
    errors: list[BaseException] = []
    reader = Runtime.create(project.config(), reader=True)
    looked: list[int] = [0]
    try:
        with storm(urls) as flushes:
            worker = project.spawn_worker(env=TEST_ENV)
            threads = [threading.Thread(target=p) for p in _paths(project, ids, errors)]
            for t in threads:
                t.start()
            while any(t.is_alive() for t in threads):  # a reader's lookups (the raw link) meanwhile
                for job_id in [i for i in ids[-5:] if not i.endswith(".then")]:  # (written once its group ends)
                    try:
                        found = records.lookup(reader.read_scripts, queue_keys, job_id)
                    except BaseException as exc:  # kept, then asserted on
                        errors.append(exc)
                        continue
                    looked[0] += 1
                    if found is None:
                        errors.append(LookupError(f"{job_id} accepted but not found"))
                time.sleep(0.005)
            for t in threads:
                t.join(120)
            wait_for(lambda: all(project.runs(i) for i in ids), timeout=90, what="every accepted job run")
            wait_for(lambda: len(_ticks(project, ids)) >= 2, timeout=30, what="two ticks run")
            assert flushes[0] >= 20, "the storm flushed"
        assert worker.poll() is None, "the worker lived through the storm"
    finally:
        reader.close()
    assert errors == [], errors[:3]
    assert len(ids) == 165 and len(set(ids)) == 165 and looked[0] > 0
    ran = [*ids, *_ticks(project, ids)]
    assert {i: len(project.runs(i)) for i in ran if len(project.runs(i)) != 1} == {}, "each job ran once"
    client = project.client
    wait_for(lambda: {j.fields.get("status") for j in client.get_many(ids).values()} == {"done"}
             and len(client.get_many(ids)) == len(ids), timeout=30, what="every job done")
    log = "".join(p.read_text(errors="replace") for p in project.root.glob("worker-*.log"))
    assert "NOSCRIPT" not in log and "NoScriptError" not in log


def _durable(p: Project, fast: str = "") -> Project:
    """The project's runner.toml with ``wait_replicas = 1`` (``fast``: lines for its fast queue)."""
    p.write_config(vt=5, fast=fast)
    path = p.root / "runner.toml"
    path.write_text(path.read_text().replace("[redis]\n", "[redis]\nwait_replicas = 1\nwait_timeout = 2\n", 1))
    p._runtime = None
    return p


def test_a_flush_storm_on_one_server_reaches_no_caller(project: Project) -> None:
    """SCRIPT FLUSH every 3 ms while 165 jobs go through every enqueue path, a reader looks
    them up on its raw link, and a real worker claims (behind its wake-up), starts,
    settles and promotes them: every accepted job runs once and ends done, no call
    fails, and no NOSCRIPT reaches a caller or the worker's log."""
    project.write_config(vt=5)
    _run_storm(project, [project.server.url], [k for keys in project.runtime.parts.values() for k in keys])


def test_a_flush_storm_with_replicas_reaches_no_caller(tmp_path: Path) -> None:
    """The same storm with ``wait_replicas = 1`` on a master and its replica: each durable
    call's reload goes with its WAIT behind it in one write (a single call, a batch's, a
    stream's, the event loop's), and every job is confirmed, runs once and ends done."""
    binary = bundled_binary()
    master = Server(tmp_path / "master", binary=binary, extra=["--repl-diskless-sync-delay", "0"]).start()
    replica = Server(tmp_path / "replica", binary=binary, extra=["--replicaof", "127.0.0.1", str(master.port)]).start()
    probe = redis.Redis(port=master.port)
    try:
        wait_for(lambda: probe.set("probe", 1) and int(probe.wait(1, 100)) == 1, timeout=20, interval=0.05,
                 what="the replica to sync and acknowledge")
        p = _durable(make_project(tmp_path / "p", master))
        try:
            assert p.runtime.scripts.replicas == 1
            _run_storm(p, [master.url], [k for keys in p.runtime.parts.values() for k in keys])
        finally:
            p.stop_all()
            if p._runtime is not None:
                p._runtime.close()
    finally:
        probe.close()
        replica.stop(kill=True)
        master.stop(kill=True)


def test_a_flush_storm_on_every_cluster_master_reaches_no_caller(tmp_path: Any, cluster: list[Any]) -> None:
    """The same storm on Redis Cluster, every master flushed every 3 ms: calls routed to a
    slot's master (single, durable and bounded calls, the per-master lanes of a batch or
    a stream, the scheduler's look on one master) all end with no NOSCRIPT, every job
    once."""
    p = clusterkit.cluster_project(tmp_path / "p", cluster[:2])
    p.write_config(vt=5)
    try:
        rt = p.runtime
        parts = [k for keys in rt.parts.values() for k in keys]
        _run_storm(p, [s.url for s in cluster], parts)
    finally:
        clusterkit.close_project(p)


def test_a_flush_storm_on_a_cluster_with_replicas_reaches_no_caller(tmp_path: Path) -> None:
    """The storm on a Cluster of 3 masters with a replica each, ``wait_replicas = 1`` and
    the fast queue in 3 partitions (spread over the masters): the durable calls pipelined
    with their WAIT on a slot's master (an enqueue's bounded call, a group's and a relay's
    call on its node) go again by their source with their WAIT behind them; every job runs
    once."""
    with clusterkit.local_cluster(tmp_path / "c", masters=3, replicas=1) as servers:
        wait_for(lambda: clusterkit.replicas_connected(servers[:3]), timeout=30, interval=0.1, what="every replica")
        p = _durable(clusterkit.cluster_project(tmp_path / "p", servers[:2]), fast="partitions = 3")
        try:
            assert p.runtime.scripts.replicas == 1
            _run_storm(p, [s.url for s in servers[:3]], [k for keys in p.runtime.parts.values() for k in keys])
        finally:
            clusterkit.close_project(p)
