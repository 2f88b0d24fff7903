"""Redis memory per job and the deploy gate's cost, for runner on its own server.

- queued: bytes of used_memory per waiting job, for a job with a 206-byte payload (the
  payload of the issue's comparison), enqueued one batch at a time;
- done: bytes still held per finished job once a worker drained them (default retention,
  well below the count bound), the outcome answering `runner job ID`; split into the
  outcomes (the done generations' hashes), their logs of ids, and the rest;
- dead: bytes of used_memory per dead job, for a handler that fails for good through a
  20-frame stack (its record, its state with the error and its trimmed traceback, its
  dead-letter entry), buried by a real worker;
- steady state: what a queue sustaining 1,000 jobs/s holds under the shipped retention
  (the done count bound times the bytes per done job), and the same for KEEP_RESULT;
- deploy gate: `runner check` (the census) and `runner check --scan` (every waiting job
  read) timed at a depth of --gate-jobs, and the census read alone (the part that could
  grow with depth; the rest is the command's start-up and its catalog and Redis checks).

Usage: python bench/memory.py [--jobs 20000] [--gate-jobs 1000000] [--rounds 3]
[--server auto|redis|valkey]; prints a summary and writes bench/results/memory.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import server, systems

from runner import config as config_mod
from runner.client import Client, Request
from runner.runtime import Runtime
from runner.store import census
from runner.worker.worker import Worker

PAD = "x" * 194  # {"pad":"<194 x>"} is 206 bytes of JSON
NOOP = '''"""A no-op: returns nothing."""

QUEUE = "fast"


def handle(payload, ctx):
    return None
'''
KEPT = NOOP.replace('QUEUE = "fast"', 'QUEUE = "fast"\nKEEP_RESULT = 86400')
# Fails for good 20 frames deep, in distinct functions with a comment on each line, as a
# handler calling into a client library does (about 3 KB of traceback whole).
FAILING = '''"""Fails for good through a 20-frame stack."""

QUEUE = "fast"
MAX_ATTEMPTS = 1


def handle(payload, ctx):
    return layer_0(payload["pad"][:12])


''' + "".join(f"def layer_{i}(order_reference):\n    return layer_{i + 1}(order_reference)  # the client's "
                f"next layer\n\n\n" for i in range(19)) + '''def layer_19(order_reference):
    raise ConnectionError(f"upstream billing service refused the connection for order {order_reference}")
'''
SCHEMA = {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
          "properties": {"pad": {"type": "string"}}, "additionalProperties": False}


def project(root: Path, url: str) -> Path:
    for name, src in (("noop", NOOP), ("kept", KEPT), ("failing", FAILING)):
        (root / "functions").mkdir(parents=True, exist_ok=True)
        (root / "functions" / f"{name}.py").write_text(src)
        (root / "schemas" / name).mkdir(parents=True, exist_ok=True)
        (root / "schemas" / name / "v1.json").write_text(json.dumps(SCHEMA))
    toml = root / "runner.toml"
    toml.write_text(f'[redis]\nurl = "{url}"\nprefix = "mem"\n\n[queues.fast]\n\n[log]\nlevel = "ERROR"\n')
    return toml


def used(rt: Runtime) -> int:
    return int(rt.redis.info("memory")["used_memory"])


def enqueue(c: Client, type_: str, n: int) -> None:
    body = {"pad": PAD}
    c.enqueue_many(Request(type_, body) for _ in range(n))


def drain(rt: Runtime, timeout_s: float = 300) -> None:
    k = rt.keys["fast"]
    w = Worker(rt, ["fast"])
    w.start()
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if rt.redis.llen(k.ready) == 0 and rt.redis.zcard(k.leases) == 0:
                break
            time.sleep(0.05)
    finally:
        w.stop(5)


def split(rt: Runtime, n: int, base: int, after: int) -> dict[str, float]:
    """Where a finished job's bytes are, per job (the round's last step: it deletes them):
    its outcome (a field of a done generation's hash, with its share of the hash's table),
    its id on the generation's log, and the rest (what the drain left beside them: the
    worker's connections and their buffers, the kept result of KEEP_RESULT)."""
    r, k = rt.redis, rt.keys["fast"]
    gen = int(r.hget(k.done_meta, "gen") or 0)
    hashes = [k.done(g) for g in range(max(0, gen - 3), gen + 1)]
    r.delete(*hashes)
    mid = used(rt)
    r.delete(*(h + ":log" for h in hashes))
    end = used(rt)
    return {"outcomes": (after - mid) / n, "logs": (mid - end) / n, "rest": (end - base) / n}


