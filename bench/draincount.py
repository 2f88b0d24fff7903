"""Instructions per job of a real worker draining no-op jobs, counted by callgrind, with
the Redis commands and script calls each job cost: the whole worker (fetcher, executor
threads, settler, renewer, scheduler, ticker), where bench/hotpath.py counts one phase.

    python bench/draincount.py                  # the runner of this checkout
    python bench/draincount.py --src ../other   # another checkout's runner/, for an A/B
    python bench/draincount.py --queue slow     # the shipped slow queue (process isolation)

N no-op jobs (the benchmark's schema, validated) are queued, then one `runner worker`
process is started under callgrind and stopped by SIGTERM once the queue is empty; the
same again with 3N jobs. Instructions per job are (count at 3N - count at N) / 2N, so
start-up, imports and the shutdown cancel out; the same difference of INFO commandstats
gives the commands and script calls per job. Under callgrind a worker runs about 50 times
slower on one core at a time, so claims and settlements batch as under a heavy load: the
figures compare two checkouts, they do not predict a drain's rate.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

BENCH = Path(__file__).resolve().parent

HANDLER = 'QUEUE = "{queue}"\n\n\ndef handle(payload, ctx):\n    return None\n'
SCHEMA = {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
          "properties": {"t": {"type": "number"}}, "additionalProperties": False}
ENQUEUE = """
import sys
from runner.client import Client, Request
c = Client.from_config(sys.argv[1])
n = int(sys.argv[2])
for i in range(0, n, 500):
    out = c.enqueue_many([Request("noop", {"t": 1.5}) for _ in range(min(500, n - i))], batch=500)
    bad = [r for r in out if isinstance(r, Exception)]
    if bad:
        raise bad[0]
"""
SCRIPT_CALLS = ("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro")
HARNESS = ("info", "config|resetstat", "flushall", "ping", "llen", "zcard", "script|flush")
# --calls: the worker under a profile hook that counts Python calls by function, in every
# thread, written as JSON at exit (a count per function, where callgrind's is per C frame).
CALLS = """
import atexit, collections, json, os, runpy, sys, threading
counts = collections.Counter()
def hook(frame, event, arg):
    if event == "call":
        c = frame.f_code
        counts[f"{c.co_filename.rsplit('/runner/', 1)[-1]}:{c.co_firstlineno}:{c.co_qualname}"] += 1
def dump():
    sys.setprofile(None)
    while True:  # (threads still count while the copy is made)
        try:
            text = json.dumps(dict(counts))
            break
        except RuntimeError:
            pass
    with open(os.environ["DRAINCOUNT_CALLS"], "w") as f:
        f.write(text)
