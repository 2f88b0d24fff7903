"""ctx.wait_for_event on a real local 3-master Redis Cluster: an event name's waiters live
in a slot of their own, apart from the queue's partitions (each its own slot too), and an
emit resumes the waiting jobs of every partition."""

from __future__ import annotations

from pathlib import Path

import clusterkit
from clusterkit import close_project, cluster_project, local_cluster, shard_set, shards_fixture  # noqa: F401  (the shards fixtures)
from durable_helpers import ORDER_PAID_WAITER, registered

from runner.store.embedded import Server
from runner.store.keys import EventKeys, key_slot

from conftest import Project, wait_for

# The local cluster and a project on it (clusterkit.py).
cluster, cproject = clusterkit.cluster, clusterkit.cproject


def test_waiters_in_every_partition_resume_on_a_cluster(cproject: Project) -> None:
    """partitions = 3 on 3 masters: one emit per order resumes its job, wherever it lives."""
    p = cproject
    p.write_config(fast="partitions = 3")
    p.add_function("waiter", ORDER_PAID_WAITER.format(isolation=""))
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


def test_a_dead_shard_delays_only_its_own_waiters(tmp_path: Path, shards: list[Server]) -> None:
    """One master of three dies while jobs wait on every partition (partitions = 6): an
    emit still resumes the waiters whose jobs live on the other masters; the dead one's
    waiters stay on record and the event stays pending for the relay, whose scheduler
    goes on serving the live partitions."""
    p = cluster_project(tmp_path / "p", shards)
    try:
        p.write_config(vt=2, fast="partitions = 6")
        p.add_function("waiter", ORDER_PAID_WAITER.format(isolation=""))
        c = p.client
        p.spawn_worker("fast")
        rt = c.runtime
        r = rt.redis
        jobs = [c.enqueue("waiter", {"order_id": 1}).id for _ in range(18)]
        for j in jobs:
            wait_for(lambda j=j: c.get(j).status == "waiting", timeout=60, what="each job to wait")
        port_of = {k.tag: r.get_node_from_key(k.ready).port for k in rt.parts["fast"]}
        keep = {r.get_node_from_key(rt.keys["fast"].ready).port,
                r.get_node_from_key(EventKeys(rt.config.redis.prefix, "order.paid").shapes).port}
        dead = next(s for s in shards if s.port not in keep and s.port in port_of.values())
        home_of = {j: next(k.tag for k in rt.parts["fast"] if r.exists(k.job(j))) for j in jobs}
        lost = [j for j in jobs if port_of[home_of[j]] == dead.port]
        live = [j for j in jobs if j not in lost]
        assert lost and live
        dead.stop(kill=True)
        c.emit("order.paid", {"order_id": 1})
        # (A job look-up reads every partition, the dead one's too: the step after the wait
        # says the job resumed.)
        wait_for(lambda: all((p.records / f"{j}-after").exists() for j in live), timeout=60,
                 what="the live partitions' waiters to resume")
        assert not any((p.records / f"{j}-after").exists() for j in lost)
        assert registered(p) == len(lost)
        assert r.llen(rt.keys["fast"].wakes) == 1  # pending: told once the shard is back
    finally:
        close_project(p)
