"""An idle worker's cost (issue 53): one `runner worker --queue fast` process (the
Procfile's) that ran one job and then has nothing to do, next to Huey's consumer with its
2 worker processes: CPU as a share of one core (every thread, from schedstat), wake-ups
per second by thread, and Redis commands per second. Target: runner under 0.5 % of a core
over 60 s.

Usage: python bench/idle.py [--quick] [--reps N] [--seconds S] [--systems runner,huey];
full: 3 repetitions of 60 s each, quick: 1 of 15 s. Prints a table and writes
bench/results/idle.{json,md}.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import systems  # first: it freezes the runner under test

systems.snapshot(Path(tempfile.mkdtemp(prefix="bench-runner-")))

from harness import light, scenarios, standalone, venv  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 repetition of 15 s")
    ap.add_argument("--reps", type=int, help="repetitions (default: 3, quick: 1)")
    ap.add_argument("--seconds", type=float, help="the idle span measured (default: 60, quick: 15)")
    ap.add_argument("--systems", default="runner,huey", help="runner, huey or both")
    ap.add_argument("--server", choices=["auto", "redis", "valkey"], default="auto")
    ap.add_argument("--no-write", action="store_true", help="print only; keep results/ as it is")
    a = ap.parse_args()
    mode = "quick" if a.quick else "full"
    reps = a.reps or (1 if a.quick else 3)
    seconds = a.seconds or (15.0 if a.quick else 60.0)
    wanted = a.systems.split(",")

    def scenario(env: scenarios.Env) -> dict[str, object]:
        toml = systems.runner_project(env.work / "project")
        chosen = [systems.runner_system(toml, workers=1, note="1 process (`runner worker --queue fast`)")]
        if "huey" in wanted:
            chosen += [s for s in systems.peer_systems(str(venv.ensure()), env.url) if s.name == "huey"]
        chosen = [s for s in chosen if s.name in wanted]
        return {"reps": reps, "seconds": seconds, "idle": light.run_idle(env, chosen, reps, seconds)}

    standalone.run("idle", "An idle worker", mode, a.server, not a.no_write, scenario, light.idle_markdown)


if __name__ == "__main__":
    main()
