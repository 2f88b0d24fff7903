"""Light load (issue 53): worker CPU per job while 500 jobs/s are offered one at a time
(open loop), for runner with 1 and with 2 worker processes and for Huey (1 consumer, 2
worker processes), interleaved on one server; also Redis CPU and commands per job, and
p50/p99 latency. Target: runner's worker CPU per job at most Huey's, for both.

Usage: python bench/light.py [--quick] [--reps N] [--n N] [--rate R] [--systems ...];
full: 3 repetitions of 2,500 jobs (run.py's latency scenario), quick: 1 of 1,000. Prints
a table and writes bench/results/light.{json,md}. `python bench/idle.py` measures an idle
worker.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import systems  # first: it freezes the runner under test

systems.snapshot(Path(tempfile.mkdtemp(prefix="bench-runner-")))

from harness import light, scenarios, standalone, venv  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 repetition of 1,000 jobs")
    ap.add_argument("--reps", type=int, help="repetitions (default: 3, quick: 1)")
    ap.add_argument("--n", type=int, help="jobs offered per run (default: 2,500, quick: 1,000)")
    ap.add_argument("--rate", type=float, default=500.0, help="jobs offered per second")
    ap.add_argument("--systems", default="runner-1,runner,huey", help="of runner-1, runner, huey")
    ap.add_argument("--server", choices=["auto", "redis", "valkey"], default="auto")
    ap.add_argument("--no-write", action="store_true", help="print only; keep results/ as it is")
    a = ap.parse_args()
    mode = "quick" if a.quick else "full"
    reps = a.reps or (1 if a.quick else 3)
    n = a.n or (1000 if a.quick else 2500)
    wanted = a.systems.split(",")

    def scenario(env: scenarios.Env) -> dict[str, Any]:
        toml = systems.runner_project(env.work / "project")
        everyone = [systems.runner_system(toml, workers=1, system_name="runner-1",
                                          note="1 process x 16 threads (shipped defaults)"),
                    systems.runner_system(toml)]
        if "huey" in wanted:
            everyone += [s for s in systems.peer_systems(str(venv.ensure()), env.url) if s.name == "huey"]
        chosen = [s for s in everyone if s.name in wanted]
        return {"reps": reps, "n": n, "rate_per_s": a.rate, "rate": light.run_rate(env, chosen, reps, n, a.rate)}

    standalone.run("light", "Light load", mode, a.server, not a.no_write, scenario, light.rate_markdown)


if __name__ == "__main__":
    main()
