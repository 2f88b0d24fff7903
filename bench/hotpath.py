"""Instructions per job on a worker's hot path, counted by callgrind: a figure that holds
from one run to the next whatever else the machine does, for A/B comparisons of changes
too small to see through a drain's noise.

    python bench/hotpath.py                  # the runner of this checkout
    python bench/hotpath.py --src ../other   # another checkout's runner/, for an A/B
    python bench/hotpath.py --no-valgrind    # wall time only (microseconds per job)
    python bench/hotpath.py --phases executor

Five phases, each on one thread with no Redis round trip inside the loop (a server is
started for the runtime's set-up only):

- executor: Executors._loop over N claimed no-op jobs, schema validation on: pick,
  resolve and validate, the Context, the timeout guard, the run, the settlement;
- batch: the same over N jobs of a BATCH function (size 100, wait 0) returning None:
  gathering, the batch's ctx, one call per 100, each member's settlement (the members
  come started, as if their start mark had landed: its round trip is left out);
- claim: Fetcher.claim turning a 20-job claim reply into runs on the inbox (the script
  call answers from memory);
- settle: the settler building the script calls of 20 done jobs (Entries.add_calls), and
  the commands packed as the pipeline would send them;
- process: the executor phase on the shipped slow queue (isolation = "process"), jobs
  claimed ahead as a drain claims them, so they go to the child in batches: the worker's
  side (one executor slot feeding its warm child) and the child's side (taking the jobs,
  the handler, each outcome) counted apart;
- process1: the same, one job at a time (as at light load, or with prefetch = 0).

Instructions per job are (count at 3N - count at N) / 2N, so start-up and imports cancel
out. Needs valgrind (Debian's package); about two minutes.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import queue
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
PHASES = ("executor", "batch", "claim", "settle", "process", "process1")
BATCH = 20  # jobs per claim reply and per settle batch

HANDLER = 'QUEUE = "fast"\n\n\ndef handle(payload, ctx):\n    return None\n'
BATCHED = ('QUEUE = "fast"\nBATCH = {"size": 100, "wait": 0}\n\n\n'
           'def handle_batch(payloads, ctx):\n    return None\n')
ISOLATED = 'QUEUE = "slow"\n\n\ndef handle(payload, ctx):\n    return None\n'  # (slow: isolation = "process")
SCHEMA = {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
          "properties": {"t": {"type": "number"}}, "additionalProperties": False}


def project(root: Path, src: Path) -> Path:
    (root / "functions").mkdir(parents=True, exist_ok=True)
    for name, code in (("noop", HANDLER), ("noop_process", ISOLATED), ("noop_batch", BATCHED)):
        (root / "functions" / f"{name}.py").write_text(code)
        (root / "schemas" / name).mkdir(parents=True, exist_ok=True)
        (root / "schemas" / name / "v1.json").write_text(json.dumps(SCHEMA))
    shipped = (src / "runner.toml") if (src / "runner.toml").exists() else BENCH.parent / "runner.toml"
    text = shipped.read_text().replace('prefix = "runner"', 'prefix = "hotpath"')
    (root / "runner.toml").write_text(text + '\n[log]\nlevel = "WARNING"\n')
    return root


def child(phase: str, n: int) -> float:
    """Run one phase over ``n`` jobs in this process; microseconds per job."""
    from runner.config import load
    from runner.runtime import Runtime
    from runner.worker import fetcher as fetcher_mod
    from runner.worker.execute import Claimed, Done
    from runner.worker.executors import Executors
    from runner.worker.fetcher import Fetcher
    from runner.worker.ledger import Ledger, Run, Settlement
    from runner.worker.settler import Settler

    cfg = load(None)
    rt = Runtime.create(cfg)
    q = cfg.queues["fast"]
    inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
    outcomes: queue.SimpleQueue[Any] = queue.SimpleQueue()
    if phase in ("executor", "batch", "process", "process1"):
        ahead = phase.startswith("process")
        if ahead:
            q = cfg.queues["slow"]
        ledger = Ledger(q.concurrency, n + 16, 16)
        ex = Executors(rt, q, ledger, inbox, outcomes, lambda job: True)
        fn = "noop_process" if ahead else "noop_batch" if phase == "batch" else "noop"
        # A process job is claimed ahead, as in a drain (the claim's few jobs for ready
        # children aside): its start mark is the executor's to send.
        if phase == "process1":
            ex._slots[0].room = lambda fn, generation: 1  # type: ignore[method-assign]
        if ahead:
            # No recall: under callgrind a job runs fifty times slower, and on a loaded host
            # one past RECALL_LATE_S (or a recall as the inbox empties) handed the jobs
            # behind it back, and the phase ended short of its settlements.
            from runner.worker import slot as slot_mod

            slot_mod.RECALL_LATE_S = float("inf")  # type: ignore[misc]
            ex._starving = lambda: False  # type: ignore[method-assign]
        runs = [Run(Claimed(f"j{i}", f"t{i}", 1, fn, "1", '{"t": 1.5}', 5, "", "", 1, 1, "", "fast", 1000,
                            not ahead)) for i in range(n)]
        if ahead:  # the child is started and warm before the count begins
            ex._slots[0].warm(ex._generations.of(rt.registry))
            assert ex._slots[0].child is not None
            ex._slots[0].child.wait_ready(600.0)  # (under valgrind a start takes minutes)
        ledger.claimed(runs)
        for r in runs:
            inbox.put(r)
        inbox.put(None)
        t0 = time.perf_counter()
        ex._loop(0)
        took = time.perf_counter() - t0
        ends = [s for s in iter_queue(outcomes) if type(s.outcome).__name__ != "Start"]
        if len(ends) != n or not all(isinstance(s.outcome, Done) for s in ends):
            raise SystemExit(f"{phase}: {len(ends)} settlements for {n} jobs: {ends[:1]}")
        if ahead:  # the child exits as retired, so that its own count is written
            child = ex._slots[0].child
            assert child is not None
            child.send({"op": "exit"})
            child.proc.wait()
        return took / n * 1e6
    reply: list[Any] = [1_700_000_000_000, 0]
    fields = fetcher_mod.CLAIM_FIELDS  # (a checkout's own claim reply: its fields grow over time)
    for i in range(BATCH):
        # (the last, the step count, is claim.lua's integer 0 for a job without a step log:
        # "" sent every job down int()'s exception path, which no real claim takes)
        one = [f"01JHOTPATH{i:016d}", f"w1.5.{i}", 1, "noop", "", '{"t": 1.5}', "", "", "", "",
               "1699999999000", "", 1, "", 0]
        reply += (one + [""] * fields)[:fields]

    class Canned:
        """The claim script, answering from memory."""

        def __getattr__(self, name: str) -> Any:
            return getattr(scripts, name)

        def claim(self, *args: Any, **kwargs: Any) -> list[Any]:
            return list(reply)

    scripts = rt.scripts
    ledger = Ledger(16, 10**9, 1)
    fetcher = Fetcher(rt, q, ledger, inbox, outcomes, "w1")
    rounds = max(1, n // BATCH)
    rt._scripts = Canned()  # type: ignore[assignment]
    t0 = time.perf_counter()
    for _ in range(rounds):
        fetcher.claim(BATCH, BATCH, 0)
    took = time.perf_counter() - t0
    rt._scripts = scripts
    if phase == "claim":
        return took / (rounds * BATCH) * 1e6
    runs = []
    while not inbox.empty():
        runs.append(inbox.get())
    settler = Settler(rt, q, ledger, outcomes)
    done = [Settlement(r, Done(""), 0.0001, 1_700_000_000_001) for r in runs]
    part = rt.parts[q.name][0]
    # (Settler._add_calls in a checkout from before the builders left settler.py)
    entries = getattr(settler, "entries", None)
    add_calls = entries.add_calls if entries is not None else settler._add_calls
    figures = ([],) if "figures" in inspect.signature(add_calls).parameters else ()  # (a checkout's own)
    conn = rt.redis.connection_pool.get_connection()
    t0 = time.perf_counter()
    for i in range(0, len(done), BATCH):
        pipe = scripts.batch()
        add_calls(part, done[i:i + BATCH], 1_700_000_000_002, pipe, [], *figures)
        for _name, keys, args, _durable in pipe.calls:
            conn.pack_command("EVALSHA", "0" * 40, len(keys), *keys, *args)
    took = time.perf_counter() - t0
    rt.redis.connection_pool.release(conn)
    return took / len(done) * 1e6


def iter_queue(q: queue.SimpleQueue[Any]) -> list[Any]:
    out = []
    while not q.empty():
        out.append(q.get())
    return out


def instructions(phase: str, n: int, env: dict[str, str], cwd: Path) -> tuple[int, int]:
    """Instructions of the measured process, and of the child processes it started (the
    process phase's child; 0 for the others)."""
    with tempfile.TemporaryDirectory() as out:
        proc = subprocess.run(
            ["valgrind", "--tool=callgrind", "--trace-children=yes", f"--callgrind-out-file={out}/cg.%p",
             sys.executable, __file__, "--child", phase, str(n)], env=env, cwd=cwd, capture_output=True,
            text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{phase}: callgrind failed ({proc.returncode}): {proc.stderr[-800:]}")
        # One "Collected" line per process: the first is the measured one.
        counts = {int(pid): int(n) for pid, n in re.findall(r"==(\d+)== Collected : (\d+)", proc.stderr)}
    if not counts:
        raise SystemExit(f"{phase}: no count from callgrind: {proc.stderr[-800:]}")
    main = min(counts, key=lambda pid: proc.stderr.index(f"=={pid}=="))
    # The child's count: the largest of the others (the sentry's shell runs next to nothing).
    others = sorted((c for pid, c in counts.items() if pid != main), reverse=True)
    return counts[main], others[0] if others else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", default=str(BENCH.parent), help="a checkout whose runner/ is measured")
    ap.add_argument("--n", type=int, default=1000, help="jobs per phase at the small count (the large is 3x)")
    ap.add_argument("--no-valgrind", action="store_true", help="wall time only")
    ap.add_argument("--phases", default=",".join(PHASES), help="a subset of the phases")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(f"{child(a.child[0], int(a.child[1])):.3f}")
        return
    sys.path.insert(0, str(BENCH))
    from harness import server

    src = Path(a.src).resolve()
    if not (src / "runner" / "worker").is_dir():
        raise SystemExit(f"--src {src}: no runner/ package there")
    if not a.no_valgrind and shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind), or pass --no-valgrind")
    redis = server.start("auto")
    work = Path(tempfile.mkdtemp(prefix="hotpath-"))
    try:
        root = project(work / "project", src)
        env = {**os.environ, "PYTHONPATH": str(src), "REDIS_URL": redis.url}
        print(f"runner from {src}; server {redis.kind} {redis.version}", flush=True)
        for phase in a.phases.split(","):
            if phase not in PHASES:
                raise SystemExit(f"--phases: unknown {phase!r} ({', '.join(PHASES)})")
            jobs = "10000" if phase.startswith("process") else "20000"  # (within max_jobs_per_child)
            wall = [float(subprocess.run([sys.executable, __file__, "--child", phase, jobs], env=env, cwd=root,
                                         capture_output=True, text=True, check=True).stdout)
                    for _ in range(5)]
            line = f"{phase:>9}: {statistics.median(wall):6.2f} us/job wall (median of 5, {min(wall):.2f} to " \
                   f"{max(wall):.2f})"
            if not a.no_valgrind:
                small, large = (instructions(phase, k, env, root) for k in (a.n, 3 * a.n))
                line += f", {(large[0] - small[0]) // (2 * a.n):,} instructions/job"
                if phase.startswith("process"):
                    line += f" in the worker, {(large[1] - small[1]) // (2 * a.n):,} in its child"
            print(line, flush=True)
    finally:
        redis.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
