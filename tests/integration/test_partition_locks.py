"""RESOURCE_KEY across the partitions of a queue: a group's then-job and its members
must meet the other jobs of their key in the partition the key routes to, so no two runs
of one resource overlap (docs/partitions.md, "Routing")."""

from __future__ import annotations

from clusterkit import cluster, cproject  # noqa: F401  (a project on the local cluster)

from runner.client import Request
from runner.store import routing

from conftest import Project, wait_for


def _away_from_home(project: Project, n: int) -> str:
    """A resource whose key routes to a partition other than the queue's home one."""
    home = project.runtime.keys["fast"].partition
    return next(f"x{i}" for i in range(100) if routing.partition_of(f"r:res:x{i}", n) != home)


def _overlaps(project: Project, ids: list[str] | None = None) -> int:
    """How many runs of the resource (of these jobs, else of every job) started while
    another was inside."""
    spans = sorted(tuple(map(float, line.split()[:2])) for p in project.records.iterdir()
                   if ids is None or p.name in ids for line in p.read_text().splitlines())
    count, end = 0, 0.0
    for start, stop in spans:  # by start: a run that starts before an earlier one ended
        count += start < end
        end = max(end, stop)
    return count


def test_a_groups_then_job_meets_the_other_jobs_of_its_resource(project: Project) -> None:
    """4 partitions; a group of 3 keyless members whose then-job holds a resource whose key
    routes away from the home partition, and 8 ordinary jobs of that resource sent after
    it, on 2 workers of 8 threads: never two runs of the resource at once."""
    project.write_config(concurrency=8, prefetch=0, fast="partitions = 4")
    r = _away_from_home(project, 4)
    c = project.client
    g = c.group([Request("noop", {})] * 3, then=Request("resource", {"r": r, "hold": 0.3}))
    plain = [c.enqueue("resource", {"r": r, "hold": 0.1}).id for _ in range(8)]
    for _ in range(2):
        project.spawn_worker("fast")
    wait_for(lambda: all(project.runs(i) for i in [*plain, g.then_id]), timeout=60, what="the runs")
    assert _overlaps(project) == 0, "two runs of one resource overlapped"


def test_a_groups_members_and_other_jobs_of_one_resource_never_overlap(project: Project) -> None:
    """4 partitions; a resource whose key routes away from the home partition; a group of
    6 members and a then-job of it, and 6 ordinary jobs of it, on 2 workers of 8 threads:
    never two runs of the resource at once."""
    project.write_config(concurrency=8, prefetch=0, fast="partitions = 4")
    r = _away_from_home(project, 4)
    c = project.client
    job = Request("resource", {"r": r, "hold": 0.2})
    c.group([job] * 6, then=job)
    plain = [c.enqueue("resource", {"r": r, "hold": 0.2}).id for _ in range(6)]
    for _ in range(2):
        project.spawn_worker("fast")
    wait_for(lambda: len(list(project.records.iterdir())) >= 13, timeout=60, what="13 runs")
    assert all(project.runs(i) for i in plain)
    assert _overlaps(project) == 0, "two runs of one resource overlapped"



def test_a_group_over_the_partitions_of_a_cluster_completes_once(cproject: Project) -> None:  # noqa: F811
    """On a real 3-master Cluster, 6 partitions: a group of 12 members over 3 resources
    (partitions of their own, the home one among them or not) and a then-job, with 12
    ordinary jobs of the same resources: each resource is held by one run at a time, and
    the then-job runs once, after every member, counting 12 done."""
    p = cproject
    p.write_config(concurrency=8, prefetch=0, fast="partitions = 6")
    rs = ["a", "b", "c"]
    c = p.client
    g = c.group([Request("resource", {"r": rs[i % 3], "hold": 0.05}) for i in range(12)],
                then=Request("record", {}))
    plain = {r: [c.enqueue("resource", {"r": r, "hold": 0.05}).id for _ in range(4)] for r in rs}
    for _ in range(2):
        p.spawn_worker("fast")
    wait_for(lambda: p.runs(g.then_id), timeout=60, what="the then-job")
    for i, r in enumerate(rs):
        ids = [*g.members[i::3], *plain[r]]
        wait_for(lambda ids=ids: all(p.runs(j) for j in ids), timeout=30, what=f"the runs of {r}")
        assert _overlaps(p, ids) == 0, f"two runs of resource {r} overlapped"
    assert all(len(p.runs(j)) == 1 for j in g.members) and len(p.runs(g.then_id)) == 1
    state = c.get_group(g.id)
    assert (state["done"], state["pending"], state["complete"]) == (12, 0, True), state
