"""A Sentinel-managed group, all local: a master, one or two replicas and three sentinels
(quorum 2), and a failover round: producers enqueue continuously through
``redis+sentinel://``, the master fails (SIGKILL, or stopped with SIGSTOP and resumed a
chosen time after Sentinel promoted a replica), and every job answered OK is looked for
on the new master afterwards. ``worker_round`` runs a worker through a stall instead and
counts the jobs that ran twice."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from runner.client import Client, Request
from runner.errors import NotReplicated, RedisUnavailable
from runner.store.embedded import Server, bundled_binary, free_port

from conftest import Endpoint, Project, make_project, wait_for

SERVICE = "jobs"
SENTINELS = 3
PRODUCERS = 4


@dataclass
class Group:
    master: Server
    replica: Server
    sentinels: list[subprocess.Popen[bytes]]
    ports: list[int]
    others: list[Server] = field(default_factory=list)  # replicas beside ``replica``

    @property
    def replicas(self) -> list[Server]:
        return [self.replica, *self.others]

    @property
    def url(self) -> str:
        return "redis+sentinel://" + ",".join(f"127.0.0.1:{p}" for p in self.ports) + f"/{SERVICE}"

    def ask(self, port: int, *args: Any) -> Any:
        c = redis.Redis(port=port, decode_responses=True, socket_timeout=2)
        try:
            return c.execute_command(*args)
        finally:
            c.close()

    def master_port(self) -> int | None:
        """The master as the sentinels see it (the first that answers)."""
        for port in self.ports:
            with suppress(redis.RedisError):
                return int(self.ask(port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)[1])
        return None

    def ready(self) -> bool:
        """Every sentinel sees the master, the replica and the other sentinels, and the
        replica has acknowledged the master's writes (a replica acks a second after sync)."""
        try:
            for port in self.ports:
                flat = self.ask(port, "SENTINEL", "MASTER", SERVICE)
                info = dict(zip(flat[::2], flat[1::2], strict=True))
                if int(info["num-other-sentinels"]) != SENTINELS - 1 or \
                        int(info["num-slaves"]) != len(self.replicas):
                    return False
                if int(info["port"]) != self.master.port:
                    return False
            m = redis.Redis(port=self.master.port)
            try:
                m.set("probe", 1)
                return int(m.wait(len(self.replicas), 100)) == len(self.replicas)
            finally:
                m.close()
        except (redis.RedisError, KeyError, IndexError):
            return False


# Sentinel's periods for the default run (SENTINEL DEBUG): it looks at a returning master
# every INFO_PERIOD_MS and demotes it PUBLISH_PERIOD_MS * 4 after it reported itself master,
# about 3 s instead of about 10 s. The old master still takes writes for those seconds: a
# connection or a worker that did not leave it writes there thousands of times all the
# same. The full runs keep Sentinel's own periods (the tables docs/deploy.md reports).
QUICK_PERIODS = {"info-period": 1000, "publish-period": 500}


@contextmanager
def sentinel_group(root: Path, down_after_ms: int = 500, replicas: int = 1,
                   periods: dict[str, int] | None = None) -> Iterator[Group]:
    binary = bundled_binary()
    # No 5 s wait for more replicas before a full sync (the first, and the one after a failover).
    sync = ["--repl-diskless-sync-delay", "0"]
    master = Server(root / "master", binary=binary, extra=sync).start()
    replica = Server(root / "replica", binary=binary,
                     extra=[*sync, "--replicaof", "127.0.0.1", str(master.port)]).start()
    others = [Server(root / f"replica{i}", binary=binary,
                     extra=[*sync, "--replicaof", "127.0.0.1", str(master.port)]).start()
              for i in range(1, replicas)]
    procs: list[subprocess.Popen[bytes]] = []
    ports: list[int] = []
    try:
        for i in range(SENTINELS):
            port = free_port()
            d = root / f"sentinel{i}"
            d.mkdir(parents=True)
            conf = d / "sentinel.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {d}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {master.port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {down_after_ms}\n"
                f"sentinel failover-timeout {SERVICE} 5000\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
            )
            log = open(d / "sentinel.log", "ab")  # noqa: SIM115 - the child holds it
            procs.append(subprocess.Popen([binary, str(conf), "--sentinel"], stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True))
            log.close()
            ports.append(port)
        g = Group(master, replica, procs, ports, others)
        if periods:
            args = [str(x) for kv in periods.items() for x in kv]
            for port in ports:
                wait_for(lambda port=port: _answers(g, port, "SENTINEL", "DEBUG", *args), timeout=30,
                         interval=0.05, what=f"sentinel {port} to take its periods")
        wait_for(g.ready, timeout=30, interval=0.1, what="three sentinels that see master and replica")
        yield g
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
        for s in (*others, replica, master):
            if s.proc is not None:
                with suppress(ProcessLookupError):
                    os.kill(s.proc.pid, signal.SIGCONT)
            s.stop(kill=True)


