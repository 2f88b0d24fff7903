"""One master of a 3-master Redis Cluster stalled (SIGSTOP) or slow (a delaying proxy)
beside a worker's own pace (docs/partitions.md, "A shard down"): a worker with
``prefetch = 0`` keeps starting the live partitions' jobs through a stall, a slow master's
jobs start from a worker's first call to it, and learning the layout again never waits
out a stalled node's socket timeout."""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from clusterkit import close_project, shard_project, shard_set, shards_fixture  # noqa: F401  (the shards fixtures)

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


def _quiet_master(p: Project, shards: Any, concurrency: int) -> tuple[Any, list[int], Any, int]:
    """Three partitions, prefetch 0, the scheduler's passes 10 s apart (none meets the
    stall: one would mark its master stalled at once, and the claims there would fail at
    once, never sent); the partitions, their masters' ports, a master to stall that holds
    neither the home partition (its tags are read every 10 s) nor the roster, and a live
    master's port."""
    from runner.store import roster

    p.write_config(vt=10, fast="partitions = 3", concurrency=concurrency, prefetch=0)
    cfg = p.root / "runner.toml"
    cfg.write_text(cfg.read_text().replace("scheduler_interval = 0.05", "scheduler_interval = 10"))
    r = p.runtime.redis
    parts = p.runtime.parts["fast"]
    ports = [r.get_node_from_key(k.ready).port for k in parts]
    assert len(set(ports)) == 3, ports
    busy = {r.get_node_from_key(p.runtime.keys["fast"].ready).port, r.get_node_from_key(roster.key(p.prefix)).port}
    stalled = next(s for s in shards if s.port in ports and s.port not in busy)
    return parts, ports, stalled, next(s.port for s in shards if s is not stalled)


@pytest.mark.parametrize("concurrency", [4, 1])
def test_prefetch_0_keeps_starting_the_live_partitions_jobs_through_a_stall(sproject: Project,
                                                                            shards: list[Server],
                                                                            concurrency: int) -> None:
    """``prefetch = 0``, 4 executors (or 1), 3 partitions on 3 masters, a node wait of 2 s:
    while a worker drains the queue, one master stops answering (SIGSTOP) for 3 s, and the
    live partitions' jobs keep starting: their longest gap spans at most GAP_ROUND_TRIPS of
    the test's own round trips to a live master (and under half the node wait); with one
    executor, under half the node wait (a claim out on the stalled master holds the only
    room until it is given up, ALONE_WAIT_S). Before, the fetcher's look at every
    partition's priorities waited out the node wait on the stalled master, and nothing
    was claimed meanwhile: with nothing claimed ahead, the live partitions' jobs stopped
    for about 2 s; with one executor, its claim on the stalled master held its room for
    the whole node wait (2.1 s)."""
    p = sproject
    p.write_config(vt=10, fast="partitions = 3", concurrency=concurrency, prefetch=0)
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
    assert len(during) >= (20 if concurrency > 1 else 10), f"{len(during)} live-partition starts during the stall"
    every = sorted(float(line.split()[2]) for i in ids for line in p.runs(i))
    assert all(len(p.runs(i)) <= 1 for i in ids), "a job ran twice"
    if concurrency == 1:  # (jobs of 20 ms: two starts closer than that ran at once)
        closest = min(b - a for a, b in itertools.pairwise(every))
        assert closest >= 0.019, f"two jobs ran at once on one executor ({closest:.3f} s apart)"
    bound = min(1.0, GAP_ROUND_TRIPS * rtt) if concurrency > 1 else 1.0
    assert max(gaps) < bound, \
        f"the live partitions started nothing for {max(gaps):.2f} s ({max(gaps) / rtt:.0f} of the test's " \
        f"round trips of {rtt * 1000:.2f} ms) while another master stalled"
    assert alive


