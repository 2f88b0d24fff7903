"""Each Lua transition: state before, call, state after, return code. Time is driven by
passing now_ms (the scripts' test clock), so leases, due times and retentions are exact;
the tests of the server's clock pass none and read TIME around the call."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runner.store import records
from runner.store.embedded import Server
from runner.store.scripts import Ack, Burial, Hand, NewJob, RetryAt
from runner.worker.fetcher import CLAIM_FIELDS

from conftest import Project, assert_no_job_in_two_structures, done_ids, keep_functions, make_project, structures, view

NOW = 1_800_000_000_000
LEASE = 1_000
HEAD = 2  # a claim reply starts with its time and whether it held a limited job back
FIELDS = CLAIM_FIELDS  # values per claimed job in a claim reply, after HEAD
RESERVE_MS = 10_000  # how long a woken job's slot is kept for it (includes/limits.lua)
SWEEP_MS = 1_000  # how soon promote looks again at a limit with parked jobs (includes/limits.lua)


def new(job_id: str, *, run_at: int = 0, delay: int = 0, idem: str = "", phash: str = "-", res: str = "",
        limits: str | None = None, type_: str = "noop", max_attempts: int = 3, priority: int = 0) -> NewJob:
    """A job as the client builds it: a resource key is limit 1 on "r:<resource>"."""
    if limits is None:
        limits = f"1 r:{res}" if res else ""
    return NewJob(id=job_id, type=type_, version=1, payload='{"a":1}', max_attempts=max_attempts,
                  run_at_ms=run_at, delay_ms=delay, idem_key=idem, payload_hash=phash, resource_key=res,
                  limits=limits, priority=priority)


def claim_reply(p: Project, n: int = 10, now: int | None = NOW, base: str = "w.1",
                start: int | None = None) -> list[Any]:
    """The raw claim reply: time, why it stopped short (0 | 1 held | 2 bounded), then FIELDS values per job; ``start``
    of the n jobs start at once (all unless told)."""
    return list(p.runtime.scripts.claim(
        p.keys(), n=n, start=n if start is None else start, lease_ms=LEASE, token_base=base,
        dead_ttl_ms=10_000_000, done_ttl_ms=10_000_000, now_ms=now,
    ))


def claim(p: Project, n: int = 10, now: int = NOW, base: str = "w.1", start: int | None = None) -> list[list[Any]]:
    """The claimed jobs, FIELDS values each: id, token, attempt, ..., started (1 | 0)."""
    reply = claim_reply(p, n, now, base, start)
    assert reply[0] == now and reply[1] in (0, 1, 2)  # the claim's time is the clock it ran on
    return [reply[i:i + FIELDS] for i in range(HEAD, len(reply), FIELDS)]


def enqueue(p: Project, *jobs: NewJob, now: int | None = NOW) -> list[Any]:
    return list(p.runtime.scripts.enqueue(p.keys(), list(jobs), now_ms=now))


def rec(p: Project, job_id: str) -> dict[str, str]:
    """The job as readers see it: record and state, with its claim or done outcome laid over."""
    return view(p, job_id)


def raw(p: Project, job_id: str) -> dict[str, str]:
    """The record string's fields and the state hash, as written (no claim, no outcome)."""
    r, k = p.runtime.redis, p.keys()
    return records.view(job_id, r.get(k.job(job_id)), r.hgetall(k.state(job_id)), None, None)


def state(p: Project, job_id: str) -> dict[str, str]:
    """The state hash alone (absent while the job waits untouched)."""
    return p.runtime.redis.hgetall(p.keys().state(job_id))


DEAD_GRACE = 3_600_000  # a dead job's keys expire this long after the dead retention (includes/records.lua: rec_expire)


def outcome(p: Project, job_id: str) -> str | None:
    """A done job's outcome as written, from whichever done generation holds it."""
    r, k = p.runtime.redis, p.keys()
    gen = int(r.hget(k.done_meta, "gen") or 0)
    for g in range(gen, gen - 4, -1):
        o = r.hget(k.done(g), job_id)
        if o is not None:
            return o  # type: ignore[no-any-return]
    return None


def kept(p: Project, job_id: str) -> dict[str, str]:
    """What a done job's outcome alone keeps, as readers see it (no record, no state)."""
    o = outcome(p, job_id)
    assert o is not None, f"no done outcome for {job_id}"
    return records.view(job_id, None, {}, None, o)


def done_entry(attempt: int, started: int, finished: int) -> str:
    """The history entry a done job's view adds for its successful attempt (records.view)."""
    return f'{{"attempt":{attempt},"outcome":"done","started_ms":{started},"at_ms":{finished}}}'


def parked(p: Project, key: str) -> list[str]:
    """The ids parked on a limit key, oldest first."""
    return p.runtime.redis.lrange(p.keys().limit(key) + ":w", 0, -1)


def holders(p: Project, key: str) -> dict[str, float]:
    """A limit key's holders: claim token (or "=<id>", a reserved slot) -> deadline ms."""
    return dict(p.runtime.redis.zrange(p.keys().limit(key), 0, -1, withscores=True))


def server_ms(p: Project) -> int:
    s, us = p.runtime.redis.time()
    return int(s) * 1000 + int(us) // 1000


@pytest.fixture
def p(any_project: Project) -> Project:
    return keep_functions(any_project, "noop")  # (the one function a test enqueues through the client)


# --- enqueue ---------------------------------------------------------------------------


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


def test_a_delay_counts_from_the_scripts_clock_and_run_at_is_absolute(p: Project) -> None:
    """delay_ms is added to the clock the script runs on; run_at_ms is a time of its own and
    wins over a delay; a run_at already past is due now."""
    out = enqueue(p, new("d", delay=1500), new("both", run_at=NOW + 5000, delay=1500),
                  new("past", run_at=NOW - 1))
    assert out == [1, "d", "scheduled", 1, "both", "scheduled", 1, "past", "queued"]
    r, k = p.runtime.redis, p.keys()
    assert r.zscore(k.scheduled, "d") == NOW + 1500 and rec(p, "d")["ready_ms"] == str(NOW + 1500)
    assert r.zscore(k.scheduled, "both") == NOW + 5000
    assert structures(p)["ready"] == ["past"]


def test_enqueue_batch_keeps_order_and_counts_once(p: Project) -> None:
    """A batch lands in ready in the order given (the consumer end sees the first job
    first), with its keys and limits on the record and one counter bump per type."""
    enqueue(p, new("a"), new("b", idem="k1", phash="h"), new("c", res="user:1"))
    assert p.runtime.redis.lrange(p.keys().ready, 0, -1) == ["c", "b", "a"]
    rb, rc = rec(p, "b"), rec(p, "c")
    assert rb["idem_key"] == "k1" and rb["idem_hash"] == "h" and "resource_key" not in rb and "limits" not in rb
    assert rc["resource_key"] == "user:1" and rc["limits"] == "1 r:user:1" and "idem_key" not in rc
    assert "idem_hash" not in rc
    assert p.runtime.redis.hget(p.keys().stats, "enqueued|noop") == "3"


def test_a_full_stats_hash_adds_new_names_under_other_and_keeps_counting_its_own(p: Project) -> None:
    """Another producer's type names grew a stats hash to 1.44 million fields, one per name
    and figure. Once it holds 10,000 fields, a figure of a name it does not hold yet is
    added under "_other": the hash stops growing, the count is kept, and the names it holds
    (the functions that ran before) go on counting under their own."""
    r, k = p.runtime.redis, p.keys()
    enqueue(p, new("a"))
    r.hset(k.stats, mapping={f"dead|junk{i}": 1 for i in range(10_000)})
    enqueue(p, new("b"), new("c", type_="newtype"), new("d", type_="other2"), new("e", type_="other2"))
    assert r.hget(k.stats, "enqueued|noop") == "2"
    assert r.hget(k.stats, "enqueued|newtype") is None and r.hget(k.stats, "enqueued|_other") == "3"
    assert r.hlen(k.stats) == 10_003  # (noop's figure and its mark, the junk, _other)


def test_a_functions_figures_are_all_its_own_or_all_folded_whoever_writes_them(p: Project) -> None:
    """The worker adds a success's figures itself (a second's sums: stats.add_counts), past
    the bound that folds new names: a function first seen past 10,000 fields showed
    succeeded and its timings under its own name but enqueued, retried and dead under
    "_other", and the hash grew. One rule decides for every writer, per function: one
    counted before the bound keeps every figure under its name (a figure new to it too),
    one first seen after has every figure under "_other"."""
    from runner.store import stats

    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    enqueue(p, new("a"))
    r.hset(k.stats, mapping={f"enqueued|junk{i}": 1 for i in range(10_000)})
    enqueue(p, new("b", type_="fresh"))
    left, exc = stats.add_counts_by_master(sc, {k.stats: {
        "succeeded|fresh": 1, "lat|fresh|5": 1, "lat_sum|fresh": 4, "run_sum|fresh": 0, "succeeded|noop": 2,
        "run|noop|10": 2}}, {})
    assert not left and exc is None
    jobs = {j[0]: j for j in claim(p)}
    assert sc.retry(k, [RetryAt("b", jobs["b"][1], 500, '{"type":"E","message":"m"}', '{"attempt":1}',
                                "retried|fresh")], now_ms=NOW) == [1]
    got = r.hgetall(k.stats)
    assert not [f for f in got if f.endswith("|fresh") or "|fresh|" in f], sorted(f for f in got if "fresh" in f)
    assert got["enqueued|_other"] == "1" and got["succeeded|_other"] == "1" and got["lat|_other|5"] == "1"
    assert got["retried|_other"] == "1"
    assert got["lat_sum|_other"] == "4"
    assert got["succeeded|noop"] == "2" and got["run|noop|10"] == "2"  # (new to noop, past the bound: its own)
    before = len(got)
    stats.add_counts_by_master(sc, {k.stats: {"succeeded|fresh": 1, "dead|fresh2": 1}}, {})
    assert r.hlen(k.stats) == before + 1  # (dead|_other is new; nothing of fresh or fresh2)


def test_a_type_no_function_can_have_is_counted_as_malformed(p: Project) -> None:
    """A type name is another producer's to write: one with "|" made a field that split
    into no series, one with a space or "=" one that split in two, and one of 100 KB a field
    that long. A name no function can have is counted under the malformed "?"."""
    r, k = p.runtime.redis, p.keys()
    enqueue(p, new("a", type_="a|b"), new("b", type_="x" * 100_000), new("c", type_="a b=5"))
    assert r.hgetall(k.stats) == {"enqueued|?": "3", "own|?": "1"}  # (and its mark: stats.lua)


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
    """Same key + same hash returns the first job; another hash is a conflict; no new record.
    The key names the job and its hash, with no expiry while the job is unfinished."""
    assert enqueue(p, new("a", idem="k", phash="h1"))[0] == 1
    assert enqueue(p, new("b", idem="k", phash="h1")) == [0, "a", "queued"]
    assert enqueue(p, new("c", idem="k", phash="h2")) == [-1, "a", "queued"]
    assert not rec(p, "b") and not rec(p, "c")
    assert structures(p)["ready"] == ["a"]
    r, k = p.runtime.redis, p.keys()
    assert r.get(k.idem("noop", "k")) == "a h1" and r.pttl(k.idem("noop", "k")) == -1
    assert r.hget(k.stats, "deduplicated|noop") == "1"


def test_idempotency_keys_are_per_function(p: Project) -> None:
    """The same key sent to two functions is two requests: each function's key names its
    own job, and neither is a duplicate or a conflict of the other."""
    assert enqueue(p, new("a", idem="k", phash="h")) == [1, "a", "queued"]
    assert enqueue(p, new("b", idem="k", phash="h", type_="other")) == [1, "b", "queued"]
    assert enqueue(p, new("c", idem="k", phash="h2", type_="other")) == [-1, "b", "queued"]
    r, k = p.runtime.redis, p.keys()
    assert r.get(k.idem("noop", "k")) == "a h" and r.get(k.idem("other", "k")) == "b h"


def test_the_clients_request_hash_is_canonical_and_names_the_function(p: Project) -> None:
    """The payload hash the client sends is codec.canonical_hash(type, version, payload):
    key order and 7.0 vs 7 do not make another request; another payload does."""
    from runner.errors import IdempotencyConflict
    from runner.store import codec

    first = p.client.enqueue("noop", {"a": 7.0, "b": [1]}, idempotency_key="k")
    again = p.client.enqueue("noop", {"b": [1.0], "a": 7}, idempotency_key="k")
    assert again.duplicate and again.id == first.id
    assert raw(p, first.id)["idem_hash"] == codec.canonical_hash("noop", 1, {"a": 7, "b": [1]})
    assert p.runtime.redis.get(p.keys().idem("noop", "k")) == f"{first.id} {raw(p, first.id)['idem_hash']}"
    with pytest.raises(IdempotencyConflict):
        p.client.enqueue("noop", {"a": 8}, idempotency_key="k")


def test_a_duplicate_reports_the_status_of_the_job_holding_the_key(p: Project) -> None:
    """A duplicate answers with where the first job is now: scheduled, processing (claimed),
    deferred (parked on a full limit) or done."""
    enqueue(p, new("hold", res="r1"))
    assert [g[0] for g in claim(p)] == ["hold"]
    enqueue(p, new("s", idem="ks", phash="h", delay=5000), new("w", idem="kw", phash="h", res="r1"),
            new("c", idem="kc", phash="h"))
    got = claim(p, base="w.2")
    assert [g[0] for g in got] == ["c"]  # w is parked behind the holder
    assert enqueue(p, new("x1", idem="ks", phash="h"), new("x2", idem="kw", phash="h"),
                   new("x3", idem="kc", phash="h")) == [0, "s", "scheduled", 0, "w", "deferred",
                                                        0, "c", "processing"]
    assert p.runtime.scripts.ack(p.keys(), [Ack("c", got[0][1], "", "", "")], 100_000, now_ms=NOW) == [1]
    assert enqueue(p, new("x4", idem="kc", phash="h")) == [0, "c", "done"]


def test_a_key_naming_a_job_that_no_longer_exists_is_taken_over(p: Project) -> None:
    """A key whose job record is gone (deleted by hand, or lost) is stale: the new job
    takes it instead of being answered with a job nobody can read."""
    r, k = p.runtime.redis, p.keys()
    r.set(k.idem("noop", "k"), "gone h")
    assert enqueue(p, new("a", idem="k", phash="h")) == [1, "a", "queued"]
    assert r.get(k.idem("noop", "k")) == "a h"


# --- claim -----------------------------------------------------------------------------


def test_claim_sets_lease_token_and_attempt(p: Project) -> None:
    enqueue(p, new("a"), new("b"))
    got = claim(p, n=1)
    assert [g[0] for g in got] == ["a"]  # FIFO
    _job_id, token, attempt = got[0][:3]
    assert token == "w.1:0" and attempt == 1 and got[0][12] == 1
    assert got[0][3:12] == ["noop", "1", '{"a":1}', "3", "", "", "", str(NOW), ""]
    r = rec(p, "a")
    assert r["status"] == "processing" and r["token"] == token
    assert p.runtime.redis.hget(p.keys().claims, "a") == f"{token} 1 {NOW} -"
    assert p.runtime.redis.zscore(p.keys().leases, "a") == NOW + LEASE
    assert structures(p)["ready"] == ["b"]
    assert_no_job_in_two_structures(p)


def test_each_claimed_job_gets_the_token_of_its_index_in_the_call(p: Project) -> None:
    """A call's tokens are its base and each job's index, 0 up, as decimal text past one digit
    and past two; each lands in the job's claim entry and the processing list's claim time."""
    ids = [f"j{i:03d}" for i in range(105)]
    enqueue(p, *(new(i) for i in ids))
    got = claim(p, n=105)
    assert [g[0] for g in got] == ids
    assert [g[1] for g in got] == [f"w.1:{i}" for i in range(105)]
    r, k = p.runtime.redis, p.keys()
    assert r.hget(k.claims, "j104") == f"w.1:104 1 {NOW} -"
    assert r.zrange(k.running, 0, -1, withscores=True) == [(i, NOW) for i in ids]


def test_claim_replies_with_its_time_even_when_it_claims_nothing(p: Project) -> None:
    """The first value of a claim reply is the time it ran at, so a worker can date its
    jobs by the server's clock; an empty queue answers with that and "held back: 0"."""
    assert claim_reply(p) == [NOW, 0]
    before = server_ms(p)
    at, held = claim_reply(p, now=None)
    assert before <= at <= server_ms(p) and held == 0


def test_claim_prefetches_beyond_start_without_spending_their_attempts(p: Project) -> None:
    """Of n claimed jobs, the first `start` go to free executors (started 1: the attempt
    counts at once); the rest are claimed ahead (started 0, claim flag 'p'). start.lua marks
    them started (fenced: 1 marked, 0 started already, -1 lease lost). A lapsed lease of
    a started job counts its attempt; of one still prefetched it is refunded (record field
    refunds, history "lost unstarted", no error). Claimed ahead again, such a job is held
    (started 3, 'p' and 'h': its worker's start mark lands before its handler runs), and
    a lapse in that wait spends nothing either, however often; once marked, a lapse
    counts."""
    enqueue(p, new("a"), new("b"), new("c"))
    got = {g[0]: g for g in claim(p, n=3, start=1)}
    assert {j: (g[2], g[12]) for j, g in got.items()} == {"a": (1, 1), "b": (1, 0), "c": (1, 0)}
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    tb, tc = got["b"][1], got["c"][1]
    assert r.hget(k.claims, "b") == f"{tb} 1 {NOW} p" and rec(p, "b")["status"] == "processing"
    assert sc.start(k, [("b", tb), ("c", "bogus")], now_ms=NOW + 5) == [1, -1]
    assert r.hget(k.claims, "b") == f"{tb} 1 {NOW + 5} -"  # started now: the start time moves
    assert r.hget(k.claims, "c") == f"{tc} 1 {NOW} p"
    assert sc.start(k, [("b", tb), ("a", got["a"][1])], now_ms=NOW + 6) == [0, 0]

    assert list(sc.reclaim(k, 100, 10**7, now_ms=NOW + LEASE)) == [3, 0]
    assert raw(p, "a")["attempt"] == "1" and raw(p, "b")["attempt"] == "1"
    assert '"outcome":"worker lost"' in raw(p, "b")["history"]
    rc, sc_ = raw(p, "c"), state(p, "c")
    unstarted = f'{{"attempt":1,"outcome":"lost unstarted","at_ms":{NOW + LEASE}}}'
    assert rc["attempt"] == "0" and sc_["refunds"] == "1" and rc["history"] == unstarted and "error" not in rc
    assert rc["status"] == "queued" and sc_["lost_token"].split()[0] == tc
    assert r.hget(k.stats, "lost|noop") == "2" and r.hget(k.stats, "unspent|noop") == "1"

    # c again, prefetched again and lost again: held this time, so still unspent. (They
    # went back in the order they were claimed: a and b start, c is claimed ahead.)
    history = unstarted
    for n in (1, 2):
        again = {g[0]: g for g in claim(p, n=3, start=2, now=NOW + 2 * n * LEASE, base=f"w.{n + 1}")}
        assert again["c"][2] == 1 and again["c"][12] == 3 and again["a"][12] == again["b"][12] == 1
        assert {"p", "h"} <= set(r.hget(k.claims, "c").split()[3])
        sc.reclaim(k, 100, 10**7, now_ms=NOW + (2 * n + 1) * LEASE)  # (a and b spend theirs: dead at 3)
        history += f',{{"attempt":1,"outcome":"lost unstarted","at_ms":{NOW + (2 * n + 1) * LEASE}}}'
        rc = raw(p, "c")
        assert rc["attempt"] == "0" and state(p, "c")["refunds"] == "1" and "error" not in rc
        assert rc["history"] == history
    # Claimed ahead and marked started (its handler about to run), then lost: it counts.
    assert rec(p, "a")["status"] == rec(p, "b")["status"] == "dead"
    (again,) = claim(p, n=1, start=0, now=NOW + 6 * LEASE, base="w.4")
    assert again[0] == "c" and again[12] == 3
    assert sc.start(k, [("c", again[1])], now_ms=NOW + 6 * LEASE + 1) == [1]
    sc.reclaim(k, 100, 10**7, now_ms=NOW + 7 * LEASE)
    rc = raw(p, "c")
    assert rc["attempt"] == "1" and "WorkerLost" in rc["error"]


