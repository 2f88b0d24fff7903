"""Five schedulers (worker processes) against one server, SIGKILLed at random moments
and at the fault points on either side of the tick script (before_tick, after_tick),
restarted at once: a `* * * * *` schedule and an every-2-seconds one (a seconds field,
tests only) have every tick enqueued exactly once, none lost, none doubled.

Bounded by default (SCHEDULE_CHAOS_SECONDS=20); the full run the issue asks for is
SCHEDULE_CHAOS_SECONDS=180 (see docs/chaos.md). The schedules' clock starts 10 s before
a minute, so even the short run crosses a minute boundary.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time

import pytest
from schedulekit import TEST_ENV, add_function, iso, log_has, ms, server_ms, set_clock, ticks

from conftest import Project, size, wait_for

# Bounded by default (the clock starts 10 s before a minute, so the minutely schedule
# ticks in every size); RUNNER_TEST_FULL=1 runs two minutes.
SECONDS = size("SCHEDULE_CHAOS_SECONDS", 14, 120)
WORKERS = int(os.environ.get("SCHEDULE_CHAOS_WORKERS", "5"))
FAULTS = ("before_tick", "after_tick")


def spawn(project: Project, rng: random.Random, n: int) -> subprocess.Popen[bytes]:
    env = dict(TEST_ENV)
    if rng.random() < 0.5:  # half of the workers kill themselves at a fault point, after a few passes
        env.update(RUNNER_FAULT=rng.choice(FAULTS), RUNNER_FAULT_AFTER=str(rng.randrange(0, 6)))
    return project.spawn_worker("fast", env=env, log_name=f"sched-{n}.log")


def expected(first_after_ms: int, last_ms: int, step_ms: int) -> list[str]:
    start = (first_after_ms // step_ms + 1) * step_ms
    return [iso(t) or "" for t in range(start, last_ms + 1, step_ms)]


@pytest.mark.timeout(SECONDS + 120)
def test_every_tick_once_under_sigkill_chaos(project: Project) -> None:
    add_function(project, "every2", 'SCHEDULE = "*/2 * * * * *"\nMISSED = "all"')
    add_function(project, "minutely", 'SCHEDULE = "* * * * *"\nMISSED = "all"')
    rng = random.Random(int(os.environ.get("SCHEDULE_CHAOS_SEED", "21")))
    set_clock(project, ms("2030-01-01T00:00") + 50_000)
    spawned = 0
    procs = []
    for _ in range(WORKERS):
        procs.append(spawn(project, rng, spawned))
        spawned += 1
    wait_for(lambda: log_has(project, "schedules: 2 active"), timeout=30, what="a worker to adopt")
    state = project.runtime.redis.hgetall(project.keys().schedule("every2"))
    born = int(state["def_at"])
    kills = 0
    deadline = time.monotonic() + SECONDS
    while time.monotonic() < deadline:
        time.sleep(rng.uniform(0.2, 1.5))  # pacing the faults, not waiting for anything
        victim = rng.randrange(len(procs))
        if procs[victim].poll() is None:
            procs[victim].send_signal(signal.SIGKILL)
            kills += 1
        procs[victim].wait(timeout=10)
        for i, p in enumerate(procs):  # the ones that killed themselves at a fault point too
            if p.poll() is not None:
                procs[i] = spawn(project, rng, spawned)
                spawned += 1
    # Calm: fresh workers with no faults fire whatever is due, then every tick so far is in.
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait(timeout=10)
    calm = [project.spawn_worker("fast", env=TEST_ENV, log_name=f"calm-{i}.log") for i in range(2)]
    end = server_ms(project) + int(project.runtime.redis.get(f"{project.prefix}:test:clock_offset_ms") or 0)
    want2 = expected(born, end, 2000)
    want60 = expected(born, end, 60_000)
    wait_for(lambda: set(want2) <= set(ticks(project, "every2")), timeout=30, what="every 2 s tick to fire")
    wait_for(lambda: set(want60) <= set(ticks(project, "minutely")), timeout=30, what="the minute ticks")
    got2, got60 = ticks(project, "every2"), ticks(project, "minutely")
    for got in (got2, got60):
        assert len(got) == len(set(got)), f"a tick was enqueued twice: {sorted(t for t in got if got.count(t) > 1)}"
    assert got2[:len(want2)] == want2, "a tick was lost or invented"
    assert got60[:len(want60)] == want60 and len(want60) >= 1
    faulted = sum(1 for f in project.root.glob("sched-*.log") if f.stat().st_size)
    print(f"schedule chaos: {SECONDS:g} s, {WORKERS} schedulers, {kills} SIGKILLs, {spawned} started "
          f"({faulted} logs), {len(got2)} ticks every 2 s and {len(got60)} minute ticks, each once")
    for p in calm:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)
