"""A demoted master's late answers (Redis Cluster, 3 masters with a replica each, all
local, ``[redis] wait_replicas = 1``): the master of the queue's slot is stopped (SIGSTOP)
with a worker's call in flight, its replica takes over (CLUSTER FAILOVER TAKEOVER), and the
old master is resumed within the worker's node wait. On resuming it runs the call it had
buffered, before it hears of its demotion, and answers it; its resync then wipes what the
call wrote. A claim so answered must not be run (its jobs are still ready on the new
master: the same attempt would run twice at once), and a settlement so answered must not
be taken for landed (the ack is wiped: the lease lapses and the job runs again). Each call
carries its WAIT, whose answer (UNBLOCKED, or short) says the write is not held."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import redis
from clusterkit import cluster_url, local_cluster, replicas_connected

from runner.client.inspecting import get
from runner.store.embedded import Server
from runner.store.outage import OUTAGE
from runner.store.scripts import Ack
from runner.worker.fetcher import CLAIM_FIELDS

from conftest import Endpoint, Project, make_project, wait_for

LEASE_MS = 60_000


def _project(root: Path, servers: list[Server]) -> Project:
    p = make_project(root, Endpoint(cluster_url(servers)))  # type: ignore[arg-type]
    p.write_config(vt=60)
    path = p.root / "runner.toml"
    path.write_text(path.read_text().replace("[redis]\n", "[redis]\nwait_replicas = 1\nwait_timeout = 1\n", 1))
    p._runtime = None
    p.runtime.scripts.node_wait_s = 2.0  # (a worker's: min(2 s, vt / 4))
    return p


def _info(port: int) -> dict[str, Any]:
    r = redis.Redis(port=port, decode_responses=True, socket_timeout=2)
    try:
        return dict(r.info("replication"))
    finally:
        r.close()


def _replica_of(servers: list[Server], master: int) -> Server:
    for s in servers:
        info = _info(s.port)
        if info["role"] == "slave" and int(info["master_port"]) == master:
            return s
    raise AssertionError(f"no replica of {master}")


def _synced(master: int, replica: int) -> bool:
    """Whether ``replica`` holds every write of ``master`` (the claim before the stall)."""
    return int(_info(replica)["slave_repl_offset"]) >= int(_info(master)["master_repl_offset"])


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[Server]]:
    # A long node timeout: no failover but the test's own takeover.
    with local_cluster(tmp_path / "c", masters=3, replicas=1, node_timeout_ms=15000,
                       extra=["--cluster-require-full-coverage", "no"]) as servers:
        wait_for(lambda: replicas_connected(servers[:3]), timeout=30, interval=0.1, what="every replica")
        yield servers


def _late(servers: list[Server], p: Project, send: Callable[[], Future[Any]]) -> tuple[Any, Server]:
    """``send`` a call to the master of the queue's slot while it is stopped; its replica
    takes over, and the old master resumes (0.3 s later, within the node wait) with the
    call still buffered. Returns what the call came back with (its reply, or the error it
    raised) and the new master."""
    port = p.runtime.redis.get_node_from_key(p.keys().ready).port
    old = next(s for s in servers if s.port == port)
    heir = _replica_of(servers, port)
    assert old.proc is not None
    # A connection made to the stopped master would wait for its handshake's answer, and
    # the call would go out only after the resume: the call's connection is made now.
    # So are its scripts loaded there (a NOSCRIPT's reload after the resume is not the case).
    rc = p.runtime.redis
    conn = rc.get_redis_connection(rc.get_node_from_key(p.keys().ready))
    conn.ping()
    for name in ("claim", "ack"):
        conn.script_load(p.runtime.scripts.sources[name])
    os.kill(old.proc.pid, signal.SIGSTOP)
    try:
        f = send()
        time.sleep(0.2)  # (the call is in the stopped master's socket)
        h = redis.Redis(port=heir.port)
        h.execute_command("CLUSTER", "FAILOVER", "TAKEOVER")
        h.close()
        wait_for(lambda: _info(heir.port)["role"] == "master", timeout=10, interval=0.02, what="the takeover")
        time.sleep(0.3)
    finally:
        os.kill(old.proc.pid, signal.SIGCONT)
    try:
        got: Any = f.result(timeout=10)
    except Exception as exc:
        got = exc
    # The old master hears of its demotion and resyncs from the heir (what it wrote is gone).
    wait_for(lambda: _info(old.port)["role"] == "slave" and _info(old.port).get("master_link_status") == "up",
             timeout=20, interval=0.1, what="the old master's resync")
    return got, heir


def _claimed(reply: Any) -> list[tuple[str, str]]:
    return [(reply[i], reply[i + 1]) for i in range(2, len(reply), CLAIM_FIELDS)]


def test_a_claim_answered_by_a_demoted_master_is_not_run(tmp_path: Path, cluster: list[Server]) -> None:
    """The claim goes out as a worker's claim of a partitioned queue does (launched on the
    pool, Transport.launch). Before, the old master's answer handed 4 jobs to run while the
    same 4 stayed ready on the new master, claimed again by the next claim: the same
    attempt ran twice at once. Now the claim fails as an outage (its WAIT answered
    UNBLOCKED, or short), and the jobs are still there to claim on the new master."""
    p = _project(tmp_path / "p", cluster)
    try:
        c, sc, k = p.client, p.runtime.scripts, p.keys()
        ids = [c.enqueue("record", {"n": i}).id for i in range(4)]
        call = sc.claim_call(k, n=10, start=10, lease_ms=LEASE_MS, token_base="w.1", dead_ttl_ms=10**8,
                             done_ttl_ms=10**8)

        def send() -> Future[Any]:
            launched = sc.launch(*call)
            assert launched is not None
            return launched[1]

        got, _ = _late(cluster, p, send)
        believed = [] if isinstance(got, BaseException) else _claimed(got)
        again = _claimed(sc.claim(k, n=10, start=10, lease_ms=LEASE_MS, token_base="w.2", dead_ttl_ms=10**8,
                                  done_ttl_ms=10**8))
        print(f"the late claim: {type(got).__name__ if isinstance(got, BaseException) else len(believed)}; "
              f"claimed again on the new master: {len(again)}")
        twice = {i for i, _ in believed} & {i for i, _ in again}
        assert not twice, f"{len(twice)} job(s) handed to run by the late claim and claimed again"
        assert isinstance(got, OUTAGE), got
        assert sorted(i for i, _ in believed + again) == sorted(ids)  # (none lost)
    finally:
        p.stop_all()
        p.runtime.close()


def test_a_settlement_answered_by_a_demoted_master_is_not_taken_for_landed(tmp_path: Path,
                                                                           cluster: list[Server]) -> None:
    """An ack goes out as the settler sends it on Redis Cluster (a Batch launched on the
    pool). Before, the old master answered it acked (1), and the resync wiped it: the job
    was still processing on the new master, its lease to lapse and the job to run again.
    Now the batch marks the call short (its WAIT answered UNBLOCKED, or short), and the ack
    sent again lands on the new master."""
    p = _project(tmp_path / "p", cluster)
    try:
        c, sc, k = p.client, p.runtime.scripts, p.keys()
        job = c.enqueue("record", {"n": 1}).id
        (jid, token), = _claimed(sc.claim(k, n=1, start=1, lease_ms=LEASE_MS, token_base="w.1", dead_ttl_ms=10**8,
                                         done_ttl_ms=10**8))
        assert jid == job
        port = p.runtime.redis.get_node_from_key(k.ready).port
        wait_for(lambda: _synced(port, _replica_of(cluster, port).port), timeout=10, what="the claim replicated")
        ack = Ack(jid, token, '{"ok":1}', "noop|1", "")
        pipe = sc.batch()

        def send() -> Future[Any]:
            sc.ack(k, [ack], 100_000, pipe=pipe)
            launched = pipe.launch()
            assert launched is not None, "the settler's batch must be launched on the pool, not waited for"
            return launched[1]

        got, _ = _late(cluster, p, send)
        landed = (not isinstance(got, BaseException) and not isinstance(got[0], BaseException)
                  and not pipe.short and int(got[0][0]) > 0)
        status = get(c, job).status
        print(f"the late ack: {got!r}, short {pipe.short}; the job on the new master: {status}")
        if landed:
            assert status == "done", f"the ack was taken for landed, but the job is {status} on the new master"
        else:  # sent again (fenced by its token), it lands on the new master
            assert int(sc.ack(k, [ack], 100_000)[0]) > 0
            assert get(c, job).status == "done"
        assert not landed or status == "done"
    finally:
        p.stop_all()
        p.runtime.close()
