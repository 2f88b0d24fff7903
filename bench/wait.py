"""Call and wait's cost (see harness/waits.py): `POST /jobs/noop?wait=5` against the plain
`POST /jobs/noop`, both paced at 200 requests/s with 2 workers draining, and the plain
no-op drain with the wait support present but unused against the last full run's.

Usage: python bench/wait.py [--quick] [--reps N] [--server auto|redis|valkey]; full: 3
repetitions of 10 s paced runs and of 20,000-job drains, quick: 1 of 4 s and 5,000.
Needs wrk (apt-get install wrk). Prints a table and writes bench/results/wait.{json,md}.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import systems  # first: it freezes the runner under test

systems.snapshot(Path(tempfile.mkdtemp(prefix="bench-runner-")))

from harness import extras, scenarios, server, waits  # noqa: E402

SIZES = {"full": (3, 10, 20000, 20.0), "quick": (1, 4, 5000, 10.0)}  # reps, seconds, drain n, cap


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int)
    ap.add_argument("--server", choices=["auto", "redis", "valkey"], default="auto")
    ap.add_argument("--no-write", action="store_true", help="print only; keep results/ as it is")
    a = ap.parse_args()
    mode = "quick" if a.quick else "full"
    reps, seconds, n, cap = SIZES[mode]
    reps = a.reps or reps
    redis = server.start(a.server)
    work = server.tmpdir("bench-wait-")
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    try:
        print(f"server: {redis.kind} {redis.version}; scratch: {work}; load {load}", flush=True)
        res = {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "mode": mode,
               "machine": {**extras.env_info(), "redis": f"{redis.kind} {redis.version}",
                           "kernel": platform.release(), "loadavg_start": load},
               "runner_source": systems.git_state(),
               **waits.run(scenarios.Env(redis, work), n, reps, cap, seconds)}
        res["machine"]["loadavg_end"] = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    finally:
        redis.stop()
    m = res["machine"]
    md = "\n".join([f"# Call and wait benchmark, {res['date']}", "",
                    f"Mode: {mode}. Machine: {m['cpus']} cores, Python {m['python']}, {m['redis']}; "
                    f"runner at commit {res['runner_source']['commit']}; load average at start / end: "
                    f"{m['loadavg_start']} / {m['loadavg_end']}.", "", *waits.markdown(res)])
    print(md)
    if not a.no_write:
        out = Path(__file__).resolve().parent / "results"
        out.mkdir(exist_ok=True)
        (out / "wait.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
        (out / "wait.md").write_text(md)
        print(f"written: {out}/wait.json, wait.md", flush=True)


if __name__ == "__main__":
    main()
