"""Readers while a Redis master stalls (SIGSTOP: it takes connections and says nothing, so
a call to it waits out the 15 s socket timeout): `GET /jobs/{id}` and `GET /jobs` answer
from the masters that answer within a bound, say what they left out, and never answer
500 (docs/partitions.md, "A shard down"; docs/http.md)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import falcon.testing
import pytest
from clusterkit import close_project, shard_project, shards_fixture  # noqa: F401  (the shards fixture)

from runner.store.embedded import Server
from runner.web import create_app

from conftest import Project


@pytest.fixture
def sproject(tmp_path: Path, shards: list[Server]) -> Iterator[Project]:
    p = shard_project(tmp_path / "p", shards, partitions=6, vt=10)
    yield p
    close_project(p)


def test_concurrent_reads_of_the_layout_fail_no_call_on_a_live_master(sproject: Project) -> None:
    """redis-py reads the cluster's layout again after any failed call, and each read
    closes the connections of the node it asked once it has its answer: two reads at
    once closed each other's, and a thread's read (or the call behind it) failed
    "Redis Cluster cannot be connected ... Bad file descriptor" on a live master, a bare
    RedisClusterException (an HTTP 500). Eight threads reading the layout and looking
    jobs up at once, every master up: no call fails."""
    p = sproject
    c = p.client
    ids = [c.enqueue("record", {"n": i}).id for i in range(12)]
    manager = p.runtime.redis.nodes_manager
    failed: list[BaseException] = []
    stop = time.monotonic() + 3.0

    def hammer(n: int) -> None:
        while time.monotonic() < stop and len(failed) < 20:
            try:
                manager.initialize()
                assert c.get(ids[n % len(ids)]).id == ids[n % len(ids)]
            except Exception as exc:
                failed.append(exc)

    threads = [threading.Thread(target=hammer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not failed, f"{len(failed)} calls failed, e.g. {failed[0]!r}"


def test_a_layout_no_node_gives_is_an_outage_not_a_bare_cluster_error(sproject: Project,
                                                                        shards: list[Server]) -> None:
    """A read of the layout that finds no node answering raises redis-py's
    RedisClusterException ("Redis Cluster cannot be connected"): it is an outage, the
    client's RedisUnavailable and HTTP's 503 with its problem shape, never a 500."""
    p = sproject
    job = p.client.enqueue("record", {"n": 1})
    rt = p.runtime
    web = falcon.testing.TestClient(create_app(rt))
    assert web.simulate_get(f"/jobs/{job.id}").status_code == 200
    for s in shards:
        s.stop(kill=True)
    try:
        rt.redis.nodes_manager.initialize()
    except Exception as exc:
        from runner.store.connection import UNAVAILABLE

        assert isinstance(exc, UNAVAILABLE), repr(exc)
    else:
        raise AssertionError("the layout was read with every node down")
    r = web.simulate_get(f"/jobs/{job.id}")
    assert r.status_code == 503, r.text
    assert r.json["type"].endswith("redis-unavailable"), r.json
