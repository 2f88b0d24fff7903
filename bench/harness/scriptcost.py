"""Redis time per job of each transition script: enqueue, claim, start and ack.

The scripts run through runner's own Scripts API against the benchmark's server, on a
queue of no-op jobs, in the batches a worker sends (claims of 32, 16 of them prefetched
and marked started later, acks of 32). The time is what the server says it spent in
EVALSHA (INFO commandstats: the commands a script runs included), over the jobs of the
phase: the server's CPU for the transition, without the round trips, the client or the
thread hand-offs that a drain adds. The figure to watch when a script changes.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any

from harness import server
from harness.scenarios import Env

BATCH = 32
PREFETCHED = 16  # of each claim: marked started afterwards, as a worker's prefetch is
PHASES = ("enqueue", "claim", "start", "ack")


def _project(root: Path) -> Path:
    (root / "functions").mkdir(parents=True, exist_ok=True)
    (root / "functions" / "noop.py").write_text('"""A no-op."""\nQUEUE = "fast"\n\n\n'
                                                "def handle(payload, ctx):\n    return None\n")
    (root / "schemas" / "noop").mkdir(parents=True, exist_ok=True)
    (root / "schemas" / "noop" / "v1.json").write_text(json.dumps(
        {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object"}))
    toml = root / "runner.toml"
    toml.write_text('[redis]\nprefix = "bench"\n\n[queues.fast]\nvisibility_timeout = 30\nconcurrency = 16\n')
    return toml


def _script_usec(r: Any) -> float:
    return server.script_usec(server.Stats(r).commands())


def run(env: Env, n: int, reps: int) -> dict[str, Any]:
    from runner import config
    from runner.client import Client, Request
    from runner.observe import metrics
    from runner.runtime import Runtime
    from runner.store.scripts import Ack

    toml = _project(env.work / "scripts-project")
    os.environ["REDIS_URL"] = env.url
    rt = Runtime.create(config.load(toml))
    k = rt.keys["fast"]
    client = Client(rt)
    r = env.redis.client()
    per_job: dict[str, list[float]] = {p: [] for p in PHASES}
    try:
        for rep in range(reps):
            r.flushall()
            rt.scripts.prepare()
            t0 = _script_usec(r)
            requests = [Request("noop", {"t": 1.5, "note": "a payload of a few fields"}) for _ in range(n)]
            for i in range(0, n, 100):
                client.enqueue_all(requests[i:i + 100])
            t1 = _script_usec(r)
            claimed: list[tuple[str, str, int]] = []
            calls = 0
            while len(claimed) < n:
                calls += 1
                reply = rt.scripts.claim(k, n=BATCH, start=BATCH - PREFETCHED, lease_ms=30_000,
                                         token_base=f"bench.{rep}.{calls}", dead_ttl_ms=604_800_000,
                                         done_ttl_ms=86_400_000)
                got = [(reply[i], reply[i + 1], int(reply[i + 12])) for i in range(2, len(reply), 14)]
                if not got:
                    raise RuntimeError(f"claim returned nothing with {n - len(claimed)} jobs left")
                claimed += got
            t2 = _script_usec(r)
            ahead = [(job_id, token) for job_id, token, started in claimed if not started]
            for i in range(0, len(ahead), PREFETCHED):
                rt.scripts.start(k, ahead[i:i + PREFETCHED])
            t3 = _script_usec(r)
            for i in range(0, n, BATCH):
                batch = claimed[i:i + BATCH]
                if hasattr(metrics, "Totals"):
                    totals = metrics.Totals()
                    acks = [Ack(job_id, token, "", "noop|1", metrics.succeeded("noop", 3, 0.2, totals))
                            for job_id, token, _ in batch]
                    rt.scripts.ack(k, acks, 86_400_000, 86_400_000, 1_000_000, totals=totals.text())
                else:  # a runner from before the batch totals (2026-12-02): each ack's fields
                    fields = "succeeded|noop " + metrics.timing_fields("noop", 3, 0.2)
                    rt.scripts.ack(k, [Ack(job_id, token, "", "noop|1", fields) for job_id, token, _ in batch],
                                   86_400_000, 86_400_000, 1_000_000)
            t4 = _script_usec(r)
            for phase, usec in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                per_job[phase].append(usec / n)
    finally:
        rt.close()
    out: dict[str, Any] = {"jobs": n, "reps": reps, "batch": BATCH, "prefetched": PREFETCHED, "us_per_job": {}}
    for phase, values in per_job.items():
        out["us_per_job"][phase] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    out["us_per_job_total"] = sum(v["median"] for v in out["us_per_job"].values())
    return out


def markdown(res: dict[str, Any]) -> list[str]:
    rows = ["| script | Redis µs per job, median (min-max) |", "|---|---|"]
    for phase in PHASES:
        v = res["us_per_job"][phase]
        rows.append(f"| {phase} | {v['median']:.2f} ({v['min']:.2f}-{v['max']:.2f}) |")
    rows.append(f"| all four | {res['us_per_job_total']:.2f} |")
    return [f"{res['jobs']:,} no-op jobs, {res['reps']} repetitions; claims of {res['batch']} with "
            f"{res['prefetched']} prefetched (start marks later, {res['prefetched']} a call), acks of "
            f"{res['batch']}. The start row is per job of the whole run (half the jobs get a mark).", "",
            *rows, ""]
