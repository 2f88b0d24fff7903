"""Fencing: once a lease is lost (the job was reclaimed and claimed again), every
settlement from the old claim is refused with -1 and changes nothing in Redis. (Before
another claim takes the job, the old claim's ack is a late success instead: see
tests/lua/test_scripts.py.)"""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest
from crashkit import assert_quiet, configure, outcomes, rec, wait_final, wait_log, worker_log

from runner.store.keys import QueueKeys
from runner.store.scripts import Ack, Burial, Hand, NewJob, RetryAt, Scripts

from conftest import Project, assert_no_job_in_two_structures, structures, view, wait_for

T0 = 1_700_000_000_000
LEASE = 1_000
LIMIT = "r:res:1"  # the limit key of resource "res:1"


def _claim(sc: Scripts, k: QueueKeys, now: int, base: str) -> list[Any]:
    """The one job claimed (the reply's time and held-back flag dropped)."""
    reply = list(sc.claim(k, n=1, start=1, lease_ms=LEASE, token_base=base, dead_ttl_ms=10**7,
                          done_ttl_ms=10**7, now_ms=now))
    assert reply[0] == now
    return reply[2:]


def _snapshot(project: Project, k: QueueKeys, job_id: str) -> tuple[Any, ...]:
    r = project.runtime.redis
    return (
        view(project, job_id),
        structures(project),
        r.zrange(k.leases, 0, -1, withscores=True),
        r.hgetall(k.claims),
        r.hgetall(k.stats),
        r.zrange(k.limit(LIMIT), 0, -1, withscores=True),
        r.lrange(k.limit(LIMIT) + ":w", 0, -1),
    )


def test_stale_settlements_are_refused_and_change_nothing(project: Project) -> None:
    """Claim (token A), let the lease lapse, reclaim, claim again (token B): ack, retry,
    bury, release (now and later), start, renew and checkpoint under A all return -1 and
    leave the record, the structures, the lease deadline, the claim, the counters and the
    resource's limit slot untouched; B still settles."""
    sc = project.runtime.scripts
    k = project.keys("fast")
    job = NewJob(id="job1", type="record", version=1, payload='{"n":1}', max_attempts=5,
                 run_at_ms=0, delay_ms=0, idem_key="", payload_hash="-", resource_key="res:1",
                 limits=f"1 {LIMIT}")
    assert sc.enqueue(k, [job], now_ms=T0)[0] == 1

    first = _claim(sc, k, T0, "w1.1")
    token_a = first[1]
    assert first[0] == "job1" and token_a == "w1.1:0"
    # The lease lapses without a renewal; the scheduler takes the job back.
    assert list(sc.reclaim(k, 100, 10**7, now_ms=T0 + LEASE + 1)) == [1, 0]
    second = _claim(sc, k, T0 + LEASE + 2, "w2.1")
    token_b = second[1]
    assert second[0] == "job1" and token_b != token_a and second[2] == 2
    assert project.runtime.redis.zscore(k.limit(LIMIT), token_b) == T0 + LEASE + 2 + LEASE

    before = _snapshot(project, k, "job1")
    now = T0 + LEASE + 3
    stale_calls = {
        "ack": lambda: sc.ack(k, [Ack("job1", token_a, '{"x":1}', '{"attempt":1}', "succeeded|record")],
                              10**7, now_ms=now),
        "retry": lambda: sc.retry(k, [RetryAt("job1", token_a, 10, '{"type":"E"}', "{}", "retried|record")],
                                  now_ms=now),
        "refunded retry": lambda: sc.retry(k, [RetryAt("job1", token_a, 10, "{}", "", "", refund=True)],
                                           now_ms=now),
        "bury": lambda: sc.bury(k, [Burial("job1", token_a, "why", "", "", False, "dead|record")], 10**7,
                                now_ms=now),
        "release": lambda: sc.release(k, [("job1", token_a)], now_ms=now),
        "release later": lambda: sc.release(k, [Hand("job1", token_a, "later")], now_ms=now),
        "start": lambda: sc.start(k, [("job1", token_a)], now_ms=now),
        "renew": lambda: sc.renew(k, [("job1", token_a)], LEASE, now_ms=now),
        "checkpoint": lambda: [sc.checkpoint(k, "job1", token_a, '{"step":9}')],
    }
    for name, call in stale_calls.items():
        assert [int(c) for c in call()] == [-1], name
        assert _snapshot(project, k, "job1") == before, f"a refused {name} changed Redis"

    # The current owner is unaffected.
    assert [int(c) for c in sc.ack(k, [Ack("job1", token_b, "", '{"attempt":2}', "")], 10**7, now_ms=now)] == [1]
    assert view(project, "job1")["status"] == "done"
    assert project.runtime.redis.zcard(k.limit(LIMIT)) == 0
    # And once done, neither token can settle it again (not even as a late success).
    for token in (token_b, token_a):
        assert [int(c) for c in sc.ack(k, [Ack("job1", token, "", "", "")], 10**7, now_ms=now)] == [-1]
    assert [int(c) for c in sc.release(k, [("job1", token_b)], now_ms=now)] == [-1]
    assert_no_job_in_two_structures(project)