atexit.register(dump)
threading.setprofile(hook)
sys.setprofile(hook)
sys.argv = ["runner", *sys.argv[1:]]
runpy.run_module("runner.cli", run_name="__main__")
"""


def project(root: Path, src: Path, queue: str) -> Path:
    (root / "functions").mkdir(parents=True, exist_ok=True)
    (root / "functions" / "noop.py").write_text(HANDLER.format(queue=queue))
    (root / "schemas" / "noop").mkdir(parents=True, exist_ok=True)
    (root / "schemas" / "noop" / "v1.json").write_text(json.dumps(SCHEMA))
    text = (src / "runner.toml").read_text().replace('prefix = "runner"', 'prefix = "dc"')
    toml = root / "runner.toml"
    toml.write_text(text + '\n[log]\nlevel = "WARNING"\n')
    return toml


def commandstats(r: redis.Redis) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in r.info("commandstats").items()}


def drain(n: int, queue: str, toml: Path, env: dict[str, str], r: redis.Redis,
          valgrind: bool, calls: Path | None) -> tuple[int, dict[str, int], float]:
    """One worker's run over ``n`` queued jobs: its instructions (or CPU seconds x 1e9
    without valgrind), the server's commands, and the wall seconds."""
    r.flushall()
    r.script_flush()
    subprocess.run([sys.executable, "-c", ENQUEUE, str(toml), str(n)], env=env, cwd=toml.parent, check=True)
    r.config_resetstat()
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "runner.cli", "--config", str(toml), "worker", "--queue", queue]
        if calls is not None:
            cmd[1:3] = ["-c", CALLS]
            env = {**env, "DRAINCOUNT_CALLS": str(calls)}
        if valgrind:
            cmd = ["valgrind", "--tool=callgrind", "--trace-children=yes",
                   f"--callgrind-out-file={out}/cg.%p", *cmd]
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, env=env, cwd=toml.parent, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        ready, leases = f"dc:{{{queue}}}:ready", f"dc:{{{queue}}}:leases"
        while r.llen(ready) or r.zcard(leases):
            if proc.poll() is not None:
                raise SystemExit(f"the worker exited ({proc.returncode}): {proc.stderr.read()[-1500:]}")
            time.sleep(0.02)
        took = time.monotonic() - t0
        cmds = commandstats(r)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=600)
    if valgrind:
        counts = [int(c) for c in re.findall(r"==\d+== Collected : (\d+)", err)]
        if not counts:
            raise SystemExit(f"no count from callgrind: {err[-1500:]}")
        return sum(counts), cmds, took
    return 0, cmds, took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", default=str(BENCH.parent), help="a checkout whose runner/ is measured")
    ap.add_argument("--n", type=int, default=2000, help="jobs at the small count (the large is 3x)")
    ap.add_argument("--queue", default="fast", help="the shipped queue the jobs run on")
    ap.add_argument("--no-valgrind", action="store_true", help="commands per job only")
    ap.add_argument("--calls", type=int, default=0, metavar="K",
                    help="no valgrind: the K functions whose Python calls per job grew most")
    a = ap.parse_args()
    sys.path.insert(0, str(BENCH))
    from harness import server

    src = Path(a.src).resolve()
    if not (src / "runner" / "worker").is_dir():
        raise SystemExit(f"--src {src}: no runner/ package there")
    srv = server.start("auto")
    work = Path(tempfile.mkdtemp(prefix="draincount-"))
    try:
        toml = project(work / "project", src, a.queue)
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}
        env.update({"PYTHONPATH": str(src), "REDIS_URL": srv.url})
        r = redis.Redis.from_url(srv.url, decode_responses=True)
        valgrind = not (a.no_valgrind or a.calls)
        small, large = (drain(k, a.queue, toml, env, r, valgrind, work / f"calls{k}.json" if a.calls else None)
                        for k in (a.n, 3 * a.n))
        jobs = 2 * a.n
        names = sorted(set(small[1]) | set(large[1]))
        per = {k: (large[1].get(k, 0) - small[1].get(k, 0)) / jobs for k in names if k not in HARNESS}
        scripts = sum(v for k, v in per.items() if k in SCRIPT_CALLS)
        print(f"runner from {src}, queue {a.queue}, {a.n} and {3 * a.n} jobs "
              f"({small[2]:.1f} s and {large[2]:.1f} s)")
        if valgrind:
            print(f"instructions/job: {(large[0] - small[0]) // jobs:,}")
        print(f"Redis commands/job: {sum(per.values()):.3f}, script calls/job: {scripts:.3f}")
        print("  " + ", ".join(f"{k} {v:.3f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1])
                               if abs(v) >= 0.001))
        if a.calls:
            c1, c3 = (json.loads((work / f"calls{k}.json").read_text()) for k in (a.n, 3 * a.n))
            per_fn = {k: (c3.get(k, 0) - c1.get(k, 0)) / jobs for k in set(c1) | set(c3)}
            print(f"Python calls/job: {sum(per_fn.values()):.1f}")
            for k, v in sorted(per_fn.items(), key=lambda kv: -kv[1])[:a.calls]:
                print(f"  {v:8.3f}  {k}")
    finally:
        srv.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
