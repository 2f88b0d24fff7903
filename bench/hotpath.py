"""Instructions per job on a worker's hot path, counted by callgrind: a figure that holds
from one run to the next whatever else the machine does, for A/B comparisons of changes
too small to see through a drain's noise.

    python bench/hotpath.py                  # the runner of this checkout
    python bench/hotpath.py --src ../other   # another checkout's runner/, for an A/B
    python bench/hotpath.py --no-valgrind    # wall time only (microseconds per job)
    python bench/hotpath.py --phases executor

Three phases, each on one thread with no Redis round trip inside the loop (a server is
started for the runtime's set-up only):

- executor: Executors._loop over N claimed no-op jobs, schema validation on: pick,
  resolve and validate, the Context, the timeout guard, the run, the settlement;
- claim: Fetcher.claim turning a 20-job claim reply into runs on the inbox (the script
  call answers from memory);
- settle: Settler._add_calls building the acks of 20 done jobs, and the commands packed
  as the pipeline would send them.

Instructions per job are (count at 3N - count at N) / 2N, so start-up and imports cancel
out. Needs valgrind (Debian's package); about two minutes.
"""

from __future__ import annotations

import argparse
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
PHASES = ("executor", "claim", "settle")
BATCH = 20  # jobs per claim reply and per settle batch

HANDLER = 'QUEUE = "fast"\n\n\ndef handle(payload, ctx):\n    return None\n'
SCHEMA = {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
          "properties": {"t": {"type": "number"}}, "additionalProperties": False}


def project(root: Path, src: Path) -> Path:
    (root / "functions").mkdir(parents=True, exist_ok=True)
    (root / "functions" / "noop.py").write_text(HANDLER)
    (root / "schemas" / "noop").mkdir(parents=True, exist_ok=True)
    (root / "schemas" / "noop" / "v1.json").write_text(json.dumps(SCHEMA))
    shipped = (src / "runner.toml") if (src / "runner.toml").exists() else BENCH.parent / "runner.toml"
    text = shipped.read_text().replace('prefix = "runner"', 'prefix = "hotpath"')
    (root / "runner.toml").write_text(text + '\n[log]\nlevel = "WARNING"\n')
    return root


def child(phase: str, n: int) -> float:
    """Run one phase over ``n`` jobs in this process; microseconds per job."""
    from runner.config import load
    from runner.runtime import Runtime
    from runner.worker.execute import Claimed, Done
    from runner.worker.executors import Executors
    from runner.worker.fetcher import Fetcher
    from runner.worker.ledger import Ledger, Run, Settlement
    from runner.worker.settler import Settler

    cfg = load(None)
    rt = Runtime.create(cfg)
    q = cfg.queues["fast"]
    inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
    outbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
    if phase == "executor":
        ledger = Ledger(16, n + 16, 16)
        ex = Executors(rt, q, ledger, inbox, outbox, lambda job: True)
        runs = [Run(Claimed(f"j{i}", f"t{i}", 1, "noop", "1", '{"t": 1.5}', 5, "", "", 1, 1, "", "fast", 1000))
                for i in range(n)]
        ledger.claimed(runs)
        for r in runs:
            inbox.put(r)
        inbox.put(None)
        t0 = time.perf_counter()
        ex._loop(0)
        took = time.perf_counter() - t0
        if outbox.qsize() != n:
            raise SystemExit(f"executor: {outbox.qsize()} settlements for {n} jobs")
        return took / n * 1e6
    reply: list[Any] = [1_700_000_000_000, 0]
    for i in range(BATCH):
        reply += [f"01JHOTPATH{i:016d}", f"w1.5.{i}", 1, "noop", "", '{"t": 1.5}', "", "", "", "",
                  "1699999999000", "", 1, ""]

    class Canned:
        """The claim script, answering from memory."""

        def __getattr__(self, name: str) -> Any:
            return getattr(scripts, name)

        def claim(self, *args: Any, **kwargs: Any) -> list[Any]:
            return list(reply)

    scripts = rt.scripts
    ledger = Ledger(16, 10**9, 1)
    fetcher = Fetcher(rt, q, ledger, inbox, outbox, "w1")
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
    settler = Settler(rt, q, ledger, outbox)
    done = [Settlement(r, Done(""), 0.0001, 1_700_000_000_001) for r in runs]
    part = rt.parts[q.name][0]
    conn = rt.redis.connection_pool.get_connection()
    t0 = time.perf_counter()
    for i in range(0, len(done), BATCH):
        pipe = scripts.batch()
        settler._add_calls(part, done[i:i + BATCH], 1_700_000_000_002, pipe, [])
        for _name, keys, args, _durable in pipe.calls:
            conn.pack_command("EVALSHA", "0" * 40, len(keys), *keys, *args)
    took = time.perf_counter() - t0
    rt.redis.connection_pool.release(conn)
    return took / len(done) * 1e6


def instructions(phase: str, n: int, env: dict[str, str], cwd: Path) -> int:
    with tempfile.NamedTemporaryFile(suffix=".cg") as out:
        proc = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out.name}", sys.executable, __file__,
             "--child", phase, str(n)], env=env, cwd=cwd, capture_output=True, text=True)
    m = re.search(r"Collected : (\d+)", proc.stderr)
    if proc.returncode != 0 or not m:
        raise SystemExit(f"{phase}: callgrind failed ({proc.returncode}): {proc.stderr[-800:]}")
    return int(m.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", default=str(BENCH.parent), help="a checkout whose runner/ is measured")
    ap.add_argument("--n", type=int, default=1000, help="jobs per phase at the small count (the large is 3x)")
    ap.add_argument("--no-valgrind", action="store_true", help="wall time only")
    ap.add_argument("--phases", default=",".join(PHASES), help="a subset of executor,claim,settle")
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
                raise SystemExit(f"--phases: unknown {phase!r} (executor, claim, settle)")
            wall = [float(subprocess.run([sys.executable, __file__, "--child", phase, "20000"], env=env, cwd=root,
                                         capture_output=True, text=True, check=True).stdout)
                    for _ in range(5)]
            line = f"{phase:>9}: {statistics.median(wall):6.2f} us/job wall (median of 5, {min(wall):.2f} to " \
                   f"{max(wall):.2f})"
            if not a.no_valgrind:
                small, large = (instructions(phase, k, env, root) for k in (a.n, 3 * a.n))
                line += f", {(large - small) // (2 * a.n):,} instructions/job"
            print(line, flush=True)
    finally:
        redis.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