def test_a_frozen_worker_loses_its_lease_and_its_ack_is_refused(project: Project) -> None:
    """End to end: worker 1 runs a job and is frozen (SIGSTOP) past the visibility
    timeout; worker 2 reclaims and completes it; worker 1 is thawed, its handler returns
    and its ack is refused: the record keeps worker 2's result, finish time and history.

    One executor each: worker 1's fetcher then waits for its executor, not for news with a
    claim behind it, so the frozen worker takes nothing more (a worker frozen while idle
    may take one batch; see docs/guarantees.md, "A frozen worker")."""
    configure(project, vt=1, concurrency=1)
    c = project.client
    job = c.enqueue("record", {"n": 5, "sleep": 0.6})
    w1 = project.spawn_worker("fast")
    wait_for(lambda: len(project.runs(job.id)) == 1, timeout=15, what="worker 1 to start the job")
    w1.send_signal(signal.SIGSTOP)
    try:
        w2 = project.spawn_worker("fast")
        done = wait_final(project, [job.id], timeout=20)[job.id]
        assert done["status"] == "done"
        assert done["result"] == {"n": 5, "attempt": 2}
        assert outcomes(done) == ["worker lost", "done"]
        second_pid = project.runs(job.id)[1].split()[1]
        assert second_pid == str(w2.pid)
        before = view(project, job.id)
    finally:
        w1.send_signal(signal.SIGCONT)
    # Worker 1's handler wakes up, returns, and its ack is refused.
    wait_log(worker_log(project, w1), "lease lost before it settled", timeout=15)
    assert view(project, job.id) == before
    assert rec(project, job.id)["result"] == {"n": 5, "attempt": 2}
    assert w1.poll() is None, "worker 1 must keep running after a refused ack"
    assert_quiet(project)
    assert_no_job_in_two_structures(project)