def test_a_claim_spends_at_once_only_for_the_types_not_named_later(p: Project) -> None:
    """On a queue that mixes thread functions with functions run in child processes, the
    claim decides per job: a job of a type named in ``later`` (a child's), claimed to start
    at once, carries 'p' and reads started 0, so its attempt counts at its start mark, and
    a lapse before that gives it back unspent once; a job of any other type spends its
    attempt at the claim (started 1), and its lapse counts."""
    enqueue(p, new("t", type_="noop"), new("c", type_="child"), new("u", type_="child"))
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    reply = list(sc.claim(k, n=3, start=3, lease_ms=LEASE, token_base="w.1", dead_ttl_ms=10_000_000,
                          done_ttl_ms=10_000_000, now_ms=NOW, later="other child"))
    got = {g[0]: g for g in (reply[i:i + FIELDS] for i in range(HEAD, len(reply), FIELDS))}
    assert {j: (g[2], g[12]) for j, g in got.items()} == {"t": (1, 1), "c": (1, 0), "u": (1, 0)}
    assert r.hget(k.claims, "t").split()[3] == "-"
    assert r.hget(k.claims, "c").split()[3] == "p" and rec(p, "c")["attempt"] == "0"
    assert sc.start(k, [("u", got["u"][1])], now_ms=NOW + 5) == [1]
    assert list(sc.reclaim(k, 100, 10**7, now_ms=NOW + LEASE)) == [3, 0]
    assert raw(p, "t")["attempt"] == "1" and raw(p, "u")["attempt"] == "1"
    assert raw(p, "c")["attempt"] == "0" and state(p, "c")["refunds"] == "1"


def test_a_held_claim_lapses_without_spending_however_often(p: Project) -> None:
    """hold.lua marks a claim that waits for its executor (a child process starting) 'p'
    and 'h', started at the claim or not: its lease lapsing gives the job back spending
    nothing, every time (a worker killed three times in that wait buries nothing), with no
    refund counted; start.lua then clears both marks, and the attempt counts from there.
    A cancel meanwhile leaves it to its worker, whose hand-back ends it cancelled."""
    enqueue(p, new("a", max_attempts=1), new("b"))
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    assert sc.hold(k, [("a", "bogus")]) == [-1]
    for n in range(3):
        (got,) = claim(p, n=1, start=1, now=NOW + 2 * n * LEASE, base=f"w.{n}")
        assert got[0] == "a" and got[12] == 1
        assert sc.hold(k, [("a", got[1])]) == [1]
        tok, attempt, _, flags = r.hget(k.claims, "a").split()
        assert (tok, attempt) == (got[1], "1") and {"p", "h"} <= set(flags), flags
        assert list(sc.reclaim(k, 1, 10**7, now_ms=NOW + (2 * n + 1) * LEASE)) == [1, 0]
        ra = raw(p, "a")
        assert ra["status"] == "queued" and ra["attempt"] == "0" and "error" not in ra
        assert "refunds" not in state(p, "a")
    (got,) = claim(p, n=1, start=1, now=NOW + 10 * LEASE, base="w.9")
    assert sc.hold(k, [("a", got[1])]) == [1]
    assert sc.start(k, [("a", got[1])], now_ms=NOW + 10 * LEASE + 5) == [1]
    assert r.hget(k.claims, "a").split()[2:] == [str(NOW + 10 * LEASE + 5), "s"]
    assert list(sc.reclaim(k, 1, 10**7, now_ms=NOW + 12 * LEASE)) == [0, 1]  # started: it counts
    assert rec(p, "a")["status"] == "dead"

    (got,) = claim(p, n=1, start=1, now=NOW + 20 * LEASE, base="w.b")
    assert sc.hold(k, [("b", got[1])]) == [1]
    assert list(sc.cancel(k, "b", 60_000, now_ms=NOW + 20 * LEASE + 1)) == [3, "queued"]
    assert sc.release(k, [("b", got[1])], now_ms=NOW + 20 * LEASE + 2, done_ttl_ms=60_000) == [1]
    assert rec(p, "b")["status"] == "cancelled"


def test_a_childs_job_claimed_ahead_is_held_from_its_claim_until_handed_off(p: Project) -> None:
    """A job of a type named in ``later`` (a child's) claimed ahead waits in its worker for
    a free, ready child: its claim is held from the claim ('p' and 'h', started 3), so its
    lease lapsing gives it back spending nothing, however often. Its worker ends the hold
    as the child gets it (hold.lua 'off'): from there a lapse before its start mark gives
    it back once; from then on it is held until its start mark (started 6: its child asks
    for its start before its handler runs), never charged before it, and counts after.
    Claimed ahead for a thread, a job is not held the first time; lost so, it is held from
    its next claim ahead, never charged in the wait."""
    enqueue(p, new("t", type_="noop", max_attempts=1), new("c", type_="child", max_attempts=1))
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts

    def claim_ahead(n: int) -> dict[str, list[Any]]:
        reply = list(sc.claim(k, n=2, start=0, lease_ms=LEASE, token_base=f"w.{n}", dead_ttl_ms=10_000_000,
                              done_ttl_ms=10_000_000, now_ms=NOW + 2 * n * LEASE, later="child"))
        return {g[0]: g for g in (reply[i:i + FIELDS] for i in range(HEAD, len(reply), FIELDS))}

    for n in range(3):
        got = claim_ahead(n)
        assert got["c"][12] == 3 and {"p", "h"} <= set(r.hget(k.claims, "c").split()[3])
        assert got["t"][12] == (0 if n == 0 else 3)
        assert ("h" in r.hget(k.claims, "t").split()[3]) == (n > 0)
        assert list(sc.reclaim(k, 100, 10**7, now_ms=NOW + (2 * n + 1) * LEASE)) == [2, 0]  # (requeued, buried)
        rc = raw(p, "c")
        assert rc["status"] == "queued" and rc["attempt"] == "0" and "error" not in rc
        assert "refunds" not in state(p, "c")
    assert rec(p, "t")["status"] == "queued" and raw(p, "t")["attempt"] == "0"  # never charged unstarted
    assert raw(p, "c")["history"].count('"outcome":"lost unstarted"') == 3
    got = claim_ahead(3)  # handed to its child: lost before its start mark, back unspent once
    assert sc.hold(k, [("c", got["c"][1])], off=True) == [1]
    assert r.hget(k.claims, "c").split()[3] == "ps"
    sc.reclaim(k, 100, 10**7, now_ms=NOW + 7 * LEASE)
    assert state(p, "c")["refunds"] == "1" and rec(p, "c")["status"] == "queued"
    for n in (4, 5):  # its once used: held (6) until its child asks for its start, never charged before
        got = claim_ahead(n)
        assert got["c"][12] == 6 and {"p", "h"} <= set(r.hget(k.claims, "c").split()[3])
        sc.reclaim(k, 100, 10**7, now_ms=NOW + (2 * n + 1) * LEASE)
        assert rec(p, "c")["status"] == "queued" and raw(p, "c")["attempt"] == "0"
    got = claim_ahead(6)
    assert sc.start(k, [("c", got["c"][1])], now_ms=NOW + 12 * LEASE) == [1]  # its start mark: it counts
    sc.reclaim(k, 100, 10**7, now_ms=NOW + 13 * LEASE)
    assert rec(p, "c")["status"] == "dead" and state(p, "c")["refunds"] == "1"


def test_one_hold_call_holds_and_hands_off_many_claims_each_fenced_on_its_own(p: Project) -> None:
    """hold.lua takes many claims (a batch's members) in one call: each is held or handed
    off by its own token, a stale token is refused for that job alone (-1, its claim left
    as it was), and a cancel that came in the wait answers 2 for that job only."""
    enqueue(p, new("a"), new("b"), new("c"))
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    got = {g[0]: g for g in claim(p, n=3, start=0)}
    before_b = r.hget(k.claims, "b")
    owned = [("a", got["a"][1]), ("b", "bogus"), ("c", got["c"][1])]
    assert sc.hold(k, owned) == [1, -1, 1]
    assert {"p", "h"} <= set(r.hget(k.claims, "a").split()[3]) and {"p", "h"} <= set(r.hget(k.claims, "c").split()[3])
    assert r.hget(k.claims, "b") == before_b
    assert list(sc.cancel(k, "c", 60_000, now_ms=NOW + 1)) == [3, "queued"]
    assert sc.hold(k, owned, off=True) == [1, -1, 2]
    for job_id in ("a", "c"):
        flags = r.hget(k.claims, job_id).split()[3]
        assert "p" in flags and "h" not in flags, (job_id, flags)
    assert r.hget(k.claims, "b") == before_b
    assert sc.hold(k, []) == []


def test_a_prefetched_job_that_settles_spends_its_attempt(p: Project) -> None:
    """A prefetched job settled without a start mark ran all the same: a retry counts its
    attempt (the next claim is attempt 2) and an ack records attempt 1."""
    enqueue(p, new("a"), new("b"))
    got = {g[0]: g for g in claim(p, n=2, start=0)}
    sc, k = p.runtime.scripts, p.keys()
    assert sc.retry(k, [RetryAt("a", got["a"][1], 0, '{"type":"E"}', "", "")], now_ms=NOW + 1) == [1]
    assert sc.ack(k, [Ack("b", got["b"][1], "", "", "")], 100_000, now_ms=NOW + 1) == [1]
    assert raw(p, "a")["attempt"] == "1" and rec(p, "b")["attempt"] == "1"
    assert sc.promote(k, 100, now_ms=NOW + 1) == [1, -1]
    (again,) = claim(p, now=NOW + 2, base="w.2")
    assert again[0] == "a" and again[2] == 2


def test_a_cancel_of_a_job_claimed_ahead_leaves_it_to_its_worker(p: Project) -> None:
    """cancel.lua cannot end a prefetched job (its worker may be starting it): it flags
    the claim 'c', publishes "<id> <token>" on the cancels channel and answers 3. The
    worker's hand-back (release, mode now) then ends it cancelled, not queued; had the
    worker started it instead, its start mark answers 2 (tell the handler)."""
    enqueue(p, new("a"), new("b"))
    got = {g[0]: g for g in claim(p, n=2, start=0)}
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    sub = r.pubsub()
    sub.subscribe(k.cancels)
    assert sub.get_message(timeout=2)["type"] == "subscribe"
    assert list(sc.cancel(k, "a", 60_000, now_ms=NOW + 1)) == [3, "queued"]
    assert list(sc.cancel(k, "b", 60_000, now_ms=NOW + 1)) == [3, "queued"]
    heard = [sub.get_message(timeout=2)["data"] for _ in range(2)]
    assert heard == [f"a {got['a'][1]}", f"b {got['b'][1]}"]
    sub.close()
    assert r.hget(k.claims, "a").endswith("c") and state(p, "a")["cancel_requested"] == "1"
    # a: dropped by its worker before it started.
    assert sc.release(k, [("a", got["a"][1])], now_ms=NOW + 2, done_ttl_ms=60_000) == [1]
    assert rec(p, "a")["status"] == "cancelled" and r.hget(k.claims, "a") is None
    assert r.zscore(k.cancelled, "a") == NOW + 2 and r.lrange(k.ready, 0, -1) == []
    assert 0 < r.pttl(k.job("a")) <= 60_000 + 3_600_000
    # b: its worker had started it that instant: the start mark says so.
    assert sc.start(k, [("b", got["b"][1])], now_ms=NOW + 2) == [2]
    assert list(sc.cancel(k, "b", 60_000, now_ms=NOW + 3)) == [2, "processing"]


def test_a_limited_job_is_never_prefetched(p: Project) -> None:
    """A job under limits met beyond the first `start` jobs goes back to the consumer end of
    ready, with what the claim popped after it, in order, and the claim stops, saying so
    (held back: 1, so the worker waits for a free executor rather than for new jobs): the
    job holds no slot it cannot use yet, is not parked and spends nothing."""
    enqueue(p, new("a"), new("b", res="r1"), new("c"), new("d"))
    reply = claim_reply(p, n=4, start=1)
    assert reply[:2] == [NOW, 1]
    got = [reply[i:i + FIELDS] for i in range(HEAD, len(reply), FIELDS)]
    assert [(g[0], g[12]) for g in got] == [("a", 1)]
    assert structures(p)["ready"] == ["d", "c", "b"]
    rb = raw(p, "b")
    assert rb["status"] == "queued" and "deferrals" not in rb and "attempt" not in rb
    assert holders(p, "r:r1") == {} and parked(p, "r:r1") == []
    reply = claim_reply(p, n=4, start=4, base="w.2")
    assert reply[1] == 0
    got = [reply[i:i + FIELDS] for i in range(HEAD, len(reply), FIELDS)]
    assert [g[0] for g in got] == ["b", "c", "d"] and holders(p, "r:r1") == {"w.2:0": NOW + LEASE}
    assert_no_job_in_two_structures(p)


# --- settling: ack, retry, bury, release, renew ------------------------------------------


def test_ack_is_fenced_by_token(p: Project) -> None:
    """An ack with a wrong token is refused and changes nothing; the right one finishes."""
    enqueue(p, new("a"))
    (job,) = claim(p)
    sc = p.runtime.scripts
    assert sc.ack(p.keys(), [Ack("a", "stale", '"x"', "{}", "")], 100_000, now_ms=NOW) == [-1]
    assert rec(p, "a")["status"] == "processing"
    assert p.runtime.redis.hget(p.keys().census, "noop|1") == "1"
    assert sc.ack(p.keys(), [Ack("a", job[1], '"ok"', "noop|1", "succeeded|noop")], 100_000,
                  now_ms=NOW + 5) == [1]
    r = rec(p, "a")
    # The claim is gone, so the settled token can no longer act on the job.
    assert r["status"] == "done" and r["result"] == '"ok"' and r.get("token", "") == ""
    assert not p.runtime.redis.hexists(p.keys().claims, "a")
    assert structures(p) == {"ready": [], "leases": [], "scheduled": [], "parked": [], "dead": [], "done": ["a"]}
    # A done job keeps neither key: its outcome, in the current done generation, dates it.
    assert not p.runtime.redis.exists(p.keys().job("a"), p.keys().state("a"))
    assert kept(p, "a") | {"created_ms": "-"} == {
        "status": "done", "type": "noop", "version": "1", "attempt": "1", "started_ms": str(NOW),
        "finished_ms": str(NOW + 5), "result": '"ok"', "history": done_entry(1, NOW, NOW + 5), "created_ms": "-"}
    assert r["finished_ms"] == str(NOW + 5) and r["type"] == "noop" and r["attempt"] == "1"
    assert p.runtime.redis.hget(p.keys().census, "noop|1") == "0"  # no longer counted as not done
    assert p.runtime.redis.hget(p.keys().stats, "succeeded|noop") == "1"
    # (The minute's throughput count is the worker's to add: tests/integration/test_figure_flush.py.)
    # A second ack of the same claim is refused (already done).
    assert sc.ack(p.keys(), [Ack("a", job[1], '"ok"', "", "")], 100_000, now_ms=NOW) == [-1]


def test_retry_schedules_and_promote_moves_due(p: Project) -> None:
    """A retry's delay counts from the script's clock; promote moves the job once it is due
    and answers how long until the next due job."""
    enqueue(p, new("a"))
    (job,) = claim(p)
    sc = p.runtime.scripts
    err = '{"type":"E","message":"m"}'
    assert sc.retry(p.keys(), [RetryAt("a", job[1], 500, err, '{"attempt":1}', "retried|noop")],
                    now_ms=NOW) == [1]
    assert rec(p, "a")["status"] == "retrying" and rec(p, "a")["ready_ms"] == str(NOW + 500)
    assert structures(p)["scheduled"] == ["a"]
    assert p.runtime.redis.zscore(p.keys().scheduled, "a") == NOW + 500
    assert sc.promote(p.keys(), 100, now_ms=NOW + 300) == [0, 200]
    assert sc.promote(p.keys(), 100, now_ms=NOW + 500) == [1, -1]
    assert rec(p, "a")["status"] == "queued" and structures(p)["ready"] == ["a"]
    (again,) = claim(p, now=NOW + 600, base="w.2")
    assert again[2] == 2  # second attempt


def test_a_retry_keeps_its_log_until_it_is_due_plus_the_retention(p: Project) -> None:
    """A retry due later than the log's retention would find its log and stream gone when
    it runs: the retry keeps them until it is due plus that retention, never shorter."""
    enqueue(p, new("a"), new("b"))
    jobs = {j[0]: j for j in claim(p)}
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    for i in "ab":
        sc.append_log(k, i, ['{"msg": "x"}'], 500, 262_144, 60_000)
        sc.append_log(k, i, ['{"i": 0, "data": 1}'], 500, 262_144, 60_000, key=k.stream(i))
    err = '{"type":"E","message":"m"}'
    assert sc.retry(k, [RetryAt("a", jobs["a"][1], 3_600_000, err, "", "retried|noop"),
                        RetryAt("b", jobs["b"][1], 1_000, err, "", "retried|noop")],
                    now_ms=NOW, log_keep_ms=60_000) == [1, 1]
    for key in (k.log("a"), k.stream("a")):
        assert 3_660_000 - 5_000 < r.pttl(key) <= 3_660_000, key
    for key in (k.log("b"), k.stream("b")):  # already longer than its due plus the retention
        assert 55_000 < r.pttl(key) <= 61_000, key


def test_a_refunded_retry_hands_the_job_back_without_spending_its_attempt(p: Project) -> None:
    """A retry with refund (a worker that cannot run the job yet, a handler's RateLimited)
    schedules it without counting the attempt, counted as a deferral; no error is kept."""
    enqueue(p, new("a"))
    (job,) = claim(p)
    sc = p.runtime.scripts
    assert sc.retry(p.keys(), [RetryAt("a", job[1], 250, '{"type":"R"}', "", "deferred|noop", refund=True)],
                    now_ms=NOW) == [1]
    ra = raw(p, "a")
    assert ra["status"] == "scheduled" and ra["deferrals"] == "1" and ra["ready_ms"] == str(NOW + 250)
    assert "attempt" not in ra and "error" not in ra
    assert p.runtime.redis.zscore(p.keys().scheduled, "a") == NOW + 250
    assert p.runtime.redis.hget(p.keys().stats, "deferred|noop") == "1"
    assert sc.promote(p.keys(), 100, now_ms=NOW + 250)[0] == 1
    (again,) = claim(p, now=NOW + 251, base="w.2")
    assert again[2] == 1


