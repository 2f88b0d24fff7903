"""Each Lua transition: state before, call, state after, return code. Time is driven by
passing now_ms, so leases and due times are exact."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runner.store import records
from runner.store.embedded import Server
from runner.store.scripts import Ack, Burial, NewJob, RetryAt

from conftest import Project, assert_no_job_in_two_structures, make_project, structures

NOW = 1_800_000_000_000
LEASE = 1_000


def new(job_id: str, *, run_at: int = 0, idem: str = "", phash: str = "-", res: str = "",
        type_: str = "noop", max_attempts: int = 3) -> NewJob:
    return NewJob(id=job_id, type=type_, version=1, payload='{"a":1}', max_attempts=max_attempts,
                  run_at_ms=run_at, idem_key=idem, payload_hash=phash, resource_key=res)


def claim(p: Project, n: int = 10, now: int = NOW, base: str = "w.1") -> list[list[Any]]:
    reply = p.runtime.scripts.claim(
        p.keys(), now_ms=now, n=n, lease_ms=LEASE, token_base=base, defer_base_ms=100,
        defer_cap_ms=1000, rnd=0.5, dead_ttl_ms=10_000_000, done_ttl_ms=10_000_000,
    )
    return [reply[i:i + 12] for i in range(0, len(reply), 12)]


def enqueue(p: Project, *jobs: NewJob, now: int = NOW) -> list[Any]:
    return p.runtime.scripts.enqueue(p.keys(), list(jobs), now, 60_000)


def rec(p: Project, job_id: str) -> dict[str, str]:
    """The record as readers see it: with its claim or done outcome laid over."""
    k, r = p.keys(), p.runtime.redis
    return records.merge(r.hgetall(k.job(job_id)), r.hget(k.claims, job_id), r.hget(k.done, job_id))


def raw(p: Project, job_id: str) -> dict[str, str]:
    """The record hash alone, as written."""
    return p.runtime.redis.hgetall(p.keys().job(job_id))


@pytest.fixture
def p(any_project: Project) -> Project:
    return any_project


def test_enqueue_now_and_later(p: Project) -> None:
    """A job due now is queued in ready; a later one is scheduled at its due time."""
    out = enqueue(p, new("a"), new("b", run_at=NOW + 5000))
    assert out == [1, "a", "queued", 1, "b", "scheduled"]
    s = structures(p)
    assert s["ready"] == ["a"] and s["scheduled"] == ["b"]
    assert p.runtime.redis.zscore(p.keys().scheduled, "b") == NOW + 5000
    # Fields at their defaults are left out: attempt 0, ready at creation, no keys.
    assert rec(p, "a") == {"type": "noop", "version": "1", "payload": '{"a":1}', "status": "queued",
                           "max_attempts": "3", "created_ms": str(NOW)}
    assert rec(p, "b")["status"] == "scheduled" and rec(p, "b")["ready_ms"] == str(NOW + 5000)
    assert p.runtime.redis.llen(p.keys().notify) == 1


def test_enqueue_batch_keeps_order_and_counts_once(p: Project) -> None:
    """A batch lands in ready in the order given (the consumer end sees the first job
    first), with its keys on the record and one counter bump per type."""
    enqueue(p, new("a"), new("b", idem="k1", phash="h"), new("c", res="user:1"))
    assert p.runtime.redis.lrange(p.keys().ready, 0, -1) == ["c", "b", "a"]
    assert rec(p, "b")["idem_key"] == "k1" and "resource_key" not in rec(p, "b")
    assert rec(p, "c")["resource_key"] == "user:1" and "idem_key" not in rec(p, "c")
    assert p.runtime.redis.hget(p.keys().stats, "enqueued|noop") == "3"


def test_enqueue_writes_meta_only_when_given(p: Project) -> None:
    """A job's meta (a small JSON object) is written to its record only when non-empty, and
    the job view lays its keys at the top level without shadowing a record field."""
    enqueue(p, new("a"), new("b")._replace(meta='{"schedule":"s1","tick":"2026-01-01T00:00:00Z","id":"x"}'))
    assert "meta" not in raw(p, "a")
    assert raw(p, "b")["meta"] == '{"schedule":"s1","tick":"2026-01-01T00:00:00Z","id":"x"}'
    view = records.Job("b", "fast", rec(p, "b")).as_dict()
    assert view["schedule"] == "s1" and view["tick"] == "2026-01-01T00:00:00Z"
    assert view["id"] == "b"  # meta never shadows a record field
    assert "schedule" not in records.Job("a", "fast", rec(p, "a")).as_dict()


def test_enqueue_idempotency_duplicate_and_conflict(p: Project) -> None:
    """Same key + same hash returns the first job; another hash is a conflict; no new record."""
    assert enqueue(p, new("a", idem="k", phash="h1"))[0] == 1
    assert enqueue(p, new("b", idem="k", phash="h1")) == [0, "a", "queued"]
    assert enqueue(p, new("c", idem="k", phash="h2")) == [-1, "a", "queued"]
    assert not rec(p, "b") and not rec(p, "c")
    assert structures(p)["ready"] == ["a"]


def test_claim_sets_lease_token_and_attempt(p: Project) -> None:
    enqueue(p, new("a"), new("b"))
    got = claim(p, n=1)
    assert [g[0] for g in got] == ["a"]  # FIFO
    _job_id, token, attempt = got[0][:3]
    assert token == "w.1:0" and attempt == 1
    r = rec(p, "a")
    assert r["status"] == "processing" and r["token"] == token
    assert p.runtime.redis.zscore(p.keys().leases, "a") == NOW + LEASE
    assert structures(p)["ready"] == ["b"]
    assert_no_job_in_two_structures(p)


def test_ack_is_fenced_by_token(p: Project) -> None:
    """An ack with a wrong token is refused and changes nothing; the right one finishes."""
    enqueue(p, new("a"))
    (job,) = claim(p)
    sc = p.runtime.scripts
    assert sc.ack(p.keys(), [Ack("a", "stale", '"x"', "{}", "")], NOW, 100_000) == [-1]
    assert rec(p, "a")["status"] == "processing"
    assert sc.ack(p.keys(), [Ack("a", job[1], '"ok"', '{"attempt":1}', "succeeded|noop")],
                  NOW + 5, 100_000) == [1]
    r = rec(p, "a")
    # The claim is gone, so the settled token can no longer act on the job.
    assert r["status"] == "done" and r["result"] == '"ok"' and r.get("token", "") == ""
    assert not p.runtime.redis.hexists(p.keys().claims, "a")
    assert structures(p) == {"ready": [], "leases": [], "scheduled": [], "dead": [], "done": ["a"]}
    # The record is left as it was written: no TTL; the retention index dates the outcome.
    assert p.runtime.redis.pttl(p.keys().job("a")) == -1 and raw(p, "a")["status"] == "queued"
    assert p.runtime.redis.zscore(p.keys().finished, "a") == NOW + 5
    assert p.runtime.redis.hget(p.keys().stats, "succeeded|noop") == "1"
    # A second ack of the same claim is refused (already done).
    assert sc.ack(p.keys(), [Ack("a", job[1], '"ok"', "", "")], NOW, 100_000) == [-1]


def test_retry_schedules_and_promote_moves_due(p: Project) -> None:
    enqueue(p, new("a"))
    (job,) = claim(p)
    sc = p.runtime.scripts
    err = '{"type":"E","message":"m"}'
    assert sc.retry(p.keys(), [RetryAt("a", job[1], NOW + 500, err, '{"attempt":1}', "retried|noop")], NOW) == [1]
    assert rec(p, "a")["status"] == "retrying"
    assert structures(p)["scheduled"] == ["a"]
    assert sc.promote(p.keys(), NOW + 499, 100) == [0, NOW + 500]
    assert sc.promote(p.keys(), NOW + 500, 100) == [1, -1]
    assert rec(p, "a")["status"] == "queued" and structures(p)["ready"] == ["a"]
    (again,) = claim(p, now=NOW + 600, base="w.2")
    assert again[2] == 2  # second attempt


def test_bury_with_refund_gives_the_attempt_back(p: Project) -> None:
    enqueue(p, new("a"))
    (job,) = claim(p)
    sc = p.runtime.scripts
    assert sc.bury(p.keys(), [Burial("a", job[1], "invalid payload", '{"type":"InvalidJob"}', "", True, "dead|noop")],
                   NOW, 100_000) == [1]
    r = rec(p, "a")
    assert r["status"] == "dead" and r["reason"] == "invalid payload" and r["attempt"] == "0"
    assert structures(p)["dead"] == ["a"]


def test_release_returns_to_front_without_spending_an_attempt(p: Project) -> None:
    enqueue(p, new("a"), new("b"))
    (job,) = claim(p, n=1)
    assert p.runtime.scripts.release(p.keys(), [(job[0], job[1])], NOW) == [1]
    assert rec(p, "a").get("attempt", "0") == "0" and rec(p, "a")["status"] == "queued"
    assert not p.runtime.redis.hexists(p.keys().claims, "a")
    got = claim(p, n=1, base="w.2")
    assert got[0][0] == "a"  # released job runs next


def test_renew_extends_only_owned_leases(p: Project) -> None:
    enqueue(p, new("a"))
    (job,) = claim(p)
    sc = p.runtime.scripts
    assert sc.renew(p.keys(), [("a", job[1]), ("a", "bogus")], NOW + 900, LEASE) == [1, -1]
    assert p.runtime.redis.zscore(p.keys().leases, "a") == NOW + 900 + LEASE


def test_reclaim_counts_a_lapsed_lease_as_an_attempt(p: Project) -> None:
    """A lapsed lease goes back to ready; at max_attempts it is buried as worker lost."""
    enqueue(p, new("a", max_attempts=2))
    sc = p.runtime.scripts
    (job,) = claim(p)
    assert sc.reclaim(p.keys(), NOW + LEASE - 1, 100, 100_000) == [0, 0]  # not yet
    assert sc.reclaim(p.keys(), NOW + LEASE, 100, 100_000) == [1, 0]
    assert rec(p, "a")["status"] == "queued"
    # The stale worker's ack is refused after the reclaim.
    assert sc.ack(p.keys(), [Ack("a", job[1], "", "", "")], NOW + LEASE, 1000) == [-1]
    (job2,) = claim(p, now=NOW + 2 * LEASE, base="w.2")
    assert job2[2] == 2
    assert sc.reclaim(p.keys(), NOW + 4 * LEASE, 100, 100_000) == [0, 1]
    r = rec(p, "a")
    assert r["status"] == "dead" and r["reason"] == "worker lost"
    assert '"outcome":"worker lost"' in r["history"]
    assert_no_job_in_two_structures(p)


def test_resource_lock_defers_without_spending_an_attempt(p: Project) -> None:
    """A second job on a held resource is deferred to scheduled with attempt 0; the
    holder's release wakes it."""
    enqueue(p, new("a", res="r1"), new("b", res="r1"))
    got = claim(p)
    assert [g[0] for g in got] == ["a"]
    rb = rec(p, "b")
    assert rb["status"] == "scheduled" and rb.get("attempt", "0") == "0" and rb["deferrals"] == "1"
    lock = p.keys().lock("r1")
    assert p.runtime.redis.get(lock) == got[0][1]
    # Ack releases the lock (compare-and-delete) and wakes the first waiter at once.
    p.runtime.scripts.ack(p.keys(), [Ack("a", got[0][1], "", "", "")], NOW, 1000)
    assert p.runtime.redis.get(lock) is None
    assert structures(p)["ready"] == ["b"] and structures(p)["scheduled"] == []
    assert rec(p, "b")["status"] == "queued"
    assert_no_job_in_two_structures(p)


