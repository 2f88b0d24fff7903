"""step.lua and suspend.lua: state before, call, state after, return code. A step lands only
under the claim's token and at the position the run read; the log is bounded; a sleep
ends the claim, releases the job's limit slots, spends no attempt, parks the job in the
sleeping set alone as 'sleeping' with a small state, and promote wakes it as queued with
its state's fields written back; its MAX_AGE no longer applies."""

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


def test_a_step_writes_the_runs_pending_progress_under_its_fence(p: Project) -> None:
    """A step carries the run's progress not written yet (executors._record_step, when no
    log line took it): written in the same call, only under the claim's token, also when
    the step itself is not recorded (its position taken); none given, none written."""
    sc, k = p.runtime.scripts, p.keys()
    enqueue(p, new("a"))
    (job,) = claim(p)
    entry = '{"name":"a","kind":"step","status":"ok","value":1}'
    assert list(sc.step(k, "a", "stale", 0, entry, 1000, 4 << 20, now_ms=NOW + 5, progress='{"percent":5}')) == [-1, 0]
    assert "progress" not in state(p, "a")
    assert list(sc.step(k, "a", job[1], 0, entry, 1000, 4 << 20, now_ms=NOW + 5, progress='{"percent":40}')) == [1, 1]
    assert state(p, "a")["progress"] == '{"percent":40}'
    assert _step(p, job[1], 1) == [1, 2]  # (none given: the last one stays)
    assert state(p, "a")["progress"] == '{"percent":40}'
    assert list(sc.step(k, "a", job[1], 0, entry, 1000, 4 << 20, now_ms=NOW + 5, progress='{"percent":60}')) == [-2, 2]
    assert state(p, "a")["progress"] == '{"percent":60}'


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
    assert st["status"] == "sleeping" and st.get("attempt") in (None, "0")
    # Its state keeps its log, its count and bytes and its first start in one field, and
    # nothing its wake derives (due time, 'suspended', 'run_attempt'): includes/asleep.lua.
    assert sorted(st) == ["sleep", "status", "step:0"]
    n, size, first = st["sleep"].split(" ")
    assert (n, size) == ("1", str(len(st["step:0"]))) and int(first) > 0
    # It waits in the sleeping set alone, its score its wake time.
    assert p.runtime.redis.zscore(p.keys().sleeping, "a") == NOW + 10 + 5_000
    assert p.runtime.redis.zscore(p.keys().scheduled, "a") is None
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
    assert p.runtime.scripts.promote(p.keys(), 100, now_ms=NOW + 5_009)[0] == 0  # not yet due
    p.runtime.scripts.promote(p.keys(), 100, now_ms=NOW + 5_010)
    woken = state(p, "a")
    assert woken["status"] == "queued" and "sleep" not in woken
    assert (woken["steps"], woken["step_bytes"], woken["run_attempt"], woken["suspended"], woken["ready_ms"]) == (
        "1", str(len(woken["step:0"])), "1", "1", str(NOW + 5_010))
    assert woken["run_started_ms"] == st["sleep"].split(" ")[2]
    assert p.runtime.redis.zcard(p.keys().sleeping) == 0


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


def _asleep_as_the_release_before(p: Project, job_id: str, due: int) -> None:
    """What the release before wrote for a sleep: the id in scheduled and in the sleeping
    index, its state with its due time, 'suspended', 'run_attempt', its log's count."""
    r, k = p.runtime.redis, p.keys()
    enqueue(p, new(job_id))
    r.hset(k.state(job_id), mapping={"status": "sleeping", "ready_ms": due, "suspended": "1", "run_attempt": "1",
                                     "run_started_ms": NOW, "steps": "1", "step_bytes": "40",
                                     "step:0": f'["z","nap",{NOW},{due}]'})
    r.lrem(k.ready, 0, job_id)
    r.zadd(k.scheduled, {job_id: due})
    r.zadd(k.sleeping, {job_id: due})


