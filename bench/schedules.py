"""Schedules under load (see harness/ticks.py): 10,000 schedules due on the same minute
fired by two workers on 2 cores, each tick measured from its time to its job's creation;
and the CPU idle schedules cost a worker.

Usage: python bench/schedules.py [--schedules 10000] [--rounds 3] [--idle-seconds 20];
prints a summary and writes bench/results/schedules.json. `python bench/run.py --extras
schedules` runs the same scenario inside a full run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import server, ticks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schedules", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--idle-seconds", type=float, default=20.0)
    ap.add_argument("--server", choices=["auto", "redis", "valkey"], default="auto")
    a = ap.parse_args()
    redis = server.start(a.server)
    work = server.tmpdir("bench-schedules-")
    try:
        print(f"server: {redis.kind} {redis.version}; scratch: {work}", flush=True)
        res = {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
               "redis": f"{redis.kind} {redis.version}",
               **ticks.run(redis.url, work, a.schedules, a.rounds, a.idle_seconds)}
    finally:
        redis.stop()
    b = res["burst"]
    print(f"burst: {b['schedules']} schedules, {b['workers']} workers: worst tick {b['max_late_ms']:.0f} ms "
          f"late ({'within' if b['within_2s'] else 'NOT within'} 2 s); adopted in {b['adopt_s']} s")
    for row in res["idle"]["rows"]:
        print(f"idle: {row['schedules']} schedules: {row['cpu_ms_per_s']} ms CPU/s"
              + (f" (+{row['extra_cpu_ms_per_s_per_1000']} ms/s per 1,000)" if "extra_cpu_ms_per_s_per_1000" in row
                 else ""))
    out = Path(__file__).resolve().parent / "results" / "schedules.json"
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"written: {out}")


if __name__ == "__main__":
    main()
