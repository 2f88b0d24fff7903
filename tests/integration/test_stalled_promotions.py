"""A producer whose master is replaced while it stalls learns the promoted replica within
about a second (NodeLanes.relearn), however the old master stalls: a second master
stopping while the first is marked holds no read of the layout for its socket timeout,
and a master held by a long script (answering BUSY) stays marked until the promotion is
learnt (docs/partitions.md, "A shard down")."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import redis
from clusterkit import cluster_url, local_cluster, replicas_connected, slot_master
from redis.backoff import NoBackoff
from redis.retry import Retry

from runner.store.embedded import Server

from conftest import Endpoint, Project, make_project, wait_for


class _Producer:
    """A producer's Client of its own on ``order`` (the URL's masters in that order) that
    only enqueues, each job to a partition of ``victim``."""

    def __init__(self, p: Project, order: list[Server], victim: Server) -> None:
        from runner.client import Client
        from runner.runtime import Runtime
        from runner.store import routing

        cfg = p.config()
        self.runtime = Runtime.create(replace(cfg, redis=replace(cfg.redis, url=cluster_url(order))))
        self.client = Client(self.runtime)
        r = self.runtime.redis
        parts = [i for i, k in enumerate(self.runtime.parts["fast"])
                 if r.get_node_from_key(k.ready).port == victim.port]
        assert parts, "no partition on the master to stall"
        self.slot = r.keyslot(self.runtime.parts["fast"][parts[0]].ready)
        n = len(self.runtime.parts["fast"])
        self.keys: Iterator[str] = (f"k{i}" for i in range(10**7) if routing.partition_of(f"i:record:k{i}", n) in parts)

    def enqueue(self) -> str:
        """"ok", or the error's text."""
        try:
            self.client.enqueue("record", {"n": 0}, idempotency_key=next(self.keys))
        except Exception as exc:  # (any refusal: an outage of that partition)
            return f"{type(exc).__name__}: {exc}"
        return "ok"

    def close(self) -> None:
        self.runtime.close()


def _first_accepted_after(producer: _Producer, witness: Server, victim: Server, t0: float, limit_s: float,
                          on_tick: object = None) -> tuple[float, float | None, list[tuple[float, str]]]:
    """Enqueue every 0.1 s until the promotion of ``victim``'s replica shows in ``witness``'s
    CLUSTER SLOTS and an enqueue after it is accepted, or ``limit_s`` past the promotion:
    (the promotion's time, the first accepted enqueue's from it or None, every try)."""
    at = 0.0
    got: list[tuple[float, str]] = []
    while time.monotonic() - t0 < 40 and not (at and time.monotonic() - t0 > at + limit_s):
        if callable(on_tick):
            on_tick()
        if not at and slot_master(witness.port, producer.slot) not in (0, victim.port):
            at = time.monotonic() - t0
        t = time.monotonic() - t0
        outcome = producer.enqueue()
        got.append((t, outcome))
        if at and t >= at and outcome == "ok":
            return at, t - at, got
        time.sleep(0.1)
    return at, None, got


def test_a_second_master_stalling_holds_no_read_of_the_layout(tmp_path: Path) -> None:
    """Five masters with a replica each: A stops (SIGSTOP) and the producer marks it; B
    stops 2.5 s later, first in the producer's URL and never called by it (not marked).
    Once A's replica is promoted, the producer's enqueues to A's partitions are accepted
    within about a second (at most 4 s here). Before, the producer's read of the layout
    asked B first and waited out its 15 s socket timeout, and no read started again
    until it ended: the promotion was learnt about 14 s late."""
    with local_cluster(tmp_path / "cluster", masters=5, replicas=1, node_timeout_ms=2000,
                       extra=["--cluster-require-full-coverage", "no"]) as servers:
        masters = servers[:5]
        wait_for(lambda: replicas_connected(masters), timeout=30, interval=0.1, what="every master's replica")
        p = make_project(tmp_path / "p", Endpoint(cluster_url(masters)))
        p.write_config(vt=10, fast="partitions = 5")
        r = p.runtime.redis
        home = r.get_node_from_key(p.runtime.keys["fast"].ready).port
        ports = {r.get_node_from_key(k.ready).port for k in p.runtime.parts["fast"]}
        a = next(s for s in masters if s.port != home and s.port in ports)
        b = next(s for s in masters if s.port not in (home, a.port))
        witness = next(s for s in masters if s not in (a, b))
        producer = _Producer(p, [b, a, *(s for s in masters if s not in (a, b))], a)
        assert a.proc is not None and b.proc is not None
        try:
            assert producer.enqueue() == "ok"  # (its connections made)
            os.kill(a.proc.pid, signal.SIGSTOP)
            t0 = time.monotonic()
            stopped_b = [False]

            def stop_b() -> None:
                if not stopped_b[0] and time.monotonic() - t0 > 2.5:
                    assert producer.runtime.scripts.nodes.stalled(f"127.0.0.1:{a.port}"), "A not marked"
                    os.kill(b.proc.pid, signal.SIGSTOP)
                    stopped_b[0] = True

            at, after, got = _first_accepted_after(producer, witness, a, t0, limit_s=8.0, on_tick=stop_b)
        finally:
            for s in (a, b):
                os.kill(s.proc.pid, signal.SIGCONT)
            producer.close()
            p.stop_all()
            p.runtime.close()
    assert stopped_b[0] and at, ("A's replica was not promoted", got)
    print(f"\npromoted at {at:.2f} s; first enqueue accepted {after} s after it")
    assert after is not None and after < 4.0, (at, after, got)