def test_release_lock_only_by_holder(p: Project) -> None:
    """A holder whose lock expired and was retaken cannot delete the new holder's lock."""
    enqueue(p, new("a", res="r1"))
    (job,) = claim(p)
    r = p.runtime.redis
    r.set(p.keys().lock("r1"), "someone-else")
    p.runtime.scripts.ack(p.keys(), [Ack("a", job[1], "", "", "")], NOW, 1000)
    assert r.get(p.keys().lock("r1")) == "someone-else"


def test_reclaim_releases_the_resource_lock(p: Project) -> None:
    enqueue(p, new("a", res="r1"))
    claim(p)
    p.runtime.scripts.reclaim(p.keys(), NOW + LEASE, 100, 100_000)
    assert p.runtime.redis.get(p.keys().lock("r1")) is None


def test_completed_idempotency_key_makes_a_later_job_a_duplicate(p: Project) -> None:
    """A job whose key already completed under another job is done without running."""
    enqueue(p, new("a", idem="k", phash="h"))
    (job,) = claim(p)
    p.runtime.scripts.ack(p.keys(), [Ack("a", job[1], "", "", "")], NOW, 100_000)
    assert p.runtime.redis.get(p.keys().idem("k")) == "a h done"
    # Another producer pushes a second job with the same key (bypassing enqueue's check).
    r = p.runtime.redis
    r.hset(p.keys().job("b"), mapping={"type": "noop", "version": 1, "payload": "{}", "status": "queued",
                                       "attempt": 0, "max_attempts": 3, "idem_key": "k"})
    r.lpush(p.keys().ready, "b")
    assert claim(p, base="w.2") == []
    rb = rec(p, "b")
    assert rb["status"] == "done" and rb["duplicate_of"] == "a"


