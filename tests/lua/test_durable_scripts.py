"""step.lua and suspend.lua: state before, call, state after, return code. A step lands only
under the claim's token and at the position the run read; the log is bounded; a sleep
ends the claim, releases the job's limit slots, spends no attempt, parks the job in
scheduled as 'sleeping', and promote wakes it as queued; its MAX_AGE no longer applies."""

from __future__ import annotations

import pytest
from test_scripts import LEASE, NOW, claim, enqueue, new, state

from runner.store import steps
from runner.store.scripts import Suspension

from conftest import Project, assert_no_job_in_two_structures, keep_functions, structures


@pytest.fixture
def p(project: Project) -> Project:
    return keep_functions(project)  # (the scripts read no function)


def _step(p: Project, token: str, pos: int, entry: str = '{"name":"a","kind":"step","status":"ok","value":1}',
          max_steps: int = 1000, max_bytes: int = 4 << 20) -> list[int]:
    return list(p.runtime.scripts.step(p.keys(), "a", token, pos, entry, max_steps, max_bytes, now_ms=NOW + 5))


def test_a_step_is_fenced_by_the_claim_and_its_position(p: Project) -> None:
    enqueue(p, new("a"))
    (job,) = claim(p)
    assert _step(p, "stale", 0) == [-1, 0]
    assert _step(p, job[1], 1) == [-2, 0]  # the run read an empty log: position 0 only
    assert _step(p, job[1], 0) == [1, 1]
    assert _step(p, job[1], 0) == [-2, 1]  # that position is taken
    log = steps.read(p.runtime.scripts, p.keys(), "a")
    assert log == [{"name": "a", "kind": "step", "status": "ok", "value": 1, "finished_ms": NOW + 5}]


def test_the_step_log_is_bounded_in_entries_and_bytes(p: Project) -> None:
    enqueue(p, new("a"))
    (job,) = claim(p)
    assert _step(p, job[1], 0, max_steps=1) == [1, 1]
    assert _step(p, job[1], 1, max_steps=1) == [-3, 1]
    assert _step(p, job[1], 1, entry='{"v":"' + "x" * 100 + '"}', max_bytes=120) == [-4, int(
        p.runtime.redis.hget(p.keys().state("a"), "step_bytes"))]
    assert len(steps.read(p.runtime.scripts, p.keys(), "a")) == 1


def _sleep(p: Project, token: str, pos: int = 0, delay: int | None = 5_000, due: int = 0,
           entry: str = '{"name":"nap","kind":"sleep","status":"ok"}') -> list[int]:
    s = Suspension("a", token, pos, entry, delay, due, 1000, 4 << 20, "sleeps|noop")
    return list(p.runtime.scripts.suspend(p.keys(), s, now_ms=NOW + 10))


def test_a_sleep_ends_the_claim_frees_the_slot_and_spends_no_attempt(p: Project) -> None:
    enqueue(p, new("a", res="r1"), new("b", res="r1"))
    (job,) = claim(p)  # b waits on the resource
    assert job[0] == "a"
    assert _sleep(p, "stale") == [-1]
    assert _sleep(p, job[1], pos=1) == [-2]
    assert _sleep(p, job[1]) == [1]
    st = state(p, "a")
    assert st["status"] == "sleeping" and st["ready_ms"] == str(NOW + 10 + 5_000) and st.get("attempt") in (None, "0")
    where = structures(p)
    assert where["scheduled"] == ["a"] and where["leases"] == []
    assert_no_job_in_two_structures(p)
    (entry,) = steps.read(p.runtime.scripts, p.keys(), "a")
    assert entry == {"name": "nap", "kind": "sleep", "status": "ok", "started_ms": NOW + 10, "until_ms": NOW + 5_010}
    assert p.runtime.redis.hget(p.keys().stats, "sleeps|noop") == "1"
    # The resource went to b at once.
    (other,) = claim(p, now=NOW + 20, base="w.2")
    assert other[0] == "b"
    # Due: promote wakes it queued, and its next claim is attempt 1 again.
    p.runtime.scripts.promote(p.keys(), 100, now_ms=NOW + 5_010)
    assert state(p, "a")["status"] == "queued"


def test_a_resumed_sleep_keeps_its_attempt_and_escapes_max_age(p: Project) -> None:
    enqueue(p, new("a"))
    (job,) = claim(p)
    assert job[2] == 1
    assert _sleep(p, job[1], delay=None, due=NOW + 100) == [1]
    p.runtime.scripts.promote(p.keys(), 100, now_ms=NOW + 100)
    reply = list(p.runtime.scripts.claim(p.keys(), n=1, start=1, lease_ms=LEASE, token_base="w.3",
                                         dead_ttl_ms=10_000_000, done_ttl_ms=10_000_000, now_ms=NOW + 60_000,
                                         max_ages="noop=1000"))
    assert reply[2] == "a" and reply[4] == 1, reply  # attempt 1 still
    assert reply[2 + 12] == 1  # started, not expired: MAX_AGE bounds the first start only
    # Asleep again before its recorded end (no new entry): the log keeps one entry.
    assert _sleep(p, reply[3], pos=0, delay=None, due=NOW + 200, entry="") == [1]
    assert len(steps.read(p.runtime.scripts, p.keys(), "a")) == 1