def test_promote_wakes_sleepers_of_both_layouts_once_each_within_its_bound(p: Project) -> None:
    """Due at once: 2 delayed jobs, 2 sleepers of this release (the sleeping set alone) and
    one the release before put to sleep (scheduled and the sleeping index). A promote of 3
    moves 3, the next the other 2; each job reaches ready once, each sleeper with what its
    sleep left out written back, and both sets are empty. A stale id in the sleeping set
    (its job cancelled by hand, as an earlier release's cancel might leave it) is dropped,
    not moved."""
    r, k = p.runtime.redis, p.keys()
    enqueue(p, new("d1", delay=100), new("d2", delay=100))
    for job_id in ("s1", "s2"):
        enqueue(p, new(job_id))
        (job,) = claim(p, base=f"w.{job_id}")
        s = Suspension(job_id, job[1], 0, '{"name":"nap","kind":"sleep","status":"ok"}', None, NOW + 100, 1000,
                       4 << 20, "")
        assert list(p.runtime.scripts.suspend(k, s, now_ms=NOW + 10)) == [1]
    _asleep_as_the_release_before(p, "o1", NOW + 100)
    enqueue(p, new("x"))
    r.lrem(k.ready, 0, "x")
    r.hset(k.state("x"), "status", "cancelled")
    r.zadd(k.sleeping, {"x": NOW + 50})
    assert r.zcard(k.scheduled) == 3 and r.zcard(k.sleeping) == 4
    first = p.runtime.scripts.promote(k, 3, now_ms=NOW + 200)
    assert first[0] == 3
    second = p.runtime.scripts.promote(k, 3, now_ms=NOW + 200)
    assert second[0] + first[0] == 5 and list(second)[1] == -1  # none left to wake
    assert sorted(r.lrange(k.ready, 0, -1)) == ["d1", "d2", "o1", "s1", "s2"]
    assert r.zcard(k.scheduled) == 0 and r.zcard(k.sleeping) == 0
    for job_id in ("s1", "s2", "o1"):
        st = state(p, job_id)
        assert st["status"] == "queued" and "sleep" not in st, st
        assert (st["steps"], st["run_attempt"], st["suspended"], st["ready_ms"]) == ("1", "1", "1", str(NOW + 100))
        assert int(st["step_bytes"]) == len(st["step:0"]) or job_id == "o1"
    assert state(p, "x")["status"] == "cancelled"
    assert_no_job_in_two_structures(p)


def test_a_sleeper_whose_state_was_damaged_is_dead_lettered_with_the_reason(p: Project) -> None:
    """A sleeper waits in the sleeping set alone, so promote never drops one whose state
    another writer damaged: a state of another type goes to claim, which buries it with
    the reason (as the release before did), and a state gone, or left without its status,
    while the record stays is buried by promote with a reason naming that. Only an id with
    neither record nor state is dropped. Every damaged sleeper ends in the dead letters."""
    r, k = p.runtime.redis, p.keys()
    for job_id in ("s1", "s2", "s3"):
        enqueue(p, new(job_id))
        (job,) = claim(p, base=f"w.{job_id}")
        s = Suspension(job_id, job[1], 0, '{"name":"nap","kind":"sleep","status":"ok"}', None, NOW + 100, 1000,
                       4 << 20, "")
        assert list(p.runtime.scripts.suspend(k, s, now_ms=NOW + 10)) == [1]
    r.delete(k.state("s1"))
    r.set(k.state("s1"), "garbage")
    r.delete(k.state("s2"))
    r.hdel(k.state("s3"), "status")
    r.zadd(k.sleeping, {"gone": NOW + 50})  # no record, no state: a stale id
    p.runtime.scripts.promote(k, 100, now_ms=NOW + 200)
    assert r.zcard(k.sleeping) == 0
    assert claim(p, now=NOW + 300, base="w.2") == []
    assert sorted(structures(p)["dead"]) == ["s1", "s2", "s3"]
    reasons = {job_id: r.hget(k.state(job_id), "reason") or "" for job_id in ("s1", "s2", "s3")}
    assert "state is not a hash" in reasons["s1"], reasons
    assert "sleeping" in reasons["s2"] and "state is missing" in reasons["s2"], reasons
    assert "sleeping" in reasons["s3"] and "no status" in reasons["s3"], reasons
    assert r.exists(k.job("gone"), k.state("gone")) == 0 and "gone" not in r.lrange(k.ready, 0, -1)
    assert_no_job_in_two_structures(p)


