"""ctx.wait_for_event on a real local 3-master Redis Cluster: an event name's waiters live
in a slot of their own, apart from the queue's partitions (each its own slot too), and an
emit resumes the waiting jobs of every partition."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from clusterkit import local_cluster
from test_wait_for_event import WAITER, registered

from runner.store.embedded import Server
from runner.store.keys import EventKeys, key_slot

from conftest import Endpoint, Project, make_project, wait_for


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Server]]:
    with local_cluster(tmp_path_factory.mktemp("cluster"), masters=3) as servers:
        yield servers


@pytest.fixture
def cproject(tmp_path: Path, cluster: list[Server]) -> Iterator[Project]:
    url = "redis+cluster://" + ",".join(f"127.0.0.1:{s.port}" for s in cluster[:2])
    p = make_project(tmp_path / "p", Endpoint(url))  # type: ignore[arg-type]
    yield p
    p.stop_all()
    if p._runtime is not None:
        p._runtime.close()


def test_waiters_in_every_partition_resume_on_a_cluster(cproject: Project) -> None:
    """partitions = 3 on 3 masters: one emit per order resumes its job, wherever it lives."""
    p = cproject
    p.write_config(fast="partitions = 3")
    p.add_function("waiter", WAITER.format(isolation=""))
    c = p.client
    p.spawn_worker("fast")
    jobs = {n: c.enqueue("waiter", {"order_id": n}).id for n in range(6)}
    for j in jobs.values():
        wait_for(lambda j=j: c.get(j).status == "waiting", timeout=60, what="each job to wait")
    rt = c.runtime
    slots = {key_slot(k.ready.encode()) for k in rt.parts["fast"]}
    assert key_slot(EventKeys(rt.config.redis.prefix, "order.paid").shapes.encode()) not in slots
    assert registered(p) == 6
    for n in jobs:
        c.emit("order.paid", {"order_id": n})
    for n, j in jobs.items():
        assert c.wait(j, 60).as_dict()["result"]["event"]["data"] == {"order_id": n}
    assert registered(p) == 0
