"""Redis time per job of each transition script: enqueue, claim, start and ack.

The scripts run through runner's own Scripts API against the benchmark's server, on a
queue of no-op jobs, in the batches a worker sends (claims of 32, 16 of them prefetched
and marked started later, acks of 32); or, variant "single", one job per call as at light
load (each job enqueued alone, claimed by a call asking for 32 that finds it alone, acked
alone), where every per-call cost of a script is paid per job. The time is what the
server says it spent in EVALSHA (INFO commandstats: the commands a script runs
included), over the jobs of the phase: the server's CPU for the transition, without the round trips, the client or the
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


# The flow-controlled variants (as bench/flow.py drains them): a per-key concurrency limit
# of 2 over KEYS keys, and a global rate limit far above what the loop can start.
KEYS = 100
VARIANTS = {
    "plain": "",
    "keyed": 'CONCURRENCY = {"key": "tenant:{k}", "limit": 2}\n',
    "rated": 'RATE_LIMIT = {"limit": 1_000_000, "period": 1}\n',
}
SINGLE = "single"  # plain no-op jobs, one per call (see above)


def _project(root: Path) -> Path:
    (root / "functions").mkdir(parents=True, exist_ok=True)
    for variant, options in VARIANTS.items():
        name = "noop" if variant == "plain" else f"noop_{variant}"
        (root / "functions" / f"{name}.py").write_text(f'"""A no-op."""\nQUEUE = "fast"\n{options}\n\n'
                                                       "def handle(payload, ctx):\n    return None\n")
        (root / "schemas" / name).mkdir(parents=True, exist_ok=True)
        (root / "schemas" / name / "v1.json").write_text(json.dumps(
            {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
             "properties": {"k": {"type": "string"}}, "required": ["k"]}))
    toml = root / "runner.toml"
    toml.write_text('[redis]\nprefix = "bench"\n\n[queues.fast]\nvisibility_timeout = 30\nconcurrency = 16\n')
    return toml


def _script_usec(r: Any) -> float:
    return server.script_usec(server.Stats(r).commands())


def _tally(r: Any, spent: dict[str, float], phase: str, since: float, timed: bool) -> float:
    """Add the scripts' time since ``since`` to ``phase``; the new mark (0 untimed)."""
    if not timed:
        return 0.0
    now = _script_usec(r)
    spent[phase] += now - since
    return now