SCRIPT = ("local t=redis.call('TIME') local s=tonumber(t[1]) while true do local n=redis.call('TIME') "
          "if tonumber(n[1])-s>=30 then break end end return 1")


def test_a_master_held_by_a_long_script_is_learnt_replaced(tmp_path: Path) -> None:
    """A master runs a long script: silent for its first 5 s (busy-reply-threshold), in
    which the cluster promotes its replica, then BUSY to everything. The producer that
    was calling it has its enqueues to that master's partitions accepted by the promoted
    replica within about a second of the promotion (at most 4 s here). Before, the old
    master's BUSY answer to the probe's PING cleared its stalled mark, so the layout was
    never read again, and every new connection's handshake was answered BUSY, not MOVED:
    0 enqueues of 44 were accepted over 10 s, until the script ended."""
    with local_cluster(tmp_path / "cluster", masters=3, replicas=1, node_timeout_ms=2000) as servers:
        masters = servers[:3]
        wait_for(lambda: replicas_connected(masters), timeout=30, interval=0.1, what="every master's replica")
        p = make_project(tmp_path / "p", Endpoint(cluster_url(masters)))
        p.write_config(vt=10, fast="partitions = 6")
        r = p.runtime.redis
        home = r.get_node_from_key(p.runtime.keys["fast"].ready).port
        victim = next(s for s in masters if s.port != home)
        witness = next(s for s in masters if s.port == home)
        producer = _Producer(p, masters, victim)
        side = redis.Redis(port=victim.port, socket_timeout=60)
        spinner = threading.Thread(target=lambda: _quietly(lambda: side.eval(SCRIPT, 0)), daemon=True)
        busy = [0.0]
        try:
            assert producer.enqueue() == "ok"  # (its connections made)
            spinner.start()
            t0 = time.monotonic()

            stop = threading.Event()
            at = 0.0

            def watch() -> None:  # (on a thread of its own: the producer's tries go on meanwhile)
                nonlocal at
                while not stop.is_set():
                    if not busy[0] and _answers_busy(victim):
                        busy[0] = time.monotonic() - t0
                    if not at and slot_master(witness.port, producer.slot) not in (0, victim.port):
                        at = time.monotonic() - t0
                    stop.wait(0.05)

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            got: list[tuple[float, float, str]] = []  # (started, ended, outcome)
            # Until 4 s into the old master's BUSY answers (or 40 s).
            while time.monotonic() - t0 < 40 and not (busy[0] and time.monotonic() - t0 > busy[0] + 4.0):
                t = time.monotonic() - t0
                outcome = producer.enqueue()
                got.append((t, time.monotonic() - t0, outcome))
                time.sleep(0.1)
            stop.set()
            watcher.join(10)
        finally:
            killer = redis.Redis(port=victim.port, socket_timeout=5)
            wait_for(lambda: _killed(killer), timeout=20, what="the script to be killed")
            killer.close()
            spinner.join(10)
            side.close()
            producer.close()
            p.stop_all()
            p.runtime.close()
    assert at and busy[0], ("the replica was not promoted, or its old master never answered BUSY", busy, got)
    last = max((end for _, end, outcome in got if outcome != "ok"), default=0.0)
    print(f"\npromoted at {at:.2f} s; BUSY from {busy[0]:.2f} s; the last refused enqueue ended "
          f"{last - at:+.2f} s from the promotion")
    assert any(outcome != "ok" for *_, outcome in got), got  # (the stall was seen)
    assert sum(1 for t, _, outcome in got if t > busy[0] + 1.0) >= 10, got
    assert last - at < 4.0, (at, busy, [g for g in got if g[2] != "ok"][-3:])


def _quietly(fn: Callable[[], object]) -> None:
    with contextlib.suppress(redis.RedisError):
        fn()


def _answers_busy(s: Server) -> bool:
    c = redis.Redis(port=s.port, socket_timeout=0.3, retry=Retry(NoBackoff(), 0))
    try:
        c.ping()
    except redis.ResponseError as exc:
        return str(exc).startswith("BUSY")
    except redis.RedisError:
        return False
    finally:
        c.close()
    return False


def _killed(c: redis.Redis) -> bool:
    try:
        c.script_kill()
    except redis.ResponseError as exc:
        return "No scripts in execution" in str(exc)
    except redis.RedisError:
        return False
    return True
