"""One master of a 3-master Redis Cluster stalled (SIGSTOP) or slow (a delaying proxy)
beside a worker's own pace (docs/partitions.md, "A shard down"): a worker with
``prefetch = 0`` keeps starting the live partitions' jobs through a stall, a slow master's
jobs start from a worker's first call to it, and learning the layout again never waits
out a stalled node's socket timeout."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from clusterkit import close_project, shard_project, shards_fixture  # noqa: F401  (the shards fixture)

from runner.client import Request
from runner.store.embedded import Server

from conftest import Project, wait_for


@pytest.fixture
def sproject(tmp_path: Path, shards: list[Server]) -> Iterator[Project]:
    p = shard_project(tmp_path / "p", shards, partitions=3, vt=10)
    yield p
    close_project(p)


class _Pings:
    """The test's own round trips to a live master, timed back to back on a thread: a gap
    between two starts is read as how many of them fit in it (a loaded host stretches
    both)."""

    def __init__(self, port: int) -> None:
        import redis

        self.client = redis.Redis(port=port)
        self.times: list[float] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.is_set():
            t = time.monotonic()
            self.client.ping()
            self.times.append(time.monotonic() - t)
            time.sleep(0.005)

    def stop(self) -> float:
        """The slowest tenth's round trip (its 90th percentile), in seconds."""
        self.stopping.set()
        self.thread.join(10)
        self.client.close()
        got = sorted(self.times)
        return got[int(len(got) * 0.9)] if got else float("inf")


# The longest gap between two starts of the live partitions' jobs during the stall, in the
# test's round trips to a live master. Jobs of 20 ms on 4 executors start every few ms; a
# worker that waits out the node wait (2 s) on the stalled master spans thousands.
GAP_ROUND_TRIPS = 400


def test_prefetch_0_keeps_starting_the_live_partitions_jobs_through_a_stall(sproject: Project,
                                                                            shards: list[Server]) -> None:
    """``prefetch = 0``, 4 executors, 3 partitions on 3 masters, a node wait of 2 s: while a
    worker drains the queue, one master stops answering (SIGSTOP) for 3 s, and the live
    partitions' jobs keep starting: their longest gap spans at most GAP_ROUND_TRIPS of the
    test's own round trips to a live master (and under half the node wait). Before, the
    fetcher's look at every partition's priorities waited out the node wait on the
    stalled master, and nothing was claimed meanwhile: with nothing claimed ahead, the
    live partitions' jobs stopped for about 2 s."""
    p = sproject
    p.write_config(vt=10, fast="partitions = 3", concurrency=4, prefetch=0)
    r = p.runtime.redis
    parts = p.runtime.parts["fast"]
    port = {k.tag: r.get_node_from_key(k.ready).port for k in parts}
    assert len(set(port.values())) == 3, port
    stalled = next(s for s in shards if s.port == port[parts[0].tag])
    live_port = next(s.port for s in shards if s is not stalled)
    c = p.client
    ids = [j.id for b in range(30)
           for j in c.enqueue_many([Request("record", {"n": 100 * b + i, "sleep": 0.02}) for i in range(100)])]
    where = {i: k.tag for k in parts for i in r.lrange(k.ready, 0, -1)}
    live = [i for i in ids if port[where[i]] != stalled.port]
    w = p.spawn_worker("fast")
    wait_for(lambda: sum(1 for i in live[:400] if p.runs(i)) >= 40, timeout=30, interval=0.05,
             what="the worker draining")
    pings = _Pings(live_port)
    assert stalled.proc is not None
    os.kill(stalled.proc.pid, signal.SIGSTOP)
    t0 = time.time()
    try:
        time.sleep(3.0)
    finally:
        os.kill(stalled.proc.pid, signal.SIGCONT)
    t1 = time.time()
    rtt = pings.stop()
    alive = w.poll() is None
    p.stop_all()
    starts = sorted(float(line.split()[2]) for i in live for line in p.runs(i))
    during = [s for s in starts if t0 < s < t1]
    gaps = [b - a for a, b in zip([t0, *during], [*during, t1], strict=True)]
    print(f"{len(during)} live starts in the 3 s stall, longest gap {max(gaps):.3f} s "
          f"({max(gaps) / rtt:.0f} round trips of {rtt * 1000:.2f} ms)")
    assert len(during) >= 20, f"{len(during)} live-partition starts during the stall"
    assert max(gaps) < min(1.0, GAP_ROUND_TRIPS * rtt), \
        f"the live partitions started nothing for {max(gaps):.2f} s ({max(gaps) / rtt:.0f} of the test's " \
        f"round trips of {rtt * 1000:.2f} ms) while another master stalled"
    assert alive

