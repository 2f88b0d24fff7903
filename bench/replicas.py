"""Enqueue throughput with ``[redis] wait_replicas = 1`` against 0: a master and one
replica on this machine (Redis 7.0 when installed, else Valkey), the Python client
enqueueing one by one from one thread, from 16 threads at once (their enqueues share round
trips), and with ``enqueue_many``. Medians of the rounds.

Usage: python bench/replicas.py [--jobs 20000] [--rounds 3] [--server auto|redis|valkey];
prints a markdown table and writes bench/results/replicas.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import redis

from runner import config as config_mod
from runner.client import Client, Request
from runner.runtime import Runtime
from runner.store.embedded import Server, bundled_binary

ROOT = Path(__file__).resolve().parent.parent
THREADS = 16


def _pair(kind: str, root: Path) -> tuple[Server, Server, str]:
    binary = shutil.which("redis-server") if kind in ("redis", "auto") else None
    binary = binary or bundled_binary()
    sync = ["--repl-diskless-sync-delay", "0"]
    master = Server(root / "master", binary=binary, appendonly=False, extra=sync).start()
    replica = Server(root / "replica", binary=binary, appendonly=False,
                     extra=[*sync, "--replicaof", "127.0.0.1", str(master.port)]).start()
    c = redis.Redis(port=master.port)
    deadline = time.monotonic() + 30
    while True:  # a replica acknowledges its first writes up to a second after the sync
        c.set("probe", 1)
        if int(c.wait(1, 100)) == 1:
            break
        if time.monotonic() > deadline:
            raise SystemExit("the replica did not catch up")
    info = c.info("server")
    c.close()
    name = f"valkey {info['valkey_version']}" if "valkey_version" in info else f"redis {info['redis_version']}"
    return master, replica, name


def _client(url: str, replicas: int, prefix: str) -> Client:
    text = (ROOT / "runner.toml").read_text().replace(
        'prefix = "runner"', f'prefix = "{prefix}"\nwait_replicas = {replicas}\nwait_timeout = 5', 1)
    path = Path(tempfile.mkdtemp(prefix="bench-replicas-")) / "runner.toml"
    path.write_text(text)
    shutil.copytree(ROOT / "functions", path.parent / "functions")
    shutil.copytree(ROOT / "schemas", path.parent / "schemas")
    return Client(Runtime.create(config_mod.load(path, env={"REDIS_URL": url})))


PAYLOAD = {"report_id": "r-1"}
TYPE = "refresh_report"


def one_by_one(c: Client, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        c.enqueue(TYPE, PAYLOAD)
    return n / (time.perf_counter() - t)


def threaded(c: Client, n: int) -> float:
    per = n // THREADS

    def run() -> None:
        for _ in range(per):
            c.enqueue(TYPE, PAYLOAD)

    threads = [threading.Thread(target=run) for _ in range(THREADS)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return per * THREADS / (time.perf_counter() - t)


def many(c: Client, n: int) -> float:
    reqs = [Request(TYPE, PAYLOAD) for _ in range(n)]
    t = time.perf_counter()
    c.enqueue_many(reqs)
    return n / (time.perf_counter() - t)


SCENARIOS: dict[str, tuple[Callable[[Client, int], float], float]] = {
    "one by one, 1 thread": (one_by_one, 0.25),  # a quarter of the jobs: it is the slowest
    f"{THREADS} threads at once": (threaded, 1.0),
    "enqueue_many": (many, 1.0),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--server", choices=["auto", "redis", "valkey"], default="auto")
    a = ap.parse_args()
    master, replica, name = _pair(a.server, Path(tempfile.mkdtemp(prefix="bench-replicas-")))
    rows: dict[str, dict[int, float]] = {}
    try:
        clients = {r: _client(master.url, r, f"bench{r}") for r in (0, 1)}
        for c in clients.values():  # warm: scripts loaded, connections open
            c.enqueue(TYPE, PAYLOAD)
        for label, (fn, share) in SCENARIOS.items():
            for r, c in clients.items():
                rates = []
                for _ in range(a.rounds):
                    rates.append(fn(c, int(a.jobs * share)))
                    c.runtime.redis.flushdb()
                rows.setdefault(label, {})[r] = statistics.median(rates)
                print(f"{label}, wait_replicas={r}: {rows[label][r]:,.0f} jobs/s", file=sys.stderr, flush=True)
    finally:
        replica.stop()
        master.stop()
    print(f"\n{name}, a master and one replica on this machine, medians of {a.rounds}\n")
    print("| enqueue | wait_replicas = 0 | wait_replicas = 1 | ratio |\n|---|---|---|---|")
    for label, by in rows.items():
        print(f"| {label} | {by[0]:,.0f} jobs/s | {by[1]:,.0f} jobs/s | {by[1] / by[0]:.2f} |")
    out = ROOT / "bench" / "results" / "replicas.json"
    out.write_text(json.dumps({"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                               "redis": name, "rounds": a.rounds, "jobs_per_s": rows}, indent=2) + "\n")
    print(f"\nwritten: {out}")


if __name__ == "__main__":
    main()
