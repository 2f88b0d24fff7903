"""Call and wait's cost (see harness/waits.py): `POST /jobs/noop?wait=5` against the plain
`POST /jobs/noop`, both paced at 200 requests/s with 2 workers draining, and the plain
no-op drain with the wait support present but unused against the last full run's.

Usage: python bench/wait.py [--quick] [--reps N] [--server auto|redis|valkey]; full: 3
repetitions of 10 s paced runs and of 20,000-job drains, quick: 1 of 4 s and 5,000.
Needs wrk (apt-get install wrk). Prints a table and writes bench/results/wait.{json,md}.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import systems  # first: it freezes the runner under test

systems.snapshot(Path(tempfile.mkdtemp(prefix="bench-runner-")))

from harness import standalone, waits  # noqa: E402

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
    standalone.run("wait", "Call and wait benchmark", mode, a.server, not a.no_write,
                   lambda env: waits.run(env, n, reps, cap, seconds), waits.markdown)


if __name__ == "__main__":
    main()
