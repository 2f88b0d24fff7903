"""Emit throughput (docs/events.md): emits per second from one producer thread, with 1
subscriber and with 5 subscribers on 2 queues, side by side in one run, next to plain
enqueues of one job for scale. Each emit validates against every subscriber and is one
script call (plus the placing of the other queue's jobs from the outbox).

Usage: python bench/events.py [--emits N].  bench/run.py runs it as the "events" extra.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run by itself: the repository's runner (bench/run.py has its snapshot first)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runner import config as config_mod
from runner.client import Client
from runner.runtime import Runtime
from runner.store.embedded import Server

SUB = 'QUEUE = "{queue}"\nTRIGGERS = [{events}]\n\ndef handle(payload, ctx):\n    return None\n'
SCHEMA = '{"type": "object", "required": ["order_id"], "properties": {"order_id": {"type": "integer"}}}'
TOML = """
[redis]
prefix = "be"
[queues.a]
[queues.b]
"""


def project(root: Path) -> None:
    """One subscriber of "one", five of "five" (three on queue a, two on b), and a plain
    function for the enqueue baseline."""
    subs = {"only": ("a", '"one"'), "s1": ("a", '"five"'), "s2": ("a", '"five"'), "s3": ("a", '"five"'),
            "s4": ("b", '"five"'), "s5": ("b", '"five"'), "plain": ("a", "")}
    (root / "functions").mkdir(parents=True)
    for name, (queue, events) in subs.items():
        (root / "functions" / f"{name}.py").write_text(SUB.format(queue=queue, events=events))
        (root / "schemas" / name).mkdir(parents=True)
        (root / "schemas" / name / "v1.json").write_text(SCHEMA)
    (root / "runner.toml").write_text(TOML)


def rate(fn: Any, n: int) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        fn(i)
    return n / (time.perf_counter() - t0)


def run(n: int = 5000, url: str | None = None) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-events-"))
    server = None if url else Server(tmp / "redis").start()
    try:
        root = tmp / "project"
        project(root)
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")},
               "REDIS_URL": url or (server.url if server else "")}
        client = Client(Runtime.create(config_mod.load(root / "runner.toml", env=env)))
        rate(lambda i: client.emit("five", {"order_id": i}), min(n, 500))  # warm-up
        out = {
            "enqueue_per_s": rate(lambda i: client.enqueue("plain", {"order_id": i}), n),
            "emit_1_per_s": rate(lambda i: client.emit("one", {"order_id": i}), n),
            "emit_5_per_s": rate(lambda i: client.emit("five", {"order_id": i}), n),
            "emits": n,
        }
        client.close()
        return out
    finally:
        if server is not None:
            server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--emits", type=int, default=5000)
    a = ap.parse_args()
    r = run(a.emits)
    print(f"one producer thread, {r['emits']:,} each: enqueue (1 job) {r['enqueue_per_s']:,.0f}/s; "
          f"emit to 1 subscriber {r['emit_1_per_s']:,.0f}/s; emit to 5 subscribers on 2 queues "
          f"{r['emit_5_per_s']:,.0f}/s ({5 * r['emit_5_per_s']:,.0f} jobs/s)")


if __name__ == "__main__":
    main()
