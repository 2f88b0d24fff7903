"""One queue drained on a local 3-master Redis Cluster with 1 partition and with 3: the
drain rate, and each master's share of the commands and of the Redis CPU (INFO
commandstats and cpu, read before and after). Needs Debian's redis-server and redis-cli.

Usage: python bench/partitions.py [--jobs 20000] [--workers 2]; prints a markdown table
and writes bench/results/partitions.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from runner import config as config_mod
from runner.client import Client, Request
from runner.runtime import Runtime
from runner.store.embedded import Server, free_port

ROOT = Path(__file__).resolve().parent.parent


def _port() -> int:
    while True:  # a free port whose cluster bus port (+10000) is free too
        port = free_port()
        if port + 10000 <= 65535:
            return port


def start_cluster(root: Path) -> list[Server]:
    binary, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if binary is None or cli is None:
        raise SystemExit("needs redis-server and redis-cli")
    servers = []
    for i in range(3):
        d = root / f"node{i}"
        servers.append(Server(d, port=_port(), binary=binary, appendonly=False, extra=[
            "--cluster-enabled", "yes", "--cluster-config-file", str(d / "nodes.conf")]).start())
    subprocess.run([cli, "--cluster", "create", *[f"127.0.0.1:{s.port}" for s in servers],
                    "--cluster-replicas", "0", "--cluster-yes"], check=True, capture_output=True, timeout=60)
    deadline = time.monotonic() + 30
    while any(redis.Redis(port=s.port, decode_responses=True).cluster("info")["cluster_state"] != "ok"
              for s in servers):
        if time.monotonic() > deadline:
            raise SystemExit("the cluster did not come up")
        time.sleep(0.1)
    return servers


def _node_figures(servers: list[Server]) -> list[tuple[float, int]]:
    out = []
    for s in servers:
        c = redis.Redis(port=s.port, decode_responses=True)
        cpu: dict[str, Any] = c.info("cpu")
        stats: dict[str, Any] = c.info("commandstats")
        calls = sum(int(v["calls"]) for k, v in stats.items() if k not in ("cmdstat_info", "cmdstat_cluster|info"))
        out.append((float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]), calls))
        c.close()
    return out


def run(servers: list[Server], partitions: int, jobs: int, workers: int, work: Path) -> dict[str, Any]:
    proj = work / f"p{partitions}"
    shutil.copytree(ROOT / "tests" / "fixtures" / "functions", proj / "functions")
    shutil.copytree(ROOT / "tests" / "fixtures" / "schemas", proj / "schemas")
    (proj / "runner.toml").write_text(
        f'[redis]\nprefix = "bench{partitions}"\n[queues.fast]\npartitions = {partitions}\nconcurrency = 16\n'
        '[queues.slow]\n[log]\nlevel = "WARNING"\n')
    url = "redis+cluster://" + ",".join(f"127.0.0.1:{s.port}" for s in servers)
    env = {**os.environ, "REDIS_URL": url, "RECORD_DIR": str(proj)}
    client = Client(Runtime.create(config_mod.load(proj / "runner.toml", env=env)))
    client.enqueue_many([Request("noop", {}) for _ in range(jobs)])
    before = _node_figures(servers)
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-m", "runner.cli", "--config", str(proj / "runner.toml"), "worker",
                               "--queue", "fast"], cwd=proj, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for _ in range(workers)]
    try:
        while client.stats()["fast"]["ready"] + client.stats()["fast"]["processing"] > 0:
            time.sleep(0.05)
        took = time.perf_counter() - t0
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
        client.runtime.close()
    after = _node_figures(servers)
    cpu = [a[0] - b[0] for a, b in zip(after, before, strict=True)]
    calls = [a[1] - b[1] for a, b in zip(after, before, strict=True)]
    return {"partitions": partitions, "jobs": jobs, "workers": workers, "seconds": round(took, 2),
            "jobs_per_s": round(jobs / took), "cpu_s_per_master": [round(x, 2) for x in cpu],
            "commands_per_master": calls,
            "redis_cpu_us_per_job": round(sum(cpu) / jobs * 1e6, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-partitions-"))
    servers = start_cluster(work)
    try:
        rows = [run(servers, n, a.jobs, a.workers, work) for n in (1, 3)]
    finally:
        for s in servers:
            s.stop()
    print(f"\n{a.jobs} no-op jobs, {a.workers} worker processes, a local 3-master cluster (Redis 7.0)\n")
    print("| partitions | drain jobs/s | Redis CPU s per master | commands per master | Redis CPU us/job |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['partitions']} | {r['jobs_per_s']:,} | {' / '.join(map(str, r['cpu_s_per_master']))} | "
              f"{' / '.join(f'{c:,}' for c in r['commands_per_master'])} | {r['redis_cpu_us_per_job']} |")
    out = ROOT / "bench" / "results" / "partitions.json"
    out.write_text(json.dumps({"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "rows": rows},
                              indent=2) + "\n")
    print(f"\nwritten: {out}")


if __name__ == "__main__":
    main()
