"""The longest PING of another client while one worker settles big results: N jobs whose
handlers return about M MB each (4 MB, 240 jobs by default), a client PINGing every 10 ms
beside the drain, and Redis's own time for the longest script call (SLOWLOG).

    python bench/settlestall.py                   # the runner of this checkout, a plain drain
    python bench/settlestall.py --pause           # the settlements sent again into a paused server
    python bench/settlestall.py --src ../other    # another checkout's runner/, for an A/B
    python bench/settlestall.py --aof             # with appendonly yes (everysec), as production

--pause: writes are paused (CLIENT PAUSE WRITE) while the handlers end, the worker's
connections are cut as by a brief outage, and its parked settlements go out again into
the paused server; the pause then ends. Redis reads a client it holds back on and runs all
it read back to back once it lets it go.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import redis

BENCH = Path(__file__).resolve().parent

HANDLER = '''import os
import time
from pathlib import Path

QUEUE = "fast"
BIG = "r" * {size}


def handle(payload, ctx):
    gate = Path(os.environ["GATE_DIR"])
    (gate / f"ran-{{payload['i']}}").touch()
    deadline = time.monotonic() + 120
    while os.environ.get("GATED") and not (gate / "open").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    result = BIG + str(payload["i"])
    (gate / f"ended-{{payload['i']}}").touch()
    return result
'''
ENQUEUE = """
import sys
from runner.client import Client, Request
c = Client.from_config(sys.argv[1])
c.enqueue_many([Request("big", {"i": i}) for i in range(int(sys.argv[2]))])
"""


class Pinger:
    def __init__(self, url: str) -> None:
        self.r = redis.Redis.from_url(url)
        self.waits: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.monotonic()
            self.r.ping()
            self.waits.append(time.monotonic() - t)
            self._stop.wait(0.01)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def poll(pred: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.02)


def held(r: redis.Redis, mine: set[int]) -> int:
    """Bytes Redis read of the other clients and has not run (argv-mem and qbuf)."""
    return sum(int(c["qbuf"]) + int(c["argv-mem"]) for c in r.client_list() if int(c["id"]) not in mine)


def pause_and_park(r: redis.Redis, gate: Path, n: int, mine: set[int]) -> int:
    r.execute_command("CLIENT", "PAUSE", 300_000, "WRITE")
    (gate / "open").touch()
    poll(lambda: len(list(gate.glob("ended-*"))) == n, 120, "every handler to end")
    poll(lambda: held(r, mine) > 1_000_000, 60, "a settlement to wait in the pause")
    for c in r.client_list():
        if int(c["id"]) not in mine:
            r.client_kill_filter(_id=c["id"])
    seen: list[int] = []

    def still() -> bool:
        seen.append(held(r, mine))
        return len(seen) > 50 and seen[-1] > 1_000_000 and seen[-1] == seen[-50]

    poll(still, 120, "the parked settlements to be sent again")
    return seen[-1]


def run(a: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(BENCH))
    from harness import server

    src = Path(a.src).resolve()
    srv = server.start(a.server)
    work = Path(tempfile.mkdtemp(prefix="settlestall-"))
    r = redis.Redis.from_url(srv.url)
    try:
        if a.aof:
            r.config_set("appendonly", "yes")
        root, gate = work / "project", work / "gate"
        gate.mkdir()
        (root / "functions").mkdir(parents=True)
        (root / "functions" / "big.py").write_text(HANDLER.format(size=int(a.mb * 1_000_000)))
        (root / "schemas" / "big").mkdir(parents=True)
        (root / "schemas" / "big" / "v1.json").write_text(json.dumps({"type": "object"}))
        toml = root / "runner.toml"
        shipped = (src / "runner.toml").read_text()
        toml.write_text(re.sub(r"^# max_result_bytes = .*$", f"max_result_bytes = {int(a.mb * 1_000_000) + 1000}",
                               shipped, count=1, flags=re.M)
                        .replace('prefix = "runner"', 'prefix = "ss"')
                        .replace("concurrency = 16", f"concurrency = {a.n}", 1)
                        .replace("prefetch = 16", "prefetch = 0", 1) + '\n[log]\nlevel = "WARNING"\n')
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}
        env.update({"PYTHONPATH": str(src), "REDIS_URL": srv.url, "GATE_DIR": str(gate),
                    **({"GATED": "1"} if a.pause else {})})
        subprocess.run([sys.executable, "-c", ENQUEUE, str(toml), str(a.n)], env=env, cwd=root, check=True)
        r.config_set("slowlog-log-slower-than", 1000)
        r.config_set("slowlog-max-len", 100_000)
        r.slowlog_reset()
        r.config_resetstat()
        proc = subprocess.Popen([sys.executable, "-m", "runner.cli", "--config", str(toml), "worker", "--queue",
                                 "fast"], env=env, cwd=root, stderr=subprocess.DEVNULL)
        pinger: Pinger | None = None
        buffered = 0
        try:
            if a.pause:
                poll(lambda: len(list(gate.glob("ran-*"))) == a.n, 120, "every handler to start")
            pinger = Pinger(srv.url)
            began = time.monotonic()
            mine = {r.client_id(), pinger.r.client_id()}
            if a.pause:
                try:
                    buffered = pause_and_park(r, gate, a.n, mine)
                finally:
                    r.execute_command("CLIENT", "UNPAUSE")
            poll(lambda: r.llen("ss:{fast}:ready") == 0 and r.zcard("ss:{fast}:leases") == 0, 600, "the drain")
            took = time.monotonic() - began
        finally:
            if pinger is not None:
                pinger.stop()
            proc.terminate()
            proc.wait(30)
        calls = [int(e["duration"]) / 1e6 for e in r.slowlog_get(100_000)
                 if bytes(e["command"]).upper().startswith(b"EVAL")]
        assert pinger is not None
        return {"worst_ping_ms": max(pinger.waits) * 1000, "longest_call_ms": max(calls) * 1000,
                "calls_over_1ms": len(calls), "buffered_mb": buffered / 1e6, "drain_s": took,
                "server": f"{srv.kind} {srv.version}"}
    finally:
        r.close()
        srv.stop()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", default=str(BENCH.parent), help="a checkout whose runner/ is measured")
    ap.add_argument("-n", type=int, default=240, help="jobs (and the worker's concurrency)")
    ap.add_argument("--mb", type=float, default=4.0, help="MB of each result")
    ap.add_argument("--pause", action="store_true", help="settle into a paused server (see above)")
    ap.add_argument("--aof", action="store_true", help="appendonly yes")
    ap.add_argument("--server", default="auto", choices=["auto", "redis", "valkey"])
    ap.add_argument("--reps", type=int, default=1)
    a = ap.parse_args()
    rows = [run(a) for _ in range(a.reps)]
    for row in rows:
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}))
    if len(rows) > 1:
        print("median worst PING ms", round(statistics.median(r["worst_ping_ms"] for r in rows)))


if __name__ == "__main__":
    main()
