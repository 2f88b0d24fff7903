"""Redis's own time for the worst claim call while one worker drains big jobs: N queued
jobs of about 1 MiB for a BATCH function of size N (its claims ask for N), read from
SLOWLOG with every command logged. Each claim call holds Redis for its whole run, every
other client waiting (past busy-reply-threshold, 5 s, they get BUSY).

    python bench/claimstall.py                  # the runner of this checkout, N = 200
    python bench/claimstall.py --src ../other   # another checkout's runner/, for an A/B
    python bench/claimstall.py -n 800           # the reported case (800 MiB in Redis)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

BENCH = Path(__file__).resolve().parent

HANDLER = 'QUEUE = "fast"\nBATCH = {{"size": {n}, "wait": 1}}\n\n\ndef handle_batch(payloads, ctx):\n    return None\n'
ENQUEUE = """
import sys
from runner.client import Client, Request
c = Client.from_config(sys.argv[1])
n = int(sys.argv[2])
pad = "p" * 1_000_000
for i in range(0, n, 8):
    c.enqueue_many([Request("big", {"i": j, "pad": pad}) for j in range(i, min(i + 8, n))])
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", default=str(BENCH.parent), help="a checkout whose runner/ is measured")
    ap.add_argument("-n", type=int, default=200, help="jobs of 1 MiB, and the BATCH size")
    a = ap.parse_args()
    sys.path.insert(0, str(BENCH))
    from harness import server

    src = Path(a.src).resolve()
    srv = server.start("auto")
    work = Path(tempfile.mkdtemp(prefix="claimstall-"))
    try:
        root = work / "project"
        (root / "functions").mkdir(parents=True)
        (root / "functions" / "big.py").write_text(HANDLER.format(n=a.n))
        (root / "schemas" / "big").mkdir(parents=True)
        (root / "schemas" / "big" / "v1.json").write_text(json.dumps({"type": "object"}))
        toml = root / "runner.toml"
        toml.write_text((src / "runner.toml").read_text().replace('prefix = "runner"', 'prefix = "cs"')
                        + '\n[log]\nlevel = "WARNING"\n')
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}
        env.update({"PYTHONPATH": str(src), "REDIS_URL": srv.url})
        r = redis.Redis.from_url(srv.url, decode_responses=True)
        subprocess.run([sys.executable, "-c", ENQUEUE, str(toml), str(a.n)], env=env, cwd=root, check=True)
        r.config_set("slowlog-log-slower-than", 0)
        r.config_set("slowlog-max-len", 1_000_000)
        r.slowlog_reset()
        ready = "cs:{fast}:ready"
        proc = subprocess.Popen([sys.executable, "-m", "runner.cli", "--config", str(toml), "worker", "--queue",
                                 "fast"], env=env, cwd=root, stderr=subprocess.DEVNULL)
        try:
            began = time.monotonic()
            while r.llen(ready) or r.zcard("cs:{fast}:leases"):
                if time.monotonic() - began > 600:
                    raise SystemExit("not drained in 600 s")
                time.sleep(0.2)
        finally:
            proc.terminate()
            proc.wait(30)
        claims = [int(e[2]) for e in r.execute_command("SLOWLOG", "GET", 1_000_000)
                  if len(e[3]) > 4 and str(e[3][0]).upper() in ("EVALSHA", "EVAL")
                  and e[3][3:5] == [ready, "cs:{fast}:leases"]]  # (the claim's first keys)
        print(f"runner from {src}, {srv.kind} {srv.version}, {a.n} jobs of 1 MiB, BATCH size {a.n}")
        print(f"claim calls: {len(claims)}, worst {max(claims) / 1000:.1f} ms, total {sum(claims) / 1000:.1f} ms")
    finally:
        srv.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
