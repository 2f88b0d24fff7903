"""Redis time per job of the transition scripts (see harness/scriptcost.py): enqueue,
claim, start and ack through runner's Scripts API on the benchmark's own server, from
INFO commandstats. Redis is one thread that every worker and web process shares: its
time per job bounds what one server can drain, whatever the machines in front of it.

Usage: python bench/scripts.py [--quick] [--reps N] [--server auto|redis|valkey]
[--variant plain|keyed|rated|single]; full: 5 repetitions of 20,000 jobs, quick: 3 of 5,000.
keyed and rated put the jobs under a per-key CONCURRENCY and a RATE_LIMIT, as bench/flow.py
does; single runs one job per call, as light load does (each call's own cost paid per
job). Prints a table and writes bench/results/scripts[-VARIANT].{json,md}. Run it on two
commits to weigh a change to a script. With --instructions, the server's instructions per
job instead, counted by callgrind (valgrind): exact from run to run, where a timing on
these machines wanders by a third.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import systems  # first: it freezes the runner under test

systems.snapshot(Path(tempfile.mkdtemp(prefix="bench-runner-")))

from harness import scriptcost, standalone  # noqa: E402

SIZES = {"full": (5, 20_000), "quick": (3, 5_000)}  # reps, jobs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int)
    ap.add_argument("--server", choices=["auto", "redis", "valkey"], default="auto")
    ap.add_argument("--variant", choices=["plain", "keyed", "rated", "single"], default="plain")
    ap.add_argument("--instructions", action="store_true",
                    help="count the server's instructions per job under callgrind (needs valgrind)")
    ap.add_argument("--no-write", action="store_true", help="print only; keep results/ as it is")
    a = ap.parse_args()
    mode = "quick" if a.quick else "full"
    reps, n = SIZES[mode]
    if a.instructions:
        import shutil

        from harness import server

        binary = shutil.which("redis-server") or server.bundled_binary()
        res = scriptcost.instructions(binary, 1000 if a.quick else 2000, a.variant, server.tmpdir("bench-cg-"))
        print(f"{a.variant}: {res['instructions_per_job']:,.0f} server instructions per job "
              f"(enqueue, claim, start and ack; {res['binary']})")
        return
    name = "scripts" if a.variant == "plain" else f"scripts-{a.variant}"
    standalone.run(name, "Redis time per job of the transition scripts", mode, a.server, not a.no_write,
                   lambda env: scriptcost.run(env, n, a.reps or reps, a.variant), scriptcost.markdown)


if __name__ == "__main__":
    main()
