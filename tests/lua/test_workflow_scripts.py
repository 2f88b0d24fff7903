"""The workflow transitions in Lua: MAX_AGE decided in the claim, and a group's countdown
(group.lua writes members and seals; ack, bury, reclaim and cancel count a member down
once, and the settle that finishes the last member writes the then-job)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from runner.store import records
from runner.store.scripts import Ack, Burial, Member, job_entry
from runner.worker.fetcher import CLAIM_FIELDS

from conftest import Project, keep_functions, structures

NOW = 1_800_000_000_000
LEASE = 1_000
FIELDS = CLAIM_FIELDS


@pytest.fixture
def p(any_project: Project) -> Project:
    return keep_functions(any_project)  # (the scripts read no function)


def enqueue(p: Project, *jobs: Any, now: int = NOW) -> None:
    p.runtime.scripts.enqueue(p.keys(), list(jobs), now_ms=now)


def new(job_id: str, type_: str = "noop", limits: str = "", meta: str = "") -> Any:
    from runner.store.scripts import NewJob

    return NewJob(id=job_id, type=type_, version=1, payload='{"a":1}', max_attempts=3, run_at_ms=0, delay_ms=0,
                  idem_key="", payload_hash="-", resource_key="", limits=limits, meta=meta)


def claim(p: Project, now: int, max_ages: str = "", n: int = 10, start: int | None = None) -> list[list[Any]]:
    reply = list(p.runtime.scripts.claim(p.keys(), n=n, start=n if start is None else start, lease_ms=LEASE,
                                         token_base=f"w.{now}",
                                         dead_ttl_ms=10_000_000, done_ttl_ms=10_000_000, now_ms=now,
                                         max_ages=max_ages))
    return [reply[i:i + FIELDS] for i in range(2, len(reply), FIELDS)]


# --- MAX_AGE ---------------------------------------------------------------------------


def test_claim_marks_a_job_past_its_max_age_expired_and_takes_no_limit(p: Project) -> None:
    """A job older than its type's MAX_AGE (by created_ms, on the script's clock) is claimed
    with started = 2 and no limit slot; a younger one, or one of a type without MAX_AGE, is
    claimed as usual."""
    enqueue(p, new("old", limits="1 r:x"), new("other", type_="record"))
    enqueue(p, new("young"), now=NOW + 900)
    got = {g[0]: g for g in claim(p, NOW + 1000, "noop=500 slow=1")}
    assert got["old"][12] == 2 and got["young"][12] == 1 and got["other"][12] == 1
    assert got["old"][2] == 1  # the attempt it would be
    r, k = p.runtime.redis, p.keys()
    assert r.zcard(k.limit("r:x")) == 0  # no slot taken for a job that will not run
    claim_entry = r.hget(k.claims, "old")
    assert claim_entry is not None and claim_entry.split()[3] == "-"  # no limit, idempotency or state flag


def test_a_rate_token_due_past_max_age_is_not_taken_and_the_job_expires_at_once(p: Project) -> None:
    """One start a second, MAX_AGE 1.5 s, five jobs at once: the first starts, the second
    waits for its token at +1 s, and the rest, whose tokens would come due after their
    age, expire now and leave those tokens unspent, so a job sent at +1.1 s gets the
    token of +2 s (it expired in turn when dead jobs held every token before it)."""
    enqueue(p, *[new(f"j{i}", limits="1/1000 api") for i in range(5)])
    got = {g[0]: g for g in claim(p, NOW, "noop=1500")}
    assert got["j0"][12] == 1 and all(got[f"j{i}"][12] == 2 for i in (2, 3, 4)) and "j1" not in got
    r, k = p.runtime.redis, p.keys()
    assert r.zscore(k.scheduled, "j1") == NOW + 1000
    enqueue(p, new("late", limits="1/1000 api"), now=NOW + 1100)
    assert claim(p, NOW + 1100, "noop=1500") == []
    assert r.zscore(k.scheduled, "late") == NOW + 2000


def test_an_expired_claim_buries_without_spending_its_attempt(p: Project) -> None:
    enqueue(p, new("old"))
    [job] = claim(p, NOW + 1000, "noop=500")
    sc, k = p.runtime.scripts, p.keys()
    assert sc.bury(k, [Burial("old", job[1], "expired", '{"type":"Expired"}',
                              '{"attempt":1,"outcome":"expired"}', True, "dead|noop expired|noop")],
                   10_000_000, now_ms=NOW + 1001) == [1]
    st = p.runtime.redis.hgetall(k.state("old"))
    assert st["status"] == "dead" and st["reason"] == "expired" and st["attempt"] == "0"
    assert structures(p)["dead"] == ["old"]


# --- groups ----------------------------------------------------------------------------


def member(job_id: str, gid: str, number: int) -> Any:
    return new(job_id, meta=json.dumps({"group": gid, "member": number}))


def then_entry(gid: str, queue: str = "", payload: str = '{"x":1}') -> str:
    then = new(f"{gid}.then", type_="record", meta=json.dumps({"group": gid}))._replace(payload=payload)
    return json.dumps(job_entry(queue, then))


def make_group(p: Project, gid: str, ids: list[str], *, chunks: int = 1, seal: bool = True, queue: str = "",
               inline: int = 1 << 20, payload: str = '{"x":1}') -> list[Any]:
    sc, k = p.runtime.scripts, p.keys()
    jobs = [member(j, gid, i + 1) for i, j in enumerate(ids)]
    size = max(1, -(-len(jobs) // chunks))
    parts = [jobs[i:i + size] for i in range(0, len(jobs), size)] or [[]]
    replies = []
    for n, part in enumerate(parts):
        replies.append(list(sc.group(k, gid, part, first=n == 0, seal=seal and n == len(parts) - 1,
                                     then=then_entry(gid, queue, payload), inline_bytes=inline, keep_ms=60_000,
                                     now_ms=NOW)))
    return replies


def ack(p: Project, job: list[Any], gid: str, number: int, result: str = '{"n":1}', now: int = NOW + 10) -> Any:
    outcome = json.dumps({"id": job[0], "status": "done", "result": json.loads(result)})
    return p.runtime.scripts.ack(p.keys(), [Ack(job[0], job[1], result, "noop|1", "succeeded|noop",
                                                member=Member(gid, number, "done", outcome))], 100_000, now_ms=now)


def bury(p: Project, job: list[Any], gid: str, number: int, now: int = NOW + 10) -> Any:
    outcome = json.dumps({"id": job[0], "status": "dead", "reason": "permanent failure",
                          "error": {"type": "E", "message": "m"}})
    return p.runtime.scripts.bury(p.keys(), [Burial(job[0], job[1], "permanent failure", '{"type":"E"}', "", False,
                                                    "dead|noop", member=Member(gid, number, "dead", outcome))],
                                  10_000_000, now_ms=now)


def group_hash(p: Project, gid: str) -> dict[str, str]:
    return p.runtime.redis.hgetall(p.keys().group(gid))


def then_payload(p: Project, gid: str) -> Any:
    rec = records.parse(p.runtime.redis.get(p.keys().job(f"{gid}.then")))
    return None if rec is None else json.loads(rec["payload"])


def test_the_last_members_settle_writes_the_then_job_with_every_outcome_in_order(p: Project) -> None:
    """Members count down as they settle, in any order; the settle of the last one writes
    the then-job in the same step, its payload the group (outcomes in member order) in
    front of the caller's fields."""
    assert make_group(p, "g1", ["a", "b", "c"]) == [[1, "queued", "queued", "queued"]]
    jobs = {j[0]: j for j in claim(p, NOW + 1)}
    assert ack(p, jobs["c"], "g1", 3) == [1]
    assert bury(p, jobs["a"], "g1", 1) == [1]
    assert group_hash(p, "g1")["left"] == "1" and then_payload(p, "g1") is None
    assert ack(p, jobs["b"], "g1", 2, '{"n":2}') == [1]
    got = then_payload(p, "g1")
    assert got["x"] == 1 and list(got) == ["group", "x"]
    g = got["group"]
    assert (g["id"], g["total"], g["done"], g["dead"], g["cancelled"]) == ("g1", 3, 2, 1, 0)
    assert [o["id"] for o in g["outcomes"]] == ["a", "b", "c"]
    assert [o["status"] for o in g["outcomes"]] == ["dead", "done", "done"]
    assert g["outcomes"][1]["result"] == {"n": 2}
    assert "g1.then" in p.runtime.redis.lrange(p.keys().ready, 0, -1)
    h = group_hash(p, "g1")
    assert h["completed_ms"] == str(NOW + 10) and h["left"] == "0"
    assert p.runtime.redis.pttl(p.keys().group("g1")) > 0  # kept for its retention once complete
    assert p.runtime.redis.hget(p.keys().stats, "groups_completed") == "1"


