"""Failover with Sentinel (a master, one or two replicas, three sentinels, all local):
producers enqueue continuously through ``redis+sentinel://``, the master fails, Sentinel
promotes a replica, and every job answered OK is looked for on the new master.

With ``wait_replicas = 1`` no job answered OK is ever missing. A master that stalls
(SIGSTOP) and comes back takes writes on the connections still pointing at it until
Sentinel demotes it, and its resync from the new master wipes them; with two replicas
the other one, still attached to it, even confirms them. Every connection follows
Sentinel's failover events (store/sentinel.py), so none writes there, and a worker does
not settle there either (its acks would be wiped, and the jobs run again).

The default run does one SIGKILL round for each setting, two stalls with two replicas
and one worker through a stall, with Sentinel's periods shortened (failoverkit.QUICK_PERIODS:
a returning master is demoted in about 2 s instead of about 10 s; it takes writes all the
same meanwhile). The full runs, with Sentinel's own periods (the rounds of each fault
and setting, and the stall swept from 0 to 5 s after the promotion; about 12 minutes),
are marked slow and print the tables that docs/deploy.md reports:
``python -m pytest -s -m slow tests/crash/test_failover.py`` (``FAILOVER_REPORT=path``
appends the tables to a file too).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from failoverkit import QUICK_PERIODS, Round, failover_round, worker_round

ROUNDS = int(os.environ.get("FAILOVER_ROUNDS", 5))


@pytest.mark.parametrize("wait_replicas", [0, 1])
def test_a_killed_master_loses_no_job_answered_with_wait_replicas(tmp_path: Path, wait_replicas: int) -> None:
    """SIGKILL the master under load: Sentinel promotes the replica; with wait_replicas = 1
    every job answered OK is on the new master (with 0 the count is reported, not held)."""
    r = failover_round(tmp_path, wait_replicas, "kill", periods=QUICK_PERIODS)
    print("\n" + Round.HEADER + "\n" + r.row())
    assert r.ok >= 2000
    if wait_replicas:
        assert r.missing == 0, r
        assert r.ok_after == 0  # the new master has no replica yet: nothing is answered OK there
    else:
        assert r.ok_after > 0  # producers carried on against the new master by themselves


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_failover_rounds(tmp_path: Path) -> None:
    """ROUNDS rounds of each fault (SIGKILL; stopped 3 s and resumed) with wait_replicas 0
    and 1: with 1, not one job answered OK is missing in any round."""
    rounds = [failover_round(tmp_path / f"{how}-{r}-{i}", r, how)
              for how in ("kill", "stall") for r in (0, 1) for i in range(ROUNDS)]
    table = "\n".join([Round.HEADER, *(r.row() for r in rounds)])
    print("\n" + table)
    report = os.environ.get("FAILOVER_REPORT")
    if report:
        with open(report, "a") as f:
            f.write(table + "\n")
    assert all(r.missing == 0 for r in rounds if r.wait_replicas == 1), table


STALL_OFFSETS = (0.0, 0.2)  # the default run; the slow sweep covers 0 to 5 s


@pytest.mark.parametrize("resume_after_s", STALL_OFFSETS)
def test_a_master_stalled_past_the_promotion_loses_no_job_with_two_replicas(tmp_path: Path,
                                                                           resume_after_s: float) -> None:
    """wait_replicas = 1 and two replicas (the set-up docs/deploy.md recommends): the master
    stops (SIGSTOP), Sentinel promotes a replica, and the old master resumes soon after,
    while the other replica is still attached to it. Its WAIT is answered by that replica,
    but it is a demoted master: no job answered OK may be missing once it resynced."""
    r = failover_round(tmp_path, 1, "stall", replicas=2, resume_after_s=resume_after_s, periods=QUICK_PERIODS)
    print("\n" + Round.HEADER + "\n" + r.row())
    assert r.ok >= 2000
    assert r.missing == 0, r.row()


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_stalls_from_0_to_5_s_after_the_promotion(tmp_path: Path) -> None:
    """The stall sweep: two replicas, wait_replicas = 1, the old master resumed every 0.25 s
    from 0 to 5 s after the promotion: not one job answered OK is missing."""
    offsets = [i / 4 for i in range(21)]
    rounds = [failover_round(tmp_path / f"stall-{o}", 1, "stall", replicas=2, resume_after_s=o) for o in offsets]
    table = "\n".join([Round.HEADER, *(r.row() for r in rounds)])
    print("\n" + table)
    report = os.environ.get("FAILOVER_REPORT")
    if report:
        with open(report, "a") as f:
            f.write(table + "\n")
    assert all(r.missing == 0 for r in rounds), table


def test_a_worker_leaves_a_stalled_master_at_once(tmp_path: Path) -> None:
    """One replica, the master stopped 3 s under a worker's load: Sentinel promotes the
    replica, the old master resumes and takes writes until Sentinel demotes it (about 2 s
    with the periods of the default run, 10 s with Sentinel's own). The worker must have
    left it at the failover: its acks there would be wiped by the resync, and their jobs
    run again (thousands did). Only the runs in flight at the stall may run twice (at
    least once, as any lease that lapses)."""
    r = worker_round(tmp_path, stall_s=3.0, periods=QUICK_PERIODS)
    print("\n| jobs | ran twice | failover s | old master writable s |\n|---|---|---|---|\n" + r.row())
    assert r.twice <= 100, r.row()