def test_bury_with_refund_gives_the_attempt_back(p: Project) -> None:
    enqueue(p, new("a"))
    (job,) = claim(p)
    sc = p.runtime.scripts
    assert sc.bury(p.keys(), [Burial("a", job[1], "invalid payload", '{"type":"InvalidJob"}', "", True, "dead|noop")],
                   100_000, now_ms=NOW) == [1]
    r = rec(p, "a")
    assert r["status"] == "dead" and r["reason"] == "invalid payload" and r["attempt"] == "0"
    assert structures(p)["dead"] == ["a"]
    assert 0 < p.runtime.redis.pttl(p.keys().job("a")) <= 100_000 + DEAD_GRACE
    assert 0 < p.runtime.redis.pttl(p.keys().state("a")) <= 100_000 + DEAD_GRACE


def test_release_returns_to_front_without_spending_an_attempt(p: Project) -> None:
    """A release ("now") puts the job at the consumer end of ready with its attempt
    unspent; a history entry given with it is appended."""
    enqueue(p, new("a"), new("b"))
    (job,) = claim(p, n=1)
    note = '{"attempt":1,"outcome":"released","at_ms":5}'
    assert p.runtime.scripts.release(p.keys(), [Hand(job[0], job[1], "now", note)], now_ms=NOW + 5) == [1]
    ra = rec(p, "a")
    assert ra.get("attempt", "0") == "0" and ra["status"] == "queued"
    assert ra["history"] == note and ra["ready_ms"] == str(NOW + 5)
    assert not p.runtime.redis.hexists(p.keys().claims, "a")
    got = claim(p, n=1, base="w.2")
    assert got[0][0] == "a" and got[0][2] == 1  # released job runs next, as its first attempt
    # A plain (id, token) pair is a release "now" too.
    assert p.runtime.scripts.release(p.keys(), [(got[0][0], got[0][1])], now_ms=NOW + 6) == [1]
    assert structures(p)["ready"] == ["b", "a"]


def test_jobs_handed_back_together_keep_their_arrival_order(p: Project) -> None:
    """Jobs claimed ahead and handed back in one release (a pause, a stop) go back to the
    front of ready in the order they arrived: the first handed back runs first, not the
    last."""
    enqueue(p, *(new(f"p{i}") for i in range(5)))
    got = claim(p, n=4)
    assert [g[0] for g in got] == ["p0", "p1", "p2", "p3"]
    assert p.runtime.scripts.release(p.keys(), [(g[0], g[1]) for g in got], now_ms=NOW + 5) == [1] * 4
    order = [claim(p, n=1, base=f"w.{i}")[0][0] for i in range(5)]
    assert order == ["p0", "p1", "p2", "p3", "p4"]


def test_jobs_reclaimed_together_keep_the_order_they_were_claimed_in(p: Project) -> None:
    """Jobs whose leases lapse together (one worker's claim, its worker dead) go back to
    the front of ready in the order they were claimed, the first claimed first: not
    reversed, and not by id where an id sorts before one that arrived ahead of it. Jobs of
    an earlier claim (an earlier lapse) go before those of a later one."""
    enqueue(p, *(new(f"p{i}") for i in (4, 3)))
    enqueue(p, *(new(f"p{i}") for i in (2, 1, 0)), now=NOW + 1)
    first = claim(p, n=2, start=0)
    second = claim(p, n=3, start=0, now=NOW + 10, base="w.2")
    assert [g[0] for g in first + second] == ["p4", "p3", "p2", "p1", "p0"]
    assert list(p.runtime.scripts.reclaim(p.keys(), 100, 10**7, now_ms=NOW + 10 + LEASE)) == [5, 0]
    order = [claim(p, n=1, now=NOW + 20 + LEASE, base=f"w.3.{i}")[0][0] for i in range(5)]
    assert order == ["p4", "p3", "p2", "p1", "p0"]


def test_a_job_keeps_its_priority_wherever_it_waits_again(p: Project) -> None:
    """A job of priority 9 starts before the plain jobs waiting beside it however it came
    back to waiting: due after a delay, a retry's backoff or a refund, a release, a lapsed
    lease, a limit's wake-up, a requeue from the dead-letter list. Each time it goes to
    the priority set, not to the far end of ready."""
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    enqueue(p, new("h", delay=100, priority=9), *(new(f"p{i}") for i in range(3)))
    assert sc.promote(k, 100, now_ms=NOW + 100)[0] == 1

    def next_is_h(now: int, base: str) -> list[Any]:
        (got,) = claim(p, n=1, now=now, base=base)
        assert got[0] == "h", (base, got[0], structures(p))
        return got

    got = next_is_h(NOW + 101, "w.1")  # due after its delay
    assert sc.retry(k, [RetryAt("h", got[1], 0, '{"type":"E"}', '{"attempt":1}', "")], now_ms=NOW + 102) == [1]
    assert sc.promote(k, 100, now_ms=NOW + 103)[0] == 1
    got = next_is_h(NOW + 104, "w.2")  # after a retry
    assert sc.retry(k, [RetryAt("h", got[1], 5, '{"type":"R"}', "", "", refund=True)], now_ms=NOW + 105) == [1]
    assert sc.promote(k, 100, now_ms=NOW + 110)[0] == 1
    got = next_is_h(NOW + 111, "w.3")  # after a refund
    assert sc.release(k, [Hand("h", got[1], "now")], now_ms=NOW + 112) == [1]
    got = next_is_h(NOW + 113, "w.4")  # after a release
    assert list(sc.reclaim(k, 100, 10**7, now_ms=NOW + 113 + LEASE)) == [1, 0]
    got = next_is_h(NOW + 114 + LEASE, "w.5")  # after its lease lapsed
    assert sc.bury(k, [Burial("h", got[1], "x", "", "", False, "")], 100_000, now_ms=NOW + 2 * LEASE) == [1]
    assert sc.requeue(k, "h", now_ms=NOW + 2 * LEASE + 1) == 1
    next_is_h(NOW + 2 * LEASE + 2, "w.6")  # requeued from the dead-letter list
    assert structures(p)["ready"] == ["p2", "p1", "p0"] and r.zcard(k.prio) == 0


def test_a_woken_job_of_priority_goes_ahead_of_plain_ready_ones(p: Project) -> None:
    """A job of priority held back by a full limit and woken by the slot's release waits
    in the priority set, ahead of the plain jobs."""
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    enqueue(p, new("a", limits="1 c:x"), new("h", limits="1 c:x", priority=5))
    (a,) = claim(p, n=1)
    assert a[0] == "h"
    enqueue(p, new("b", limits="1 c:x", priority=5), now=NOW + 1)
    got = claim(p, n=5, now=NOW + 2, base="w.2")
    assert [g[0] for g in got] == [] and parked(p, "c:x") == ["b", "a"]
    enqueue(p, *(new(f"p{i}") for i in range(2)), now=NOW + 3)
    assert sc.ack(k, [Ack("h", a[1], "null", "noop|1", "")], 1000, now_ms=NOW + 4) == [1]
    assert r.zrange(k.prio, 0, -1) == ["b"]
    (b,) = claim(p, n=1, now=NOW + 5, base="w.3")
    assert b[0] == "b"


def test_resumed_priority_jobs_come_back_first_in_the_order_they_were_held(p: Project) -> None:
    """A paused function's held jobs of priority 5, resumed two per call (as a long held
    list is, in chunks): they run in the order they were held, ahead of a job of the same
    priority that came meanwhile, as plain resumed jobs do at the consumer end of ready."""
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    r.hset(k.paused, "fn:noop", NOW)
    for i in range(4):
        enqueue(p, new(f"a{i}", priority=5), now=NOW + i)
    assert claim(p, n=10, now=NOW + 10) == []
    enqueue(p, new("other", type_="other", priority=5), now=NOW + 20)
    first = True
    while True:
        _, left, _ = sc.resume(k, "noop", first, limit=2)
        first = False
        if not int(left):
            break
    assert r.zrange(k.prio, 0, -1) == ["a0", "a1", "a2", "a3", "other"]


def test_a_cancelled_priority_job_leaves_the_priority_set(p: Project) -> None:
    """A cancel takes a queued job of priority out of the priority set at once: its id is
    not left to be popped after its record is trimmed (and taken for a malformed one)."""
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    enqueue(p, new("h", priority=5))
    assert list(sc.cancel(k, "h", 1000, now_ms=NOW + 1)) == [1, "cancelled"]
    assert r.zcard(k.prio) == 0


def test_release_later_keeps_the_lease_and_reclaim_requeues_without_spending(p: Project) -> None:
    """A release "later" (the handler may still run: a thread at shutdown) marks the claim
    'x' and keeps its lease, so nobody can start the job meanwhile; once the lease lapses,
    reclaim puts it back without spending the attempt, with history "interrupted"."""
    enqueue(p, new("a"))
    (job,) = claim(p)
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    assert sc.release(k, [Hand("a", job[1], "later")], now_ms=NOW + 5) == [1]
    assert r.hget(k.claims, "a") == f"{job[1]} 1 {NOW} x"
    assert r.zscore(k.leases, "a") == NOW + LEASE and rec(p, "a")["status"] == "processing"
    assert claim(p, base="w.2") == [] and structures(p)["ready"] == []
    assert list(sc.reclaim(k, 100, 10**7, now_ms=NOW + LEASE)) == [1, 0]
    ra = raw(p, "a")
    assert ra["status"] == "queued" and ra["attempt"] == "0" and "error" not in ra
    assert ra["history"] == f'{{"attempt":1,"outcome":"interrupted","at_ms":{NOW + LEASE}}}'
    assert r.hget(k.stats, "unspent|noop") == "1" and r.hget(k.stats, "lost|noop") is None
    (again,) = claim(p, now=NOW + LEASE + 1, base="w.3")
    assert again[0] == "a" and again[2] == 1


def test_renew_extends_only_owned_leases(p: Project) -> None:
    enqueue(p, new("a"))
    (job,) = claim(p)
    sc = p.runtime.scripts
    assert sc.renew(p.keys(), [("a", job[1]), ("a", "bogus")], LEASE, now_ms=NOW + 900) == [1, -1]
    assert p.runtime.redis.zscore(p.keys().leases, "a") == NOW + 900 + LEASE


def test_a_renewal_past_a_state_key_of_another_type_renews_the_call_s_other_jobs(p: Project) -> None:
    """One running job's state key of another type (damage) loses its progress, never
    the renewal of the call's jobs after it: HSET raised WRONGTYPE mid-call, the jobs
    after it kept their old leases, which could lapse under their live runs."""
    enqueue(p, new("a"), new("b"))
    (ja, jb) = claim(p)
    r, k = p.runtime.redis, p.keys()
    r.delete(k.state("a"))
    r.set(k.state("a"), "junk")
    got = p.runtime.scripts.renew(k, [("a", ja[1], '{"p":1}'), ("b", jb[1], '{"p":2}')], LEASE, now_ms=NOW + 900)
    assert list(got) == [1, 1], got
    assert r.zscore(k.leases, "b") == NOW + 900 + LEASE
    assert r.hget(k.state("b"), "progress") == '{"p":2}'


def test_renew_extends_the_limit_slot_and_reports_one_lost_to_another_holder(p: Project) -> None:
    """A renewal extends the job's limit slots with its lease. When the slot lapsed and
    another job took it (a stalled renewer), the lease is still renewed but the reply is -2:
    the handler no longer has its exclusion; once the slot is free again a renewal takes
    it back (1)."""
    enqueue(p, new("a", res="r1"))
    (a,) = claim(p)
    sc, k = p.runtime.scripts, p.keys()
    assert sc.renew(k, [("a", a[1])], LEASE, now_ms=NOW + 500) == [1]
    assert holders(p, "r:r1") == {a[1]: NOW + 500 + LEASE}
    # a's renewer stalls: its slot lapses and b takes it before any reclaim runs.
    late = NOW + 500 + LEASE + 1
    enqueue(p, new("b", res="r1"), now=late)
    (b,) = claim(p, now=late, base="w.2")
    assert b[0] == "b" and holders(p, "r:r1") == {b[1]: late + LEASE}
    assert sc.renew(k, [("a", a[1])], LEASE, now_ms=late + 1) == [-2]
    assert p.runtime.redis.zscore(k.leases, "a") == late + 1 + LEASE
    assert holders(p, "r:r1") == {b[1]: late + LEASE}
    assert sc.ack(k, [Ack("b", b[1], "", "", "")], 100_000, now_ms=late + 2) == [1]
    assert sc.renew(k, [("a", a[1])], LEASE, now_ms=late + 3) == [1]
    assert holders(p, "r:r1") == {a[1]: late + 3 + LEASE}


def test_a_late_renewal_of_a_slot_still_held_keeps_the_key_counting_it(p: Project) -> None:
    """Claims purge lapsed holders only when a key looks full, so a slot still in the key
    was counted by every admission since: a late renewal extends it as an on-time one
    does (1). Two jobs with different limits on one key (CONCURRENCY changed while a ran):
    b, under 2, joined beside a's lapsed slot; a's late renewal keeps its slot, so c, under
    2, finds the key full and waits. Told lost and dropped instead, a's slot would stop
    counting while a runs on, and c would make three."""
    enqueue(p, new("a", limits="1 c:noop"))
    (a,) = claim(p)
    late = NOW + LEASE + 1
    enqueue(p, new("b", limits="2 c:noop"), now=late)
    (b,) = claim(p, now=late, base="w.2")
    assert b[0] == "b"
    sc, k = p.runtime.scripts, p.keys()
    assert sc.renew(k, [("a", a[1])], LEASE, now_ms=late + 1) == [1]
    assert holders(p, "c:noop") == {a[1]: late + 1 + LEASE, b[1]: late + LEASE}
    enqueue(p, new("c", limits="2 c:noop"), now=late + 2)
    assert claim(p, now=late + 2, base="w.3") == []


def test_a_late_renewal_beside_a_job_under_a_higher_limit_is_not_a_lost_slot(p: Project) -> None:
    """a and c hold a key under limit 2; a's renewer runs late after b, under 3, joined
    (there was room for b either way). a keeps its slot, and d, under 3, waits."""
    enqueue(p, new("a", limits="2 c:noop"), new("c", limits="2 c:noop"))
    got = {g[0]: g for g in claim(p)}
    sc, k = p.runtime.scripts, p.keys()
    late = NOW + LEASE + 1
    assert sc.renew(k, [("c", got["c"][1])], LEASE, now_ms=late - 2) == [1]
    enqueue(p, new("b", limits="3 c:noop"), now=late)
    claim(p, now=late, base="w.2")
    assert sc.renew(k, [("a", got["a"][1])], LEASE, now_ms=late + 1) == [1]
    enqueue(p, new("d", limits="3 c:noop"), now=late + 2)
    assert claim(p, now=late + 2, base="w.3") == []
    assert len(holders(p, "c:noop")) == 3


def test_a_lapsed_slot_nobody_took_is_taken_back_by_a_late_renewal(p: Project) -> None:
    """A stalled renewer whose slot lapsed, with no other job on the key: the renewal takes
    the slot again (1)."""
    enqueue(p, new("a", limits="1 c:noop"))
    (a,) = claim(p)
    sc, k = p.runtime.scripts, p.keys()
    late = NOW + LEASE + 5
    assert sc.renew(k, [("a", a[1])], LEASE, now_ms=late) == [1]
    assert holders(p, "c:noop") == {a[1]: late + LEASE}


def test_reclaim_counts_a_lapsed_lease_as_an_attempt(p: Project) -> None:
    """A lapsed lease goes back to ready, the lapsed token kept as lost_token; at
    max_attempts it is buried as worker lost. Once another claim holds the job, the stale
    worker's ack is refused."""
    enqueue(p, new("a", max_attempts=2))
    sc = p.runtime.scripts
    (job,) = claim(p)
    assert sc.reclaim(p.keys(), 100, 100_000, now_ms=NOW + LEASE - 1) == [0, 0]  # not yet
    assert sc.reclaim(p.keys(), 100, 100_000, now_ms=NOW + LEASE) == [1, 0]
    assert rec(p, "a")["status"] == "queued" and state(p, "a")["lost_token"].split()[0] == job[1]
    (job2,) = claim(p, now=NOW + 2 * LEASE, base="w.2")
    assert job2[2] == 2
    assert sc.ack(p.keys(), [Ack("a", job[1], "", "", "")], 1000, now_ms=NOW + 2 * LEASE) == [-1]
    assert rec(p, "a")["token"] == job2[1]
    assert sc.reclaim(p.keys(), 100, 100_000, now_ms=NOW + 4 * LEASE) == [0, 1]
    r = rec(p, "a")
    assert r["status"] == "dead" and r["reason"] == "worker lost"
    assert state(p, "a")["lost_token"].split()[0] == job2[1]
    assert '"outcome":"worker lost"' in r["history"]
    assert 0 < p.runtime.redis.pttl(p.keys().job("a")) <= 100_000 + DEAD_GRACE
    assert 0 < p.runtime.redis.pttl(p.keys().state("a")) <= 100_000 + DEAD_GRACE
    assert_no_job_in_two_structures(p)


# --- late success: a lapsed lease whose run still finished --------------------------------


def test_a_late_ack_records_the_job_done_when_nobody_claimed_it_since(p: Project) -> None:
    """The lease lapsed while the handler still ran and the job waits in ready: the ack of
    the lapsed token (the record's lost_token) is a late success (2): the job is done with
    that result, and its id left in ready is dropped as a stray by the next claim."""
    enqueue(p, new("a"))
    (job,) = claim(p)
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    assert list(sc.reclaim(k, 100, 10**7, now_ms=NOW + LEASE)) == [1, 0]
    lost = f'{{"attempt":1,"outcome":"worker lost","at_ms":{NOW + LEASE}}}'
    assert sc.ack(k, [Ack("a", job[1], '"late"', "noop|1", "succeeded|noop")], 100_000,
                  now_ms=NOW + LEASE + 5) == [2]
    ra = rec(p, "a")
    assert ra["status"] == "done" and ra["result"] == '"late"' and ra["attempt"] == "1"
    # The run that finished is the one whose lease lapsed: its start, the ack's finish.
    assert ra["started_ms"] == str(NOW) and ra["finished_ms"] == str(NOW + LEASE + 5)
    assert ra["history"] == lost + "," + done_entry(1, NOW, NOW + LEASE + 5)
    assert not r.exists(k.job("a"), k.state("a"))  # lost_token and all: the job is done
    assert r.hget(k.census, "noop|1") == "0"  # (a field at 0 counts no job)
    assert r.hget(k.stats, "late|noop") == "1" and r.hget(k.stats, "succeeded|noop") == "1"
    assert structures(p)["ready"] == ["a"]  # still there: the claim drops it
    assert claim(p, now=NOW + LEASE + 6, base="w.2") == []
    assert r.hget(k.stats, "stray") == "1"
    assert structures(p) == {"ready": [], "leases": [], "scheduled": [], "parked": [], "dead": [], "done": ["a"]}
    assert sc.ack(k, [Ack("a", job[1], '"again"', "noop|1", "")], 100_000, now_ms=NOW + LEASE + 7) == [-1]
    assert rec(p, "a")["result"] == '"late"' and done_ids(r, k) == ["a"]


def test_a_late_ack_revives_a_job_buried_as_worker_lost(p: Project) -> None:
    """On its last attempt a lapsed lease buries the job as worker lost and frees its
    idempotency key; the late ack of that run takes the job out of the dead-letter set,
    leaves no expiring dead copy of it behind (record and state go, the outcome stays) and
    marks the key done for it again."""
    enqueue(p, new("a", max_attempts=1, idem="k", phash="h"))
    (job,) = claim(p)
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    assert list(sc.reclaim(k, 100, 10**7, now_ms=NOW + LEASE)) == [0, 1]
    assert r.get(k.idem("noop", "k")) is None and r.pttl(k.job("a")) > 0 and r.pttl(k.state("a")) > 0
    assert sc.ack(k, [Ack("a", job[1], '"late"', "noop|1", "")], 100_000, now_ms=NOW + LEASE + 5) == [2]
    s = structures(p)
    assert s["dead"] == [] and s["done"] == ["a"]
    ra = rec(p, "a")
    assert ra["status"] == "done" and "reason" not in ra and ra["result"] == '"late"'
    assert not r.exists(k.job("a"), k.state("a")) and outcome(p, "a") is not None
    assert r.get(k.idem("noop", "k")) == "a h done" and 0 < r.pttl(k.idem("noop", "k")) <= 100_000