def test_a_member_counts_once_whatever_settles_it_again(p: Project) -> None:
    """The double-settle guards: an ack sent twice (refused by its fence), a late success
    after the reclaim buried the member as "worker lost" (it counted as dead then), and a
    dead member requeued and run again, count nothing more."""
    make_group(p, "g2", ["a", "b", "c"])
    sc, k = p.runtime.scripts, p.keys()
    jobs = {j[0]: j for j in claim(p, NOW + 1)}
    assert ack(p, jobs["a"], "g2", 1) == [1]
    assert ack(p, jobs["a"], "g2", 1) == [-1]
    assert bury(p, jobs["c"], "g2", 3) == [1]
    assert group_hash(p, "g2")["left"] == "1"
    # b: its worker dies on every attempt (max_attempts 3): the third lapse buries it.
    now = NOW + 1
    for _ in range(2):
        now += LEASE + 1
        assert list(sc.reclaim(k, 100, 10_000_000, now_ms=now)) == [1, 0]
        jobs.update({j[0]: j for j in claim(p, now)})
    now += LEASE + 1
    assert list(sc.reclaim(k, 100, 10_000_000, now_ms=now)) == [0, 1]
    h = group_hash(p, "g2")
    assert (h["done"], h["dead"], h["left"]) == ("1", "2", "0")
    outcome = json.loads(p.runtime.redis.hget(k.group_outcomes("g2"), "2"))
    assert outcome["status"] == "dead" and outcome["reason"] == "worker lost"
    fired = then_payload(p, "g2")
    assert [o["status"] for o in fired["group"]["outcomes"]] == ["done", "dead", "dead"]
    assert ack(p, jobs["b"], "g2", 2, now=now + 1) == [2]  # a late success: done, not counted again
    # c: requeued from the dead-letter set, run again and acked: still counted once.
    assert sc.requeue(k, "c", now_ms=now + 3) == 1
    again = {j[0]: j for j in claim(p, now + 4)}
    assert ack(p, again["c"], "g2", 3, now=now + 5) == [1]
    h = group_hash(p, "g2")
    assert (h["done"], h["dead"], h["left"]) == ("1", "2", "0")
    assert then_payload(p, "g2") == fired
    assert p.runtime.redis.hget(k.stats, "groups_completed") == "1"