# About 13 s (a worker's start through the slow master): run with -m slow; the bounded
# variant below runs by default.
@pytest.mark.slow
def test_a_slow_master_is_not_taken_for_stalled_at_a_worker_s_first_call(sproject: Project,
                                                                        shards: list[Server]) -> None:
    """One master of three answers every call 0.4 s late (a delaying proxy: slow, not
    stalled) from before a worker starts, with a node wait of 2 s: no call of the worker
    to it is given up (no warning names it), and its jobs, ready and delayed, run. Before,
    the scheduler's first call there (no round trip of it timed yet) was given up at
    0.3 s, the master marked stalled, and its partitions backed off."""
    from clusterkit import cluster_url, slow_master

    from conftest import Endpoint

    p = sproject
    r = p.runtime.redis
    parts = p.runtime.parts["fast"]
    port = {k.tag: r.get_node_from_key(k.ready).port for k in parts}
    slow = next(s for s in shards if s.port == port[parts[-1].tag])
    # Seeded with the live masters only: every process reaches the slow one as announced.
    p.server = Endpoint(cluster_url([s for s in shards if s is not slow]))  # type: ignore[assignment]
    p.write_config(vt=8, fast="partitions = 3", concurrency=4, prefetch=0)
    with slow_master(shards, slow, 0.2):
        c = p.client
        ids = [j.id for b in range(3)  # (each call's keyless jobs go to the next partition)
               for j in c.enqueue_many([Request("record", {"n": 10 * b + i}, delay_s=0.5 * i) for i in range(3)])]
        w = p.spawn_worker("fast")
        wait_for(lambda: all(p.runs(j) for j in ids), timeout=30, interval=0.1, what="every job to run")
        alive = w.poll() is None
        log = (p.root / "worker-0.log").read_text()
        p.stop_all()  # (before the proxy goes)
    named = [ln for ln in log.splitlines() if "Redis unavailable" in ln or "answer" in ln]
    assert not named, "a call to the slow master was given up:\n" + "\n".join(named)
    assert alive
    assert "Traceback" not in log, log[-3000:]


def test_a_first_call_waits_for_a_slow_master_and_gives_up_on_a_stalled_one(sproject: Project,
                                                                            shards: list[Server]) -> None:
    """A worker's first calls as the scheduler makes them (a 0.3 s wait stretched for a
    master known slow, a node wait of 2 s), from a client built while one master answers
    every call 0.4 s late (a delaying proxy): a command and a script not loaded there yet,
    each on a connection to be made, are answered, not given up. A master that stalls
    (SIGSTOP) is still given up at its first call, within about the 0.3 s. Before, a
    master's first call waited 0.3 s (no round trip of it timed yet), and it takes a
    handshake of three round trips and a script's load of two more: given up, and the
    slow master marked stalled."""
    from clusterkit import cluster_url, slow_master

    from runner.runtime import Runtime
    from runner.store.outage import OUTAGE
    from runner.store.records import lookup_keys

    from conftest import Endpoint

    p = sproject
    r = p.runtime.redis
    parts = p.runtime.parts["fast"]
    port = {k.tag: r.get_node_from_key(k.ready).port for k in parts}
    slow = next(s for s in shards if s.port == port[parts[-1].tag])
    stalled = next(s for s in shards if s.port == port[parts[0].tag])
    p.server = Endpoint(cluster_url([s for s in shards if s is not slow]))  # type: ignore[assignment]
    p.write_config(vt=8, fast="partitions = 3")
    with slow_master(shards, slow, 0.2):
        rt = Runtime.create(p.config())
        try:
            rt.scripts.node_wait_s = 2.0
            on_slow, on_stalled = parts[-1], parts[0]
            pool = rt.redis.get_redis_connection(rt.redis.get_node_from_key(on_slow.ready)).connection_pool
            with rt.scripts.waiting(0.3):
                pool.disconnect()  # (each call makes its connection, as a worker's first calls do)
                t = time.monotonic()
                rt.scripts.on_node(on_slow.ready, lambda: rt.redis.llen(on_slow.ready), what="a read")
                read_s = time.monotonic() - t
                pool.disconnect()
                t = time.monotonic()
                rt.scripts.call("lookup", lookup_keys(on_slow, "none"), ("none",))
                script_s = time.monotonic() - t
                assert stalled.proc is not None
                os.kill(stalled.proc.pid, signal.SIGSTOP)
                try:
                    t = time.monotonic()
                    with pytest.raises(OUTAGE):
                        rt.scripts.on_node(on_stalled.ready, lambda: rt.redis.llen(on_stalled.ready), what="a read")
                    given_up_s = time.monotonic() - t
                finally:
                    os.kill(stalled.proc.pid, signal.SIGCONT)
            print(f"slow master: a first read {read_s:.2f} s, a first script {script_s:.2f} s; "
                  f"a stalled master given up in {given_up_s:.2f} s")
            assert given_up_s < 1.0, f"a stalled master's first call was given up after {given_up_s:.2f} s"
        finally:
            rt.close()