def test_a_late_ack_is_refused_when_the_job_settled_otherwise(p: Project) -> None:
    """A lapsed token acks late only while the job waits for a new run: after another
    claim settled it (done), or when it died for another reason, the ack is -1 and
    nothing changes."""
    enqueue(p, new("a"), new("b"))
    got = {g[0]: g[1] for g in claim(p)}
    k, sc = p.keys(), p.runtime.scripts
    assert list(sc.reclaim(k, 100, 10**7, now_ms=NOW + LEASE)) == [2, 0]
    again = {g[0]: g[1] for g in claim(p, now=NOW + LEASE + 1, base="w.2")}
    assert sc.ack(k, [Ack("a", again["a"], '"second"', "", "")], 100_000, now_ms=NOW + LEASE + 2) == [1]
    assert sc.bury(k, [Burial("b", again["b"], "failed", "", "", False, "")], 100_000,
                   now_ms=NOW + LEASE + 2) == [1]
    before = (rec(p, "a"), rec(p, "b"), structures(p))
    assert sc.ack(k, [Ack("a", got["a"], '"first"', "", ""), Ack("b", got["b"], '"first"', "", "")],
                  100_000, now_ms=NOW + LEASE + 3) == [-1, -1]
    assert (rec(p, "a"), rec(p, "b"), structures(p)) == before
    assert rec(p, "a")["result"] == '"second"'


@pytest.mark.parametrize("lapse", ["prefetched", "later"])
def test_a_late_ack_after_a_refunded_lapse_records_the_attempt_that_ran(p: Project, lapse: str) -> None:
    """A run whose lapse spent nothing (claimed ahead with its start mark lost, or given up
    at shutdown with the handler running) that still finishes is done as the attempt it
    ran as (1), not as attempt 0."""
    enqueue(p, new("a"))
    (job,) = claim(p, n=1, start=0 if lapse == "prefetched" else 1)
    k, sc = p.keys(), p.runtime.scripts
    if lapse == "later":
        assert sc.release(k, [Hand("a", job[1], "later")], now_ms=NOW + 1) == [1]
    assert list(sc.reclaim(k, 100, 10**7, now_ms=NOW + LEASE)) == [1, 0]
    assert sc.ack(k, [Ack("a", job[1], '"late"', "", "")], 100_000, now_ms=NOW + LEASE + 5) == [2]
    ra = rec(p, "a")
    assert ra["status"] == "done" and ra["attempt"] == "1"


def test_a_late_ack_is_refused_once_the_job_was_claimed_again_since(p: Project) -> None:
    """Run 1's lease lapses; run 2 claims the job, fails and is retried; once the retry is
    due the job waits in ready again. Run 1's ack must not make it done: another claim ran
    the job since (the record now holds attempt 2's start and error)."""
    enqueue(p, new("a"))
    (first,) = claim(p)
    k, sc = p.keys(), p.runtime.scripts
    assert list(sc.reclaim(k, 100, 10**7, now_ms=NOW + LEASE)) == [1, 0]
    (second,) = claim(p, now=NOW + LEASE + 1, base="w.2")
    assert second[2] == 2
    assert sc.retry(k, [RetryAt("a", second[1], 10, '{"type":"E"}', '{"attempt":2}', "")],
                    now_ms=NOW + LEASE + 2) == [1]
    assert sc.promote(k, 100, now_ms=NOW + LEASE + 12)[0] == 1
    assert sc.ack(k, [Ack("a", first[1], '"first"', "", "")], 100_000, now_ms=NOW + LEASE + 13) == [-1]
    assert rec(p, "a")["status"] == "queued"


# --- limits: parking, waking, reservations, the sweep -----------------------------------


def test_a_full_limit_parks_the_job_without_spending_an_attempt(p: Project) -> None:
    """A second job on a held resource is parked: status deferred, attempt 0, deferrals
    +1, only in the limit's waiter list (not in ready, not scheduled), its key named in
    limwait for the sweep. The holder's ack frees the slot and wakes it at once: the slot
    is reserved for it and it goes to the consumer end of ready."""
    enqueue(p, new("a", res="r1"), new("b", res="r1"))
    got = claim(p)
    assert [g[0] for g in got] == ["a"]
    r, k = p.runtime.redis, p.keys()
    rb = raw(p, "b")
    assert rb["status"] == "deferred" and rb.get("attempt", "0") == "0" and rb["deferrals"] == "1"
    assert parked(p, "r:r1") == ["b"]
    s = structures(p)
    assert s["ready"] == [] and s["scheduled"] == [] and s["leases"] == ["a"]
    assert r.zscore(k.limwait, "r:r1") == NOW + SWEEP_MS
    assert holders(p, "r:r1") == {got[0][1]: NOW + LEASE}
    assert r.hget(k.stats, "deferred|noop") == "1"
    # Ack frees the slot and hands it to the first parked job.
    assert p.runtime.scripts.ack(k, [Ack("a", got[0][1], "", "", "")], 1000, now_ms=NOW + 5) == [1]
    assert holders(p, "r:r1") == {"=b": NOW + 5 + RESERVE_MS}
    assert structures(p)["ready"] == ["b"] and structures(p)["scheduled"] == []
    assert rec(p, "b")["status"] == "queued" and raw(p, "b")["ready_ms"] == str(NOW + 5)
    assert parked(p, "r:r1") == [] and r.zscore(k.limwait, "r:r1") is None
    (b,) = claim(p, now=NOW + 6, base="w.2")
    assert b[0] == "b" and b[2] == 1  # parking spent no attempt
    assert holders(p, "r:r1") == {b[1]: NOW + 6 + LEASE} and "woken" not in state(p, "b")
    assert_no_job_in_two_structures(p)


def test_a_job_under_two_limits_takes_a_slot_of_each_or_none(p: Project) -> None:
    """A job under several limits is claimed only when every one has a free slot; parked on
    the full one, it holds no slot of the others. A limit of n admits n holders."""
    lim = "2 shared\n1 r:x"
    enqueue(p, new("a", limits=lim), new("b", limits="1 r:x"), new("c", limits=lim), new("d", limits="2 shared"))
    got = {g[0]: g[1] for g in claim(p)}
    assert sorted(got) == ["a", "d"]
    assert set(holders(p, "shared")) == {got["a"], got["d"]} and set(holders(p, "r:x")) == {got["a"]}
    assert parked(p, "r:x") == ["b", "c"] and parked(p, "shared") == []
    assert raw(p, "c")["status"] == "deferred"


def test_a_concurrency_key_with_a_slash_is_a_slot_not_a_rate(p: Project) -> None:
    """A rendered key may hold '/' (a tenant "a/b"): the line is still a concurrency limit
    (a rate line is "<n>/<period> <key>"), so the job takes a slot and no rate token, and a
    second job on the full key parks."""
    enqueue(p, new("a", limits="1 c:tenant:a/b"), new("b", limits="1 c:tenant:a/b"))
    got = claim(p)
    assert [g[0] for g in got] == ["a"]
    assert holders(p, "c:tenant:a/b") == {got[0][1]: NOW + LEASE}
    assert parked(p, "c:tenant:a/b") == ["b"]
    assert p.runtime.redis.type(p.keys().limit("c:tenant:a/b")) == "zset"  # holders, not a rate's bucket


def test_a_release_frees_only_its_own_slot(p: Project) -> None:
    """A holder whose slot lapsed and was taken by another job (no reclaim ran yet) still
    settles its claim, but its release cannot take the new holder's slot."""
    enqueue(p, new("a", res="r1"))
    (a,) = claim(p)
    late = NOW + LEASE + 1
    enqueue(p, new("b", res="r1"), now=late)
    (b,) = claim(p, now=late, base="w.2")
    assert holders(p, "r:r1") == {b[1]: late + LEASE}
    assert p.runtime.scripts.ack(p.keys(), [Ack("a", a[1], "", "", "")], 1000, now_ms=late + 1) == [1]
    assert holders(p, "r:r1") == {b[1]: late + LEASE}


def _settle_a(p: Project, how: str, token: str, at: int) -> None:
    sc, k = p.runtime.scripts, p.keys()
    if how == "ack":
        assert sc.ack(k, [Ack("a", token, "", "", "")], 1000, now_ms=at) == [1]
    elif how == "retry":
        assert sc.retry(k, [RetryAt("a", token, 60_000, '{"type":"E"}', "", "")], now_ms=at) == [1]
    elif how == "bury":
        assert sc.bury(k, [Burial("a", token, "failed", "", "", False, "")], 1000, now_ms=at) == [1]
    elif how == "release":
        assert sc.release(k, [("a", token)], now_ms=at) == [1]
    else:
        assert list(sc.reclaim(k, 100, 1000, now_ms=at)) == [1, 0]


@pytest.mark.parametrize("how", ["ack", "retry", "bury", "release", "reclaim"])
def test_every_settlement_frees_the_slot_and_wakes_the_first_parked_job(p: Project, how: str) -> None:
    """Whichever way the holder settles (ack, retry, bury, release, a reclaimed lease), its
    slot is freed and handed to the first parked job, which is next out of ready; a holder
    that went back to ready itself is behind it, and parks when it is claimed."""
    enqueue(p, new("a", res="r1"), new("b", res="r1"), new("c", res="r1"))
    (a,) = claim(p)
    assert parked(p, "r:r1") == ["b", "c"]
    at = NOW + LEASE if how == "reclaim" else NOW + 5
    _settle_a(p, how, a[1], at)
    assert holders(p, "r:r1") == {"=b": at + RESERVE_MS}
    assert parked(p, "r:r1") == ["c"] and rec(p, "b")["status"] == "queued"
    (b,) = claim(p, n=1, now=at + 1, base="w.2")
    assert b[0] == "b" and holders(p, "r:r1") == {b[1]: at + 1 + LEASE}
    if how in ("release", "reclaim"):
        assert claim(p, now=at + 2, base="w.3") == []
        assert parked(p, "r:r1") == ["c", "a"] and raw(p, "a")["status"] == "deferred"
    assert_no_job_in_two_structures(p)


def test_parked_jobs_wake_in_order_and_a_reserved_slot_beats_a_newcomer(p: Project) -> None:
    """Each parked job has one waiter entry, whatever the claims meanwhile; the first
    parked is the first woken; a newcomer popped before the woken job finds the slot
    reserved and parks behind the others, and the woken job takes its slot."""
    enqueue(p, new("a", res="r1"), new("b", res="r1"), new("c", res="r1"))
    (a,) = claim(p)
    for i in range(3):
        assert claim(p, base=f"w.x{i}") == []
    assert parked(p, "r:r1") == ["b", "c"]
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    assert sc.ack(k, [Ack("a", a[1], "", "", "")], 1000, now_ms=NOW + 5) == [1]
    assert structures(p)["ready"] == ["b"] and parked(p, "r:r1") == ["c"]
    # A newcomer d reaches the consumer end first (pushed there by hand).
    enqueue(p, new("d", res="r1"), now=NOW + 6)
    r.delete(k.ready)
    r.rpush(k.ready, "b", "d")
    got = claim(p, n=1, now=NOW + 7, base="w.2")
    assert [g[0] for g in got] == ["b"]  # d parked, which is no claim: the call went on to b
    assert parked(p, "r:r1") == ["c", "d"] and raw(p, "d")["status"] == "deferred"
    assert holders(p, "r:r1") == {got[0][1]: NOW + 7 + LEASE}
    assert sc.ack(k, [Ack("b", got[0][1], "", "", "")], 1000, now_ms=NOW + 8) == [1]
    assert parked(p, "r:r1") == ["d"] and structures(p)["ready"] == ["c"]
    assert holders(p, "r:r1") == {"=c": NOW + 8 + RESERVE_MS}


def test_a_woken_job_that_lost_its_reserved_slot_goes_back_to_the_head(p: Project) -> None:
    """A reservation lasts RESERVE_MS: a woken job claimed after that may find its slot
    taken; it parks again at the head of the line (it was first), not behind the others."""
    enqueue(p, new("a", res="r1"), new("b", res="r1"), new("c", res="r1"))
    (a,) = claim(p)
    r, k = p.runtime.redis, p.keys()
    assert p.runtime.scripts.ack(k, [Ack("a", a[1], "", "", "")], 1000, now_ms=NOW + 5) == [1]
    assert state(p, "b")["woken"] == "1"
    # Woken to the consumer end of ready: counted for the queued list's cursors (seek_list.lua).
    assert r.get(k.ready_tails) == "1" and k.ready_tails == k.ready + ":tails"
    later = NOW + 5 + RESERVE_MS + 1
    enqueue(p, new("d", res="r1"), now=later)
    r.delete(k.ready)
    r.rpush(k.ready, "b", "d")  # d is popped first, after b's reservation lapsed
    got = claim(p, n=2, now=later, base="w.2")
    assert [g[0] for g in got] == ["d"]
    assert parked(p, "r:r1") == ["b", "c"]
    rb = raw(p, "b")
    assert rb["status"] == "deferred" and rb["deferrals"] == "2" and "woken" not in state(p, "b")
    # Back at the head: counted for the deferred list's cursors, for a day.
    assert r.get(k.waiters("r:r1") + ":heads") == "1" and 0 < r.pttl(k.waiters("r:r1") + ":heads") <= 86_400_000


def test_a_woken_job_cancelled_before_its_claim_hands_its_reserved_slot_on(p: Project) -> None:
    """A job woken from a limit's waiters holds a reserved slot until its claim; cancelled
    before that, it gives the slot to the next waiter at once (not RESERVE_MS later)."""
    enqueue(p, new("a", res="r1"), new("b", res="r1"), new("c", res="r1"))
    (a,) = claim(p)
    sc, k = p.runtime.scripts, p.keys()
    assert sc.ack(k, [Ack("a", a[1], "", "", "")], 1000, now_ms=NOW + 5) == [1]
    assert holders(p, "r:r1") == {"=b": NOW + 5 + RESERVE_MS}
    assert sc.cancel(k, "b", 1000, now_ms=NOW + 6)[0] == 1
    assert holders(p, "r:r1") == {"=c": NOW + 6 + RESERVE_MS}
    assert parked(p, "r:r1") == [] and rec(p, "c")["status"] == "queued"
    (c,) = claim(p, n=5, now=NOW + 7, base="w.2")
    assert c[0] == "c" and holders(p, "r:r1") == {c[1]: NOW + 7 + LEASE}
    assert_no_job_in_two_structures(p)


def test_a_stray_id_of_a_parked_job_is_dropped_not_run(p: Project) -> None:
    """A parked job's id found in ready (pushed again by hand) is a stray: the job stays
    parked, once, and does not run past its limit."""
    enqueue(p, new("a", res="r1"), new("b", res="r1"))
    claim(p)
    p.runtime.redis.rpush(p.keys().ready, "b")
    assert claim(p, base="w.2") == []
    assert p.runtime.redis.hget(p.keys().stats, "stray") == "1"
    assert parked(p, "r:r1") == ["b"] and raw(p, "b")["status"] == "deferred"


def test_promote_sweeps_a_limit_whose_holder_lapsed_without_a_release(p: Project) -> None:
    """The holder's worker died and no reclaim has run: promote's sweep of limwait wakes the
    parked job once the holder's slot lapsed. Until then each sweep finds the limit full
    and looks again SWEEP_MS later; promote answers the ms until that next sweep."""
    enqueue(p, new("a", res="r1"), new("b", res="r1"))
    (a,) = claim(p)
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    assert sc.renew(k, [("a", a[1])], LEASE, now_ms=NOW + 900) == [1]  # a's slot lasts to NOW + 1900
    assert sc.promote(k, 100, now_ms=NOW + 400) == [0, SWEEP_MS - 400]
    assert sc.promote(k, 100, now_ms=NOW + SWEEP_MS) == [0, SWEEP_MS]  # swept: still full
    assert parked(p, "r:r1") == ["b"] and r.zscore(k.limwait, "r:r1") == NOW + 2 * SWEEP_MS
    assert sc.promote(k, 100, now_ms=NOW + 2 * SWEEP_MS) == [0, -1]
    assert structures(p)["ready"] == ["b"] and parked(p, "r:r1") == []
    assert holders(p, "r:r1") == {"=b": NOW + 2 * SWEEP_MS + RESERVE_MS}
    assert r.zscore(k.limwait, "r:r1") is None
    assert rec(p, "b")["status"] == "queued"


def test_the_sweep_drops_a_stale_waiter_entry_and_then_wakes_the_job_behind_it(p: Project) -> None:
    """A waiter entry whose job is gone (its record deleted) cannot say what the limit is:
    the sweep drops it and looks again at once; the next sweep wakes the job behind it."""
    enqueue(p, new("a", res="r1"), new("b", res="r1"))
    claim(p)
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    r.lpush(k.limit("r:r1") + ":w", "ghost")
    after = NOW + LEASE + 1  # a's slot lapsed
    assert sc.promote(k, 100, now_ms=after) == [0, 0]
    assert parked(p, "r:r1") == ["b"]
    assert sc.promote(k, 100, now_ms=after) == [0, -1]
    assert structures(p)["ready"] == ["b"] and parked(p, "r:r1") == []


def test_a_retry_keeps_its_backoff_despite_a_stale_waiter_entry_of_its_own(p: Project) -> None:
    """A job may find its own id left on its limit's waiter list. When it fails and is
    scheduled for a retry, releasing its own slot must not take the stale entry for a
    parked job and queue it at once, skipping the backoff (nor reserve it a slot)."""
    r = p.runtime.redis
    k = p.keys()
    enqueue(p, new("b", res="r"))
    r.rpush(k.limit("r:r") + ":w", "b")  # a stale entry
    (job,) = claim(p, n=1)
    assert p.runtime.scripts.retry(k, [RetryAt("b", job[1], 60_000, '{"type":"E"}', '{"attempt":1}', "")],
                                   now_ms=NOW + 5) == [1]
    assert rec(p, "b")["status"] == "retrying"
    assert structures(p)["ready"] == [] and r.zscore(k.scheduled, "b") == NOW + 5 + 60_000
    assert holders(p, "r:r") == {} and parked(p, "r:r") == []


# --- idempotency keys --------------------------------------------------------------------


def test_a_key_has_no_expiry_until_its_job_completes_then_the_retention(p: Project) -> None:
    """While its job is unfinished (scheduled, claimed, retrying) the key never expires, so
    a second request cannot slip in under a slow job; the ack marks it done for the
    idempotency retention, and later requests are answered with the done job."""
    enqueue(p, new("a", idem="k", phash="h", delay=100))
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    ik = k.idem("noop", "k")
    assert r.pttl(ik) == -1
    sc.promote(k, 100, now_ms=NOW + 100)
    (job,) = claim(p, now=NOW + 100)
    assert sc.retry(k, [RetryAt("a", job[1], 0, '{"type":"E"}', "", "")], now_ms=NOW + 101) == [1]
    assert r.get(ik) == "a h" and r.pttl(ik) == -1
    sc.promote(k, 100, now_ms=NOW + 101)
    (job,) = claim(p, now=NOW + 102, base="w.2")
    assert sc.ack(k, [Ack("a", job[1], "", "", "")], 50_000, now_ms=NOW + 103) == [1]
    assert r.get(ik) == "a h done" and 0 < r.pttl(ik) <= 50_000
    assert enqueue(p, new("b", idem="k", phash="h")) == [0, "a", "done"]
    assert enqueue(p, new("c", idem="k", phash="other")) == [-1, "a", "done"]


