"""Flow control's cost (see harness/flow.py): the plain no-op drain, the drain under a
per-key CONCURRENCY limit (2 per key over 100 keys) and under a global RATE_LIMIT far
above capacity, side by side on one server with the harness' runner workers; each limited
drain as a ratio to the plain one (target: at least 70 %), and the plain drain against
the last full run's (target: within 5 %).

Usage: python bench/flow.py [--quick] [--reps N] [--server auto|redis|valkey]; full: 3
repetitions of 20,000 jobs per drain (run.py's drain), quick: 1 of 5,000. Prints a table
and writes bench/results/flow.{json,md}. `python bench/run.py --extras flow` runs the
same scenario inside a full run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import systems  # first: it freezes the runner under test

systems.snapshot(Path(tempfile.mkdtemp(prefix="bench-runner-")))

from harness import extras, flow, scenarios, server  # noqa: E402


class Size(NamedTuple):
    reps: int
    n: int  # jobs per drain
    cap_s: float  # a drain not done by then is measured on what it ran


# run.py's drain sizes, so the plain drain compares with a full run's.
SIZES = {"full": Size(3, 20000, 20.0), "quick": Size(1, 5000, 10.0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 repetition of 5,000 jobs per drain")
    ap.add_argument("--reps", type=int, help="repetitions (default: 3, quick: 1)")
    ap.add_argument("--server", choices=["auto", "redis", "valkey"], default="auto")
    ap.add_argument("--no-write", action="store_true", help="print only; keep results/ as it is")
    a = ap.parse_args()
    mode = "quick" if a.quick else "full"
    size = SIZES[mode]._replace(reps=a.reps) if a.reps else SIZES[mode]
    redis = server.start(a.server)
    work = server.tmpdir("bench-flow-")
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    try:
        print(f"server: {redis.kind} {redis.version}; scratch: {work}; load {load}", flush=True)
        res = {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "mode": mode,
               "machine": {**extras.env_info(), "redis": f"{redis.kind} {redis.version}",
                           "kernel": platform.release(), "loadavg_start": load},
               "runner_source": systems.git_state(),
               **flow.run(scenarios.Env(redis, work), size.n, size.reps, size.cap_s)}
        res["machine"]["loadavg_end"] = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    finally:
        redis.stop()
    m = res["machine"]
    md = "\n".join([f"# Flow control benchmark, {res['date']}", "",
                    f"Mode: {mode}. Machine: {m['cpus']} cores, Python {m['python']}, {m['redis']}; "
                    f"runner at commit {res['runner_source']['commit']}; load average at start / end: "
                    f"{m['loadavg_start']} / {m['loadavg_end']}.", "", *flow.markdown(res)])
    print(md)
    if not a.no_write:
        out = Path(__file__).resolve().parent / "results"
        out.mkdir(exist_ok=True)
        (out / "flow.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
        (out / "flow.md").write_text(md)
        print(f"written: {out}/flow.json, flow.md", flush=True)


if __name__ == "__main__":
    main()