def test_a_thawed_worker_never_starts_a_job_it_claimed_ahead_whose_lease_lapsed(project: Project) -> None:
    """Worker 1 (one executor, three jobs claimed ahead) is frozen (SIGSTOP) past the lease
    while a job runs; worker 2 reclaims all four and runs each to its end, and stops.
    Thawed, worker 1 starts none of the jobs it had claimed ahead: each one's lease lapsed
    in the freeze, and the job ran elsewhere. (Its executor took the next one off its
    inbox before the renewal said the lease was lost, and started its handler at once:
    a second run of a finished job, with ctx.lock_lost False.) A job enqueued after the
    thaw runs on worker 1, behind whatever was left in its inbox."""
    project.add_function("record_long", (project.root / "functions" / "record.py").read_text()
                         .replace("MAX_ATTEMPTS = 4", "MAX_ATTEMPTS = 4\nTIMEOUT = 8"))
    configure(project, vt=1, concurrency=1, prefetch=4)
    c = project.client
    first = c.enqueue("record_long", {"n": 0, "sleep": 2}).id
    w1 = project.spawn_worker("fast")
    wait_for(lambda: project.runs(first), timeout=15, what="worker 1 to start the first job")
    ahead = [c.enqueue("record", {"n": i}).id for i in range(1, 4)]
    wait_for(lambda: all(rec(project, i)["status"] == "processing" for i in ahead), timeout=10,
             what="worker 1 to claim the others ahead")
    w1.send_signal(signal.SIGSTOP)
    try:
        w2 = project.spawn_worker("fast")
        done = wait_final(project, [first, *ahead], timeout=30)
        assert {r["status"] for r in done.values()} == {"done"}, [outcomes(r) for r in done.values()]
        w2.send_signal(signal.SIGTERM)
        assert w2.wait(timeout=20) == 0
        before = {i: view(project, i) for i in ahead}
    finally:
        w1.send_signal(signal.SIGCONT)
    last = c.enqueue("record", {"n": 9}).id
    assert wait_final(project, [last], timeout=20)[last]["status"] == "done"
    assert project.runs(last)[0].split()[1] == str(w1.pid)
    for i in ahead:
        assert [r.split()[1] for r in project.runs(i)] == [str(w2.pid)], (i, project.runs(i))
        assert view(project, i) == before[i]
    assert w1.poll() is None
    assert_quiet(project)
    assert_no_job_in_two_structures(project)


def test_a_worker_frozen_while_idle_takes_at_most_a_batch_and_loses_nothing(project: Project) -> None:
    """Worker 1 is idle (its claim waits behind a BLPOP) and is frozen; jobs enqueued in
    the next second may be taken by that pending claim. They come back once the lease
    lapses and run on worker 2: every job ends done, each handler ran to its end once."""
    configure(project, vt=1, concurrency=2, batch=4)
    c = project.client
    w1 = project.spawn_worker("fast")
    wait_log(worker_log(project, w1), "serving fast", timeout=15)
    time.sleep(0.3)  # its first wait is out
    w1.send_signal(signal.SIGSTOP)
    try:
        w2 = project.spawn_worker("fast")
        wait_log(worker_log(project, w2), "serving fast", timeout=15)
        ids = [c.enqueue("record", {"n": i}).id for i in range(12)]
        done = wait_final(project, ids, timeout=30)
        assert {r["status"] for r in done.values()} == {"done"}
        lost = [i for i, r in done.items() if outcomes(r) != ["done"]]
        assert len(lost) <= 4, lost  # one batch at most
        for job_id in lost:
            assert outcomes(done[job_id]) == ["worker lost", "done"]
        for job_id in ids:
            runs = project.runs(job_id)
            assert len(runs) == 1 and runs[0].split()[1] == str(w2.pid), runs
    finally:
        w1.send_signal(signal.SIGCONT)
    assert_quiet(project)
    assert_no_job_in_two_structures(project)


