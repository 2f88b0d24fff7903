"""What a plain job costs the server in commands, script by script, counted from INFO
commandstats around one call (it counts the commands a script runs inside it). Light
load makes every job its own batch, so each command here is paid per job
(docs/benchmarks.md, "Light load"); these pin the cuts so a later change that brings a
command back fails here, and each test also checks the state the cut must keep."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from test_scripts import NOW, claim, enqueue, new

from runner.store.scripts import Ack

from conftest import SCAN_COUNT, Project, keep_functions, structures


@pytest.fixture
def p(any_project: Project) -> Project:
    return keep_functions(any_project)  # (the scripts read no function)


def counts(r: Any) -> Counter[str]:
    """Calls per command so far (lower-case names, "cmdstat_" dropped)."""
    return Counter({k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in r.info("commandstats").items()})


def sent(r: Any, call: Any) -> Counter[str]:
    """The commands one call made the server run (the INFO read itself taken out)."""
    before = counts(r)
    call()
    got = counts(r) - before
    got["info"] -= 1
    return +got


def test_an_ack_writes_no_throughput_minute(p: Project) -> None:
    """The minute's throughput count ("done") is summed in the worker with a success's
    other figures and added within a second (tests/integration/test_figure_flush.py): an
    ack of a plain job sends no HINCRBY or PEXPIRE for it, only the census's HINCRBY, and
    leaves no minute hash."""
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    enqueue(p, new("a"))
    (ja,) = claim(p, n=1)
    got = sent(r, lambda: sc.ack(k, [Ack("a", ja[1], "", "noop|1", "")], 100_000, now_ms=NOW + 1))
    assert got["hincrby"] == 1 and got["pexpire"] == 0, got
    assert not r.exists(k.throughput((NOW + 1) // 60_000))
    assert r.hget(k.census, "noop|1") == "0"  # the census still goes down in the ack's step


def test_an_enqueue_wakes_idle_workers_with_one_push_and_a_bounded_list(p: Project) -> None:
    """An enqueue wakes idle workers with one LPUSH on the wake-up list (no LLEN before
    it): the list still never holds more than 64 tokens, however many enqueues no
    worker takes, and a worker that comes later finds one to wake it."""
    r, k = p.runtime.redis, p.keys()
    one = sent(r, lambda: enqueue(p, new("a")))
    assert one["llen"] == 0 and one["lpush"] == 2 and r.llen(k.notify) == 1
    for i in range(200):
        enqueue(p, new(f"j{i}"))
        assert 1 <= r.llen(k.notify) <= 64
    assert r.llen(k.ready) == 201


def test_a_plain_claim_checks_no_key_s_type_before_it_writes(p: Project) -> None:
    """A claim of plain jobs (records in place, nothing to bury or mark done) sends no
    type check at all: not of the scheduled and dead sets, which a plain claim does not
    write (the retry, deferral or burial that later gives up its claim checks the set it
    writes next and refuses whole, the claim kept: test_scripts,
    test_a_set_damaged_while_a_job_runs_refuses_its_settle_and_keeps_the_claim), not of
    the leases, whose write is made with a pcall and refuses with every id back
    (test_a_leases_key_damaged_costs_no_job), and not of the done meta, which only a
    settle that reads it checks. Each was a command per claim call, paid per job at
    light load."""
    r, k = p.runtime.redis, p.keys()
    r.zadd(k.dead, {f"d{i}": i for i in range(500)})
    r.zadd(k.scheduled, {f"s{i}": NOW * 2 for i in range(500)})
    r.zadd(k.leases, {f"l{i}": NOW * 2 for i in range(500)})
    enqueue(p, new("a"), new("b"))
    got = sent(r, lambda: claim(p, n=2))
    assert got["zscore"] == 0 and got["zintercard"] == 0 and got["hget"] == 0, got
    assert r.hlen(k.claims) == 2 and r.zcard(k.leases) == 502
    assert r.zcard(k.scheduled) == 500 and r.zcard(k.dead) == 500


@pytest.mark.parametrize("kind", ["set", "string", "hash"])
def test_a_leases_key_damaged_costs_no_job(p: Project, kind: str) -> None:
    """A leases key overwritten with another type (the claim checks no type first): a
    claim of plain jobs fails at its lease write, puts every id it popped back in ready
    in order and refuses, naming the key, with no claim written; a claim that meets a job
    whose settle writes (a state hash, a limit) checks the leases before that write and
    refuses the same way, that job's state untouched. Once the reclaim puts the key
    aside, every job is claimed, once."""
    from redis.exceptions import ResponseError

    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    enqueue(p, new("a"), new("b"))
    {"set": lambda: r.sadd(k.leases, "x"), "string": lambda: r.set(k.leases, "x"),
     "hash": lambda: r.hset(k.leases, "x", "1")}[kind]()
    for n in (1, 2, 5):
        with pytest.raises(ResponseError, match="the leases key of this queue holds the wrong"):
            claim(p, n=n)
        assert r.lrange(k.ready, 0, -1) == ["b", "a"] and r.hlen(k.claims) == 0, n
    enqueue(p, new("c", limits="1 c:x"))
    r.hset(k.state("b"), "lost_token", "old 1 1")
    for n in (1, 3):
        with pytest.raises(ResponseError, match="the leases key of this queue holds the wrong"):
            claim(p, n=n)
        assert r.lrange(k.ready, 0, -1) == ["c", "b", "a"] and r.hlen(k.claims) == 0, n
        assert r.hget(k.state("b"), "lost_token") == "old 1 1"
        assert not [key for key in r.scan_iter(count=SCAN_COUNT, match=k.lim_prefix + "*")]
    sc.reclaim(k, 100, 10**7, now_ms=NOW + 1)
    assert r.type(k.leases + ":corrupt") == kind
    assert [g[0] for g in claim(p, n=5)] == ["a", "b", "c"]
    assert r.zcard(k.leases) == 3 and r.hlen(k.claims) == 3


def test_a_claim_asks_for_pauses_priority_and_state_with_one_exists(p: Project) -> None:
    """With nothing paused, no job of priority waiting and no state hash for the jobs it
    pops, a claim learns all three from one EXISTS of the pause hash, the priority set
    and the popped jobs' state hashes (no HGETALL of the pauses, no EXISTS per job), in a
    batch too; with a pause or a job of priority it puts the popped ids back in order,
    reads the pauses as before, serves priority first, and a queue paused since the last
    claim claims nothing and keeps its order."""
    r, k = p.runtime.redis, p.keys()
    enqueue(p, new("a"), new("b"))
    got = sent(r, lambda: claim(p, n=1))
    assert got["hgetall"] == 0 and got["exists"] == 1 and got["rpop"] == 1
    enqueue(p, new("hi", priority=5))
    r.hset(k.paused, "fn:other", NOW)
    taken: list[Any] = []
    got = sent(r, lambda: taken.extend(claim(p, n=1)))
    assert got["hgetall"] == 1 and got["rpush"] == 1  # b went back
    assert [g[0] for g in taken] == ["hi"] and r.lrange(k.ready, 0, -1) == ["b"]
    r.hdel(k.paused, "fn:other")
    assert [g[0] for g in claim(p, n=1)] == ["b"]
    enqueue(p, new("lo"), new("lo2"), new("hi2", priority=3))
    r.hset(k.paused, "queue", NOW)
    assert claim(p, n=2) == [] and r.lrange(k.ready, 0, -1) == ["lo2", "lo"]
    r.hdel(k.paused, "queue")
    assert [g[0] for g in claim(p, n=2)] == ["hi2", "lo"]
    enqueue(p, *(new(f"j{i}") for i in range(10)))
    got = sent(r, lambda: claim(p, n=20))
    # (a record is read by one GETRANGE of its head, whole when small: claim.lua's rec_peek)
    assert got["exists"] == 1 and got["getrange"] == 11 and got["get"] == 0 and r.hlen(k.claims) == 16


def test_an_ack_counts_its_done_generation_by_the_log_it_pushes(p: Project) -> None:
    """An ack learns how many outcomes its done generation holds from the LPUSH of the
    generation's log (its reply), so it sends no HINCRBY of the generation's count; the
    count is written once it reaches a quarter of the count bound, and the next ack
    begins a new generation there, as before (count bound 8: generations of 2)."""
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    ids = ["a", "b", "c", "d", "e"]
    enqueue(p, *(new(i) for i in ids))
    tokens = {g[0]: g[1] for g in claim(p, n=5)}
    costs = []
    for n, i in enumerate(ids):
        costs.append(sent(r, lambda i=i, n=n: sc.ack(k, [Ack(i, tokens[i], "", "noop|1", "")], 100_000,
                                                     done_max=8, now_ms=NOW + 1 + n)))
    # One HINCRBY each, the census's (the throughput minute is the worker's to add).
    assert [c["hincrby"] for c in costs] == [1, 1, 1, 1, 1]
    assert [r.hkeys(k.done(g)) for g in range(3)] == [["a", "b"], ["c", "d"], ["e"]]
    assert r.lrange(k.done(1) + ":log", 0, -1) == ["d", "c"]
    assert r.hget(k.done_meta, "gen") == "2"


def test_a_claim_that_empties_the_queue_drops_the_wake_ups_left_for_nobody(p: Project) -> None:
    """Each enqueue call pushes a wake-up and a fetcher takes one per claim: a claim that
    took the jobs of two enqueues left one for nobody, and a fetcher woke to claim nothing
    (a third of the claims at light load with one worker). A call that empties the queue,
    every id it popped claimed, drops them with one DEL; one that leaves jobs behind,
    takes a single id or settles an id otherwise (a burial here) keeps them, and the next
    enqueue wakes a fetcher as before."""
    r, k = p.runtime.redis, p.keys()
    enqueue(p, new("a"))
    enqueue(p, new("b"))
    assert r.llen(k.notify) == 2
    got = sent(r, lambda: claim(p, n=10, base="w.1"))
    assert got["del"] == 1 and r.llen(k.notify) == 0 and r.hlen(k.claims) == 2
    enqueue(p, new("c"))
    enqueue(p, new("d"))
    enqueue(p, new("e"))
    assert [g[0] for g in claim(p, n=2, base="w.2")] == ["c", "d"] and r.llen(k.notify) == 3  # e waits
    got = sent(r, lambda: claim(p, n=10, base="w.3"))
    assert got["del"] == 0 and r.llen(k.notify) == 3  # one id: a wake-up per job is the usual case
    r.delete(k.notify)
    enqueue(p, new("f"))
    r.lpush(k.ready, "ghost")  # no record: buried by the claim
    assert [g[0] for g in claim(p, n=10, base="w.4")] == ["f"] and r.llen(k.notify) == 1
    enqueue(p, new("g"))
    assert r.llen(k.notify) == 2 and r.lrange(k.ready, 0, -1) == ["g"]


def test_an_id_twice_in_one_claim_is_read_again_after_a_gate_wrote_its_state(p: Project) -> None:
    """A claim knows from one EXISTS that the jobs it popped have no state hash; a gate may
    write one (a full limit parks the job), and the same id popped again in that call is
    read again: its state says deferred, and it is dropped as a stray, not parked twice
    (or claimed while it waits on the limit)."""
    r, k = p.runtime.redis, p.keys()
    enqueue(p, new("holder", limits="1 c:x"))
    assert [g[0] for g in claim(p, n=1, base="w.1")] == ["holder"]  # takes the only slot
    enqueue(p, new("r", limits="1 c:x"))
    r.lpush(k.ready, "r")  # the same id twice in ready
    assert claim(p, n=5, base="w.2") == []
    waiters = [key for key in r.scan_iter(count=SCAN_COUNT, match=k.lim_prefix + "*:w")]
    assert [r.lrange(w, 0, -1) for w in waiters] == [["r"]]
    assert "r" not in structures(p)["ready"] and r.hget(k.claims, "r") is None


def test_a_census_field_at_zero_stays_and_counts_nothing(p: Project) -> None:
    """At light load a job's type goes 1 -> 0 -> 1 in the census as each job is enqueued
    and done: the ack that takes a field to 0 leaves it there (no HDEL, one command a job
    at light load), and the deploy gate's readers count a field at 0 as no job (the
    census counts and the tag set's emptiness); the next enqueue counts from 0, and a
    field below 0 (damage) is still dropped."""
    from runner.store import census, tagset

    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    enqueue(p, new("a"))
    (ja,) = claim(p, n=1)
    got = sent(r, lambda: sc.ack(k, [Ack("a", ja[1], "", "noop|1", "")], 100_000, now_ms=NOW + 1))
    assert got["hdel"] == 1, got  # the claim's entry only
    assert r.hget(k.census, "noop|1") == "0"
    assert census.counts(r, {"fast": k}) == (0, {})
    assert tagset.drained(r, k)  # a partition with only a 0 in its census is drained
    enqueue(p, new("b"))
    assert r.hget(k.census, "noop|1") == "1" and census.counts(r, {"fast": k})[0] == 1
    r.hset(k.census, "noop|1", 0)
    (jb,) = claim(p, n=1)
    assert sc.ack(k, [Ack("b", jb[1], "", "noop|1", "")], 100_000, now_ms=NOW + 2) == [1]
    assert r.hget(k.census, "noop|1") is None  # -1: damage, dropped as before


def test_a_claim_of_one_id_checks_it_for_a_claim_by_writing_its_own(p: Project) -> None:
    """At light load a claim asks for many and pops one id: it learns whether that id
    already holds a claim (a stray, never run twice) from the HSETNX that writes its own
    claim, not from an HMGET before it. A lone stray, plain or with a state hash or an
    idempotency key, is dropped with the claim, lease and claim time it holds untouched;
    with the claims hash damaged the id goes back and the claim refuses, naming it."""
    from redis.exceptions import ResponseError

    r, k = p.runtime.redis, p.keys()
    enqueue(p, new("a"))
    got = sent(r, lambda: claim(p, n=16, base="w.1"))
    assert got["hmget"] == 0 and got["hsetnx"] == 1 and got["hset"] == 0, got
    enqueue(p, new("b", idem="kb", phash="h"))
    enqueue(p, new("c"))
    r.hset(k.state("c"), "lost_token", "old 1 1")
    assert [g[0] for g in claim(p, n=1, base="w.2")] == ["b"]
    assert [g[0] for g in claim(p, n=1, base="w.3")] == ["c"]
    held = {i: (r.hget(k.claims, i), r.zscore(k.leases, i), r.zscore(k.leases + ":since", i)) for i in "abc"}
    for i in "abc":  # each pushed again while it holds its claim, alone in ready
        r.rpush(k.ready, i)
        assert claim(p, n=16, now=NOW + 1000, base=f"w.{i}") == [], i
        assert (r.hget(k.claims, i), r.zscore(k.leases, i), r.zscore(k.leases + ":since", i)) == held[i], i
    assert r.hget(k.stats, "stray") == "3" and r.llen(k.ready) == 0
    assert r.hget(k.state("c"), "lost_token") is None  # (its own claim took it, not the stray's)
    enqueue(p, new("d"))
    r.delete(k.claims)
    r.set(k.claims, "clobbered")
    with pytest.raises(ResponseError, match="the claims key of this queue holds the wrong"):
        claim(p, n=16, base="w.4")
    assert r.lrange(k.ready, 0, -1) == ["d"] and r.zscore(k.leases, "d") is None


def test_an_idle_promote_reads_each_due_set_s_head_once(p: Project) -> None:
    """The scheduler calls promote every interval, and most calls find nothing due: such a
    call reads the head of scheduled, sleeping and limwait once each (a ZRANGE, whose score
    is also the answer's next-due time) and runs no ZRANGEBYSCORE, empty sets or not. A
    call that finds one due runs it for that set and answers from the set as it is left."""
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    got = sent(r, lambda: sc.promote(k, 100, now_ms=NOW))
    assert got["zrangebyscore"] == 0 and got["zrange"] == 3, got
    r.zadd(k.scheduled, {"later": NOW + 500})
    r.zadd(k.sleeping, {"nap": NOW + 300})
    r.zadd(k.limwait, {"r:x": NOW + 700})
    answer: list[Any] = []
    got = sent(r, lambda: answer.extend(sc.promote(k, 100, now_ms=NOW)))
    assert got["zrangebyscore"] == 0 and got["zrange"] == 3, got
    assert answer == [0, 300]
    enqueue(p, new("d", delay=100))
    got = sent(r, lambda: answer.__setitem__(slice(None), sc.promote(k, 100, now_ms=NOW + 150)))
    assert got["zrangebyscore"] == 1 and answer == [1, 150], got  # 'nap' at NOW + 300 next
    assert structures(p)["ready"] == ["d"] and r.zcard(k.scheduled) == 1
