"""The core choice of a worker process (worker/affinity.py): /proc/stat read per core,
a core no sibling holds at start, and a move only when other work crowds this process's
core and another core is clearly less loaded."""

from __future__ import annotations

import random

from runner.worker.affinity import CpuTimes, busy_shares, move_to, parse_cpus, pick, read_cpus

STAT = """cpu  300 0 100 600 0 0 0 0 0 0
cpu0 200 0 50 250 0 0 0 0 0 0
cpu1 100 0 50 340 10 0 0 0 0 0
intr 12345
"""


def test_proc_stat_gives_busy_and_total_per_core() -> None:
    cpus = read_cpus(STAT)
    assert cpus == {0: CpuTimes(250, 500), 1: CpuTimes(150, 500)}  # iowait counts as idle


def test_busy_share_is_per_interval() -> None:
    before = {0: CpuTimes(100, 200), 1: CpuTimes(100, 200)}
    after = {0: CpuTimes(190, 300), 1: CpuTimes(110, 300)}
    shares = busy_shares(before, after)
    assert round(shares[0], 2) == 0.9 and round(shares[1], 2) == 0.1


def test_start_takes_a_core_no_sibling_holds() -> None:
    rng = random.Random(7)
    assert {pick([0, 1, 2], taken=[1], rng=rng) for _ in range(50)} == {0, 2}
    # Every core held (more workers than cores): any of them.
    assert {pick([0, 1], taken=[0, 1], rng=rng) for _ in range(50)} == {0, 1}
    # Only cores in the mask count (taskset, cpusets).
    assert {pick([0, 2], rng=rng) for _ in range(50)} == {0, 2}


def test_a_move_needs_other_work_on_this_core_and_a_clearly_lighter_one() -> None:
    # Busy with its own threads only (90 % of the core is this process): stay.
    assert move_to(0, [0, 1], {0: 0.95, 1: 0.1}, own=0.9) is None
    # Other work takes 60 % of core 0; core 1 carries 10 %: move.
    assert move_to(0, [0, 1], {0: 0.9, 1: 0.1}, own=0.3) == 1
    # Core 1 is about as loaded as the others' share here: stay.
    assert move_to(0, [0, 1], {0: 0.9, 1: 0.5}, own=0.3) is None
    # Only the candidates given (cores no sibling holds) count, the lightest first.
    assert move_to(0, [0, 2, 3], {0: 1.0, 1: 0.0, 2: 0.3, 3: 0.2}, own=0.2) == 3


def test_cpu_lists_round_trip() -> None:
    assert parse_cpus("0,2,5") == {0, 2, 5}
    assert parse_cpus("") == set()