def test_an_unsealed_group_never_fires_and_the_seal_fires_a_finished_one(p: Project) -> None:
    """A group written in chunks fires only once sealed: members that all finished before
    the seal leave it to the sealing call."""
    assert make_group(p, "g3", ["a", "b"], seal=False) == [[1, "queued", "queued"]]
    jobs = {j[0]: j for j in claim(p, NOW + 1)}
    ack(p, jobs["a"], "g3", 1)
    ack(p, jobs["b"], "g3", 2)
    assert group_hash(p, "g3")["left"] == "0" and then_payload(p, "g3") is None
    r, k = p.runtime.redis, p.keys()
    assert r.pttl(k.group_outcomes("g3")) > 0  # unsealed: its outcomes expire with it
    reply = p.runtime.scripts.group(k, "g3", [], first=False, seal=True, then="", inline_bytes=0, keep_ms=60_000,
                                    now_ms=NOW + 20)
    assert list(reply) == [2]
    assert [o["id"] for o in then_payload(p, "g3")["group"]["outcomes"]] == ["a", "b"]
    # A chunk for a sealed group, or a first chunk for an existing one, is refused.
    assert list(p.runtime.scripts.group(k, "g3", [], first=False, seal=True, then="", inline_bytes=0,
                                        keep_ms=1, now_ms=NOW)) == [-2]
    assert make_group(p, "g3", ["z"])[0] == [-1]


def test_outcomes_past_the_inline_bound_are_left_for_the_handler_to_read(p: Project) -> None:
    make_group(p, "g4", ["a", "b"], inline=10, payload="{}")
    for j in claim(p, NOW + 1):
        ack(p, j, "g4", 1 if j[0] == "a" else 2)
    got = then_payload(p, "g4")
    assert list(got) == ["group"] and got["group"]["outcomes"] is None
    hashed = p.runtime.redis.hgetall(p.keys().group_outcomes("g4"))
    assert sorted(json.loads(v)["id"] for v in hashed.values()) == ["a", "b"]