def one_round(url: str, root: Path, n: int, type_: str) -> dict[str, float]:
    rt = Runtime.create(config_mod.load(project(root, url)))
    try:
        rt.redis.flushall()
        c = Client(rt)
        enqueue(c, type_, 10)  # the queue's own keys (stats, census...) exist before the baseline
        drain(rt)
        time.sleep(0.2)
        base = used(rt)
        enqueue(c, type_, n)
        queued = (used(rt) - base) / n
        drain(rt)
        after = used(rt)
        done = (after - base) / n
        if type_ == "failing":
            assert rt.redis.zcard(rt.keys["fast"].dead) == n + 10
            return {"queued": queued, "dead": done}
        return {"queued": queued, "done": done, **split(rt, n, base, after)}
    finally:
        rt.close()


def gate(url: str, root: Path, depth: int) -> dict[str, Any]:
    toml = project(root, url)
    rt = Runtime.create(config_mod.load(toml))
    try:
        rt.redis.flushall()
        c = Client(rt)
        t0 = time.perf_counter()
        body = {"pad": PAD}
        c.enqueue_many(Request("noop", body) for _ in range(depth))
        fill_s = time.perf_counter() - t0
        reads = []
        for _ in range(5):
            t = time.perf_counter()
            total, _ = census.counts(rt.redis, rt.keys)
            reads.append(time.perf_counter() - t)
        assert total == depth, (total, depth)
    finally:
        rt.close()
    out: dict[str, Any] = {"depth": depth, "fill_s": round(fill_s, 1),
                           "census_read_ms": round(statistics.median(reads) * 1000, 2)}
    # The runner under test (a full run's frozen, compiled copy), as the other scenarios run it.
    env = {**os.environ, "PYTHONPATH": str(systems.runner_src())}
    for label, args in (("census", []), ("scan", ["--scan"])):
        times = []
        for _ in range(3 if label == "census" else 1):
            t = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "runner.cli", "--config", str(toml), "check", "--json",
                                   *args], capture_output=True, text=True, cwd=root, env=env)
            times.append(time.perf_counter() - t)
            assert proc.returncode == 0, proc.stdout + proc.stderr
        out[f"{label}_s"] = round(statistics.median(times), 3)
    return out


