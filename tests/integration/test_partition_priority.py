"""PRIORITY across the partitions of a queue (docs/partitions.md, "Priority"): a job of
a higher priority starts before every job of a lower one that has not started, whichever
partitions hold them, on a single server and on a real Cluster."""

from __future__ import annotations

import pytest
from clusterkit import cluster, cproject  # noqa: F401  (a project on the local cluster)
from test_flow_control import add_limited, started_at

from conftest import Project, wait_for


@pytest.mark.parametrize("partitions", [4, 8])
def test_priority_is_strict_across_partitions(project: Project, partitions: int) -> None:
    """40 plain jobs, then one job of a priority from 1 to 9 in every partition but one,
    each sent in a round trip of its own so that they spread over every partition; one
    worker of one thread, prefetch = 0: every prioritised job starts before every plain
    one, highest first."""
    project.write_config(concurrency=1, prefetch=0, fast=f"partitions = {partitions}")
    add_limited(project, "None")
    c = project.client
    plain = [c.enqueue("limited", {}).id for _ in range(40)]
    high = {c.enqueue("limited", {}, priority=1 + i * 5 % 9).id: 1 + i * 5 % 9 for i in range(partitions - 1)}
    assert len({_partition(project, i) for i in [*plain, *high]}) == partitions
    project.spawn_worker("fast")
    every = [*plain, *high]
    wait_for(lambda: all(started_at(project, i) for i in every), timeout=60, what="every job to start")
    order = sorted(every, key=lambda i: started_at(project, i) or 0)
    late = [i for i in order[:len(high)] if i not in high]
    assert not late, f"{len(late)} plain job(s) started before a prioritised one"
    got = [high[i] for i in order[:len(high)]]
    assert got == sorted(got, reverse=True), got


def _partition(p: Project, job_id: str) -> int:
    for k in p.runtime.parts["fast"]:
        if p.runtime.redis.exists(k.job(job_id)):
            return k.partition
    raise AssertionError(f"job {job_id} is in no partition")



def test_priority_is_strict_across_six_partitions_of_a_cluster(cproject: Project) -> None:  # noqa: F811
    """On a real 3-master Cluster, 6 partitions: while the worker's one thread is busy,
    30 plain jobs and then 5 prioritised ones arrive over the partitions; once it is free,
    the 5 start first, highest first."""
    p = cproject
    p.write_config(concurrency=1, prefetch=0, fast="partitions = 6")
    add_limited(p, "None")
    c = p.client
    p.spawn_worker("fast")
    busy = c.enqueue("limited", {"hold": 1.0}).id
    wait_for(lambda: started_at(p, busy), timeout=30, what="the worker to be busy")
    plain = [c.enqueue("limited", {}).id for _ in range(30)]
    high = {c.enqueue("limited", {}, priority=v).id: v for v in (3, 9, 1, 7, 5)}
    every = [*plain, *high]
    wait_for(lambda: all(started_at(p, i) for i in every), timeout=60, what="every job to start")
    order = sorted(every, key=lambda i: started_at(p, i) or 0)
    assert [high.get(i, 0) for i in order[:5]] == [9, 7, 5, 3, 1]