def test_a_stale_claims_log_lines_and_stream_chunks_are_refused(project: Project) -> None:
    """Claim (token A), lease lapsed, reclaimed, claimed again (token B): a log or stream
    write under A is refused (-1) and leaves the job's log and stream as they were; one
    under B lands; once the job is done neither token writes."""
    sc, r = project.runtime.scripts, project.runtime.redis
    k = project.keys("fast")
    job = NewJob(id="job1", type="record", version=1, payload='{"n":1}', max_attempts=5,
                 run_at_ms=0, delay_ms=0, idem_key="", payload_hash="-", resource_key="", limits="")
    assert sc.enqueue(k, [job], now_ms=T0)[0] == 1
    token_a = _claim(sc, k, T0, "w1.1")[1]
    assert int(sc.append_log(k, "job1", ['{"msg": "a1"}'], 500, 262_144, 60_000, token=token_a)) == 1
    assert list(sc.reclaim(k, 100, 10**7, now_ms=T0 + LEASE + 1)) == [1, 0]
    token_b = _claim(sc, k, T0 + LEASE + 2, "w2.1")[1]

    def lists() -> tuple[list[str], list[str]]:
        return r.lrange(k.log("job1"), 0, -1), r.lrange(k.stream("job1"), 0, -1)

    assert lists() == (['{"msg": "a1"}'], [])
    for token in (token_a, ""):  # (no token: a write that names no claim is no run's)
        assert int(sc.append_log(k, "job1", ['{"msg": "stale"}'], 500, 262_144, 60_000, token=token)) == -1
        assert int(sc.append_log(k, "job1", ['{"a": 1, "i": 5, "data": "stale"}'], 500, 262_144, 60_000,
                                 key=k.stream("job1"), token=token)) == -1
    assert lists() == (['{"msg": "a1"}'], [])
    assert int(sc.append_log(k, "job1", ['{"msg": "b"}'], 500, 262_144, 60_000, token=token_b)) == 2
    assert int(sc.append_log(k, "job1", ['{"a": 2, "i": 0, "data": "b"}'], 500, 262_144, 60_000,
                             key=k.stream("job1"), token=token_b)) == 1
    assert [int(c) for c in sc.ack(k, [Ack("job1", token_b, "", "", "")], 10**7, now_ms=T0 + LEASE + 3)] == [1]
    done = lists()
    for token in (token_a, token_b):
        assert int(sc.append_log(k, "job1", ['{"msg": "late"}'], 500, 262_144, 60_000, token=token)) == -1
    assert lists() == done


CHATTY = '''
import time

QUEUE = "fast"
TIMEOUT = 10


def handle(payload, ctx):
    for i in range(60 if ctx.attempt == 1 else 3):
        ctx.logger.info("a%d line %d", ctx.attempt, i)
        ctx.stream("a%d c%d" % (ctx.attempt, i))
        time.sleep(0.05)
    return ctx.attempt
'''


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_frozen_worker_writes_nothing_into_the_log_of_a_job_another_worker_ended(project: Project,
                                                                                    isolation: str) -> None:
    """Worker 1 runs a job that logs and streams, and is frozen (SIGSTOP) past its lease;
    worker 2 runs attempt 2 to done; worker 1 is thawed and its handler goes on logging
    and streaming until its settlement is refused. The done job's log ends with attempt
    2's lines and its stream holds what it held when the job ended. (Attempt 1's lines
    and chunks were appended after attempt 2's.)"""
    configure(project, vt=1, concurrency=1, isolation=isolation)
    project.add_function("chatty", CHATTY)
    c = project.client
    job = c.enqueue("chatty", {})
    w1 = project.spawn_worker("fast")
    wait_for(lambda: any(ln["msg"].startswith("a1") for ln in c.logs(job.id)["lines"]), timeout=15,
             what="worker 1's first lines")
    w1.send_signal(signal.SIGSTOP)
    try:
        project.spawn_worker("fast")
        assert wait_final(project, [job.id], timeout=20)[job.id]["status"] == "done"
        from runner.client import watching
        log_then = c.logs(job.id)["lines"]
        stream_then = watching.stream_chunks(c, job.id)["chunks"]
        assert log_then[-1]["msg"] == "a2 line 2" and stream_then[-1]["data"] == "a2 c2"
    finally:
        w1.send_signal(signal.SIGCONT)
    wait_log(worker_log(project, w1), "lease lost before it settled", timeout=20)
    assert c.logs(job.id)["lines"] == log_then
    assert watching.stream_chunks(c, job.id)["chunks"] == stream_then
    assert w1.poll() is None