def run(url: str, work: Path, jobs: int, rounds: int, gate_jobs: int) -> dict[str, Any]:
    """Every measurement above on the server at ``url`` (flushed as it goes), scratch
    files under ``work``; also `python bench/run.py`'s "memory" scenario."""
    work.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                           "jobs": jobs, "payload_bytes": 206}
    for type_ in ("noop", "kept", "failing"):
        runs = [one_round(url, work, jobs if type_ != "failing" else min(jobs, 5000), type_) for _ in range(rounds)]
        if type_ == "failing":
            res["dead"] = {"median": round(statistics.median(r["dead"] for r in runs), 1),
                           "min": round(min(r["dead"] for r in runs), 1), "max": round(max(r["dead"] for r in runs), 1),
                           "jobs": min(jobs, 5000)}
            print(f"dead (20-frame traceback): {res['dead']['median']:.0f} B/job", flush=True)
            continue
        res[type_] = {m: {"median": round(statistics.median(r[m] for r in runs), 1),
                          "min": round(min(r[m] for r in runs), 1), "max": round(max(r[m] for r in runs), 1)}
                      for m in ("queued", "done", "outcomes", "logs", "rest")}
        print(f"{type_}: queued {res[type_]['queued']['median']:.0f} B/job, "
              f"done {res[type_]['done']['median']:.0f} B/job (outcomes {res[type_]['outcomes']['median']:.0f}, "
              f"logs {res[type_]['logs']['median']:.0f}, rest {res[type_]['rest']['median']:.0f})", flush=True)
    done_max = config_mod.Retention().done_max
    res["done_max"] = done_max
    res["steady_1000_per_s_mb"] = round(done_max * res["noop"]["done"]["median"] / 1e6, 1)
    print(f"steady state at 1,000 jobs/s (done_max {done_max:,}): "
          f"{res['steady_1000_per_s_mb']:.0f} MB of done outcomes", flush=True)
    if gate_jobs:
        res["gate"] = gate(url, work, gate_jobs)
        g = res["gate"]
        print(f"deploy gate at {g['depth']:,} waiting jobs: census read {g['census_read_ms']} ms, "
              f"`runner check` {g['census_s'] * 1000:.0f} ms, scan {g['scan_s']:.1f} s", flush=True)
    return res


def markdown(res: dict[str, Any]) -> list[str]:
    """The scenario's lines in the results' markdown."""
    def m(t: str, k: str) -> str:
        c = res[t][k]
        return f"{c['median']:,.0f} ({c['min']:,.0f}-{c['max']:,.0f})"

    out = [f"**Redis memory per job, runner alone** ({res['jobs']:,} jobs a round, a "
           f"{res['payload_bytes']}-byte JSON payload, `python bench/memory.py`)", "",
           "| function | bytes per queued job | bytes still held per finished job |", "|---|---|---|",
           f"| no-op, default retention | {m('noop', 'queued')} | {m('noop', 'done')} |",
           f"| `KEEP_RESULT = 86400` | {m('kept', 'queued')} | {m('kept', 'done')} |", "",
           *([f"Of a finished no-op job's bytes: its outcome in a done generation {m('noop', 'outcomes')}, its "
              f"id on the generation's log {m('noop', 'logs')}, the rest {m('noop', 'rest')} (the worker's "
              "connections and their buffers).", ""]
             if "outcomes" in res["noop"] else []),
           *([f"A dead job whose handler failed 20 frames deep holds {res['dead']['median']:,.0f} bytes "
              f"({res['dead']['min']:,.0f}-{res['dead']['max']:,.0f}; {res['dead']['jobs']:,} jobs a round)", ""]
             if "dead" in res else []),
           f"A queue finishing 1,000 jobs/s holds {res['steady_1000_per_s_mb']:,.0f} MB of outcomes at the "
           f"default count bound (`done_max = {res['done_max']:,}`).", ""]
    g = res.get("gate")
    if g:
        out += [f"**The deploy gate at {g['depth']:,} waiting jobs**: `runner check` {g['census_s'] * 1000:,.0f} ms "
                f"(the census read alone {g['census_read_ms']} ms); `runner check --scan`, which reads every "
                f"waiting job, {g['scan_s']:,.1f} s. Filling the queue took {g['fill_s']:,.0f} s.", ""]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--gate-jobs", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--server", choices=["auto", "redis", "valkey"], default="auto")
    a = ap.parse_args()
    redis = server.start(a.server)
    work = server.tmpdir("bench-memory-")
    try:
        print(f"server: {redis.kind} {redis.version}; scratch: {work}", flush=True)
        res = {"redis": f"{redis.kind} {redis.version}", **run(redis.url, work, a.jobs, a.rounds, a.gate_jobs)}
    finally:
        redis.stop()
    out = Path(__file__).resolve().parent / "results" / "memory.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
