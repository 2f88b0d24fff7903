"""The chaos test (bounded by default: 300 jobs and 7 s of faults, the first two a
SIGKILL and a SIGTERM, and Redis restarted gracefully and then by SIGKILL within them;
RUNNER_TEST_FULL=1 runs the full size that docs/chaos.md reports, 20,000 jobs and 180 s;
CHAOS_JOBS, CHAOS_SECONDS, CHAOS_WORKERS and CHAOS_SEED set each). Prints the figures
table (pytest -s shows it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from chaoskit import Chaos

from conftest import size


def _env(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


SECONDS = size("CHAOS_SECONDS", 7, 180)
JOBS = int(size("CHAOS_JOBS", 300, 20_000))


@pytest.mark.timeout(int(SECONDS * 2 + 240))
@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_chaos_nothing_lost_nothing_doubled(tmp_path: Path, isolation: str) -> None:
    """Workers SIGKILLed and SIGTERMed, Redis restarted (gracefully and by SIGKILL) at
    random moments under load with idempotency keys, resource keys, transient failures
    and slow jobs, with handlers in threads and in child processes: every accepted job
    ends done or dead, none is lost, no handler runs beyond what the history accounts
    for, no idempotency key has two jobs' effects, and no job, lease or lock is left
    behind."""
    chaos = Chaos(
        tmp_path,
        jobs=JOBS,
        seconds=SECONDS,
        workers=int(_env("CHAOS_WORKERS", 3)),
        faults=True,
        seed=int(_env("CHAOS_SEED", 8)),
        isolation=isolation,
    )
    fig = chaos.run()
    print("\n" + fig.table())
    report = os.environ.get("CHAOS_REPORT")
    if report:
        Path(report).write_text(fig.table() + "\n")
    assert fig.sigkills > 0 and fig.sigterms > 0 and fig.redis_restarts > 0
    assert fig.done + fig.dead == fig.jobs
    if isolation == "process":
        # A job waiting for its child to start has not started: a kill in that wait, or a
        # stop of every process, buries nothing (all 15 "worker lost" deaths of a 5,000-job
        # run were such jobs).
        assert fig.unstarted_burials == 0, fig.table()
        # An attempt is spent when the handler starts in its child: only a kill between the
        # child's start message and the handler's first line (its record of the start) can
        # charge one without a start, at most one per executor slot a kill stops.
        assert fig.charged_unrun <= fig.sigkills * 4, fig.table()


def test_many_workers_thousands_of_jobs_random_failures(tmp_path: Path) -> None:
    """No faults, only load: three workers and their schedulers over 1,200 jobs (2,500 at full size) with a 20 %
    transient failure rate (one of 200 resource keys each).
    Every job ends done exactly once (one 'done' in its history,
    one completed run), attempts within limits, each run accounted for by an attempt."""
    chaos = Chaos(tmp_path, jobs=int(size("LOAD_JOBS", 1200, 2500)), seconds=3, workers=3, faults=False, seed=5,
                  resources=200, slow=False)
    fig = chaos.run()
    print("\n" + fig.table())
    assert fig.redeliveries == 0 and fig.extra_runs == 0 and fig.extra_completions == 0
    assert fig.resource_overlaps == 0
    assert fig.retries > 0