def test_promote_says_when_the_next_sleeper_is_due(p: Project) -> None:
    """The sleeping set is a due index: promote's answer counts it (the scheduler sleeps
    until then), with nothing in scheduled."""
    enqueue(p, new("a"))
    (job,) = claim(p)
    assert _sleep(p, job[1], delay=None, due=NOW + 5_000) == [1]
    assert list(p.runtime.scripts.promote(p.keys(), 100, now_ms=NOW + 1_000)) == [0, 4_000]


def test_a_sleeper_of_either_layout_is_cancelled_and_run_now_at_once(p: Project) -> None:
    """Cancel takes a sleeper out of the sleeping set (and scheduled, for the release
    before's), at once; run now moves the release before's sleeper too."""
    r, k = p.runtime.redis, p.keys()
    enqueue(p, new("a"))
    (job,) = claim(p)
    assert _sleep(p, job[1], delay=60_000) == [1]
    _asleep_as_the_release_before(p, "o1", NOW + 60_000)
    _asleep_as_the_release_before(p, "o2", NOW + 60_000)
    assert p.runtime.scripts.cancel(k, "a", 60_000, now_ms=NOW + 20)[0] == 1
    assert p.runtime.scripts.cancel(k, "o1", 60_000, now_ms=NOW + 20)[0] == 1
    assert [state(p, i)["status"] for i in ("a", "o1")] == ["cancelled", "cancelled"]
    assert list(p.runtime.scripts.run_now(k, "o2", now_ms=NOW + 30)) == [1, "sleeping"]
    assert r.zcard(k.scheduled) == 0 and r.zcard(k.sleeping) == 0 and r.lrange(k.ready, 0, -1) == ["o2"]
    assert state(p, "o2")["steps"] == "1"


def test_the_deploy_gates_scan_and_check_read_each_sleeper_once(p: Project) -> None:
    """`runner check --scan` counts a sleeper of this release (the sleeping set alone) and
    one of the release before (in both sets) as scheduled, once each; `runner check`'s
    read of suspended jobs finds each once, with its recorded steps."""
    from runner.store import census

    k = p.keys()
    enqueue(p, new("a"))
    (job,) = claim(p)
    assert _sleep(p, job[1], delay=60_000) == [1]
    _asleep_as_the_release_before(p, "o1", NOW + 60_000)
    scanned = sorted((state_, job_id) for state_, job_id, _ in census.scan(p.runtime.redis, k))
    assert scanned == [("scheduled", "a"), ("scheduled", "o1")]
    found, short = steps.suspended(p.runtime.redis, [k])
    assert sorted((job_id, status, names) for _, job_id, _, status, names in found) == [
        ("a", "sleeping", ["nap"]), ("o1", "sleeping", ["nap"])]
    assert short == []


def test_stats_and_queues_count_a_sleeper_of_either_layout_once(p: Project) -> None:
    """During a rolling deploy a sleeper the release before suspended is in the scheduled
    set and the sleeping set until a worker's start moves it: `runner stats` (scheduled,
    sleepers included) and GET /queues and /metrics (scheduled apart from sleeping) count
    it once, as one of this release is, beside a plain delayed job."""
    from runner.observe import figures

    enqueue(p, new("d", delay=60_000))
    enqueue(p, new("a"))
    (job,) = claim(p)
    assert _sleep(p, job[1], delay=60_000) == [1]
    for job_id in ("o1", "o2"):
        _asleep_as_the_release_before(p, job_id, NOW + 60_000)
    assert p.client.stats()["fast"]["scheduled"] == 4
    (q,) = [q for q in figures.read_queues(p.runtime, now_ms=NOW + 100) if q.name == "fast"]
    assert (q.scheduled, q.sleeping, q.waiting) == (1, 3, 0)

