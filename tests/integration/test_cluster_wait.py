"""Durable enqueues on Redis Cluster (`[redis] wait_replicas`): the script calls of one
round trip go to each master at once, each master's calls and its one WAIT pipelined, so
a master short of replicas (a promoted one whose replica has not rejoined) costs a round
trip one WAIT timeout long, not one per partition one after another."""

from __future__ import annotations

import time
from typing import Any

import pytest
from clusterkit import cluster, cproject  # noqa: F401  (a project on the local cluster)

from runner.errors import NotReplicated
from runner.store.keys import QueueKeys
from runner.store.records import new_id
from runner.store.scripts import NewJob

from conftest import Project

WAIT_S = 0.3


def _six(p: Project) -> tuple[Any, list[QueueKeys]]:
    p.write_config(vt=2, fast="partitions = 6")
    cfg = p.root / "runner.toml"
    cfg.write_text(cfg.read_text().replace("[redis]\n", f"[redis]\nwait_replicas = 1\nwait_timeout = {WAIT_S}\n", 1))
    rt = p.runtime
    parts = rt.parts["fast"]
    for k in parts:  # scripts loaded on every master
        with pytest.raises(NotReplicated):
            rt.scripts.enqueue(k, [_job()])
    return rt, parts


def _job() -> NewJob:
    return NewJob(new_id(), "record", 1, "{}", 3, 0, 0, "", "", "", "")


def test_a_group_commit_over_six_partitions_waits_once(cproject: Project) -> None:  # noqa: F811
    """One round trip of 6 enqueue calls (one per partition) on 3 masters without
    replicas, with wait_replicas = 1: the masters wait WAIT_S each at the same time, so
    the round trip takes about two WAIT_S (two partitions a master), not six; every job is
    written, and the round trip answers NotReplicated."""
    rt, parts = _six(cproject)
    batch = rt.scripts.batch()
    for k in parts:
        rt.scripts.enqueue(k, [_job() for _ in range(10)], pipe=batch)
    t0 = time.monotonic()
    with pytest.raises(NotReplicated):
        batch.execute(raise_on_error=False)
    took = time.monotonic() - t0
    assert sum(rt.redis.llen(k.ready) for k in parts) == 66
    assert took < 4 * WAIT_S, f"{took:.2f} s for 6 calls (WAIT {WAIT_S} s each)"


def test_a_stream_over_six_partitions_waits_once(cproject: Project) -> None:  # noqa: F811
    """enqueue_many's stream: 6 calls sent before any is read overlap on the 3 masters."""
    rt, parts = _six(cproject)
    stream = rt.scripts.stream()
    t0 = time.monotonic()
    for i, k in enumerate(parts):
        stream.send(*rt.scripts.enqueue_call(k, [_job()]), tag=i, durable=True)
    short = 0
    while len(stream):
        try:
            stream.read()
        except NotReplicated:
            short += 1
    took = time.monotonic() - t0
    assert short == 6
    assert took < 4 * WAIT_S, f"{took:.2f} s for 6 calls (WAIT {WAIT_S} s each)"


@pytest.mark.parametrize("n", [1])
def test_one_partition_is_one_wait(cproject: Project, n: int) -> None:  # noqa: F811
    """The bound above is not the WAIT's own: one call waits WAIT_S once."""
    p = cproject
    cfg = p.root / "runner.toml"
    cfg.write_text(cfg.read_text().replace("[redis]\n", f"[redis]\nwait_replicas = 1\nwait_timeout = {WAIT_S}\n", 1))
    p._runtime = None
    c = p.client
    t0 = time.monotonic()
    with pytest.raises(NotReplicated):
        c.enqueue("record", {"n": n})
    assert WAIT_S * 0.9 <= time.monotonic() - t0 < 3 * WAIT_S