def _answers(g: Group, port: int, *args: Any) -> bool:
    try:
        g.ask(port, *args)
    except redis.ConnectionError:
        return False
    return True


@dataclass
class Round:
    """One failover: jobs answered OK, and those of them the new master lacks."""

    wait_replicas: int
    how: str
    replicas: int = 1
    resume_after_s: float | None = None  # "stall": resumed this long after the promotion
    ok: int = 0
    missing: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    failover_s: float = 0.0  # from the fault to Sentinel naming the replica master
    demoted_s: float = 0.0  # "stall": from the old master's resumption to its demotion
    ok_after: int = 0  # answered OK once the new master was in place

    HEADER = ("| master | replicas | wait_replicas | answered OK | missing after | NotReplicated | RedisUnavailable "
              "| failover s | old master writable s |\n|---|---|---|---|---|---|---|---|---|")

    def row(self) -> str:
        fault = "SIGKILL" if self.how == "kill" else "stopped 3 s" if self.resume_after_s is None else \
            f"stopped, resumed {self.resume_after_s:g} s after the promotion"
        demoted = f"{self.demoted_s:.1f}" if self.how == "stall" else "-"
        return (f"| {fault} | {self.replicas} | {self.wait_replicas} | {self.ok} | {self.missing} | "
                f"{self.refused['NotReplicated']} | {self.refused['RedisUnavailable']} | {self.failover_s:.1f} "
                f"| {demoted} |")


