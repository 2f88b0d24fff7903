"""Start-up of a command (see harness/startup.py): `python -c pass`, `runner --help`,
`runner stats` and `runner job ID`, each a fresh process, interleaved round by round so
drift hits them alike; each command's wall and CPU ms over the interpreter's, pair by pair
(median and quartiles). Target: `runner stats` and `runner job ID` within 60 ms of
`python -c pass`, and `runner --help` no slower than before.

Usage: python bench/startup.py [--quick] [--rounds N] [--server auto|redis|valkey]; full:
60 rounds, quick: 15. Prints a table and writes bench/results/startup.{json,md}. `python
bench/run.py --extras startup` runs the same scenario, and a worker's start, in a full run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import systems  # first: it freezes the runner under test

systems.snapshot(Path(tempfile.mkdtemp(prefix="bench-runner-")))

from harness import standalone, startup  # noqa: E402

ROUNDS = {"full": 60, "quick": 15}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--server", choices=["auto", "redis", "valkey"], default="auto")
    ap.add_argument("--no-write", action="store_true", help="print only; keep results/ as it is")
    a = ap.parse_args()
    mode = "quick" if a.quick else "full"
    rounds = a.rounds or ROUNDS[mode]
    standalone.run("startup", "Start-up benchmark", mode, a.server, not a.no_write,
                   lambda env: {"cli": startup.cli(env, systems.runner_system(
                       systems.runner_project(env.work / "project")), rounds)},
                   startup.markdown)


if __name__ == "__main__":
    main()