def test_learning_the_layout_again_does_not_wait_out_a_stalled_seed(sproject: Project,
                                                                    shards: list[Server]) -> None:
    """The first master of the URL stalls (SIGSTOP), and another master dies (SIGKILL): a
    keyed enqueue to the dead one, refused as it connects, learns the layout again (the
    slot may have a new master) and is answered within the enqueue's bound (2 s) and a
    little. Before, the layout was asked of the URL's masters in turn, the stalled one
    first, and the enqueue waited out its 15 s socket timeout."""
    from runner.errors import RedisUnavailable
    from runner.store import routing

    p = sproject
    c = p.client
    r = p.runtime.redis
    parts = p.runtime.parts["fast"]
    stalled = shards[0]  # (the first seed of the project's URL)
    ports = [r.get_node_from_key(k.ready).port for k in parts]
    other = next(s for s in shards if s is not stalled and s.port in ports)
    keys = (f"k{n}" for n in range(10_000) if ports[routing.partition_of(f"i:record:k{n}", len(parts))] == other.port)
    c.enqueue("record", {"n": 0}, idempotency_key=next(keys))  # (a kept connection to that master)
    assert stalled.proc is not None
    os.kill(stalled.proc.pid, signal.SIGSTOP)
    try:
        other.stop(kill=True)
        t = time.monotonic()
        try:
            c.enqueue("record", {"n": 1}, idempotency_key=next(keys))
            out = "written"
        except RedisUnavailable as exc:
            out = str(exc)
        took = time.monotonic() - t
    finally:
        os.kill(stalled.proc.pid, signal.SIGCONT)
    print(f"the enqueue to the dead master: {took:.2f} s -> {out}")
    assert took < 3.0, f"an enqueue waited {took:.1f} s to learn the layout with a seed stalled"



