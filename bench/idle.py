"""An idle worker's cost (issue 53): one `runner worker --queue fast` process (the
Procfile's) that ran one job and then has nothing to do, next to Huey's consumer with its
2 worker processes: CPU as a share of one core (every thread, from schedstat), wake-ups
per second by thread, and Redis commands per second. Target: runner under 0.5 % of a core
over 60 s.

Usage: python bench/idle.py [--quick] [--reps N] [--seconds S] [--systems runner,huey];
full: 3 repetitions of 60 s each, quick: 1 of 15 s. Prints a table and writes
bench/results/idle.{json,md}. The shell (options, server, results) is light.py's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import light as shell  # first: it freezes the runner under test (bench/light.py)
from harness import light


def _options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--seconds", type=float, help="the idle span measured (default: 60, quick: 15)")


def _measure(run: shell.Run) -> dict[str, Any]:
    seconds = run.args.seconds or (15.0 if run.args.quick else 60.0)
    everyone = [shell.systems.runner_system(run.toml, workers=1, note="1 process (`runner worker --queue fast`)"),
                *run.huey()]
    chosen = [s for s in everyone if s.name in run.wanted]
    return {"reps": run.reps, "seconds": seconds, "idle": light.run_idle(run.env, chosen, run.reps, seconds)}


def main() -> None:
    shell.command("idle", "An idle worker", __doc__ or "", "1 repetition of 15 s", "runner,huey",
                  "runner, huey or both", _options, _measure, light.idle_markdown)


if __name__ == "__main__":
    main()
