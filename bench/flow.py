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
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import systems  # first: it freezes the runner under test

systems.snapshot(Path(tempfile.mkdtemp(prefix="bench-runner-")))

from harness import flow, standalone  # noqa: E402


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
    standalone.run("flow", "Flow control benchmark", mode, a.server, not a.no_write,
                   lambda env: flow.run(env, size.n, size.reps, size.cap_s), flow.markdown)


if __name__ == "__main__":
    main()
