"""The core choice of a worker process (worker/affinity.py): /proc/stat read per core,
the idlest core no sibling holds at start, and a move only when the process waited for
its core while another had room."""

from __future__ import annotations

from runner.worker.affinity import CpuTimes, idle_shares, move_to, parse_cpus, pick, read_cpus

STAT = """cpu  300 0 100 600 0 0 0 0 0 0
cpu0 200 0 50 250 0 0 0 0 0 0
cpu1 100 0 50 340 10 0 0 0 0 0
intr 12345
"""


def test_proc_stat_gives_busy_and_total_per_core() -> None:
    cpus = read_cpus(STAT)
    assert cpus == {0: CpuTimes(250, 500), 1: CpuTimes(150, 500)}  # iowait counts as idle


def test_idle_share_is_per_interval() -> None:
    before = {0: CpuTimes(100, 200), 1: CpuTimes(100, 200)}
    after = {0: CpuTimes(190, 300), 1: CpuTimes(110, 300)}
    shares = idle_shares(before, after)
    assert round(shares[0], 2) == 0.1 and round(shares[1], 2) == 0.9


def test_start_takes_the_idlest_core_no_sibling_holds() -> None:
    idle = {0: 0.2, 1: 0.9, 2: 0.7}
    assert pick([0, 1, 2], idle) == 1
    assert pick([0, 1, 2], idle, taken=[1]) == 2
    # Every core held (more workers than cores): share the idlest.
    assert pick([0, 1, 2], idle, taken=[0, 1, 2]) == 1
    # Only cores in the mask count (taskset, cpusets).
    assert pick([0, 2], idle) == 2


def test_a_move_needs_a_crowded_core_and_a_roomy_other() -> None:
    assert move_to(0, [0, 1], {0: 0.0, 1: 0.9}, waited=0.05) is None  # not waiting: stay
    assert move_to(0, [0, 1], {0: 0.0, 1: 0.3}, waited=0.6) is None  # nowhere better
    assert move_to(0, [0, 1, 2], {0: 0.0, 1: 0.6, 2: 0.8}, waited=0.6) == 2


def test_cpu_lists_round_trip() -> None:
    assert parse_cpus("0,2,5") == {0, 2, 5}
    assert parse_cpus("") == set()