def run(env: Env, n: int, reps: int, variant: str = "plain", phases: bool = True) -> dict[str, Any]:
    """``variant``: plain no-op jobs, claimed all first (16 of each 32 prefetched, marked
    started afterwards) and then acked; or keyed / rated (under a limit: never
    prefetched), each batch of 32 claimed and then acked before the next; or single (plain
    jobs, one per call). ``phases``: time each phase (single: an INFO read per call, left
    out under callgrind, which counts the run's total)."""
    from runner import config
    from runner.client import Client, Request
    from runner.observe import metrics
    from runner.runtime import Runtime
    from runner.store.scripts import Ack

    try:
        from runner.worker.fetcher import CLAIM_FIELDS
    except ImportError:  # a runner from before the name (14 values, before the step log's count)
        CLAIM_FIELDS = 14
    toml = _project(env.work / "scripts-project")
    os.environ["REDIS_URL"] = env.url
    rt = Runtime.create(config.load(toml))
    k = rt.keys["fast"]
    client = Client(rt)
    r = env.redis.client()
    fn = "noop" if variant in ("plain", SINGLE) else f"noop_{variant}"

    def acks_of(batch: list[tuple[str, str, int]]) -> None:
        if hasattr(metrics, "Totals"):
            totals = metrics.Totals()
            acks = [Ack(job_id, token, "", f"{fn}|1", metrics.succeeded(fn, 3, 0.2, totals))
                    for job_id, token, _ in batch]
            rt.scripts.ack(k, acks, 86_400_000, 86_400_000, 1_000_000, totals=totals.text())
        else:  # a runner from before the batch totals (2026-12-02): each ack's fields
            fields = f"succeeded|{fn} " + metrics.timing_fields(fn, 3, 0.2)
            rt.scripts.ack(k, [Ack(job_id, token, "", f"{fn}|1", fields) for job_id, token, _ in batch],
                           86_400_000, 86_400_000, 1_000_000)

    def claim(label: str, start: int) -> list[tuple[str, str, int]]:
        reply = rt.scripts.claim(k, n=BATCH, start=start, lease_ms=30_000, token_base=label,
                                 dead_ttl_ms=604_800_000, done_ttl_ms=86_400_000)
        return [(reply[i], reply[i + 1], int(reply[i + 12])) for i in range(2, len(reply), CLAIM_FIELDS)]

    per_job: dict[str, list[float]] = {p: [] for p in PHASES}
    try:
        for rep in range(reps):
            r.flushall()
            rt.scripts.prepare()
            spent = dict.fromkeys(PHASES, 0.0)
            t = _script_usec(r)
            requests = [Request(fn, {"k": str(i % KEYS)}) for i in range(n)]
            if variant == SINGLE:
                for i, req in enumerate(requests):
                    client.enqueue_all([req])
                    t = _tally(r, spent, "enqueue", t, phases)
                    got = claim(f"bench.{rep}.{i}", BATCH)
                    if len(got) != 1:
                        raise RuntimeError(f"a claim of one job alone took {len(got)}")
                    t = _tally(r, spent, "claim", t, phases)
                    acks_of(got)
                    t = _tally(r, spent, "ack", t, phases)
                for phase in PHASES:
                    per_job[phase].append(spent[phase] / n)
                continue
            for i in range(0, n, 100):
                client.enqueue_all(requests[i:i + 100])
            spent["enqueue"], t = _script_usec(r) - t, _script_usec(r)
            claimed: list[tuple[str, str, int]] = []
            calls = 0
            while len(claimed) < n:
                calls += 1
                got = claim(f"bench.{rep}.{calls}", BATCH - PREFETCHED if variant == "plain" else BATCH)
                if not got:
                    raise RuntimeError(f"claim returned nothing with {n - len(claimed)} jobs left")
                claimed += got
                if variant != "plain":  # the slots go back before the next batch is claimed
                    now = _script_usec(r)
                    spent["claim"] += now - t
                    acks_of(got)
                    t = _script_usec(r)
                    spent["ack"] += t - now
            if variant == "plain":
                spent["claim"], t = _script_usec(r) - t, _script_usec(r)
                ahead = [(job_id, token) for job_id, token, started in claimed if not started]
                for i in range(0, len(ahead), PREFETCHED):
                    rt.scripts.start(k, ahead[i:i + PREFETCHED])
                spent["start"], t = _script_usec(r) - t, _script_usec(r)
                for i in range(0, n, BATCH):
                    acks_of(claimed[i:i + BATCH])
                spent["ack"] = _script_usec(r) - t
            for phase in PHASES:
                per_job[phase].append(spent[phase] / n)
    finally:
        rt.close()
    out: dict[str, Any] = {"jobs": n, "reps": reps, "batch": BATCH, "prefetched": PREFETCHED, "variant": variant,
                           "us_per_job": {}}
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
    variant = res.get("variant", "plain")
    if variant == SINGLE:
        how = ("one job per call, as at light load: each enqueued alone, claimed by a call asking for "
               f"{res['batch']} that finds it alone (started at once: no start mark), acked alone")
    elif variant == "plain":
        how = (f"claims of {res['batch']} with {res['prefetched']} prefetched (start marks later, "
               f"{res['prefetched']} a call), acks of {res['batch']}. The start row is per job of the whole "
               "run (half the jobs get a mark)")
    else:
        how = (f"under {VARIANTS[variant].strip()} ({KEYS} keys: k = i % {KEYS}); each claim of "
               f"{res['batch']} starts them all and is acked before the next claim")
    return [f"{res['jobs']:,} no-op jobs, {res['reps']} repetitions, {variant}: {how}.", "", *rows, ""]


def _under_callgrind(binary: str, variant: str, n: int, work: Path) -> int:
    """Instructions a fresh server executes for one run of ``n`` jobs (start-up included)."""
    import socket
    import subprocess
    import time

    import redis

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = work / f"callgrind-{variant}-{n}.out"
    proc = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", binary,
                             "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        for _ in range(600):
            try:
                redis.Redis(port=port).ping()
                break
            except redis.ConnectionError:
                time.sleep(0.1)

        class _Server:
            def __init__(self) -> None:
                self.url = url

            def client(self) -> redis.Redis:
                return redis.Redis.from_url(url, decode_responses=True)

        run(Env(_Server(), work), n, 1, variant, phases=False)  # type: ignore[arg-type]
        redis.Redis(port=port).shutdown(nosave=True)
    except redis.ConnectionError:
        pass  # SHUTDOWN closes the connection: the expected end
    finally:
        proc.wait(timeout=300)
    for line in out.read_text().splitlines():
        if line.startswith("totals:") or line.startswith("summary:"):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {out}")


def instructions(binary: str, n: int, variant: str, work: Path) -> dict[str, Any]:
    """Server instructions per job for enqueue, claim, start and ack together, counted by
    callgrind: the same for the same binary, scripts and inputs whatever else the machine
    does, so a change to a script shows even where timings drown in the machine's drift.
    Two fresh servers, one running ``n`` jobs and one ``2n``: the difference over ``n``
    leaves out start-up and the fixed costs."""
    one = _under_callgrind(binary, variant, n, work)
    two = _under_callgrind(binary, variant, 2 * n, work)
    return {"variant": variant, "jobs": n, "binary": binary, "instructions_per_job": (two - one) / n}