def test_a_then_job_on_another_queue_goes_to_the_outbox(p: Project) -> None:
    make_group(p, "g5", ["a"], queue="slow")
    [j] = claim(p, NOW + 1)
    ack(p, j, "g5", 1)
    [entry] = p.runtime.redis.lrange(p.keys().outbox, 0, -1)
    fields = json.loads(entry)
    assert fields[0] == "slow" and fields[1] == "g5.then" and len(fields) == 14 and fields[13] == "0"
    assert json.loads(fields[4])["group"]["outcomes"][0]["id"] == "a"


def test_cancelling_a_queued_member_counts_it_cancelled(p: Project) -> None:
    make_group(p, "g6", ["a", "b"])
    sc, k = p.runtime.scripts, p.keys()
    assert list(sc.cancel(k, "a", 60_000, now_ms=NOW + 1)) == [1, "cancelled"]
    h = group_hash(p, "g6")
    assert h["cancelled"] == "1" and h["left"] == "1"
    [j] = claim(p, NOW + 2)
    ack(p, j, "g6", 2)
    g = then_payload(p, "g6")["group"]
    assert [o["status"] for o in g["outcomes"]] == ["cancelled", "done"] and g["cancelled"] == 1


def test_a_cancel_completed_by_the_claim_or_a_release_counts_the_member_cancelled(p: Project) -> None:
    """A running member asked to stop whose worker died ends cancelled at its next claim; a
    member claimed ahead and cancelled ends cancelled when its worker hands it back: each
    counts down once, as cancelled."""
    from runner.store.scripts import Hand

    make_group(p, "g7", ["a", "b"])
    sc, k = p.runtime.scripts, p.keys()
    [a] = claim(p, NOW + 1, n=1)
    [b] = claim(p, NOW + 1, n=1, start=0)  # claimed ahead, not started
    assert list(sc.cancel(k, "a", 60_000, now_ms=NOW + 2)) == [2, "processing"]
    assert list(sc.cancel(k, "b", 60_000, now_ms=NOW + 2)) == [3, "queued"]
    assert sc.release(k, [Hand("b", b[1])], now_ms=NOW + 3) == [1]
    assert group_hash(p, "g7")["cancelled"] == "1"
    assert list(sc.reclaim(k, 100, 10_000_000, now_ms=NOW + 2 + LEASE)) == [1, 0]  # a's worker died
    assert claim(p, NOW + 3 + LEASE) == []  # a ends cancelled instead of running again
    h = group_hash(p, "g7")
    assert (h["cancelled"], h["left"]) == ("2", "0") and a[0] == "a"
    g = then_payload(p, "g7")["group"]
    assert [o["status"] for o in g["outcomes"]] == ["cancelled", "cancelled"]


def test_a_relayed_job_under_a_limit_marks_its_key_where_it_is_placed(p: Project) -> None:
    """On a partitioned queue the relay places a keyed job (a follow-up or a then-job routed
    to another partition, a tick's job) with its first limit key marked there, as an
    enqueue marks it, so a producer on another count of partitions finds the key in that
    partition (routing.Placement) while the job is merely queued."""
    p.write_config(fast="partitions = 4")
    k = p.runtime.parts["fast"][1]
    job = new("r1", "resource", limits="1 r:res:a\n2 ck:acct:a")
    assert list(p.runtime.scripts.relay(k, [job_entry("fast", job)[1:]], now_ms=NOW)) == [1]
    assert p.runtime.redis.exists(k.limit("r:res:a") + ":at")
    assert p.runtime.redis.lrange(k.ready, 0, -1) == ["r1"]


def test_the_census_holds_no_name_no_function_can_have(p: Project) -> None:
    """The census keeps one field per type and version ever enqueued, read whole by the
    deploy gate and the drain of a partition. Another writer's outbox entries name any
    type: a 100 KB name became a 100 KB field kept for ever (its count back at 0). A name
    no function can have is counted as "?" (the same going in and out)."""
    k, r, sc = p.keys(), p.runtime.redis, p.runtime.scripts
    huge = "x" * 100_000
    assert list(sc.relay(k, [job_entry("fast", new("f1", huge))[1:]], now_ms=NOW)) == [1]
    assert r.hgetall(k.census) == {"?|1": "1"}
    (f1,) = claim(p, NOW)
    assert sc.ack(k, [Ack(f1[0], f1[1], "null", f"{huge}|1", "")], 100_000, now_ms=NOW) == [1]
    assert r.hgetall(k.census) == {"?|1": "0"}