def test_ack_marks_the_key_done_only_while_it_still_names_the_job(p: Project) -> None:
    """A key that names another job by the time of the ack (it was freed and taken
    meanwhile) is that job's: the ack leaves it as it is."""
    enqueue(p, new("a", idem="k", phash="h"))
    (job,) = claim(p)
    r, k = p.runtime.redis, p.keys()
    r.set(k.idem("noop", "k"), "z h2")
    assert p.runtime.scripts.ack(k, [Ack("a", job[1], "", "", "")], 50_000, now_ms=NOW) == [1]
    assert r.get(k.idem("noop", "k")) == "z h2" and r.pttl(k.idem("noop", "k")) == -1


def test_bury_frees_the_key_of_its_job_only(p: Project) -> None:
    """A dead job's key is freed (a failed request may be sent again); a key that names
    another job is not touched."""
    enqueue(p, new("a", idem="k1", phash="h"), new("b", idem="k2", phash="h"))
    got = {g[0]: g[1] for g in claim(p)}
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    r.set(k.idem("noop", "k2"), "other h")
    assert sc.bury(k, [Burial("a", got["a"], "failed", "", "", False, ""),
                       Burial("b", got["b"], "failed", "", "", False, "")], 100_000, now_ms=NOW) == [1, 1]
    assert r.get(k.idem("noop", "k1")) is None and r.get(k.idem("noop", "k2")) == "other h"
    assert enqueue(p, new("c", idem="k1", phash="h")) == [1, "c", "queued"]


def test_claim_marks_a_duplicate_only_for_the_same_payload(p: Project) -> None:
    """A job whose key already completed under another job is done without running when
    its payload hash is that job's (or it has none recorded, as an older producer writes
    it); with another payload it is a request of its own and runs. A duplicate keeps no
    record: its outcome names the job it duplicates."""
    enqueue(p, new("a", idem="k", phash="h"))
    (job,) = claim(p)
    p.runtime.scripts.ack(p.keys(), [Ack("a", job[1], "", "", "")], 100_000, now_ms=NOW)
    assert p.runtime.redis.get(p.keys().idem("noop", "k")) == "a h done"
    # Other producers push jobs with the same key (bypassing enqueue's check).
    r, k = p.runtime.redis, p.keys()
    base = {"type": "noop", "version": 1, "payload": "{}", "max_attempts": 3, "idem_key": "k"}
    r.set(k.job("b"), records.encode({**base, "idem_hash": "h"}))
    r.set(k.job("c"), records.encode({**base, "idem_hash": "other"}))
    r.hset(k.census, "noop|1", 2)  # as their producers would have counted them
    r.lpush(k.ready, "b", "c")
    got = claim(p, base="w.2")
    assert [g[0] for g in got] == ["c"]
    rd = rec(p, "b")
    assert rd["status"] == "done" and rd["duplicate_of"] == "a"
    assert not r.exists(k.job("b"), k.state("b"))
    kd = kept(p, "b")
    assert (kd["type"], kd["version"], kd["duplicate_of"], kd["attempt"]) == ("noop", "1", "a", "0")
    assert "result" not in kd and "history" not in kd
    assert rec(p, "c")["status"] == "processing" and raw(p, "c")["idem_hash"] == "other"
    assert r.hget(k.stats, "duplicates|noop") == "1" and r.hget(k.census, "noop|1") == "1"


def test_requeue_takes_its_key_back_or_goes_back_without_it(p: Project) -> None:
    """A requeued dead job takes its key again when it is free (with the hash of the payload
    it goes back with); when another job took the key meanwhile, it goes back without a
    key (2), and its history says why, before the requeue's own entry."""
    enqueue(p, new("a", idem="k1", phash="h1"), new("b", idem="k2", phash="h2"))
    got = {g[0]: g[1] for g in claim(p)}
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    assert sc.bury(k, [Burial("a", got["a"], "x", "", "", False, ""),
                       Burial("b", got["b"], "x", "", "", False, "")], 100_000, now_ms=NOW) == [1, 1]
    assert enqueue(p, new("c", idem="k2", phash="h3")) == [1, "c", "queued"]
    assert sc.requeue(k, "a", '{"a":2}', "1", "h9", now_ms=NOW + 1) == 1
    assert r.get(k.idem("noop", "k1")) == "a h9" and r.pttl(k.idem("noop", "k1")) == -1
    assert raw(p, "a")["idem_hash"] == "h9" and raw(p, "a")["idem_key"] == "k1"
    entry = '{"outcome":"requeued","by":"test"}'
    assert sc.requeue(k, "b", history=entry, now_ms=NOW + 2) == 2
    rb = raw(p, "b")
    assert "idem_key" not in rb and "idem_hash" not in rb and rb["status"] == "queued"
    note = ('{"outcome":"key dropped","message":"idempotency key k2 is held by another job",'
            f'"at_ms":{NOW + 2}}}')
    assert rb["history"] == note + "," + f'{{"outcome":"requeued","by":"test","at_ms":{NOW + 2}}}'  # stamped
    assert r.get(k.idem("noop", "k2")) == "c h3"
    # A requeue without a new hash keeps the stored one.
    (a,) = [g for g in claim(p, now=NOW + 3, base="w.2") if g[0] == "a"]
    assert sc.bury(k, [Burial("a", a[1], "x", "", "", False, "")], 100_000, now_ms=NOW + 4) == [1]
    assert sc.requeue(k, "a", now_ms=NOW + 5) == 1
    assert r.get(k.idem("noop", "k1")) == "a h9"


def test_a_requeued_job_whose_key_another_completed_ends_as_its_duplicate(p: Project) -> None:
    """A job died (the key freed), a retry with the same payload completed the key, and
    the dead job is requeued: it keeps its key (3) and its claim acknowledges it as the
    other job's duplicate, without running it (a charge requeued from the dead letters
    must not run twice). With another payload it goes back without the key (2)."""
    enqueue(p, new("a", idem="k1", phash="h1"))
    (a,) = claim(p)
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    assert sc.bury(k, [Burial("a", a[1], "x", "", "", False, "")], 100_000, now_ms=NOW) == [1]
    enqueue(p, new("b", idem="k1", phash="h1"), now=NOW + 1)
    (b,) = claim(p, now=NOW + 2, base="w.2")
    assert sc.ack(k, [Ack("b", b[1], "", "noop|1", "")], 100_000, now_ms=NOW + 3) == [1]
    assert r.get(k.idem("noop", "k1")).startswith("b h1")
    assert sc.requeue(k, "a", now_ms=NOW + 4) == 3
    assert claim(p, now=NOW + 5, base="w.3") == []  # not run
    ra = rec(p, "a")
    assert ra["status"] == "done" and ra.get("duplicate_of") == "b", ra
    assert r.get(k.idem("noop", "k1")).startswith("b h1")


def test_remove_frees_a_key_that_still_names_the_job(p: Project) -> None:
    """Deleting a dead job deletes its key if it still names the job, never another job's."""
    enqueue(p, new("a", idem="k1", phash="h"), new("b", idem="k2", phash="h"))
    got = {g[0]: g[1] for g in claim(p)}
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    sc.bury(k, [Burial(i, got[i], "x", "", "", False, "") for i in "ab"], 100_000, now_ms=NOW)
    r.set(k.idem("noop", "k1"), "a h")  # as if the job had taken it back
    r.set(k.idem("noop", "k2"), "other h")
    assert sc.remove(k, "a") == 1 and sc.remove(k, "b") == 1
    assert r.get(k.idem("noop", "k1")) is None and r.get(k.idem("noop", "k2")) == "other h"


# --- what must never reach a handler: malformed records, strays ---------------------------


