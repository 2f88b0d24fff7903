"""Workflows under load, on a Redis server of the benchmark's own and real worker processes:

- chain: N chains of 3 no-op functions (step1 -> ctx.enqueue step2 -> ctx.enqueue step3),
  each follow-up written with its parent's ack; jobs/s end to end (3 N jobs, from the
  queue's resume to the last step3 done), against a plain drain of 3 N no-op jobs by the
  same workers in the same run;
- group: one group of M no-op members and a then-job: the time from the settle of the last
  member (the group's completion, which writes the then-job in that very script step) to
  the then-job's start (its claim), both on the server's clock; and the whole group's wall time, and how long the
  then-job took to read the M outcomes back (past the inline bound they are read from Redis).

Each figure is the median of --rounds rounds. The queue is paused while a round's jobs are
enqueued, so a round times the workers, not the producer.

Usage: python bench/workflows.py [--chains 20000] [--members 10000] [--rounds 3]
[--workers 2] [--server auto|redis|valkey] [--quick]; prints a summary and writes
bench/results/workflows.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import server
from harness.procs import Group

from runner import config as config_mod
from runner.client import Client, Request
from runner.runtime import Runtime

REPO = Path(__file__).resolve().parent.parent
QUICK = {"chains": 500, "members": 1000, "rounds": 3}

NOOP = '''QUEUE = "fast"


def handle(payload, ctx):
    return None
'''
STEP = '''QUEUE = "fast"


def handle(payload, ctx):
    ctx.enqueue("{next}", {{}})
'''
GATHER = '''import json, os, time
QUEUE = "fast"


def handle(payload, ctx):
    t0 = time.perf_counter()
    group = payload["group"]
    outcomes = group["outcomes"] if group["outcomes"] is not None else ctx.group_outcomes(group["id"])
    read_ms = (time.perf_counter() - t0) * 1000
    with open(os.path.join(os.environ["BENCH_DIR"], "gather-" + ctx.job_id), "w") as f:
        json.dump({{"outcomes": len(outcomes), "read_ms": read_ms, "inline": group["outcomes"] is not None}}, f)
'''
TOML = '''[redis]
url = "{url}"
prefix = "wf"

[queues.fast]
visibility_timeout = 30
concurrency = 8

[retention]
done_max = 10000000

[log]
level = "WARNING"
format = "json"
'''


def project(root: Path, url: str) -> Path:
    sources = {"noop": NOOP, "step1": STEP.format(next="step2"), "step2": STEP.format(next="step3"),
               "step3": NOOP, "gather": GATHER.format()}
    for name, src in sources.items():
        (root / "functions").mkdir(parents=True, exist_ok=True)
        (root / "functions" / f"{name}.py").write_text(src)
        (root / "schemas" / name).mkdir(parents=True, exist_ok=True)
        (root / "schemas" / name / "v1.json").write_text('{"type": "object"}')
    toml = root / "runner.toml"
    toml.write_text(TOML.format(url=url))
    return toml


def wait(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.01) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(interval)


def counter(rt: Runtime, field: str) -> int:
    return int(rt.redis.hget(rt.keys["fast"].stats, field) or 0)


def timed_drain(rt: Runtime, workers: int, enqueue: Callable[[], None], done: Callable[[], bool],
                timeout: float) -> float:
    """Enqueue with the queue paused, then resume and time until ``done``."""
    c = Client(rt)
    c.pause("fast")
    enqueue()
    t0 = time.perf_counter()
    c.resume("fast")
    rt.redis.lpush(rt.keys["fast"].notify, *["1"] * workers)  # wake every idle worker, not one
    wait(done, timeout, "the round to finish", interval=0.005)
    return time.perf_counter() - t0


def chain_round(rt: Runtime, workers: int, n: int) -> dict[str, float]:
    c = Client(rt)
    rt.redis.flushall()
    drain_s = timed_drain(rt, workers, lambda: c.enqueue_many(Request("noop", {}) for _ in range(3 * n)),
                          lambda: counter(rt, "succeeded|noop") >= 3 * n, 600)
    rt.redis.flushall()
    chain_s = timed_drain(rt, workers, lambda: c.enqueue_many(Request("step1", {}) for _ in range(n)),
                          lambda: counter(rt, "succeeded|step3") >= n, 600)
    return {"drain_jobs_per_s": 3 * n / drain_s, "chain_jobs_per_s": 3 * n / chain_s,
            "chains_per_s": n / chain_s}


def group_round(rt: Runtime, work: Path, m: int) -> dict[str, float]:
    c = Client(rt)
    rt.redis.flushall()
    t0 = time.perf_counter()
    g = c.group([Request("noop", {}) for _ in range(m)], then=Request("gather", {}))
    sent_s = time.perf_counter() - t0
    done = wait(lambda: (v := c.get_group(g.id))["then"]["status"] == "done" and v, 600, "the then-job",
                interval=0.02)
    wall_s = time.perf_counter() - t0
    started = c.get(g.then_id).as_dict()["started_at"]
    gathered = json.loads((work / f"gather-{g.then_id}").read_text())
    assert gathered["outcomes"] == m, gathered
    # Both on the server's clock: the group completes in the last member's settle, and the
    # then-job's start is its claim.
    return {"last_member_to_then_start_ms": (started - done["completed_at"]) * 1000,
            "create_s": sent_s, "wall_s": wall_s, "outcomes_read_ms": gathered["read_ms"],
            "inline": float(gathered["inline"])}


def median(rounds: list[dict[str, float]], key: str, digits: int = 1) -> dict[str, float]:
    values = [r[key] for r in rounds]
    return {"median": round(statistics.median(values), digits), "min": round(min(values), digits),
            "max": round(max(values), digits)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chains", type=int, default=20_000)
    ap.add_argument("--members", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--server", choices=["auto", "redis", "valkey"], default="auto")
    ap.add_argument("--quick", action="store_true", help=f"a small run that proves it works: {QUICK}")
    a = ap.parse_args()
    if a.quick:
        a.chains, a.members, a.rounds = QUICK["chains"], QUICK["members"], QUICK["rounds"]
    redis = server.start(a.server)
    work = server.tmpdir("bench-workflows-")
    toml = project(work, redis.url)
    env = {**os.environ, "REDIS_URL": redis.url, "BENCH_DIR": str(work),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "runner.cli", "--config", str(toml), "worker"]
    procs = Group().start([cmd] * a.workers, env, str(work), work / "worker")
    rt = Runtime.create(config_mod.load(toml, env={"REDIS_URL": redis.url}))
    try:
        print(f"server: {redis.kind} {redis.version}; {a.workers} workers; scratch: {work}", flush=True)
        wait(lambda: len(rt.redis.hgetall(f"{rt.config.redis.prefix}:workers")) >= a.workers, 60,
             "the workers to start", interval=0.05)
        chain_round(rt, a.workers, min(a.chains, 500))  # warm-up (imports, scripts, connections): not counted
        chains = []
        for i in range(a.rounds):
            chains.append(chain_round(rt, a.workers, a.chains))
            r = chains[-1]
            print(f"chain round {i + 1}: drain {r['drain_jobs_per_s']:.0f} jobs/s, chain of 3 "
                  f"{r['chain_jobs_per_s']:.0f} jobs/s ({r['chains_per_s']:.0f} chains/s)", flush=True)
        groups = []
        for i in range(a.rounds):
            groups.append(group_round(rt, work, a.members))
            r = groups[-1]
            print(f"group round {i + 1}: {a.members} members, last member -> then start "
                  f"{r['last_member_to_then_start_ms']:.1f} ms, whole group {r['wall_s']:.2f} s, "
                  f"outcomes read in {r['outcomes_read_ms']:.0f} ms", flush=True)
        assert procs.alive(), "a worker died during the run"
        res: dict[str, Any] = {
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "redis": f"{redis.kind} {redis.version}", "workers": a.workers, "rounds": a.rounds,
            "quick": a.quick, "cpus": os.cpu_count(),
            "chain": {"chains": a.chains, "jobs": 3 * a.chains,
                      "drain_jobs_per_s": median(chains, "drain_jobs_per_s", 0),
                      "chain_jobs_per_s": median(chains, "chain_jobs_per_s", 0),
                      "chains_per_s": median(chains, "chains_per_s", 0)},
            "group": {"members": a.members,
                      "last_member_to_then_start_ms": median(groups, "last_member_to_then_start_ms"),
                      "create_s": median(groups, "create_s", 3), "wall_s": median(groups, "wall_s", 2),
                      "outcomes_read_ms": median(groups, "outcomes_read_ms"),
                      "outcomes_inline": bool(groups[0]["inline"])},
        }
        ch = res["chain"]
        res["chain"]["chain_vs_drain"] = round(ch["chain_jobs_per_s"]["median"] / ch["drain_jobs_per_s"]["median"], 3)
    finally:
        rt.close()
        procs.stop()
        redis.stop()
    g = res["group"]
    print(f"chain of 3: {ch['chain_jobs_per_s']['median']:.0f} jobs/s vs drain {ch['drain_jobs_per_s']['median']:.0f} "
          f"jobs/s ({ch['chain_vs_drain']:.2f}x); group of {g['members']}: last member -> then start "
          f"{g['last_member_to_then_start_ms']['median']:.1f} ms (median of {a.rounds})")
    out = Path(__file__).resolve().parent / "results" / "workflows.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"written: {out}")


if __name__ == "__main__":
    main()