def test_hold_locks_while_suspended_keeps_the_slot_reserved_for_the_job(p: Project) -> None:
    """HOLD_LOCKS_WHILE_SUSPENDED: the sleeping job's resource slot becomes a reservation
    (no other job of the key runs meanwhile) that its claim after the sleep takes over."""
    enqueue(p, new("a", res="r1"), new("b", res="r1"))
    (job,) = claim(p)
    s = Suspension("a", job[1], 0, '{"name":"nap","kind":"sleep","status":"ok"}', 5_000, 0, 1000, 4 << 20, "",
                   hold=True)
    assert list(p.runtime.scripts.suspend(p.keys(), s, now_ms=NOW + 10)) == [1]
    assert claim(p, now=NOW + 20, base="w.2") == []  # b stays parked: the slot is a's
    assert p.runtime.redis.zscore(p.keys().limit("r:r1"), "=a") == NOW + 10 + 5_000 + 10_000
    p.runtime.scripts.promote(p.keys(), 100, now_ms=NOW + 5_010)
    (again,) = claim(p, now=NOW + 5_020, base="w.3")
    assert again[0] == "a"


def test_a_resumed_job_with_max_age_is_never_claimed_ahead(p: Project) -> None:
    """Its worker would judge MAX_AGE again at the start: it is claimed only to start."""
    enqueue(p, new("a"))
    (job,) = claim(p)
    assert _sleep(p, job[1], delay=None, due=NOW + 100) == [1]
    p.runtime.scripts.promote(p.keys(), 100, now_ms=NOW + 100)
    ahead = list(p.runtime.scripts.claim(p.keys(), n=1, start=0, lease_ms=LEASE, token_base="w.4",
                                         dead_ttl_ms=10_000_000, done_ttl_ms=10_000_000, now_ms=NOW + 60_000,
                                         max_ages="noop=1000"))
    assert ahead[2:] == [], ahead
    now = list(p.runtime.scripts.claim(p.keys(), n=1, start=1, lease_ms=LEASE, token_base="w.5",
                                       dead_ttl_ms=10_000_000, done_ttl_ms=10_000_000, now_ms=NOW + 60_001,
                                       max_ages="noop=1000"))
    assert now[2] == "a" and now[2 + 12] == 1, now


def test_signals_kept_unread_are_bounded_and_a_wait_that_reads_one_frees_its_room(p: Project) -> None:
    """signal.lua counts what it keeps ('sigs', 'sig_bytes'): past the count -4, past the
    bytes -5, nothing changed; an unbounded call (a child's end) is never refused; wait.lua
    taking one gives its room back."""
    enqueue(p, new("a"))
    sc, k = p.runtime.scripts, p.keys()
    assert [int(x) for x in sc.signal(k, "a", "x", '"12345"', most=2, most_bytes=20)[:1]] == [1]
    assert int(sc.signal(k, "a", "y", '"123456789012345"', most=2, most_bytes=20)[0]) == -5
    assert int(sc.signal(k, "a", "y", '"1"', most=2, most_bytes=20)[0]) == 1
    assert int(sc.signal(k, "a", "z", "1", most=2, most_bytes=20)[0]) == -4
    assert p.runtime.redis.hget(k.state("a"), "sig:z") is None
    assert int(sc.signal(k, "a", "child.3", "1")[0]) == 1  # unbounded
    (job,) = claim(p)
    code, body = sc.take_signal(k, "a", job[1], 0, "x", '{"name":"x","kind":"signal","signal":"x"', None, 1000,
                                4 << 20, now_ms=NOW + 5)
    assert int(code) == 1 and body == '"12345"'
    assert p.runtime.redis.hmget(k.state("a"), "sigs", "sig_bytes") == ["2", "4"]
    assert int(sc.signal(k, "a", "w", "1", most=3, most_bytes=20)[0]) == 1


def test_a_damaged_step_count_reads_at_most_the_logs_bound(p: Project) -> None:
    """Another writer's steps=1000000 made one call build a million field names: the
    script reads at most the log's bound (MAX_STEPS), the missing entries marked damaged."""
    enqueue(p, new("a"))
    (job,) = claim(p)
    assert _step(p, job[1], 0) == [1, 1]
    p.runtime.redis.hset(p.keys().state("a"), "steps", "1000000")
    log = steps.read(p.runtime.scripts, p.keys(), "a")
    assert len(log) == steps.MAX_STEPS
    assert log[0]["name"] == "a" and log[1]["damaged"] and log[-1]["damaged"]


def test_a_claim_says_how_many_entries_the_step_log_holds(p: Project) -> None:
    """The claim reply's last field is the job's step log length: 0 for a job that has
    none (its run then reads no log, a round trip saved on every first run), the count
    for a job whose earlier run recorded steps (its run reads them to replay)."""
    enqueue(p, new("a"))
    (job,) = claim(p)
    assert job[-1] == 0
    assert _step(p, job[1], 0) == [1, 1]
    assert _step(p, job[1], 1, '{"name":"b","kind":"step","status":"ok","value":2}') == [1, 2]
    assert list(p.runtime.scripts.reclaim(p.keys(), 1, 10**7, now_ms=NOW + 2 * LEASE)) == [1, 0]
    (again,) = claim(p, now=NOW + 3 * LEASE, base="w.2")
    assert again[0] == "a" and int(again[-1]) == 2