@pytest.mark.parametrize("setup,reason", [
    (lambda r, k: r.set(k.job("x"), "not a hash"), "a Redis string instead of a hash"),
    (lambda r, k: r.hset(k.job("x"), mapping={"type": "noop", "status": "queued"}),
     "missing field(s) version, payload"),
    (lambda r, k: None, "no job record for this id"),
])
def test_malformed_records_are_buried_with_a_reason(p: Project, setup: Any, reason: str) -> None:
    r = p.runtime.redis
    k = p.keys()
    setup(r, k)
    r.lpush(k.ready, "x")
    enqueue(p, new("ok"))
    got = claim(p)
    assert [g[0] for g in got] == ["ok"]  # the good job behind it still runs
    assert structures(p)["dead"] == ["x"]
    assert reason in rec(p, "x")["reason"]


def test_stray_id_of_a_done_job_is_dropped_not_rerun(p: Project) -> None:
    enqueue(p, new("a"))
    (job,) = claim(p)
    p.runtime.scripts.ack(p.keys(), [Ack("a", job[1], "", "", "")], NOW, 100_000)
    p.runtime.redis.lpush(p.keys().ready, "a")
    assert claim(p, base="w.2") == []
    assert rec(p, "a")["status"] == "done"


def test_stray_id_of_a_claimed_job_or_twice_in_ready_is_claimed_once(p: Project) -> None:
    """An id pushed again while its job holds a claim, or twice before one claim call, is
    dropped as a stray: the record still says queued, so only the claims hash and the
    call's own memory can tell, and the job must not run twice."""
    enqueue(p, new("a"), new("b"))
    (job,) = claim(p, n=1)
    assert job[0] == "a"
    r, k = p.runtime.redis, p.keys()
    r.rpush(k.ready, "a")  # a copy of the claimed one, at the consumer end
    r.rpush(k.ready, "b")  # b twice
    got = claim(p, n=10, base="w.2")
    assert [g[0] for g in got] == ["b"]
    assert r.hget(k.stats, "stray") == "2"
    assert rec(p, "a")["token"] == job[1]  # the first claim still owns a
    assert sorted(structures(p)["leases"]) == ["a", "b"]