class Producers:
    """PRODUCERS threads enqueueing through one Client as fast as they can; every OK id is
    kept, every refusal counted by kind (a producer backs off 10 ms after one)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.ok: list[str] = []
        self.refused: Counter[str] = Counter()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(PRODUCERS)]

    def _run(self, i: int) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            try:
                self.ok.append(self.client.enqueue("record", {"n": i * 10_000_000 + n}).id)
            except (NotReplicated, RedisUnavailable) as exc:
                self.refused[type(exc).__name__] += 1
                time.sleep(0.01)

    def __enter__(self) -> Producers:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)


def _durable(p: Project, replicas: int, timeout_s: float) -> None:
    path = p.root / "runner.toml"
    path.write_text(path.read_text().replace(
        "[redis]\n", f"[redis]\nwait_replicas = {replicas}\nwait_timeout = {timeout_s}\n", 1))
    p._runtime = None


def missing_on(port: int, p: Project, ids: list[str]) -> int:
    """How many of ``ids`` have no job record on the server at ``port`` (no worker runs,
    so every job accepted is still queued there with its record)."""
    k = p.keys()
    c = redis.Redis(port=port, decode_responses=True)
    try:
        gone = 0
        for i in range(0, len(ids), 1000):
            pipe = c.pipeline(transaction=False)
            for job_id in ids[i:i + 1000]:
                pipe.exists(k.job(job_id))
            gone += sum(1 for n in pipe.execute() if not n)
        return gone
    finally:
        c.close()


def failover_round(root: Path, wait_replicas: int, how: str = "kill", warmup: int = 2000,
                   timeout_s: float = 0.5, stall_s: float = 3.0, replicas: int = 1,
                   resume_after_s: float | None = None, periods: dict[str, int] | None = None) -> Round:
    """One round on a fresh group. ``how``: "kill" SIGKILLs the master; "stall" stops it
    (SIGSTOP) until Sentinel has promoted a replica, for at least ``stall_s`` (or for
    ``resume_after_s`` after the promotion), then lets it run on: it comes back believing
    it is the master until Sentinel demotes it."""
    out = Round(wait_replicas, how, replicas, resume_after_s)
    with sentinel_group(root / "group", replicas=replicas, periods=periods) as g:
        p = make_project(root / "p", Endpoint(g.url))  # type: ignore[arg-type]
        _durable(p, wait_replicas, timeout_s)
        client = p.client
        try:
            with Producers(client) as prod:
                wait_for(lambda: len(prod.ok) >= warmup, timeout=30, interval=0.01, what="the warm-up")
                assert g.master.proc is not None
                t0 = time.monotonic()
                if how == "kill":
                    g.master.stop(kill=True)
                else:
                    os.kill(g.master.proc.pid, signal.SIGSTOP)
                old = g.master.port
                wait_for(lambda: g.master_port() not in (None, old), timeout=30, interval=0.01,
                         what="Sentinel to promote a replica")
                out.failover_s = time.monotonic() - t0
                if how == "stall":
                    pause = stall_s - out.failover_s if resume_after_s is None else resume_after_s
                    time.sleep(max(0.0, pause))  # the stall itself, not a sync
                    os.kill(g.master.proc.pid, signal.SIGCONT)
                    resumed = time.monotonic()
                    # Until Sentinel demotes it, the old master takes writes on the
                    # connections that still point at it.
                    wait_for(lambda: _role(g.master.port) == "slave", timeout=60, interval=0.05,
                             what="Sentinel to demote the old master")
                    out.demoted_s = time.monotonic() - resumed
                promoted = len(prod.ok)
                # A moment on the new master (wait_replicas = 1 has no replica there now:
                # each of those enqueues is refused, as it should be).
                deadline = time.monotonic() + 1.0
                wait_for(lambda: time.monotonic() > deadline, timeout=5, interval=0.05)
            out.ok = len(prod.ok)
            out.ok_after = out.ok - promoted
            out.refused = prod.refused
            new = g.master_port()
            assert new is not None
            if how == "stall":
                # The old master (and any other replica) resynced from the new one: let them
                # finish, so what only they held is gone.
                for s in [g.master, *g.replicas]:
                    if s.port != new:
                        wait_for(lambda s=s: _synced(s.port), timeout=30, interval=0.05, what="the resync")
            out.missing = missing_on(new, p, prod.ok)
        finally:
            if p._runtime is not None:
                p._runtime.close()
    return out


def _role(port: int) -> str | None:
    c = redis.Redis(port=port, decode_responses=True, socket_timeout=1)
    try:
        return str(c.info("replication")["role"])
    except redis.RedisError:
        return None
    finally:
        c.close()


def _synced(port: int) -> bool:
    c = redis.Redis(port=port, decode_responses=True, socket_timeout=1)
    try:
        info = c.info("replication")
        return info.get("master_link_status") == "up" and not info.get("master_sync_in_progress")
    except redis.RedisError:
        return False
    finally:
        c.close()


@dataclass
class WorkerRound:
    """A worker through a stall: the jobs queued before, and how many of them ran twice."""

    jobs: int
    twice: int = 0
    failover_s: float = 0.0
    demoted_s: float = 0.0

    def row(self) -> str:
        return f"| {self.jobs} | {self.twice} | {self.failover_s:.1f} | {self.demoted_s:.1f} |"


def _runs(p: Project) -> Counter[str]:
    return Counter({f.name: len(f.read_text().splitlines()) for f in p.records.iterdir()})


def worker_round(root: Path, stall_s: float = 3.0, jobs: int = 12_000,
                 periods: dict[str, int] | None = None) -> WorkerRound:
    """``jobs`` queued (wait_replicas = 1, one replica), a worker running them, and the
    master stopped (SIGSTOP) for ``stall_s`` mid-way: Sentinel promotes the replica, the
    old master resumes, and the worker must not go on settling there (its acks would be
    wiped by the resync, and the jobs run again). Counts the jobs that ran twice."""
    out = WorkerRound(jobs)
    with sentinel_group(root / "group", periods=periods) as g:
        p = make_project(root / "p", Endpoint(g.url))  # type: ignore[arg-type]
        p.write_config(vt=5, concurrency=8, prefetch=8, batch=64)
        _durable(p, 1, 1.0)
        try:
            reqs = [Request("record", {"n": i, "sleep": 0.001}) for i in range(jobs)]
            for i in range(0, jobs, 1000):
                p.client.enqueue_all(reqs[i:i + 1000])
            p.spawn_worker("fast")
            wait_for(lambda: sum(_runs(p).values()) >= jobs // 10, timeout=60, interval=0.05,
                     what="the worker to be under way")
            assert g.master.proc is not None
            t0 = time.monotonic()
            os.kill(g.master.proc.pid, signal.SIGSTOP)
            old = g.master.port
            wait_for(lambda: g.master_port() not in (None, old), timeout=30, interval=0.01,
                     what="Sentinel to promote the replica")
            out.failover_s = time.monotonic() - t0
            time.sleep(max(0.0, stall_s - out.failover_s))
            os.kill(g.master.proc.pid, signal.SIGCONT)
            resumed = time.monotonic()
            wait_for(lambda: _role(g.master.port) == "slave", timeout=60, interval=0.05,
                     what="Sentinel to demote the old master")
            out.demoted_s = time.monotonic() - resumed
            wait_for(lambda: _synced(g.master.port), timeout=30, interval=0.05, what="the resync")
            new = redis.Redis(port=g.replica.port, decode_responses=True)
            k = p.keys()
            try:
                wait_for(lambda: new.llen(k.ready) == 0 and new.zcard(k.leases) == 0 and new.zcard(k.scheduled) == 0,
                         timeout=120, interval=0.2, what="every job to end")
            finally:
                new.close()
            out.twice = sum(1 for n in _runs(p).values() if n > 1)
        finally:
            p.stop_all()
            if p._runtime is not None:
                p._runtime.close()
    return out