@pytest.mark.parametrize("setup,reason", [
    (lambda r, k: r.set(k.job("x"), "not a record"), 'not a record of this runner ("not a record")'),
    (lambda r, k: r.hset(k.job("x"), mapping={"type": "noop", "status": "queued"}),
     "a Redis hash instead of a string"),
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
    p.runtime.scripts.ack(p.keys(), [Ack("a", job[1], "", "", "")], 100_000, now_ms=NOW)
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


def test_reclaim_takes_back_a_job_whose_claim_entry_is_damaged(p: Project) -> None:
    """A lapsed lease whose claim entry is garbage still brings its job back with the
    attempt counted; a lease left beside a done outcome is dropped, never rerun."""
    enqueue(p, new("a"), new("c"))
    got = {g[0]: g for g in claim(p, n=2)}
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    r.hset(k.claims, "a", "not a claim")
    assert sc.ack(k, [Ack("c", got["c"][1], "", "noop|1", "")], 100_000, now_ms=NOW) == [1]
    r.zadd(k.leases, {"c": NOW})  # a stray lease beside c's outcome
    assert list(sc.reclaim(k, 100, 10**7, now_ms=NOW + LEASE + 1)) == [1, 0]
    assert r.lrange(k.ready, 0, -1) == ["a"]
    v = rec(p, "a")
    assert v["status"] == "queued" and v["attempt"] == "1", v
    assert v["history"].endswith(f'"outcome":"worker lost","at_ms":{NOW + LEASE + 1}}}')
    assert rec(p, "c")["status"] == "done"
    assert r.hlen(k.claims) == 0
    assert_no_job_in_two_structures(p)


# --- damaged keys: refused or healed, never a lost job -----------------------------------


def test_claim_with_a_damaged_queue_key_refuses_and_loses_nothing(p: Project) -> None:
    """With any key of the queue that a claim may write or must read (claims, done meta,
    leases, scheduled, dead) damaged to another type, claim raises an error naming it and
    leaves every popped id back in ready, in order; once the key is repaired the jobs are
    claimed as usual. (The first id has no record: settling it asks the done generations
    whether it is a done job's stray, so the done meta key is read, and buries it, so the
    dead set is written; the next one is under a rate limit: a token not due would put it
    in the scheduled set.)"""
    from redis.exceptions import ResponseError

    enqueue(p, new("a", limits="1/60000 rl"), new("b"), new("c"))
    r, k = p.runtime.redis, p.keys()
    r.rpush(k.ready, "ghost")
    for name, damaged in (("claims", k.claims), ("done", k.done_meta), ("leases", k.leases),
                          ("dead", k.dead), ("scheduled", k.scheduled)):
        r.delete(damaged)
        r.set(damaged, "not the right type")
        with pytest.raises(ResponseError, match=f"the {name}[a-z ]* key of this queue holds the wrong"):
            claim(p, n=2)
        if name == "scheduled":
            # Only a settle that writes there checks it (a plain claim does not): the
            # ghost, buried first, stays buried; the rest are back in order.
            assert r.lrange(k.ready, 0, -1) == ["c", "b", "a"], name
            assert r.hget(k.stats, "dead|?") == "1"
        else:
            assert r.lrange(k.ready, 0, -1) == ["c", "b", "a", "ghost"], name
            assert r.hget(k.stats, "dead|?") is None, name  # nothing settled
        r.delete(damaged)
    assert [g[0] for g in claim(p, n=3)] == ["a", "b", "c"]
    assert structures(p)["dead"] == ["ghost"]


@pytest.mark.parametrize("how", ["retry", "bury", "bury-on-failure", "ack-followup", "suspend"])
def test_a_set_damaged_while_a_job_runs_refuses_its_settle_and_keeps_the_claim(p: Project, how: str) -> None:
    """The scheduled or dead set overwritten with another type while a job runs (after its
    claim's check): its retry, burial, ack with a follow-up or sleep gave up the claim and
    then failed on the set, leaving the job in no structure. The script refuses before
    any write, naming the key: the claim, lease and state stay as they were, and the same
    settle lands once the key is put aside (the scheduler's reclaim renames it)."""
    from redis.exceptions import ResponseError

    from runner.store.scripts import Followup, Suspension

    enqueue(p, new("a"))
    (job,) = claim(p)
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    later = new("a.1", delay=60_000)
    calls = {
        "retry": ("scheduled", lambda: sc.retry(k, [RetryAt("a", job[1], 500, '{"type":"E"}', "", "")], now_ms=NOW)),
        "bury": ("dead", lambda: sc.bury(k, [Burial("a", job[1], "failed", '{"type":"E"}', "", False, "")],
                                         100_000, now_ms=NOW)),
        "bury-on-failure": ("scheduled", lambda: sc.bury(
            k, [Burial("a", job[1], "failed", '{"type":"E"}', "", False, "", followups=(Followup("fast", later),))],
            100_000, now_ms=NOW)),
        "ack-followup": ("scheduled", lambda: sc.ack(k, [Ack("a", job[1], '"ok"', "noop|1", "",
                                                             followups=(Followup("fast", later),))],
                                                     100_000, now_ms=NOW)),
        "suspend": ("scheduled", lambda: sc.suspend(
            k, Suspension("a", job[1], 0, '{"name":"nap","kind":"sleep","status":"ok"}', 5_000, 0, 1000, 4 << 20, ""),
            now_ms=NOW)),
    }
    name, settle = calls[how]
    damaged = k.scheduled if name == "scheduled" else k.dead
    claim_before, state_before = r.hget(k.claims, "a"), r.hgetall(k.state("a"))
    r.set(damaged, "clobbered")
    with pytest.raises(ResponseError, match=f"settle refused: the {name} key of this queue holds the wrong"):
        settle()
    assert r.hget(k.claims, "a") == claim_before and r.zscore(k.leases, "a") is not None
    assert r.hgetall(k.state("a")) == state_before and r.get(damaged) == "clobbered"
    assert not r.exists(k.job("a.1"))  # no follow-up written either
    sc.reclaim(k, 100, 10**7, now_ms=NOW + 1)  # the scheduler's pass after an error reply
    assert r.get(damaged + ":corrupt") == "clobbered"
    got = settle()
    assert (got[0] if how == "suspend" else got) == (1 if how == "suspend" else [1]), got
    assert r.hget(k.claims, "a") is None
    where = structures(p)
    assert "a" in where["dead" if how.startswith("bury") else "scheduled"] or how == "ack-followup"
    if how in ("ack-followup", "bury-on-failure"):
        assert "a.1" in where["scheduled"]


@pytest.mark.parametrize("kind", ["set", "string", "hash", "list"])
@pytest.mark.parametrize("name", ["scheduled", "dead"])
def test_a_scheduled_or_dead_key_damaged_costs_no_job(p: Project, name: str, kind: str) -> None:
    """A plain claim does not write the scheduled or dead set, and checks neither: a plain
    job is claimed beside such a key damaged to any other type (the claim refused before,
    a command per call to check), but a settle that may write there in the same call (a
    rate token) refuses with the ids back in order, and a retry or burial of the claimed
    job later refuses with its claim kept; once the reclaim puts the key aside each of
    them lands, and the done meta, damaged too, stops no plain claim either."""
    from redis.exceptions import ResponseError

    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    damaged = k.scheduled if name == "scheduled" else k.dead
    {"set": lambda: r.sadd(damaged, "x"), "string": lambda: r.set(damaged, "x"),
     "hash": lambda: r.hset(damaged, "x", "1"), "list": lambda: r.rpush(damaged, "x")}[kind]()
    r.set(k.done_meta, "not the right type")
    enqueue(p, new("a"))
    (job,) = claim(p, n=1)
    assert job[0] == "a"

    def settle() -> Any:
        if name == "scheduled":
            return sc.retry(k, [RetryAt("a", job[1], 500, '{"type":"E"}', "", "")], now_ms=NOW)
        return sc.bury(k, [Burial("a", job[1], "failed", '{"type":"E"}', "", False, "")], 100_000, now_ms=NOW)

    with pytest.raises(ResponseError, match=f"settle refused: the {name} key of this queue holds the wrong"):
        settle()
    assert r.hget(k.claims, "a") is not None and r.zscore(k.leases, "a") is not None
    enqueue(p, new("rated", limits="1/60000 rl"), new("plain"))
    if name == "scheduled":
        with pytest.raises(ResponseError, match="the scheduled key of this queue holds the wrong"):
            claim(p, n=2)  # a rate token not due would put it in scheduled
        assert r.lrange(k.ready, 0, -1) == ["plain", "rated"] and r.hget(k.claims, "rated") is None
    sc.reclaim(k, 100, 10**7, now_ms=NOW + 1)
    assert r.type(damaged + ":corrupt") == kind
    r.delete(k.done_meta)
    assert settle() == [1]
    assert "a" in structures(p)[name]
    assert sorted(g[0] for g in claim(p, n=2)) == ["plain", "rated"]


def test_a_damaged_key_met_after_a_claim_keeps_the_claim_and_refuses_next(p: Project) -> None:
    """A damaged done meta, first needed by an id popped after the call claimed jobs (a
    stray's lookup): those jobs keep their claims and are handed out (nothing of theirs
    needs the key), the call says "claim again at once" (2), the id in hand and the rest
    go back in order, and the next call, which starts with that id, refuses naming the key."""
    from redis.exceptions import ResponseError

    enqueue(p, new("a"), new("b"))
    r, k = p.runtime.redis, p.keys()
    r.lpush(k.ready, "ghost")  # popped after a and b
    r.set(k.done_meta, "not the right type")
    reply = claim_reply(p, n=4)
    assert reply[1] == 2 and [reply[i] for i in range(HEAD, len(reply), FIELDS)] == ["a", "b"]
    assert r.hlen(k.claims) == 2 and r.zcard(k.leases) == 2 and r.lrange(k.ready, 0, -1) == ["ghost"]
    with pytest.raises(ResponseError, match="the done generation key of this queue holds the wrong"):
        claim(p, n=4)
    assert r.lrange(k.ready, 0, -1) == ["ghost"] and r.get(k.done_meta) == "not the right type"
    r.delete(k.done_meta)
    assert claim(p, n=4) == [] and structures(p)["dead"] == ["ghost"]


def test_a_damaged_list_index_costs_no_job(p: Project) -> None:
    """The list indexes (delayed, sleeping, waiting) only feed the job lists: overwritten
    with another type, a delayed enqueue, its promotion and a retry still land (promote
    took the job off scheduled, then failed on the index, and the job was in no structure:
    20 of 20 lost), and the reclaim puts the index aside."""
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    r.set(k.delayed, "clobbered")
    assert enqueue(p, new("later", run_at=NOW + 10)) == [1, "later", "scheduled"]
    assert r.zscore(k.scheduled, "later") == NOW + 10
    sc.promote(k, 100, now_ms=NOW + 11)
    assert r.lrange(k.ready, 0, -1) == ["later"] and rec(p, "later")["status"] == "queued"
    sc.reclaim(k, 100, 10**7, now_ms=NOW + 12)
    assert r.get(k.delayed + ":corrupt") == "clobbered" and r.hget(k.stats, "corrupt|delayed") == "1"
    assert [g[0] for g in claim(p, n=1, now=NOW + 13)] == ["later"]


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
    assert list(sc.reclaim(k, 100, 10**7, now_ms=NOW + 1)) == [2, 0]
    assert r.get(k.leases + ":corrupt") == "clobbered" and r.hget(k.stats, "corrupt|leases") == "1"
    assert {rec(p, j)["status"] for j in "ab"} == {"queued"} and rec(p, "a")["attempt"] == "1"
    assert r.hlen(k.claims) == 0 and r.zcard(k.leases) == 0
    got = claim(p, n=3, now=NOW + 2, base="w.2")
    assert sorted(g[0] for g in got) == ["a", "b", "c"]
    assert_no_job_in_two_structures(p)


@pytest.mark.parametrize("name", ["stats", "notify", "ready", "dead", "scheduled", "limwait", "delayed", "sleeping",
                                  "waiting"])
def test_reclaim_renames_any_damaged_queue_key_aside(p: Project, name: str) -> None:
    """Every structural key of the queue found with the wrong Redis type is renamed to
    <key>:corrupt and counted (corrupt|<name>), after which enqueue and claim work."""
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    key = getattr(k, name)
    r.set(key, "clobbered")
    sc.reclaim(k, 100, 10**7, now_ms=NOW)
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
    assert list(sc.ack(k, [Ack("a", got[0][1], "", "", "")], 100_000, now_ms=NOW)) == [1]
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
        sc.ack(k, [Ack("a", job[1], "", "", "")], 100_000, now_ms=NOW)
    assert list(sc.reclaim(k, 100, 10**7, now_ms=NOW + LEASE + 1)) == [1, 0]
    assert r.get(k.claims + ":corrupt") == "clobbered" and r.hget(k.stats, "corrupt|claims") == "1"
    assert rec(p, "a")["status"] == "queued" and rec(p, "a")["attempt"] == "1"
    got = claim(p, n=2, now=NOW + LEASE + 2, base="w.3")
    assert sorted(g[0] for g in got) == ["a", "b"] and {g[0]: g[2] for g in got}["a"] == 2
    assert_no_job_in_two_structures(p)


def test_an_ack_batch_survives_a_damaged_idempotency_key(p: Project) -> None:
    """An idempotency key damaged to another Redis type must not fail an ack batch
    part-way (the jobs before would be done but still hold leases, those after
    unsettled): every job of the batch is done and the leases are gone. The damaged key
    is nobody's mark: the next request with that key is accepted and takes it."""
    r = p.runtime.redis
    k = p.keys()
    enqueue(p, new("a"), new("b", idem="bad", phash="h"), new("d"))
    got = {g[0]: g[1] for g in claim(p, n=10)}
    assert sorted(got) == ["a", "b", "d"]
    r.delete(k.idem("noop", "bad"))
    r.rpush(k.idem("noop", "bad"), "x")
    acks = [Ack(i, got[i], "", "", "") for i in ("a", "b", "d")]
    assert p.runtime.scripts.ack(k, acks, 100_000, now_ms=NOW + 5) == [1, 1, 1]
    assert all(rec(p, i)["status"] == "done" for i in "abd")
    assert structures(p)["leases"] == []
    assert enqueue(p, new("e", idem="bad", phash="h")) == [1, "e", "queued"]
    assert r.get(k.idem("noop", "bad")) == "e h"


def _damage_limit(p: Project, key: str, which: str) -> None:
    r, k = p.runtime.redis, p.keys()
    target = k.limit(key) + (":w" if which == "waiters" else "")
    r.delete(target)
    r.hset(target, "not", "the right type")


def _settle_all(p: Project, how: str, got: dict[str, str]) -> list[Any]:
    sc, k, ids = p.runtime.scripts, p.keys(), ("a", "c", "d")
    if how == "ack":
        return list(sc.ack(k, [Ack(i, got[i], "", "", "") for i in ids], 100_000, now_ms=NOW + 5))
    if how == "retry":
        return list(sc.retry(k, [RetryAt(i, got[i], 10, "{}", "", "") for i in ids], now_ms=NOW + 5))
    if how == "bury":
        return list(sc.bury(k, [Burial(i, got[i], "x", "", "", False, "") for i in ids], 100_000,
                            now_ms=NOW + 5))
    if how == "release":
        return list(sc.release(k, [(i, got[i]) for i in ids], now_ms=NOW + 5))
    return list(sc.renew(k, [(i, got[i]) for i in ids], LEASE, now_ms=NOW + 5))


@pytest.mark.parametrize("how", ["ack", "retry", "bury", "release", "renew"])
def test_a_batch_survives_a_damaged_limit_key(p: Project, how: str) -> None:
    """A limit's holders key damaged to another Redis type must not fail a settling batch
    (or a renewal) part-way: the call answers for every job, and the jobs of the batch
    without that limit settle (or are renewed) as usual."""
    enqueue(p, new("a"), new("c", res="r"), new("d"))
    got = {g[0]: g[1] for g in claim(p, n=10)}
    _damage_limit(p, "r:r", "holders")
    codes = _settle_all(p, how, got)
    assert len(codes) == 3 and codes[0] == codes[2] == 1
    if how != "renew":
        assert not {"a", "d"} & set(p.runtime.redis.hkeys(p.keys().claims))


@pytest.mark.parametrize("which", ["holders", "waiters"])
def test_the_sweep_survives_a_damaged_limit_key(p: Project, which: str) -> None:
    """A limit key with parked jobs damaged to another Redis type must not fail promote
    (the scheduler's tick would stop there, before reclaim): scheduled jobs still move and
    the call answers."""
    enqueue(p, new("a", res="r1"), new("b", res="r1"), new("s", delay=SWEEP_MS))
    claim(p)
    _damage_limit(p, "r:r1", which)
    moved, _due = p.runtime.scripts.promote(p.keys(), 100, now_ms=NOW + SWEEP_MS)
    assert moved == 1


def test_reclaim_with_a_damaged_limit_key_loses_no_job(p: Project) -> None:
    """A limit key damaged to another Redis type must cost no reclaimed job: every lapsed
    lease of the batch comes back to ready."""
    enqueue(p, new("a"), new("c", res="r"), new("d"))
    claim(p, n=10)
    _damage_limit(p, "r:r", "holders")
    assert list(p.runtime.scripts.reclaim(p.keys(), 100, 10**7, now_ms=NOW + LEASE)) == [3, 0]
    assert sorted(structures(p)["ready"]) == ["a", "c", "d"]


def test_a_damaged_idempotency_key_costs_no_popped_job(p: Project) -> None:
    """An idempotency key damaged to another Redis type must not fail a claim part-way
    (ids already popped would be lost): it reads as no completion mark, the job with it
    runs and so does the rest of the batch."""
    r = p.runtime.redis
    k = p.keys()
    enqueue(p, new("a"), new("b", idem="bad", phash="h"), new("d"))
    r.delete(k.idem("noop", "bad"))
    r.rpush(k.idem("noop", "bad"), "not a string")
    got = claim(p, n=10)
    assert [g[0] for g in got] == ["a", "b", "d"]
    s = structures(p)
    assert sorted(s["leases"]) == ["a", "b", "d"] and s["ready"] == []
    assert_no_job_in_two_structures(p)


@pytest.mark.parametrize("which", ["holders", "waiters"])
def test_a_damaged_limit_key_costs_no_popped_job(p: Project, which: str) -> None:
    """A limit's holders key or waiter list damaged to another Redis type must not fail a
    claim part-way: the jobs around it are claimed, and the job under that limit is not
    lost (back in ready, or parked on a waiter list that is a list)."""
    r = p.runtime.redis
    k = p.keys()
    enqueue(p, new("a"), new("c", res="busy"), new("d"))
    r.zadd(k.limit("r:busy"), {"someone-else": NOW + 60_000})  # held: c is to be parked
    _damage_limit(p, "r:busy", which)
    got = claim(p, n=10)
    wk = k.limit("r:busy") + ":w"
    ids = [g[0] for g in got]
    # The damaged key is renamed aside: with damaged holders the limit starts afresh and
    # c is claimed; with a damaged waiter list c is parked on a fresh one.
    assert ids == (["a", "c", "d"] if which == "holders" else ["a", "d"])
    assert which == "holders" or (r.type(wk) == "list" and r.lrange(wk, 0, -1) == ["c"])
    assert r.exists(k.limit("r:busy") + (":corrupt" if which == "holders" else ":w:corrupt")) == 1
    assert_no_job_in_two_structures(p)


def test_enqueue_heals_an_idempotency_key_damaged_to_another_type(p: Project) -> None:
    """A damaged idempotency key reads as free: the batch is enqueued whole (no record
    written without its ready entry) and the key holds the new job."""
    r = p.runtime.redis
    k = p.keys()
    r.rpush(k.idem("noop", "bad"), "not a string")
    assert enqueue(p, new("a"), new("b", idem="bad", phash="h")) == [1, "a", "queued", 1, "b", "queued"]
    assert structures(p)["ready"] == ["b", "a"]
    assert r.get(k.idem("noop", "bad")) == "b h"


def _record(**fields: Any) -> str:
    return records.encode({"type": "noop", "version": 1, "payload": "{}", "max_attempts": 3, **fields})


@pytest.mark.parametrize("setup,reason,corrupt", [
    (lambda r, k: r.rpush(k.job("x"), "1"), "a Redis list instead of a string", ":corrupt"),
    (lambda r, k: r.zadd(k.job("x"), {"m": 1}), "a Redis zset instead of a string", ":corrupt"),
    (lambda r, k: r.sadd(k.job("x"), "m"), "a Redis set instead of a string", ":corrupt"),
    (lambda r, k: r.set(k.job("x"), "1\x1fnoop\x1f1"), "not a record of this runner", ""),
    (lambda r, k: r.set(k.job("x"), _record(type="")), "missing field(s) type", ""),
    (lambda r, k: r.set(k.job("x"), _record(max_attempts="three")), "not an integer: max_attempts", ""),
    (lambda r, k: r.set(k.job("x"), _record(created_ms="1.5e12")), "not an integer: created_ms", ""),
    (lambda r, k: r.set(k.job("x"), _record(max_attempts="-")), "not an integer: max_attempts", ""),
    # (a record past the 8 KiB its claim reads first: judged from its head alone)
    (lambda r, k: r.set(k.job("x"), _record(max_attempts=" 3", payload="[" + "0," * 5000 + "0]")),
     "not an integer: max_attempts", ""),
    (lambda r, k: (r.set(k.job("x"), _record()), r.set(k.state("x"), "s")),
     "its state is not a hash", ":s:corrupt"),
    (lambda r, k: (r.set(k.job("x"), _record()), r.hset(k.state("x"), "attempt", "1.5")),
     "not an integer: attempt", ""),
    (lambda r, k: (r.set(k.job("x"), _record()), r.hset(k.state("x"), "status", "zombie")),
     'unknown status "zombie"', ""),
    (lambda r, k: r.hset(k.job("x"), "other", "1"), "a Redis hash instead of a string", ":corrupt"),
    (lambda r, k: None, "no job record for this id", ""),
])
def test_malformed_record_in_a_batch_is_buried_and_the_rest_claimed(
    p: Project, setup: Any, reason: str, corrupt: str
) -> None:
    """A malformed record (or state) between good jobs is buried with its reason (a foreign
    value is kept aside under :corrupt); the good jobs of the same claim run."""
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
    assert r.exists(k.job("x") + ":corrupt") == (corrupt == ":corrupt")
    assert r.exists(k.job("x") + ":s:corrupt") == (corrupt == ":s:corrupt")
    assert r.hget(k.stats, "dead|?") == "1"


# --- dead letters, checkpoints, retention --------------------------------------------------


def test_requeue_and_remove_dead(p: Project) -> None:
    enqueue(p, new("a"))
    (job,) = claim(p)
    sc = p.runtime.scripts
    sc.bury(p.keys(), [Burial("a", job[1], "permanent failure", "", "", False, "")], 100_000, now_ms=NOW)
    assert sc.requeue(p.keys(), "b", now_ms=NOW) == -1
    assert sc.requeue(p.keys(), "a", '{"a":2}', "1", now_ms=NOW + 1) == 1
    r = rec(p, "a")
    assert r["status"] == "queued" and r["attempt"] == "0" and r["payload"] == '{"a":2}'
    assert r["ready_ms"] == str(NOW + 1) and r["enqueued_ms"] == str(NOW + 1) and "reason" not in r
    assert p.runtime.redis.ttl(p.keys().job("a")) == -1
    (job,) = claim(p, base="w.2")
    assert job[2] == 1  # a fresh attempt budget
    sc.bury(p.keys(), [Burial("a", job[1], "x", "", "", False, "")], 100_000, now_ms=NOW)
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


def test_trim_forgets_dead_entries_past_the_retention_with_their_records(p: Project) -> None:
    """A dead record expires after the dead retention; trim, given the same retention,
    drops the dead-letter entries older than that together with their records (should
    one still be there), keeps the newer ones, and is bounded per call."""
    enqueue(p, new("old1"), new("old2"), new("new"))
    sc, k, r = p.runtime.scripts, p.keys(), p.runtime.redis
    for job_id, at in (("old1", NOW), ("old2", NOW + 1), ("new", NOW + 10_000)):
        (job,) = claim(p, n=1, now=at, base=f"w.{job_id}")
        assert sc.bury(k, [Burial(job_id, job[1], "x", "", "", False, "")], 50_000, now_ms=at) == [1]
        assert 0 < r.pttl(k.job(job_id)) <= 50_000 + DEAD_GRACE
        assert 0 < r.pttl(k.state(job_id)) <= 50_000 + DEAD_GRACE
    assert r.hget(k.census, "noop|1") == "3"  # dead jobs are not done
    later = NOW + 55_000  # old1 and old2 are past 50 s, new is not
    assert sc.trim(k, 50_000, 10**9, 1, now_ms=later) == [1, 0]
    assert sorted(structures(p)["dead"]) == ["new", "old2"] and not r.exists(k.job("old1"), k.state("old1"))
    assert sc.trim(k, 50_000, 10**9, 100, now_ms=later) == [1, 0]
    assert structures(p)["dead"] == ["new"] and not r.exists(k.job("old2"), k.state("old2"))
    assert r.exists(k.job("new")) and r.exists(k.state("new"))
    assert r.hget(k.census, "noop|1") == "1"  # trimmed jobs leave the census
    assert sc.trim(k, 50_000, 10**9, 100, now_ms=later) == [0, 0]


def test_trim_deletes_done_jobs_past_retention_with_their_outcomes(p: Project) -> None:
    """Done outcomes live in generations of a quarter of the retention each: an ack starts
    a new one when the current one is that old, and so does trim on an idle queue; with the
    fifth the oldest goes whole (outcome and log). So a done job past the retention is gone
    (records, state and outcome: nothing of it is left), a newer one keeps its outcome."""
    from runner.errors import JobNotFound

    enqueue(p, new("a"), new("b"), new("c"))
    sc, k, r = p.runtime.scripts, p.keys(), p.runtime.redis
    keep = 20_000  # generations of 5 s
    for job_id, at in (("a", NOW), ("b", NOW + 1), ("c", NOW + 10_000)):
        (job,) = claim(p, n=1, now=at, base=f"w.{job_id}")
        assert sc.ack(k, [Ack(job_id, job[1], "", "noop|1", "")], 100_000, done_ttl_ms=keep, now_ms=at) == [1]
        assert not r.exists(k.job(job_id), k.state(job_id))
    assert r.hkeys(k.done(0)) == ["a", "b"] and r.hkeys(k.done(1)) == ["c"]  # c began generation 1
    assert sc.trim(k, 10**9, keep, 100, now_ms=NOW + 14_999) == [0, 1]  # generation 1 is not 5 s old
    assert sc.trim(k, 10**9, keep, 100, now_ms=NOW + 15_000) == [0, 2]
    assert sc.trim(k, 10**9, keep, 100, now_ms=NOW + 20_000) == [0, 3]
    assert sorted(done_ids(r, k)) == ["a", "b", "c"] and rec(p, "a")["status"] == "done"
    assert sc.trim(k, 10**9, keep, 100, now_ms=NOW + 25_000) == [0, 4]  # a and b are 25 s old
    assert not r.exists(k.done(0), k.done(0) + ":log")
    assert rec(p, "a") == {} and rec(p, "b") == {}
    with pytest.raises(JobNotFound):
        p.client.get("a")
    assert structures(p)["done"] == ["c"] and rec(p, "c")["status"] == "done"
    assert not p.client.get("c").as_dict()["last_error"]
    assert r.hget(k.census, "noop|1") == "0"  # (a field at 0 counts no job)


def test_client_run_at_schedules_at_that_time(p: Project) -> None:
    """enqueue(run_at=...) schedules the job at exactly that time, not before."""
    import time

    at = time.time() + 3600
    job = p.client.enqueue("noop", {}, run_at=at)
    assert job.status == "scheduled"
    assert p.runtime.redis.zscore(p.keys().scheduled, job.id) == int(at * 1000)
    assert p.runtime.scripts.promote(p.keys(), 100, now_ms=int(at * 1000) - 1) == [0, 1]


# --- the server's clock ----------------------------------------------------------------------


def test_scripts_run_on_the_servers_clock_when_no_test_clock_is_passed(p: Project) -> None:
    """Without now_ms every script reads TIME: a delay counts from the server's time, a
    claim replies with it and leases from it, a retry's delay and an ack's finish time are
    the server's too (the throughput minute, added by the worker, is the server's as well:
    tests/integration/test_figure_flush.py)."""
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    t0 = server_ms(p)
    assert enqueue(p, new("later", delay=60_000), new("a"), now=None)[2] == "scheduled"
    t1 = server_ms(p)
    due = int(r.zscore(k.scheduled, "later") or 0)
    assert t0 + 60_000 <= due <= t1 + 60_000
    assert t0 <= int(raw(p, "a")["created_ms"]) <= t1
    reply = claim_reply(p, now=None)
    at, (job,) = reply[0], [reply[HEAD:]]
    assert t1 <= at <= server_ms(p) and job[0] == "a"
    assert r.zscore(k.leases, "a") == at + LEASE
    assert r.hget(k.claims, "a") == f"{job[1]} 1 {at} -"
    assert sc.retry(k, [RetryAt("a", job[1], 500, '{"type":"E"}', "", "")]) == [1]
    failed = int(raw(p, "a")["finished_ms"])
    assert at <= failed and r.zscore(k.scheduled, "a") == failed + 500
    r.zadd(k.scheduled, {"a": 0})  # due at once
    assert sc.promote(k, 100)[0] == 1
    again = claim_reply(p, now=None, base="w.2")[HEAD:]
    assert sc.ack(k, [Ack("a", again[1], "", "noop|1", "")], 100_000) == [1]
    finished = int(rec(p, "a")["finished_ms"])
    assert failed <= finished <= server_ms(p)


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
    assert holders(p, "r:r1") == {"w.1:1": NOW + LEASE}
    assert r.hget(p.keys().claims, "b") == f"w.1:1 1 {NOW} r"  # 'r': the settler reads its limits
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
        r.hset(k.state(f"s{i}"), "status", "done")
    assert claim_reply(p, n=1) == [NOW, 2]  # s0..s3 popped and dropped: the bound is 4, said as 2
    assert structures(p)["ready"] == ["b", "a", "s4"]
    assert r.hget(k.stats, "stray") == "4"
    got = claim(p, n=2, base="w.2")  # s4 dropped, then a and b in a second pop
    assert [g[0] for g in got] == ["a", "b"]
    assert structures(p)["ready"] == [] and sorted(structures(p)["leases"]) == ["a", "b"]
    assert r.hget(k.stats, "stray") == "5"


def test_ack_with_a_wrong_token_changes_nothing(p: Project) -> None:
    """A refused ack leaves the record, its lease, the stats and the other acks of the
    batch as they were; the emptied token of a settled claim is refused too."""
    enqueue(p, new("a"), new("b"))
    got = claim(p)
    r = p.runtime.redis
    k = p.keys()
    before = rec(p, "a")
    stats_before = r.hgetall(k.stats)
    codes = p.runtime.scripts.ack(k, [Ack("a", got[1][1], '"x"', "noop|1", "succeeded|noop"),
                                      Ack("b", got[1][1], '"y"', "noop|1", "succeeded|noop")],
                                  100_000, now_ms=NOW)
    assert codes == [-1, 1]
    assert rec(p, "a") == before and r.pttl(k.job("a")) == -1
    assert r.zscore(k.leases, "a") == NOW + LEASE
    assert r.hget(k.stats, "succeeded|noop") == "1" and stats_before.get("succeeded|noop") is None
    # b is settled: its token field is empty, and an empty token owns nothing.
    assert rec(p, "b").get("token", "") == "" and not r.hexists(k.claims, "b")
    sc = p.runtime.scripts
    assert sc.ack(k, [Ack("b", "", "", "noop|1", "")], 100_000, now_ms=NOW) == [-1]
    assert sc.renew(k, [("b", "")], LEASE, now_ms=NOW) == [-1]


def test_ack_counts_the_batch_totals_only_when_every_ack_lands(p: Project) -> None:
    """The worker sends a batch's stats fields summed as well as each job's: a batch that
    lands whole is counted from the sum, in one pass; a batch with a refused ack is counted
    from the fields of the acks that landed, never the sum (which holds the refused one's)."""
    enqueue(p, new("a"), new("b"), new("c"))
    got = {g[0]: g for g in claim(p)}
    r = p.runtime.redis
    k = p.keys()
    sc = p.runtime.scripts
    r.delete(k.stats)  # the enqueue's own count
    fields = "succeeded|noop lat|noop|5 lat_sum|noop=4 run|noop|1 run_sum|noop=1"
    # The sum says 2 runs, not the 3 the jobs' fields would add up to: the sum is what counts.
    totals = "succeeded|noop=2 lat|noop|5=2 lat_sum|noop=8 run|noop|1=2 run_sum|noop=2"
    assert sc.ack(k, [Ack("a", got["a"][1], "", "noop|1", fields)], 100_000, now_ms=NOW, totals=totals) == [1]
    assert r.hgetall(k.stats) == {"succeeded|noop": "2", "lat|noop|5": "2", "lat_sum|noop": "8",
                                  "run|noop|1": "2", "run_sum|noop": "2", "own|noop": "1"}
    r.delete(k.stats)
    codes = sc.ack(k, [Ack("b", "not-its-token", "", "noop|1", fields), Ack("c", got["c"][1], "", "noop|1", fields)],
                   100_000, now_ms=NOW, totals="succeeded|noop=100")
    assert codes == [-1, 1]
    assert r.hgetall(k.stats) == {"succeeded|noop": "1", "lat|noop|5": "1", "lat_sum|noop": "4",
                                  "run|noop|1": "1", "run_sum|noop": "1", "own|noop": "1"}
    assert sc.start(k, [("b", "")], now_ms=NOW) == [-1]
    assert sc.release(k, [Hand("b", "", "later")], now_ms=NOW) == [-1]
    assert sc.checkpoint(k, "b", "", "{}") == -1
    # A job whose state was damaged to processing, with an empty token, is not owned by '' either.
    r.set(k.job("b"), records.encode({"type": "noop", "version": 1, "payload": "{}", "max_attempts": 3}))
    r.hset(k.state("b"), mapping={"status": "processing", "token": ""})
    assert sc.ack(k, [Ack("b", "", "", "", "")], 100_000, now_ms=NOW) == [-1]


def test_ack_writes_one_history_entry(p: Project) -> None:
    """A first attempt's success has no earlier history: the outcome keeps none, and the
    view shows one entry, the success, dated by the outcome's start and finish."""
    enqueue(p, new("a"))
    (job,) = claim(p)
    assert p.runtime.scripts.ack(p.keys(), [Ack("a", job[1], "null", "noop|1", "")], 100_000,
                                 now_ms=NOW + 2) == [1]
    ka = kept(p, "a")
    assert ka["history"] == done_entry(1, NOW, NOW + 2) and ka["result"] == "null"
    assert not p.runtime.redis.exists(p.keys().job("a"), p.keys().state("a"))
    r = rec(p, "a")
    assert r["history"] == done_entry(1, NOW, NOW + 2)
    assert "error" not in r
    assert p.client.get("a").as_dict()["history"] == [{"attempt": 1, "outcome": "done", "started_ms": NOW,
                                                        "at_ms": NOW + 2}]


def test_history_after_retry_then_success_has_both_entries_in_order(p: Project) -> None:
    """Each attempt adds its entry after the earlier ones; the success clears the error
    of the failed attempt."""
    enqueue(p, new("a"))
    sc = p.runtime.scripts
    k = p.keys()
    (job,) = claim(p)
    first = '{"attempt":1,"outcome":"retry"}'
    assert sc.retry(k, [RetryAt("a", job[1], 10, '{"type":"E","message":"m"}', first, "")], now_ms=NOW) == [1]
    assert rec(p, "a")["history"] == first and rec(p, "a").get("token", "") == ""
    assert sc.promote(k, 100, now_ms=NOW + 10)[0] == 1
    (job2,) = claim(p, now=NOW + 20, base="w.2")
    assert job2[2] == 2
    assert sc.ack(k, [Ack("a", job2[1], '"ok"', "noop|1", "")], 100_000, now_ms=NOW + 30) == [1]
    ka = kept(p, "a")  # the history of the attempts before the success is in the outcome
    assert ka["history"] == first + "," + done_entry(2, NOW + 20, NOW + 30) and ka["result"] == '"ok"'
    r = rec(p, "a")
    assert r["history"] == first + "," + done_entry(2, NOW + 20, NOW + 30)
    assert "error" not in r and r["status"] == "done" and r["attempt"] == "2"
    assert [h["attempt"] for h in p.client.get("a").as_dict()["history"]] == [1, 2]


def test_batch_ack_removes_only_its_own_leases(p: Project) -> None:
    """One ZREM for the batch: the leases of jobs outside it (or refused) stay, scores
    and all."""
    enqueue(p, *(new(c) for c in "abcd"))
    got = {g[0]: g[1] for g in claim(p)}
    sc = p.runtime.scripts
    k = p.keys()
    assert sc.renew(k, [("c", got["c"])], LEASE, now_ms=NOW + 500) == [1]
    codes = sc.ack(k, [Ack("a", got["a"], "", "", ""), Ack("d", "stale", "", "", ""),
                       Ack("b", got["b"], "", "", "")], 100_000, now_ms=NOW + 600)
    assert codes == [1, -1, 1]
    r = p.runtime.redis
    assert r.zrange(k.leases, 0, -1, withscores=True) == [("d", NOW + LEASE), ("c", NOW + 500 + LEASE)]
    assert rec(p, "a")["status"] == "done" and rec(p, "b")["status"] == "done"
    assert rec(p, "c")["status"] == "processing" and rec(p, "d")["status"] == "processing"
    assert_no_job_in_two_structures(p)


def _settle_twice(p: Project, how: str, token: str) -> Any:
    sc, k = p.runtime.scripts, p.keys()
    if how == "ack":
        return sc.ack(k, [Ack("a", token, "", "noop|1", "settled|noop")] * 2, 100_000, now_ms=NOW)
    if how == "retry":
        return sc.retry(k, [RetryAt("a", token, 10, "{}", '{"n":1}', "settled|noop")] * 2, now_ms=NOW)
    if how == "bury":
        return sc.bury(k, [Burial("a", token, "x", "", '{"n":1}', False, "settled|noop")] * 2, 100_000,
                       now_ms=NOW)
    return sc.release(k, [Hand("a", token, "now", '{"n":1}')] * 2, now_ms=NOW)


@pytest.mark.parametrize("how", ["ack", "retry", "bury", "release"])
def test_the_same_claim_twice_in_one_batch_settles_once(p: Project, how: str) -> None:
    """A batch holding one claim twice (ack.lua: "the same claim twice in one batch settles
    once") settles it once: the second copy is refused, counts nothing and adds no second
    history entry, ready entry or done outcome (nor uncounts the job twice)."""
    enqueue(p, new("a"), new("b"))
    (job, _b) = claim(p)
    r, k = p.runtime.redis, p.keys()
    assert list(_settle_twice(p, how, job[1])) == [1, -1]
    assert r.hget(k.stats, "settled|noop") in (None, "1")
    if how == "ack":  # an ack takes no history entry: the view adds the success's own
        assert rec(p, "a")["history"] == done_entry(1, NOW, NOW)
        assert done_ids(r, k) == ["a"] and r.hget(k.census, "noop|1") == "1"
    else:
        assert rec(p, "a")["history"] == '{"n":1}'
    assert len(r.lrange(k.ready, 0, -1)) <= 1


def test_batch_retry_and_bury_set_each_job_apart(p: Project) -> None:
    """A retry batch schedules each job at its own due time and a bury batch buries each
    with its own error and refund; jobs outside the batches keep their leases."""
    enqueue(p, *(new(c) for c in "abcde"))
    got = {g[0]: g[1] for g in claim(p)}
    sc = p.runtime.scripts
    k = p.keys()
    assert sc.retry(k, [RetryAt("a", got["a"], 100, '{"type":"A"}', '{"n":"a"}', "retried|noop"),
                        RetryAt("b", got["b"], 200, '{"type":"B"}', '{"n":"b"}', "retried|noop")],
                    now_ms=NOW) == [1, 1]
    assert sc.bury(k, [Burial("c", got["c"], "bad", '{"type":"C"}', "", True, "dead|noop"),
                       Burial("d", got["d"], "failed", "", '{"n":"d"}', False, "dead|noop")],
                   100_000, now_ms=NOW + 5) == [1, 1]
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
    assert 0 < r.pttl(k.job("d")) <= 100_000 + DEAD_GRACE and 0 < r.pttl(k.state("d")) <= 100_000 + DEAD_GRACE
    assert r.pttl(k.job("a")) == -1 and r.pttl(k.state("a")) == -1  # a retried job does not expire
    assert r.hget(k.stats, "retried|noop") == "2" and r.hget(k.stats, "dead|noop") == "2"
    assert_no_job_in_two_structures(p)


def test_promote_takes_any_limit(p: Project) -> None:
    """ARGV[2] is the most jobs to move: any positive count is a valid one."""
    enqueue(p, new("a", delay=10))
    assert p.runtime.scripts.promote(p.keys(), 30, now_ms=NOW + 10) == [1, -1]


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
    """The common case (no keys, first attempt succeeds): claim reads each record once (a
    GET of the record string; a job that waits untouched has no state hash to read, and
    one EXISTS for the batch says so, with the pauses and the priority set) and
    writes nothing to it; it pops, checks for strays (one HMGET of the claims; no key's
    type is checked: the lease write is a pcall, and a settle that writes checks the keys
    it needs first), records the claims, the leases and their claim times with one
    command each for the batch.
    Ack reads no record, whatever the batch size: one HMGET for the fences, one HMGET of
    the done generation (and, the first time, one HSET to begin it), one HSET and one
    LPUSH for the outcomes (the push's reply is the generation's count: no HINCRBY of
    it), one DEL of the records and states, one HDEL and two ZREMs for the claims, leases
    and claim times, one HINCRBY for the census (no throughput minute: the worker adds
    it). On the server's clock each call adds one TIME, nothing else."""
    proj = make_project(tmp_path / "project", quiet_server)
    try:
        enqueue(proj, *(new(f"j{i}") for i in range(40)))
        r = proj.runtime.redis
        sc, k = proj.runtime.scripts, proj.keys()
        claim(proj, n=1)  # loads the script
        sc.ack(k, [], 1000, now_ms=NOW)
        phases = []
        for now in (NOW, None):
            t0 = _calls(r)
            reply = claim_reply(proj, n=10, now=now, base=f"w.{now}")
            got = [reply[i:i + FIELDS] for i in range(HEAD, len(reply), FIELDS)]
            t1 = _calls(r)
            acks = [Ack(g[0], g[1], "null", "noop|1", "succeeded|noop") for g in got]
            assert sc.ack(k, acks, 100_000, now_ms=now) == [1] * 10
            t2 = _calls(r)
            phases.append((_inside(t0, t1), _inside(t1, t2)))
    finally:
        proj.stop_all()
        proj.runtime.close()
    # Per job: a GETRANGE of the record (its first 8 KiB: whole when small); per
    # batch one RPOP, one EXISTS of the pauses, the priority set and the popped
    # jobs' state hashes (all absent for jobs that waited untouched: no HMGET of
    # their fields, no EXISTS each), the claims' HMGET, no type check, one HSET of
    # the claims and one ZADD each of the leases and of their claim times (the
    # processing list's order), whatever the batch size.
    claim_cost = {"rpop": 1, "getrange": 10, "hmget": 1, "hset": 1, "zadd": 2, "exists": 1}
    # + one HINCRBY for the stats field given here (a worker gives none: it sums them) and
    # one for the census (the minute's throughput count is the worker's to add too)
    ack_cost = {"hmget": 2, "hset": 1, "lpush": 1, "del": 1, "hdel": 1, "zrem": 2, "hincrby": 2}
    # The first ack begins generation 0, and its stats field, new to the hash, asks the
    # hash's size and marks its type as counted under its own name (includes/stats.lua)
    assert phases[0] == (claim_cost, {**ack_cost, "hset": 2, "hlen": 1, "hsetnx": 1})
    assert phases[1] == ({**claim_cost, "time": 1}, {**ack_cost, "time": 1})


def test_requeue_appends_who_requeued_to_the_history(p: Project) -> None:
    """An entry given to requeue goes after the attempts already in the history, in the
    same step, stamped with the script's time (the server's); without one the history is
    left as it was."""
    enqueue(p, new("a"), new("b"))
    sc = p.runtime.scripts
    for job in claim(p, n=2):
        sc.bury(p.keys(), [Burial(job[0], job[1], "permanent failure", "", '{"attempt":1}', False, "")],
                100_000, now_ms=NOW)
    entry = f'{{"outcome":"requeued","by":"ops","at_ms":{NOW}}}'
    assert sc.requeue(p.keys(), "a", history='{"outcome":"requeued","by":"ops"}', now_ms=NOW) == 1
    assert rec(p, "a")["history"] == '{"attempt":1},' + entry
    assert sc.requeue(p.keys(), "b", now_ms=NOW) == 1
    assert rec(p, "b")["history"] == '{"attempt":1}'
    assert sc.requeue(p.keys(), "a", history='{"outcome":"requeued","by":"ops"}', now_ms=NOW) == -1  # not dead
    assert rec(p, "a")["history"] == '{"attempt":1},' + entry


def test_requeue_keeps_the_time_an_older_client_put_in_its_entry(p: Project) -> None:
    """A client of the release before (a rolling deploy) sends its entry with its own
    at_ms: it is kept as sent, not given a second one."""
    enqueue(p, new("a"))
    sc = p.runtime.scripts
    (job,) = claim(p)
    sc.bury(p.keys(), [Burial(job[0], job[1], "permanent failure", "", '{"attempt":1}', False, "")],
            100_000, now_ms=NOW)
    old = '{"outcome":"requeued","by":"ops","at_ms":5}'
    assert sc.requeue(p.keys(), "a", history=old, now_ms=NOW) == 1
    assert rec(p, "a")["history"] == '{"attempt":1},' + old


def test_claim_parks_a_full_keys_backlog_past_its_bound_and_reaches_another_key(p: Project) -> None:
    """300 jobs of a key at its limit, then one of another key: one claim of n = 1 parks
    the first 4 by asking and up to 256 more as known full (the bound widens for them),
    says it stopped at its bound (2); the next claim parks the rest and claims the other
    key's job."""
    r = p.runtime.redis
    k = p.keys()
    r.zadd(k.lim_prefix + "c:t:a", {"other": NOW + 60_000})
    enqueue(p, *(new(f"a{i}", limits="1 c:t:a") for i in range(300)), new("b", limits="1 c:t:b"))
    assert claim_reply(p, n=1) == [NOW, 2]
    assert r.llen(k.lim_prefix + "c:t:a:w") == 4 + 256
    got = claim(p, n=1, base="w.2")
    assert [g[0] for g in got] == ["b"]
    assert r.llen(k.lim_prefix + "c:t:a:w") == 300
    assert r.lrange(k.lim_prefix + "c:t:a:w", 0, 2) == ["a0", "a1", "a2"]  # in arrival order


def test_a_handlers_rate_limited_is_free_100_times_then_spends_the_attempt(p: Project) -> None:
    """retry with refund mode 2 (RateLimited): no attempt spent and a history entry while
    the job's count is within 100; the 101st is an ordinary retry that spends its attempt."""
    r = p.runtime.redis
    k = p.keys()
    enqueue(p, new("a"))
    (job,) = claim(p, n=1)
    back = RetryAt("a", job[1], 1000, '{"type":"RateLimited"}', '{"outcome":"rate limited"}', "ratelimited|noop",
                   refund=True, rate_limited=True)
    assert p.runtime.scripts.retry(k, [back], now_ms=NOW) == [1]
    assert rec(p, "a")["status"] == "scheduled" and "attempt" not in raw(p, "a")
    assert r.hget(k.state("a"), "ratelimits") == "1" and r.hget(k.stats, "ratelimited|noop") == "1"
    r.hset(k.state("a"), "ratelimits", 100)
    r.zrem(k.scheduled, "a")
    r.hset(k.state("a"), "status", "queued")
    r.rpush(k.ready, "a")
    (job,) = claim(p, n=1, base="w.2")
    assert p.runtime.scripts.retry(k, [back._replace(token=job[1])], now_ms=NOW) == [1]
    assert rec(p, "a")["status"] == "retrying" and raw(p, "a")["attempt"] == "1"


def test_a_lease_deadline_keeps_every_digit_of_the_clock(p: Project) -> None:
    """The lease deadline is the claim's time plus the lease, to the last digit, whatever
    the clock given (a test's clock may carry a fraction): formatted once for the whole
    batch, it must not be rounded to 14 digits."""
    enqueue(p, new("a"), new("b"))
    claim_reply(p, n=2, now=NOW + 0.25)
    leases = p.runtime.redis.zrange(p.keys().leases, 0, -1, withscores=True)
    assert leases == [("a", NOW + 0.25 + LEASE), ("b", NOW + 0.25 + LEASE)]


def test_a_damaged_claim_attempt_is_written_back_as_a_number(p: Project) -> None:
    """A claim entry whose attempt has leading zeros (damage; the scripts never write one)
    is read as its number: the start mark and the done outcome write "7", not "007",
    which would make the job's view invalid JSON."""
    enqueue(p, new("a"), new("b"))
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    claim(p, n=2, start=0)  # both prefetched: their entries carry 'p'
    r.hset(k.claims, mapping={"a": f"tok 007 {NOW} p", "b": f"tok 007 {NOW} p"})
    assert sc.start(k, [("a", "tok")], now_ms=NOW) == [1]
    assert r.hget(k.claims, "a") == f"tok 7 {NOW} -"
    assert sc.ack(k, [Ack("b", "tok", "", "noop|1", "succeeded|noop")], 100_000, now_ms=NOW + 5) == [1]
    assert (outcome(p, "b") or "").startswith("noop 1 7 ")
    job = p.client.get("b").as_dict()
    assert job["status"] == "done" and job["attempt"] == 7


def test_statuses_reads_each_jobs_status_alone_in_two_commands_at_most(p: Project) -> None:
    """statuses.lua (a deaf wait's read, store/waiter.py): per id, in order, its state's
    status; '' for a record whose state says none (queued or running untouched); '-' for
    neither record nor state (done, or no such job). A state damaged to another type says
    nothing: its record does. Two commands a job at most, whatever it holds."""
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    enqueue(p, *(new(i) for i in ("run", "ok", "dead", "queued", "again", "gone")))
    got = {j[0]: j[1] for j in claim(p, n=3)}
    assert set(got) == {"run", "ok", "dead"}  # (the oldest first: the others wait)
    assert sc.ack(k, [Ack("ok", got["ok"], '"r"', "noop|1", "")], 100_000, now_ms=NOW + 1) == [1]
    assert sc.bury(k, [Burial("dead", got["dead"], "failed", "", "", False, "")], 100_000, now_ms=NOW + 1) == [1]
    assert list(sc.cancel(k, "again", 60_000, now_ms=NOW + 2)) == [1, "cancelled"]
    r.delete(k.job("gone"))
    r.set(k.state("run"), "damaged")  # (another writer's)
    ids = ["queued", "run", "ok", "dead", "again", "gone", "never"]
    before = r.info("commandstats")
    assert sc.statuses(k, ids) == ["", "", "-", "dead", "cancelled", "-", "-"]
    after = r.info("commandstats")
    ran = sum(int(v["calls"]) - int(before.get(c, {"calls": 0})["calls"]) for c, v in after.items()
              if c in ("cmdstat_hget", "cmdstat_exists"))
    assert ran <= 2 * len(ids)
    assert sc.statuses(k, []) == []


def test_lookup_with_a_cut_returns_the_big_values_cut_and_their_sizes(p: Project) -> None:
    """lookup.lua given a cut: the record's payload, each state value and the outcome's
    result and payload lines past it come back cut to that many bytes, with their full
    sizes named; the record's other fields and what is short stay whole. Without a cut
    the reply is the four values as before."""
    k, r = p.keys(), p.runtime.redis
    payload = '{"s":"' + "é" * 50 + '"}'
    r.set(k.job("j1"), records.encode({"type": "noop", "version": 1, "max_attempts": 3, "idem_key": "key",
                                       "payload": payload}))
    r.hset(k.state("j1"), mapping={"status": "dead", "checkpoint": '{"c":"' + "x" * 40 + '"}', "reason": "short"})
    rec_, state, _, _, sizes = p.runtime.scripts.lookup(k, "j1", cut=16)
    fields = records.parse(rec_)
    assert fields is not None and fields["idem_key"] == "key" and fields["type"] == "noop"
    assert fields["payload"].encode("utf-8", "surrogateescape") == payload.encode()[:16]
    state = dict(zip(state[::2], state[1::2], strict=True))
    assert state["checkpoint"] == '{"c":"' + "x" * 10 and state["reason"] == "short"
    assert dict(zip(sizes[::2], sizes[1::2], strict=True)) == {"payload": len(payload.encode()), "checkpoint": 48}
    assert len(p.runtime.scripts.lookup(k, "j1")) == 4
    # Past its read budget a value comes back empty, its size still named.
    _, state, _, _, sizes = p.runtime.scripts.lookup(k, "j1", cut=16, read=47)
    state = dict(zip(state[::2], state[1::2], strict=True))
    assert state["checkpoint"] == "" and state["reason"] == "short"
    assert dict(zip(sizes[::2], sizes[1::2], strict=True))["checkpoint"] == 48
    result = '{"r":"' + "y" * 40 + '"}'
    r.hset(k.done(0), "j2", f"noop 1 1 {NOW} +5\n\n{result}\n{{\"m\":1}}\n")
    _, _, _, outcome, sizes = p.runtime.scripts.lookup(k, "j2", cut=16)
    assert outcome == f"noop 1 1 {NOW} +5\n\n{result[:16]}\n{{\"m\":1}}\n"
    assert sizes == ["result", len(result)]


def test_lookup_of_a_state_hash_past_its_bound_reads_only_the_fields_shown(p: Project) -> None:
    """A state hash of records.MAX_STATE_FIELDS fields is read as ever (by a job's view; a
    list row's bound is lower); one more field and
    lookup.lua reads only records.STATE_SHOWN, by name, with or without a cut, and says
    how many fields the hash holds (records.WIDE): the job view names it damaged."""
    k, r = p.keys(), p.runtime.redis
    r.set(k.job("w"), records.encode({"type": "noop", "version": 1, "max_attempts": 3, "payload": "{}"}))
    own = {name: "v" for name in records.STATE_SHOWN}
    own.update(status="dead", attempt="2", error='{"type":"E","message":"' + "m" * 100 + '"}')
    junk = records.MAX_STATE_FIELDS - len(own) - 2
    r.hset(k.state("w"), mapping={**own, "steps": "1", "step:0": '{"name":"a"}'})
    r.hset(k.state("w"), mapping={f"junk{i}": "j" for i in range(junk)})
    assert r.hlen(k.state("w")) == records.MAX_STATE_FIELDS
    assert len(p.runtime.scripts.lookup(k, "w")[1]) == 2 * records.MAX_STATE_FIELDS
    # (a list row's bound is lower, records.LIST_STATE_FIELDS: this hash is wide to it)
    assert records.WIDE in p.runtime.scripts.lookup(k, "w", cut=16)[1]
    r.hset(k.state("w"), "one-more", "j")
    state = p.runtime.scripts.lookup(k, "w")[1]
    assert dict(zip(state[::2], state[1::2], strict=True)) == {**own, records.WIDE: str(records.MAX_STATE_FIELDS + 1)}
    _, state, _, _, sizes = p.runtime.scripts.lookup(k, "w", cut=16)
    state = dict(zip(state[::2], state[1::2], strict=True))
    assert set(state) == {*own, records.WIDE} and state["error"] == own["error"][:16]
    assert dict(zip(sizes[::2], sizes[1::2], strict=True)) == {"error": len(own["error"])}
    view = p.client.get("w").as_dict()
    assert view["status"] == "dead" and view["attempt"] == 2 and "steps" not in view
    assert "state" in view["damaged"]


def test_remove_takes_the_jobs_log_and_stream_with_it(p: Project) -> None:
    """A dead job deleted by an operator leaves no log or stream behind (they live as long
    as the job); another job's stay."""
    enqueue(p, new("a"), new("b"))
    got = {g[0]: g[1] for g in claim(p)}
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    sc.bury(k, [Burial(i, got[i], "x", "", "", False, "") for i in "ab"], 100_000, now_ms=NOW)
    for i in "ab":
        sc.append_log(k, i, ['{"msg": "x"}'], 500, 262_144, 60_000)
        sc.append_log(k, i, ['{"i": 0, "data": 1}'], 500, 262_144, 60_000, key=k.stream(i))
    assert sc.remove(k, "a") == 1
    assert r.exists(k.log("a"), k.stream("a")) == 0
    assert r.exists(k.log("b"), k.stream("b")) == 2


def test_joblog_keeps_the_newest_lines_within_both_bounds(p: Project) -> None:
    """joblog appends in order, drops the oldest past the line bound and past the byte
    bound (never the newest line), and sets the expiry it is given."""
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    assert sc.append_log(k, "j", [f"line{i}" for i in range(5)], 3, 1000, 60_000) == 3
    assert r.lrange(k.log("j"), 0, -1) == ["line2", "line3", "line4"]
    assert sc.append_log(k, "j", ["x" * 995], 3, 1000, 60_000) == 2  # 5 + 995 bytes: within 1000
    assert r.lrange(k.log("j"), 0, -1) == ["line4", "x" * 995]
    assert sc.append_log(k, "j", ["y" * 1200], 3, 1000, 60_000) == 1  # the newest stays, whatever its size
    assert r.lrange(k.log("j"), 0, -1) == ["y" * 1200]
    assert 0 < r.pttl(k.log("j")) <= 60_000
    assert sc.append_log(k, "none", [], 3, 1000, 60_000) == 0 and r.exists(k.log("none")) == 0


def test_joblog_sets_a_log_or_stream_of_another_type_aside(p: Project) -> None:
    """A log key another program made a hash, or a stream key a string: the write renames
    it to <key>:corrupt (kept as long as the log, counted in the queue's stats) and the
    log starts afresh with the lines written (every write failed: the run's lines were
    lost)."""
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    r.hset(k.log("j"), "x", "y")
    r.set(k.stream("j"), "junk")
    assert sc.append_log(k, "j", ["l1", "l2"], 10, 1000, 60_000, marker="m #LOST#") == 2
    assert sc.append_log(k, "j", ['{"a": 1, "i": 0}'], 10, 1000, 60_000, key=k.stream("j")) == 1
    assert r.lrange(k.log("j"), 0, -1) == ["l1", "l2"]
    assert r.hgetall(k.log("j") + ":corrupt") == {"x": "y"} and r.get(k.stream("j") + ":corrupt") == "junk"
    assert r.lrange(k.stream("j"), 0, -1) == ['{"a": 1, "i": 0}']
    assert 0 < r.pttl(k.log("j") + ":corrupt") <= 60_000 and 0 < r.pttl(k.stream("j") + ":corrupt") <= 60_000
    assert r.hget(k.stats, "corrupt|log") == "1" and r.hget(k.stats, "corrupt|stream") == "1"


def test_aside_renames_a_key_of_another_type_and_leaves_any_other(p: Project) -> None:
    """aside.lua (a writer answered WRONGTYPE) renames a key of another type than asked to
    <key>:corrupt; one of that type, or none, is left as it is."""
    r, sc = p.runtime.redis, p.runtime.scripts
    key = p.runtime.config.redis.prefix + ":workers"
    r.set(key, "junk")
    assert sc.aside(key, "hash") == 1
    assert r.get(key + ":corrupt") == "junk" and r.exists(key) == 0
    assert sc.aside(key, "hash") == 0  # (gone)
    r.hset(key, "w", "1")
    assert sc.aside(key, "hash") == 0 and r.hgetall(key) == {"w": "1"}


def _bounded(lines: list[str], most: int, budget: int) -> list[str]:
    """The newest of ``lines`` within both bounds, never none: what joblog keeps."""
    kept = lines[-most:]
    while len(kept) > 1 and sum(map(len, kept)) > budget:
        kept = kept[1:]
    return kept


def test_joblog_keeps_its_count_beside_the_log_and_counts_again_when_it_does_not_hold(p: Project) -> None:
    """joblog trims by a count of the log's lines and bytes kept beside it (no write reads
    the log whole); when the count does not hold for the log as it is (a line written by
    another writer, the newest or the oldest, or 5,000 of them; the count gone, or of
    another type), the write reads the newest lines within the bound again, as it read
    them on every write before, and keeps both bounds exactly."""
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    most, budget, log = 4, 100, k.log("c")

    def write(*lines: str) -> None:
        expected = _bounded(r.lrange(log, 0, -1) + list(lines), most, budget)
        sc.append_log(k, "c", list(lines), most, budget, 60_000)
        held = r.lrange(log, 0, -1)
        assert held == expected, (held, expected)
        assert r.get(log + ":size").split()[:2] == [str(len(held)), str(sum(map(len, held)))]
        assert 0 < r.pttl(log + ":size") <= 60_000

    write("a" * 10, "b" * 10, "c" * 10)
    write("d" * 30, "e" * 40)
    r.rpush(log, "z" * 25)  # another writer's newest line: the count does not hold
    write("f" * 5)
    r.lpush(log, "y" * 20)  # its oldest: the length differs
    write("g" * 10)
    r.delete(log + ":size")
    write("h" * 10)
    r.delete(log + ":size")
    r.hset(log + ":size", "x", "y")  # (another type: counted again, then written over)
    write("i" * 60, "j" * 60)
    r.rpush(log, *[f"w{i}" for i in range(5_000)])  # another writer's long list: its newest read
    write("l" * 10)
    write("k" * 500)  # past the bytes alone: the newest stays
    assert r.lrange(log, 0, -1) == ["k" * 500]


def test_joblog_writes_a_runs_progress_ahead_of_its_lines_fenced(p: Project) -> None:
    """A run's progress goes to the job's state in its lines' call (or a call with no
    lines), under its claim's token: a run whose lease was lost writes neither."""
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    enqueue(p, new("a"))
    token = claim(p, n=1)[0][1]
    assert sc.append_log(k, "a", ["l1"], 10, 1000, 60_000, token=token, progress='{"percent": 5}') == 1
    assert r.hget(k.job("a") + ":s", "progress") == '{"percent": 5}' and r.lrange(k.log("a"), 0, -1) == ["l1"]
    assert sc.append_log(k, "a", [], 10, 1000, 60_000, token=token, progress='{"percent": 9}') == 1
    assert r.hget(k.job("a") + ":s", "progress") == '{"percent": 9}'
    assert sc.append_log(k, "a", ["l2"], 10, 1000, 60_000, token="w.9:9", progress='{"percent": 70}') == -1
    assert r.hget(k.job("a") + ":s", "progress") == '{"percent": 9}' and r.lrange(k.log("a"), 0, -1) == ["l1"]
    sc.append_log(k, "a", ["l3"], 10, 1000, 60_000, token=token)  # (none reported: left as it was)
    assert r.hget(k.job("a") + ":s", "progress") == '{"percent": 9}'


def _marked(sc: Any, k: Any, lines: list[str], dropped: int = 0, most: int = 4, budget: int = 100_000) -> Any:
    from runner.worker.joblog import marker
    return sc.append_log(k, "m", lines, most, budget, 60_000, marker=marker(most, budget), dropped=dropped)


def test_joblogs_marker_counts_the_sent_lines_it_trimmed_and_those_never_sent(p: Project) -> None:
    """A log's lines sent in earlier writes and then pushed out by newer ones are lost as
    surely as lines the worker dropped unsent: the marker at the log's head counts both,
    across writes, and takes a slot of the bounds itself (the newest lines stay)."""
    import json

    from runner.worker.joblog import line
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    sent = [line("INFO", f"l{i}") for i in range(10)]
    _marked(sc, k, sent[:3])
    kept = [json.loads(x) for x in r.lrange(k.log("m"), 0, -1)]
    assert [x["msg"] for x in kept] == ["l0", "l1", "l2"]  # nothing lost: no marker
    _marked(sc, k, sent[3:6])  # l0..l2 sent, three of them trimmed here (one for the marker)
    kept = [json.loads(x) for x in r.lrange(k.log("m"), 0, -1)]
    assert [x["msg"] for x in kept][1:] == ["l3", "l4", "l5"] and kept[0]["src"] == "runner"
    assert kept[0]["msg"].startswith("[3 earlier line(s) dropped")
    _marked(sc, k, sent[6:10], dropped=1000)  # 1,000 lost unsent ahead of l6
    msgs = [json.loads(x)["msg"] for x in r.lrange(k.log("m"), 0, -1)]
    assert msgs[1:] == ["l7", "l8", "l9"], msgs
    assert msgs[0].startswith("[1,007 earlier line(s) dropped"), msgs[0]  # 3 + l3..l6 + 1,000


def test_joblog_numbers_each_line_across_trims(p: Project) -> None:
    """Each line of a log gets "n", its place among every line written to the log (the
    marker the place just ahead of the first kept), so the same text twice is two lines
    and a reader can tell which it saw last whatever was trimmed since."""
    import json

    from runner.worker.joblog import line
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    tick = line("INFO", "tick", ts_ms=1)
    _marked(sc, k, [tick] * 3)
    _marked(sc, k, [tick] * 3)
    kept = [json.loads(x) for x in r.lrange(k.log("m"), 0, -1)]
    assert [x["n"] for x in kept] == [2, 3, 4, 5] and kept[0]["src"] == "runner"
    assert all(x["msg"] == "tick" for x in kept[1:])


def test_a_batchs_start_marks_clear_each_members_marks_in_one_call(p: Project) -> None:
    """start.lua marks a BATCH function's members, claimed held ('p' and 'h'), in one call:
    a plain member's entry comes back with its token and attempt, the start time and no
    flag; a member with other flags keeps those (its idempotency key's 'i'); a stale token
    is refused and its entry left as it was; an entry whose attempt is written with
    leading zeros (damage) is written back as a number. A plain claim made ahead ('p'
    alone) is marked as a member's is."""
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts
    enqueue(p, new("a"), new("b"), new("c", idem="k1"), new("d"), new("e"), new("f", type_="other"))
    reply = list(sc.claim(k, n=5, start=5, lease_ms=LEASE, token_base="w.1", dead_ttl_ms=10_000_000,
                          done_ttl_ms=10_000_000, now_ms=NOW, gathered="noop"))
    got = {reply[i]: reply[i:i + FIELDS] for i in range(HEAD, len(reply), FIELDS)}
    assert sorted(got) == ["a", "b", "c", "d", "e"] and all(j[12] == 3 for j in got.values())
    assert {i: r.hget(k.claims, i).split()[3] for i in got} == {"a": "ph", "b": "ph", "c": "iph", "d": "ph",
                                                                 "e": "ph"}
    tok_e = got["e"][1]
    r.hset(k.claims, "e", f"{tok_e} 007 {NOW} ph")
    (f,) = claim(p, n=1, start=0, base="w.2")
    assert r.hget(k.claims, "f").split()[3] == "p"
    at = NOW + 7
    owned = [(i, got[i][1]) for i in ("a", "b", "c")] + [("d", "stale"), ("e", tok_e), ("f", f[1])]
    assert sc.start(k, owned, now_ms=at) == [1, 1, 1, -1, 1, 1]
    entries = {i: r.hget(k.claims, i).split() for i in ("a", "b", "c", "d", "e", "f")}
    assert entries["a"] == [got["a"][1], "1", str(at), "-"] and entries["b"] == [got["b"][1], "1", str(at), "-"]
    assert entries["c"] == [got["c"][1], "1", str(at), "i"]
    assert entries["d"] == [got["d"][1], "1", str(NOW), "ph"]
    assert entries["e"] == [tok_e, "7", str(at), "-"]
    assert entries["f"] == [f[1], "1", str(at), "-"]
    assert sc.start(k, owned[:1], now_ms=at + 1) == [0]  # started already: nothing to mark


def test_a_free_executor_takes_a_keyless_batch_of_jobs_under_limits(p: Project) -> None:
    """Jobs under limits are claimed only for the free executors, and a BATCH function
    without a key ("<type>=<size>") runs up to size of them in one executor's call: two
    free executors take two batches of four of its jobs under a limit far from full, each
    with its own slot, and the next one goes back (held). Keyed ("<type>"), or with no
    free executor, each job still needs an executor of its own."""
    r, k, sc = p.runtime.redis, p.keys(), p.runtime.scripts

    def claim_held(start: int, gathered: str) -> tuple[int, list[str]]:
        reply = list(sc.claim(k, n=20, start=start, lease_ms=LEASE, token_base=f"w.{start}.{gathered}",
                              dead_ttl_ms=10_000_000, done_ttl_ms=10_000_000, now_ms=NOW, gathered=gathered))
        return reply[1], [reply[i] for i in range(HEAD, len(reply), FIELDS)]

    enqueue(p, *[new(f"j{i:02d}", limits="20 c:noop") for i in range(10)])
    held, got = claim_held(2, "noop=4")
    assert (held, got) == (1, [f"j{i:02d}" for i in range(8)])
    assert r.zcard(f"{k.lim_prefix}c:noop") == 8  # each holds its own slot of the limit
    assert claim_held(0, "noop=4") == (1, [])  # no free executor: nothing under a limit
    assert claim_held(1, "noop") == (1, ["j08"])  # keyed: one job per free executor
    # A plain job under a limit between two of a batch's takes a free executor of its own.
    enqueue(p, new("b1", limits="20 c:noop"), new("x", limits="20 c:other", type_="other"),
            new("b2", limits="20 c:noop"), new("b3", limits="20 c:noop"), now=NOW + 1)
    assert claim_held(1, "noop=4") == (1, ["j09", "b1"])
    assert claim_held(2, "noop=4") == (0, ["x", "b2", "b3"])