def test_reclaim_takes_back_a_job_whose_claim_entry_is_damaged_or_legacy(p: Project) -> None:
    """A lapsed lease whose claim entry is garbage, or missing because an older release
    kept the claim on the record (status processing), still brings its job back with the
    attempt counted; a lease left beside a done outcome is dropped, never rerun."""
    enqueue(p, new("a"), new("b"), new("c"))
    got = {g[0]: g for g in claim(p, n=3)}
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    r.hset(k.claims, "a", "not a claim")
    # b as an older release left it: no claim entry, the claim on the record
    r.hdel(k.claims, "b")
    r.hset(k.job("b"), mapping={"status": "processing", "token": "old:1", "attempt": 1})
    assert sc.ack(k, [Ack("c", got["c"][1], "", "", "")], NOW, 100_000) == [1]
    r.zadd(k.leases, {"c": NOW})  # a stray lease beside c's outcome
    assert list(sc.reclaim(k, NOW + LEASE + 1, 100, 10**7)) == [2, 0]
    assert sorted(r.lrange(k.ready, 0, -1)) == ["a", "b"]
    for job_id in "ab":
        v = rec(p, job_id)
        assert v["status"] == "queued" and v["attempt"] == "1", v
        assert v["history"].endswith(f'"outcome":"worker lost","at_ms":{NOW + LEASE + 1}}}')
    assert rec(p, "c")["status"] == "done"
    assert r.hlen(k.claims) == 0
    assert_no_job_in_two_structures(p)


def test_claim_with_a_damaged_queue_key_refuses_and_loses_nothing(p: Project) -> None:
    """With any key of the queue that a claim may write (claims, done, leases, scheduled,
    dead) damaged to another type, claim raises an error naming it and leaves
    every popped id back in ready, in order; once the key is repaired the jobs are
    claimed as usual."""
    from redis.exceptions import ResponseError

    enqueue(p, new("a"), new("b"), new("c"))
    r, k = p.runtime.redis, p.keys()
    for name, damaged in (("claims", k.claims), ("done", k.done), ("leases", k.leases),
                          ("scheduled", k.scheduled), ("dead", k.dead)):
        r.delete(damaged)
        r.set(damaged, "not the right type")
        with pytest.raises(ResponseError, match=f"the {name} key of this queue holds the wrong"):
            claim(p, n=2)
        assert r.lrange(k.ready, 0, -1) == ["c", "b", "a"], name
        r.delete(damaged)
    assert [g[0] for g in claim(p, n=3)] == ["a", "b", "c"]


def test_reclaim_renames_damaged_leases_aside_and_takes_every_claimed_job_back(p: Project) -> None:
    """A leases key overwritten with another type: the scheduler's reclaim renames it to
    <key>:corrupt, counts it, and gives every job still holding a claim a lapsed lease,
    so it is taken back at once (an attempt counted) instead of sitting claimed forever;
    then the queue claims again."""
    enqueue(p, new("a"), new("b"), new("c"))
    claim(p, n=2)
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    r.delete(k.leases)
    r.set(k.leases, "clobbered")
    assert list(sc.reclaim(k, NOW + 1, 100, 10**7)) == [2, 0]
    assert r.get(k.leases + ":corrupt") == "clobbered" and r.hget(k.stats, "corrupt|leases") == "1"
    assert {rec(p, j)["status"] for j in "ab"} == {"queued"} and rec(p, "a")["attempt"] == "1"
    assert r.hlen(k.claims) == 0 and r.zcard(k.leases) == 0
    got = claim(p, n=3, now=NOW + 2, base="w.2")
    assert sorted(g[0] for g in got) == ["a", "b", "c"]
    assert_no_job_in_two_structures(p)


@pytest.mark.parametrize("name", ["stats", "notify", "ready", "dead", "scheduled"])
def test_reclaim_renames_any_damaged_queue_key_aside(p: Project, name: str) -> None:
    """Every structural key of the queue found with the wrong Redis type is renamed to
    <key>:corrupt and counted (corrupt|<name>), after which enqueue and claim work."""
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    key = getattr(k, name)
    r.set(key, "clobbered")
    sc.reclaim(k, NOW, 100, 10**7)
    assert r.get(key + ":corrupt") == "clobbered" and r.hget(k.stats, f"corrupt|{name}") == "1"
    assert enqueue(p, new("a")) == [1, "a", "queued"]
    assert [g[0] for g in claim(p)] == ["a"]


