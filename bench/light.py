"""Light load (issue 53): worker CPU per job while 500 jobs/s are offered one at a time
(open loop), for runner with 1 and with 2 worker processes and for Huey (1 consumer, 2
worker processes), interleaved on one server; also Redis CPU and commands per job, and
p50/p99 latency. Target: runner's worker CPU per job at most Huey's, for both.

Usage: python bench/light.py [--quick] [--reps N] [--n N] [--rate R] [--systems ...];
full: 3 repetitions of 2,500 jobs (run.py's latency scenario), quick: 1 of 1,000. Prints
a table and writes bench/results/light.{json,md}. `python bench/idle.py` measures an idle
worker through the same shell (``command`` below).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import systems  # first: it freezes the runner under test

systems.snapshot(Path(tempfile.mkdtemp(prefix="bench-runner-")))

from harness import light, scenarios, standalone, venv  # noqa: E402


@dataclass(frozen=True, slots=True)
class Run:
    """What a measurement gets: the parsed options, the repetitions, the systems asked
    for, the server and scratch space, and the runner project to run."""

    args: argparse.Namespace
    reps: int
    wanted: list[str]
    env: scenarios.Env
    toml: Path

    def huey(self) -> list[Any]:
        """Huey's consumer (2 worker processes) when asked for."""
        if "huey" not in self.wanted:
            return []
        return [s for s in systems.peer_systems(str(venv.ensure()), self.env.url) if s.name == "huey"]


def command(name: str, title: str, doc: str, quick: str, systems_default: str, systems_help: str,
            options: Callable[[argparse.ArgumentParser], None], measure: Callable[[Run], dict[str, Any]],
            markdown: Callable[[dict[str, Any]], list[str]]) -> None:
    """The shell of light.py and idle.py: their shared options (--quick, --reps,
    --systems, --server, --no-write) and ``options``' own, then one standalone run of
    ``measure`` on a fresh server and project, written to results/<name>.{json,md}."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=quick)
    ap.add_argument("--reps", type=int, help="repetitions (default: 3, quick: 1)")
    options(ap)
    ap.add_argument("--systems", default=systems_default, help=systems_help)
    ap.add_argument("--server", choices=["auto", "redis", "valkey"], default="auto")
    ap.add_argument("--no-write", action="store_true", help="print only; keep results/ as it is")
    a = ap.parse_args()
    mode = "quick" if a.quick else "full"
    reps = a.reps or (1 if a.quick else 3)

    def scenario(env: scenarios.Env) -> dict[str, Any]:
        toml = systems.runner_project(env.work / "project")
        return measure(Run(a, reps, a.systems.split(","), env, toml))

    standalone.run(name, title, mode, a.server, not a.no_write, scenario, markdown)


def _options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--n", type=int, help="jobs offered per run (default: 2,500, quick: 1,000)")
    ap.add_argument("--rate", type=float, default=500.0, help="jobs offered per second")


def _measure(run: Run) -> dict[str, Any]:
    n = run.args.n or (1000 if run.args.quick else 2500)
    everyone = [systems.runner_system(run.toml, workers=1, system_name="runner-1",
                                      note="1 process x 16 threads (shipped defaults)"),
                systems.runner_system(run.toml), *run.huey()]
    chosen = [s for s in everyone if s.name in run.wanted]
    return {"reps": run.reps, "n": n, "rate_per_s": run.args.rate,
            "rate": light.run_rate(run.env, chosen, run.reps, n, run.args.rate)}


def main() -> None:
    command("light", "Light load", __doc__ or "", "1 repetition of 1,000 jobs", "runner-1,runner,huey",
            "of runner-1, runner, huey", _options, _measure, light.rate_markdown)


if __name__ == "__main__":
    main()
