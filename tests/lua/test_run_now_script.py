"""run_now.lua: state before, call, state after, return code. A delayed, retrying or
sleeping job goes to ready at once with no attempt spent and a history entry; a sleep's
recorded end becomes the call's time, so its replay does not sleep again; anything else
(queued, claimed, waiting for a signal, moved by a promote that came first) is refused
with its status and nothing changes."""

from __future__ import annotations

import json

import pytest
from test_durable_scripts import _sleep
from test_scripts import NOW, claim, enqueue, new, state

from runner.store import steps
from runner.store.scripts import RetryAt, Suspension

from conftest import Project, assert_no_job_in_two_structures, keep_functions, structures

WHO = '{"outcome":"run now","by":"ops"}'


@pytest.fixture
def p(project: Project) -> Project:
    return keep_functions(project)  # (the scripts read no function)


def run_now(p: Project, job_id: str, at: int = NOW + 50) -> list[object]:
    return list(p.runtime.scripts.run_now(p.keys(), job_id, entry=WHO, now_ms=at))


def test_a_delayed_job_runs_now_keeping_its_id_with_the_operator_on_record(p: Project) -> None:
    enqueue(p, new("a", delay=600_000))
    assert structures(p)["scheduled"] == ["a"]
    assert run_now(p, "a") == [1, "scheduled"]
    st = state(p, "a")
    assert st["status"] == "queued" and st["ready_ms"] == str(NOW + 50)
    assert json.loads("[" + st["history"] + "]") == [{"outcome": "run now", "by": "ops", "at_ms": NOW + 50}]
    assert structures(p)["ready"] == ["a"] and structures(p)["scheduled"] == []
    assert_no_job_in_two_structures(p)
    (job,) = claim(p, now=NOW + 60)
    assert job[0] == "a" and job[2] == 1  # its first attempt
    assert run_now(p, "a") == [-2, "processing"]  # claimed: refused, nothing changed


def test_a_retrying_job_runs_now_without_spending_an_attempt(p: Project) -> None:
    enqueue(p, new("a"))
    (job,) = claim(p)
    err = '{"type":"E","message":"m"}'
    assert p.runtime.scripts.retry(p.keys(), [RetryAt("a", job[1], 600_000, err, '{"attempt":1}', "retried|noop")],
                                   now_ms=NOW) == [1]
    assert run_now(p, "a") == [1, "retrying"]
    (again,) = claim(p, now=NOW + 60, base="w.2")
    assert again[2] == 2  # the retry's attempt, not a third


def test_a_sleeping_job_wakes_with_its_sleep_cut_short(p: Project) -> None:
    enqueue(p, new("a"))
    (job,) = claim(p)
    assert _sleep(p, job[1], delay=3_600_000) == [1]
    n, before, first = state(p, "a")["sleep"].split(" ")  # (its count, bytes and first start: asleep.lua)
    assert p.runtime.redis.zscore(p.keys().sleeping, "a") == NOW + 10 + 3_600_000
    assert run_now(p, "a", NOW + 70) == [1, "sleeping"]
    (entry,) = steps.read(p.runtime.scripts, p.keys(), "a")
    assert entry == {"name": "nap", "kind": "sleep", "status": "ok", "started_ms": NOW + 10, "until_ms": NOW + 70}
    st = state(p, "a")
    assert st["status"] == "queued" and st["step_bytes"] == before  # the same number of digits
    # Woken, its state is as the release before kept it: what its sleep left out is back.
    assert (st["steps"], st["run_started_ms"], st["run_attempt"], st["suspended"], st["ready_ms"]) == (
        n, first, "1", "1", str(NOW + 70))
    assert "sleep" not in st
    assert structures(p)["ready"] == ["a"] and p.runtime.redis.zcard(p.keys().sleeping) == 0


def test_what_waits_for_no_time_is_refused_and_left_as_it_was(p: Project) -> None:
    enqueue(p, new("q"), new("d", delay=1_000))
    assert run_now(p, "q") == [-2, "queued"]
    assert run_now(p, "nope") == [-1, ""]
    # A promote that came first leaves nothing to move: fenced.
    p.runtime.scripts.promote(p.keys(), 100, now_ms=NOW + 2_000)
    assert run_now(p, "d") == [-2, "queued"]
    # A wait for a signal ends with the signal or its timeout, not a run now.
    enqueue(p, new("w"))
    claimed = {j[0]: j for j in claim(p, now=NOW + 2_100)}
    s = Suspension("w", claimed["w"][1], 0, '{"name":"ok","kind":"signal","signal":"ok"}', 600_000, 0, 1000,
                   4 << 20, "waits|noop", kind="signal", signal="ok")
    assert list(p.runtime.scripts.suspend(p.keys(), s, now_ms=NOW + 2_200)) == [1]
    before = state(p, "w")
    assert run_now(p, "w") == [-2, "waiting"]
    assert state(p, "w") == before and structures(p)["scheduled"] == ["w"]