def test_enqueue_and_ack_go_through_damaged_stats_and_wakeup_keys(p: Project) -> None:
    """Counters and the wake-up list are not worth a transition: with them damaged to
    another type, enqueue still answers "queued" (the job is in, so an error would make
    the caller send it twice), a claim still claims and an ack still settles its job."""
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    for key in (k.stats, k.notify, k.throughput(NOW // 60_000)):
        r.set(key, "clobbered")
    assert enqueue(p, new("a"), new("b", idem="i", phash="h")) == [1, "a", "queued", 1, "b", "queued"]
    assert enqueue(p, new("c", idem="i", phash="h")) == [0, "b", "queued"]
    got = claim(p, n=2)
    assert [g[0] for g in got] == ["a", "b"]
    assert list(sc.ack(k, [Ack("a", got[0][1], "", "", "")], NOW, 100_000)) == [1]
    assert rec(p, "a")["status"] == "done"
    assert_no_job_in_two_structures(p)


def test_reclaim_renames_a_damaged_claims_hash_aside_and_takes_its_jobs_back(p: Project) -> None:
    """A claims hash overwritten with another type stops claims and acks; the scheduler's
    reclaim renames it to <key>:corrupt, counts it, and takes the claimed job back when its
    lease lapses (the attempt counted), after which claims work again."""
    from redis.exceptions import ResponseError

    enqueue(p, new("a"), new("b"))
    (job,) = claim(p, n=1)
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    r.delete(k.claims)
    r.set(k.claims, "clobbered")
    with pytest.raises(ResponseError):
        claim(p, n=1, base="w.2")
    with pytest.raises(ResponseError):
        sc.ack(k, [Ack("a", job[1], "", "", "")], NOW, 100_000)
    assert list(sc.reclaim(k, NOW + LEASE + 1, 100, 10**7)) == [1, 0]
    assert r.get(k.claims + ":corrupt") == "clobbered" and r.hget(k.stats, "corrupt|claims") == "1"
    assert rec(p, "a")["status"] == "queued" and rec(p, "a")["attempt"] == "1"
    got = claim(p, n=2, now=NOW + LEASE + 2, base="w.3")
    assert sorted(g[0] for g in got) == ["a", "b"] and {g[0]: g[2] for g in got}["a"] == 2
    assert_no_job_in_two_structures(p)


def test_requeue_and_remove_dead(p: Project) -> None:
    enqueue(p, new("a"))
    (job,) = claim(p)
    sc = p.runtime.scripts
    sc.bury(p.keys(), [Burial("a", job[1], "permanent failure", "", "", False, "")], NOW, 100_000)
    assert sc.requeue(p.keys(), "b", NOW) == -1
    assert sc.requeue(p.keys(), "a", NOW, '{"a":2}', "1") == 1
    r = rec(p, "a")
    assert r["status"] == "queued" and r["attempt"] == "0" and r["payload"] == '{"a":2}'
    assert p.runtime.redis.ttl(p.keys().job("a")) == -1
    (job,) = claim(p, base="w.2")
    sc.bury(p.keys(), [Burial("a", job[1], "x", "", "", False, "")], NOW, 100_000)
    assert sc.remove(p.keys(), "a") == 1
    assert not rec(p, "a") and structures(p)["dead"] == []
    assert sc.remove(p.keys(), "a") == -1


def test_checkpoint_is_fenced(p: Project) -> None:
    enqueue(p, new("a"))
    (job,) = claim(p)
    sc = p.runtime.scripts
    assert sc.checkpoint(p.keys(), "a", "bad", '{"i":1}') == -1
    assert sc.checkpoint(p.keys(), "a", job[1], '{"i":1}') == 1
    assert rec(p, "a")["checkpoint"] == '{"i":1}'


def test_dead_retention_expires_records_and_trim_forgets_their_entries(p: Project) -> None:
    """A dead record expires after the dead retention; trim drops the set entries older
    than the cutoff and keeps the newer ones."""
    enqueue(p, new("old"), new("new"))
    sc = p.runtime.scripts
    for job_id, at in (("old", NOW), ("new", NOW + 10_000)):
        (job,) = claim(p, n=1, now=at, base=f"w.{job_id}")
        assert sc.bury(p.keys(), [Burial(job_id, job[1], "x", "", "", False, "")], at, 50_000) == [1]
        assert 0 < p.runtime.redis.pttl(p.keys().job(job_id)) <= 50_000
    assert sc.trim(p.keys(), NOW + 5_000, 0, 100) == [1, 0]
    assert structures(p)["dead"] == ["new"]


def test_trim_deletes_done_jobs_past_retention_with_their_outcomes(p: Project) -> None:
    """A done job past the done retention loses its record, outcome and index entry in one
    step; a newer one keeps all three; the limit bounds one call."""
    enqueue(p, new("a"), new("b"), new("c"))
    sc, k, r = p.runtime.scripts, p.keys(), p.runtime.redis
    for job_id, at in (("a", NOW), ("b", NOW + 1), ("c", NOW + 10_000)):
        (job,) = claim(p, n=1, now=at, base=f"w.{job_id}")
        assert sc.ack(k, [Ack(job_id, job[1], "", "", "")], at, 100_000) == [1]
    assert sc.trim(k, 0, NOW + 5_000, 1) == [0, 1]
    assert not r.exists(k.job("a")) and not r.hexists(k.done, "a")
    assert rec(p, "b")["status"] == "done"
    assert sc.trim(k, 0, NOW + 5_000, 100) == [0, 1]
    assert not r.exists(k.job("b")) and not p.client.get("c").as_dict()["last_error"]
    assert structures(p)["done"] == ["c"] and rec(p, "c")["status"] == "done"


def test_client_run_at_schedules_at_that_time(p: Project) -> None:
    """enqueue(run_at=...) schedules the job at exactly that time, not before."""
    import time

    at = time.time() + 3600
    job = p.client.enqueue("noop", {}, run_at=at)
    assert job.status == "scheduled"
    assert p.runtime.redis.zscore(p.keys().scheduled, job.id) == int(at * 1000)
    assert p.runtime.scripts.promote(p.keys(), int(at * 1000) - 1, 100)[0] == 0


# --- batches: one command for many jobs, and still one outcome per job ---------------


def test_batch_claim_pops_several_ids_and_gives_each_its_own_lease(p: Project) -> None:
    """One claim takes several jobs (with and without a resource key) in FIFO order; each
    has its own token and lease; the jobs beyond n stay in ready, in order."""
    enqueue(p, new("a"), new("b", res="r1"), new("c"), new("d"), new("e"))
    got = claim(p, n=3)
    assert [g[0] for g in got] == ["a", "b", "c"]
    assert [g[1] for g in got] == ["w.1:0", "w.1:1", "w.1:2"]
    r = p.runtime.redis
    for job_id, token, attempt, *_ in got:
        assert attempt == 1
        assert rec(p, job_id)["status"] == "processing" and rec(p, job_id)["token"] == token
        assert r.zscore(p.keys().leases, job_id) == NOW + LEASE
    assert r.get(p.keys().lock("r1")) == "w.1:1"
    assert structures(p)["ready"] == ["e", "d"]
    assert rec(p, "d")["status"] == "queued"
    assert_no_job_in_two_structures(p)


def test_claim_pops_again_after_strays_within_its_bound(p: Project) -> None:
    """Strays do not count as claims, so the claim pops again for the jobs still wanted,
    but never more than n * 4 ids in one call; an id left in ready is untouched."""
    r = p.runtime.redis
    k = p.keys()
    enqueue(p, *(new(f"s{i}") for i in range(5)), new("a"), new("b"))
    for i in range(5):
        r.hset(k.job(f"s{i}"), "status", "done")
    assert claim(p, n=1) == []  # s0..s3 popped and dropped: the bound is 4
    assert structures(p)["ready"] == ["b", "a", "s4"]
    assert r.hget(k.stats, "stray") == "4"
    got = claim(p, n=2, base="w.2")  # s4 dropped, then a and b in a second pop
    assert [g[0] for g in got] == ["a", "b"]
    assert structures(p)["ready"] == [] and sorted(structures(p)["leases"]) == ["a", "b"]
    assert r.hget(k.stats, "stray") == "5"


def test_a_retry_keeps_its_backoff_despite_a_stale_waiter_entry_of_its_own(p: Project) -> None:
    """A job that once waited on its resource may have left its id on the waiter list.
    When that job later fails and is scheduled for a retry, releasing its own lock must
    not take the stale entry for a waiting job and queue it at once, skipping the backoff."""
    r = p.runtime.redis
    k = p.keys()
    enqueue(p, new("b", res="r"))
    r.rpush(k.lock("r") + ":waiters", "b")  # left over from an earlier deferral
    (job,) = claim(p, n=1)
    due = NOW + 60_000
    assert p.runtime.scripts.retry(k, [RetryAt("b", job[1], due, '{"type":"E"}', '{"attempt":1}', "")],
                                   NOW + 5) == [1]
    assert rec(p, "b")["status"] == "retrying"
    assert structures(p)["ready"] == [] and r.zscore(k.scheduled, "b") == due
    assert r.get(k.lock("r")) is None


def test_an_ack_batch_survives_damaged_lock_and_idempotency_keys(p: Project) -> None:
    """Keys damaged to another Redis type must not fail an ack batch part-way (the jobs
    before would be done but still hold leases, those after unsettled): every job of the
    batch is done, the leases are gone, the damaged lock is dropped (it is no one's lock)
    and the damaged idempotency key is replaced by the completion mark."""
    r = p.runtime.redis
    k = p.keys()
    enqueue(p, new("a"), new("b", idem="bad", phash="h"), new("c", res="r"), new("d"))
    got = {g[0]: g[1] for g in claim(p, n=10)}
    assert sorted(got) == ["a", "b", "c", "d"]
    r.delete(k.idem_prefix + "bad", k.lock("r"))
    r.rpush(k.idem_prefix + "bad", "x")
    r.hset(k.lock("r"), "x", "y")
    r.hset(k.lock("r") + ":waiters", "x", "y")
    acks = [Ack(i, got[i], "", "", "") for i in ("a", "b", "c", "d")]
    assert p.runtime.scripts.ack(k, acks, NOW + 5, 100_000) == [1, 1, 1, 1]
    assert all(rec(p, i)["status"] == "done" for i in "abcd")
    assert structures(p)["leases"] == []
    assert r.exists(k.lock("r")) == 0
    assert r.get(k.idem_prefix + "bad") == "b - done"  # the payload hash went with the damage


def test_enqueue_heals_an_idempotency_key_damaged_to_another_type(p: Project) -> None:
    """A damaged idempotency key reads as free: the batch is enqueued whole (no record
    written without its ready entry) and the key holds the new job."""
    r = p.runtime.redis
    k = p.keys()
    r.rpush(k.idem_prefix + "bad", "not a string")
    assert enqueue(p, new("a"), new("b", idem="bad", phash="h")) == [1, "a", "queued", 1, "b", "queued"]
    assert structures(p)["ready"] == ["b", "a"]
    assert r.get(k.idem_prefix + "bad") == "b h"


def test_damaged_idempotency_and_waiter_keys_cost_no_popped_job(p: Project) -> None:
    """An idempotency key or a resource's waiter list damaged to another Redis type must
    not fail a claim part-way (ids already popped would be lost): the job with the damaged
    idempotency key runs, the one on a busy resource with a damaged waiter list is still
    deferred (its fallback timer wakes it), and the rest of the batch is claimed."""
    r = p.runtime.redis
    k = p.keys()
    enqueue(p, new("a"), new("b", idem="bad", phash="h"), new("c", res="busy"), new("d"))
    r.delete(k.idem_prefix + "bad")
    r.rpush(k.idem_prefix + "bad", "not a string")
    r.hset(k.lock("busy") + ":waiters", "not", "a list")
    r.set(k.lock("busy"), "someone-else")
    got = claim(p, n=10)
    assert [g[0] for g in got] == ["a", "b", "d"]
    s = structures(p)
    assert sorted(s["leases"]) == ["a", "b", "d"] and s["scheduled"] == ["c"] and s["ready"] == []
    assert rec(p, "c")["status"] == "scheduled"
    assert_no_job_in_two_structures(p)


@pytest.mark.parametrize("setup,reason,corrupt", [
    (lambda r, k: r.rpush(k.job("x"), "1"), "a Redis list instead of a hash", True),
    (lambda r, k: r.zadd(k.job("x"), {"m": 1}), "a Redis zset instead of a hash", True),
    (lambda r, k: r.hset(k.job("x"), "other", "1"), "missing field(s) type, version, payload, status", False),
    (lambda r, k: None, "no job record for this id", False),
])
def test_malformed_record_in_a_batch_is_buried_and_the_rest_claimed(
    p: Project, setup: Any, reason: str, corrupt: bool
) -> None:
    """A malformed record between good jobs is buried with its reason (a foreign value is
    kept aside under :corrupt); the good jobs of the same claim run."""
    r = p.runtime.redis
    k = p.keys()
    enqueue(p, new("a"))
    setup(r, k)
    r.lpush(k.ready, "x")
    enqueue(p, new("b"))
    got = claim(p, n=5)
    assert [g[0] for g in got] == ["a", "b"]
    assert structures(p)["dead"] == ["x"] and sorted(structures(p)["leases"]) == ["a", "b"]
    dead = rec(p, "x")
    assert dead["status"] == "dead" and reason in dead["reason"]
    assert r.exists(k.job("x") + ":corrupt") == (1 if corrupt else 0)
    assert r.hget(k.stats, "dead|?") == "1"


def test_ack_with_a_wrong_token_changes_nothing(p: Project) -> None:
    """A refused ack leaves the record, its lease, the stats and the other acks of the
    batch as they were; the emptied token of a settled claim is refused too."""
    enqueue(p, new("a"), new("b"))
    got = claim(p)
    r = p.runtime.redis
    k = p.keys()
    before = rec(p, "a")
    stats_before = r.hgetall(k.stats)
    codes = p.runtime.scripts.ack(k, [Ack("a", got[1][1], '"x"', '{"attempt":1}', "succeeded|noop"),
                                      Ack("b", got[1][1], '"y"', '{"attempt":1}', "succeeded|noop")],
                                  NOW, 100_000)
    assert codes == [-1, 1]
    assert rec(p, "a") == before and r.pttl(k.job("a")) == -1
    assert r.zscore(k.leases, "a") == NOW + LEASE
    assert r.hget(k.stats, "succeeded|noop") == "1" and stats_before.get("succeeded|noop") is None
    # b is settled: its token field is empty, and an empty token owns nothing.
    assert rec(p, "b").get("token", "") == "" and not r.hexists(k.claims, "b")
    sc = p.runtime.scripts
    assert sc.ack(k, [Ack("b", "", "", "", "")], NOW, 100_000) == [-1]
    assert sc.renew(k, [("b", "")], NOW, LEASE) == [-1]
    assert sc.checkpoint(k, "b", "", "{}") == -1
    # A record damaged to processing with an empty token is not owned by '' either.
    r.hset(k.job("b"), "status", "processing")
    assert sc.ack(k, [Ack("b", "", "", "", "")], NOW, 100_000) == [-1]


def test_ack_writes_one_history_entry(p: Project) -> None:
    enqueue(p, new("a"))
    (job,) = claim(p)
    entry = '{"attempt":1,"outcome":"done","started_ms":1,"at_ms":2}'
    assert p.runtime.scripts.ack(p.keys(), [Ack("a", job[1], "null", entry, "")], NOW, 100_000) == [1]
    r = rec(p, "a")
    assert r["history"] == entry
    assert "error" not in r
    assert p.client.get("a").as_dict()["history"] == [{"attempt": 1, "outcome": "done", "started_ms": 1,
                                                        "at_ms": 2}]


def test_history_after_retry_then_success_has_both_entries_in_order(p: Project) -> None:
    """Each attempt adds its entry after the earlier ones; the success clears the error
    of the failed attempt."""
    enqueue(p, new("a"))
    sc = p.runtime.scripts
    k = p.keys()
    (job,) = claim(p)
    first = '{"attempt":1,"outcome":"retry"}'
    assert sc.retry(k, [RetryAt("a", job[1], NOW + 10, '{"type":"E","message":"m"}', first, "")], NOW) == [1]
    assert rec(p, "a")["history"] == first and rec(p, "a").get("token", "") == ""
    assert sc.promote(k, NOW + 10, 100)[0] == 1
    (job2,) = claim(p, now=NOW + 20, base="w.2")
    assert job2[2] == 2
    second = '{"attempt":2,"outcome":"done"}'
    assert sc.ack(k, [Ack("a", job2[1], '"ok"', second, "")], NOW + 30, 100_000) == [1]
    r = rec(p, "a")
    assert r["history"] == first + "," + second
    assert "error" not in r and r["status"] == "done" and r["attempt"] == "2"
    assert [h["attempt"] for h in p.client.get("a").as_dict()["history"]] == [1, 2]


def test_batch_ack_removes_only_its_own_leases(p: Project) -> None:
    """One ZREM for the batch: the leases of jobs outside it (or refused) stay, scores
    and all."""
    enqueue(p, *(new(c) for c in "abcd"))
    got = {g[0]: g[1] for g in claim(p)}
    sc = p.runtime.scripts
    k = p.keys()
    assert sc.renew(k, [("c", got["c"])], NOW + 500, LEASE) == [1]
    codes = sc.ack(k, [Ack("a", got["a"], "", "", ""), Ack("d", "stale", "", "", ""),
                       Ack("b", got["b"], "", "", "")], NOW + 600, 100_000)
    assert codes == [1, -1, 1]
    r = p.runtime.redis
    assert r.zrange(k.leases, 0, -1, withscores=True) == [("d", NOW + LEASE), ("c", NOW + 500 + LEASE)]
    assert rec(p, "a")["status"] == "done" and rec(p, "b")["status"] == "done"
    assert rec(p, "c")["status"] == "processing" and rec(p, "d")["status"] == "processing"
    assert_no_job_in_two_structures(p)


def test_batch_retry_and_bury_set_each_job_apart(p: Project) -> None:
    """A retry batch schedules each job at its own due time and a bury batch buries each
    with its own error and refund; jobs outside the batches keep their leases."""
    enqueue(p, *(new(c) for c in "abcde"))
    got = {g[0]: g[1] for g in claim(p)}
    sc = p.runtime.scripts
    k = p.keys()
    assert sc.retry(k, [RetryAt("a", got["a"], NOW + 100, '{"type":"A"}', '{"n":"a"}', "retried|noop"),
                        RetryAt("b", got["b"], NOW + 200, '{"type":"B"}', '{"n":"b"}', "retried|noop")],
                    NOW) == [1, 1]
    assert sc.bury(k, [Burial("c", got["c"], "bad", '{"type":"C"}', "", True, "dead|noop"),
                       Burial("d", got["d"], "failed", "", '{"n":"d"}', False, "dead|noop")],
                   NOW + 5, 100_000) == [1, 1]
    r = p.runtime.redis
    assert r.zrange(k.scheduled, 0, -1, withscores=True) == [("a", NOW + 100), ("b", NOW + 200)]
    assert r.zrange(k.dead, 0, -1, withscores=True) == [("c", NOW + 5), ("d", NOW + 5)]
    assert r.zrange(k.leases, 0, -1) == ["e"]
    ra, rc, rd = rec(p, "a"), rec(p, "c"), rec(p, "d")
    assert ra["status"] == "retrying" and ra["error"] == '{"type":"A"}' and ra["ready_ms"] == str(NOW + 100)
    assert ra["history"] == '{"n":"a"}'
    assert rc["status"] == "dead" and rc["attempt"] == "0" and rc["error"] == '{"type":"C"}'
    assert "history" not in rc
    assert rd["attempt"] == "1" and rd["reason"] == "failed" and "error" not in rd and rd["history"] == '{"n":"d"}'
    assert 0 < r.pttl(k.job("d")) <= 100_000
    assert r.hget(k.stats, "retried|noop") == "2" and r.hget(k.stats, "dead|noop") == "2"
    assert_no_job_in_two_structures(p)


@pytest.fixture(scope="module")
def quiet_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server of its own, so its command counts are this module's alone."""
    s = Server(tmp_path_factory.mktemp("quiet"), appendonly=False).start()
    yield s
    s.stop()


def _calls(r: Any) -> dict[str, int]:
    return {name.removeprefix("cmdstat_"): v["calls"] for name, v in r.info("commandstats").items()}


def _inside(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Commands run inside the scripts between two readings (EVALSHA and INFO left out)."""
    return {c: n - before.get(c, 0) for c, n in after.items()
            if n != before.get(c, 0) and c not in ("evalsha", "eval", "info", "script|load")}


def test_claim_and_ack_cost_a_few_commands_per_job(tmp_path: Path, quiet_server: Server) -> None:
    """The common case (no keys, first attempt succeeds): claim reads each record once and
    writes nothing to it; it pops, checks for strays (claims and outcomes) and that the
    keys it may write hold their types (one ZSCORE each for leases, scheduled, dead),
    records the claims and the leases with one command each for the batch. Ack touches no record: one
    HMGET for the fences, one HSET for the outcomes, one ZADD for their retention index,
    one HDEL and one ZREM for the claims and leases, whatever the batch size."""
    proj = make_project(tmp_path / "project", quiet_server)
    try:
        enqueue(proj, *(new(f"j{i}") for i in range(20)))
        r = proj.runtime.redis
        claim(proj, n=1)  # loads the script
        proj.runtime.scripts.ack(proj.keys(), [], NOW, 1000)
        t0 = _calls(r)
        got = claim(proj, n=10)
        t1 = _calls(r)
        acks = [Ack(g[0], g[1], "null", '{"attempt":1}', "succeeded|noop") for g in got]
        assert proj.runtime.scripts.ack(proj.keys(), acks, NOW, 100_000) == [1] * 10
        t2 = _calls(r)
    finally:
        proj.stop_all()
        proj.runtime.close()
    assert len(got) == 10
    assert _inside(t0, t1) == {"rpop": 1, "hmget": 10 + 2, "zscore": 3, "hset": 1, "zadd": 1}
    # + one HINCRBY for the stats field, one HINCRBY and PEXPIRE for this minute's counter
    assert _inside(t1, t2) == {"hmget": 1, "hset": 1, "zadd": 1, "hdel": 1, "zrem": 1, "pexpire": 1,
                               "hincrby": 2}