def test_prefetch_0_starts_live_jobs_sent_one_at_a_time_while_a_claim_waits_on_a_stall(
        sproject: Project, shards: list[Server]) -> None:
    """``prefetch = 0``, 4 executors, 3 partitions on 3 masters, a node wait of 2 s, and
    an idle worker: one master stops answering (SIGSTOP), the worker's next round of
    claims (at its idle wake-up, within a second) sends one there, which stays out until
    it is given up, and then jobs sent one at a time to the live partitions start about
    as soon as they are sent: the longest wait spans at most GAP_ROUND_TRIPS of the
    test's own round trips to a live master (and under half the node wait). Before, the
    claim out held the room of every executor (the worker was idle as it was sent), and
    the live partitions' jobs waited for it to be given up: about 2 s."""
    from runner.store import routing

    p = sproject
    parts, ports, stalled, live_port = _quiet_master(p, shards, concurrency=4)
    keys = (f"k{n}" for n in range(100_000)  # (keyed to a live partition: the producer never meets the stall)
            if ports[routing.partition_of(f"i:record:k{n}", len(parts))] != stalled.port)
    c = p.client
    w = p.spawn_worker("fast")
    first = c.enqueue("record", {"n": -1}, idempotency_key=next(keys)).id
    wait_for(lambda: p.runs(first), timeout=30, interval=0.05, what="the worker to start")
    sent: dict[str, float] = {}
    pings = _Pings(live_port)
    assert stalled.proc is not None
    os.kill(stalled.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(1.3)  # (the idle worker's round of claims, once a second, meets the stall)
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            t = time.time()
            sent[c.enqueue("record", {"n": len(sent)}, idempotency_key=next(keys)).id] = t
            time.sleep(0.05)
    finally:
        os.kill(stalled.proc.pid, signal.SIGCONT)
    rtt = pings.stop()
    wait_for(lambda: all(p.runs(j) for j in sent), timeout=30, interval=0.1, what="every job to run")
    alive = w.poll() is None
    late = sorted(float(p.runs(j)[0].split()[2]) - t for j, t in sent.items())
    print(f"{len(late)} jobs sent one at a time during the stall: started late, median {late[len(late) // 2]:.3f} s, "
          f"worst {late[-1]:.3f} s ({late[-1] / rtt:.0f} round trips of {rtt * 1000:.2f} ms)")
    assert len(late) >= 10
    assert late[-1] < min(1.0, GAP_ROUND_TRIPS * rtt), \
        f"a live partition's job started {late[-1]:.2f} s after it was sent ({late[-1] / rtt:.0f} of the test's " \
        f"round trips of {rtt * 1000:.2f} ms) while a claim waited on a stalled master"
    assert alive


def test_a_stalled_master_holds_up_no_live_partition_s_settles(sproject: Project, shards: list[Server]) -> None:
    """3 partitions on 3 masters, a node wait of 2 s: jobs on every partition have just
    ended when one master stops answering (SIGSTOP) for 3 s, one of its jobs ends during
    the stall, and jobs sent one at a time to the live partitions meanwhile are recorded
    done about as soon as their handlers end: the longest wait, from a handler's start to
    its record's finished_at, spans at most GAP_ROUND_TRIPS of the test's own round trips
    to a live master (and under half the node wait). The stalled partition's job settles
    once its master is back, done once, run once. Before, the settler waited on its own
    thread for the stalled master twice over: the batch holding that partition's
    settlement waited for every master, up to the node wait (2 s), and the add of the
    landed acks' figures, one pipeline over every partition's hashes, waited out the
    stall (its socket timeout is 15 s). Either alone left live jobs recorded done about
    2 s late (with the two, 2.6 s in this test; a 20 s stall, 6.5 s at the median and up
    to 17 s)."""
    from runner.store import routing

    p = sproject
    parts, ports, stalled, live_port = _quiet_master(p, shards, concurrency=8)
    victim = ports.index(stalled.port)

    def keyed(live: bool) -> Iterator[str]:
        return (f"k{n}" for n in range(100_000)
                if (routing.partition_of(f"i:record:k{n}", len(parts)) == victim) is not live)

    live_keys, victim_keys = keyed(True), keyed(False)
    c = p.client
    w = p.spawn_worker("fast")
    first = c.enqueue("record", {"n": -1}, idempotency_key=next(live_keys)).id
    wait_for(lambda: p.runs(first), timeout=30, interval=0.05, what="the worker to start")
    on_victim = [c.enqueue("record", {"n": -2 - i}, idempotency_key=next(victim_keys)).id for i in range(20)]
    on_victim.append(c.enqueue("record", {"n": -100, "sleep": 0.5}, idempotency_key=next(victim_keys)).id)

    def finished(j: str) -> float | None:
        got = c.get(j).as_dict().get("finished_at")
        return float(got) if isinstance(got, (int, float)) else None

    wait_for(lambda: all(finished(j) for j in on_victim[:-1]) and p.runs(on_victim[-1]),
             timeout=30, interval=0.01, what="the stalled partition's jobs to end")
    sent: list[str] = []
    pings = _Pings(live_port)
    assert stalled.proc is not None
    os.kill(stalled.proc.pid, signal.SIGSTOP)
    t0 = time.time()
    try:
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            sent.append(c.enqueue("record", {"n": len(sent)}, idempotency_key=next(live_keys)).id)
            time.sleep(0.02)
    finally:
        os.kill(stalled.proc.pid, signal.SIGCONT)
    t1 = time.time()
    rtt = pings.stop()
    wait_for(lambda: all(finished(j) for j in [*sent, *on_victim]), timeout=30, interval=0.1,
             what="every job to be recorded done")
    alive = w.poll() is None
    p.stop_all()
    late = sorted(finished(j) - float(p.runs(j)[0].split()[2])  # type: ignore[operator]
                  for j in sent if t0 < float(p.runs(j)[0].split()[2]) < t1 - 0.2)
    print(f"{len(late)} live jobs during the stall: recorded done after their start, median "
          f"{late[len(late) // 2]:.3f} s, worst {late[-1]:.3f} s ({late[-1] / rtt:.0f} round trips of "
          f"{rtt * 1000:.2f} ms)")
    assert len(late) >= 20
    assert late[-1] < min(1.0, GAP_ROUND_TRIPS * rtt), \
        f"a live partition's job was recorded done {late[-1]:.2f} s after its start ({late[-1] / rtt:.0f} of " \
        f"the test's round trips of {rtt * 1000:.2f} ms) while another master stalled"
    held = on_victim[-1]
    assert len(p.runs(held)) == 1 and c.get(held).status == "done", (p.runs(held), c.get(held).as_dict())
    assert alive
    log = (p.root / "worker-0.log").read_text()
    assert "Traceback" not in log and "unexpected error" not in log, log[-3000:]
