"""The schedule transitions, on Valkey and Redis 7.0: a tick (tick.lua, with the enqueue
script appended) and a deploy's takeover (adopt.lua). State before, call, state after,
return code."""

from __future__ import annotations

from typing import Any

import pytest

from runner.store import codec, records
from runner.store.scripts import NewJob, job_entry

from conftest import Project, keep_functions, structures, view

NOW = 1_800_000_000_000
MIN = 60_000


@pytest.fixture
def p(any_project: Project) -> Project:
    return keep_functions(any_project)  # (the scripts read no function)


def job(job_id: str) -> NewJob:
    return NewJob(id=job_id, type="noop", version=1, payload="{}", max_attempts=3, run_at_ms=0, delay_ms=0,
                  idem_key="", payload_hash="-", resource_key="", limits="", meta='{"schedule":"s","tick":"t"}')


def tick(p: Project, job_id: str, tick_ms: int, *, mode: str = "fire", digest: str = "d1", born: int = NOW,
         overlap: str = "allow", missed: int = 0, late: int = 5, away: bool = False, seen: str = "") -> list[Any]:
    entry = codec.dumps(job_entry("fast", job(job_id))) if away else ""
    return list(p.runtime.scripts.tick(p.keys(), "s", job(job_id), mode=mode, tick_ms=tick_ms, digest=digest,
                                       born_ms=born, overlap=overlap, missed=missed, late_ms=late, now_ms=NOW,
                                       away=entry, seen=seen))


def state(p: Project) -> dict[str, str]:
    return p.runtime.redis.hgetall(p.keys().schedule("s"))  # type: ignore[no-any-return]


def test_a_tick_fires_once(p: Project) -> None:
    """The first call for a tick enqueues its job (an ordinary job, with its meta); a
    second call for the same tick, or an earlier one, is refused and writes nothing."""
    assert tick(p, "j1", NOW) == [1, "j1", "queued"]
    assert tick(p, "j2", NOW) == [-2, str(NOW), "handled"]
    assert tick(p, "j3", NOW - MIN) == [-2, str(NOW), "handled"]
    assert structures(p)["ready"] == ["j1"]
    job = records.Job("j1", "fast", view(p, "j1")).as_dict()
    assert job["schedule"] == "s" and job["status"] == "queued" and job["max_attempts"] == 3
    st = state(p)
    assert (st["def"], st["tick"], st["fired"], st["job"], st["n_fired"], st["late_ms"]) == (
        "d1", str(NOW), str(NOW), "j1", "1", "5")
    assert p.runtime.redis.hget(p.keys().stats, "enqueued|noop") == "1"


def test_a_skip_records_the_tick_and_counts_the_missed(p: Project) -> None:
    assert tick(p, "j1", NOW, mode="skip", missed=3) == [2, "", "skipped"]
    assert tick(p, "j2", NOW) == [-2, str(NOW), "handled"]
    assert structures(p)["ready"] == []
    assert state(p)["n_missed"] == "3" and "job" not in state(p)
    assert tick(p, "j3", NOW + MIN, missed=1) == [1, "j3", "queued"]
    assert state(p)["n_missed"] == "4"


def test_overlap_skip_waits_for_the_last_job(p: Project) -> None:
    """OVERLAP skip: a tick while the last job is queued, claimed or deferred is skipped
    and counted; once that job is done, the next tick fires."""
    assert tick(p, "j1", NOW, overlap="skip")[0] == 1
    assert tick(p, "j2", NOW + MIN, overlap="skip") == [3, "j1", "queued"]
    assert state(p)["n_overlap"] == "1" and state(p)["tick"] == str(NOW + MIN)
    p.runtime.redis.hset(p.keys().claims, "j1", "tok 1 1 -")
    assert tick(p, "j3", NOW + 2 * MIN, overlap="skip") == [3, "j1", "processing"]
    p.runtime.redis.hdel(p.keys().claims, "j1")
    # Held back by a limit or a paused function: still the last run, not started.
    p.runtime.redis.hset(p.keys().state("j1"), "status", "deferred")
    assert tick(p, "j3b", NOW + 3 * MIN, overlap="skip") == [3, "j1", "deferred"]
    # Done: the record and its state go, the outcome sits in a done generation.
    p.runtime.redis.delete(p.keys().job("j1"), p.keys().state("j1"))
    p.runtime.redis.hset(p.keys().done(0), "j1", "noop 1 1 0 0\n\n")
    assert tick(p, "j4", NOW + 4 * MIN, overlap="skip") == [1, "j4", "queued"]
    assert tick(p, "j5", NOW + 5 * MIN, overlap="allow") == [1, "j5", "queued"]


def test_a_tick_whose_job_routes_away_goes_to_the_outbox_once(p: Project) -> None:
    """A fired tick whose job belongs in another partition writes the tick's bookkeeping
    and the job's outbox entry (kept in the state too) in one step, and no job here; the
    same tick again is refused and writes no second entry. A manual run alike; a job
    written here again clears the entry kept."""
    assert tick(p, "j1", NOW, away=True) == [1, "j1", "queued"]
    assert tick(p, "j2", NOW, away=True) == [-2, str(NOW), "handled"]
    r, k = p.runtime.redis, p.keys()
    entry = codec.dumps(job_entry("fast", job("j1")))
    assert r.lrange(k.outbox, 0, -1) == [entry]
    assert structures(p)["ready"] == [] and not r.exists(k.job("j1"))
    st = state(p)
    assert (st["tick"], st["job"], st["tick_job"], st["n_fired"]) == (str(NOW), "j1", "j1", "1")
    assert st["job_away"] == st["tick_job_away"] == entry
    assert tick(p, "m1", NOW, mode="manual", away=True) == [1, "m1", "queued"]
    st = state(p)
    assert r.llen(k.outbox) == 2 and st["job_away"] != st["tick_job_away"] == entry
    assert tick(p, "j3", NOW + MIN) == [1, "j3", "queued"]
    assert "job_away" not in state(p) and "tick_job_away" not in state(p)


def test_overlap_skip_reads_a_last_job_where_the_caller_found_it(p: Project) -> None:
    """OVERLAP skip with a partitioned queue: the caller's reading of the last job says
    (still in the outbox: queued; its status in another partition; 'here': looked up in
    this partition); a last job the caller did not read (the state moved on since) refuses
    the tick (-4) and writes nothing."""
    r, k = p.runtime.redis, p.keys()
    assert tick(p, "j1", NOW, away=True, overlap="skip")[0] == 1
    assert tick(p, "j2", NOW + MIN, away=True, overlap="skip", seen="j1 relaying") == [3, "j1", "queued"]
    before = state(p)
    for seen in ("-", "j0 done", "j10 done"):
        assert tick(p, "j3", NOW + 2 * MIN, away=True, overlap="skip", seen=seen) == [-4, "j1", "look"]
    assert state(p) == before and r.llen(k.outbox) == 1
    assert tick(p, "j3", NOW + 2 * MIN, away=True, overlap="skip", seen="j1 processing") == [3, "j1", "processing"]
    assert tick(p, "j4", NOW + 3 * MIN, away=True, overlap="skip", seen="j1 done") == [1, "j4", "queued"]
    # Not found anywhere and gone from the outbox: done (looked up here, nothing).
    assert tick(p, "j5", NOW + 4 * MIN, overlap="skip", seen="j4 here") == [1, "j5", "queued"]
    # A last job written here (a keyless tick): 'here' looks it up in this partition.
    assert tick(p, "j6", NOW + 5 * MIN, overlap="skip", seen="j5 here") == [3, "j5", "queued"]


def test_a_placed_tick_job_lands_in_its_partition_once(p: Project) -> None:
    """4 partitions: the job of a tick sent away is placed by its id in the partition its
    resource routes to (outbox.place, as the ticker and the relay do), marked there for
    another count's producers, once however often placed; until it leaves the outbox the
    schedule's reading of it says 'relaying', then its status there."""
    from runner import outbox
    from runner.store import routing
    from runner.store.schedules import last_jobs

    p.write_config(fast="partitions = 4")
    rt, home = p.runtime, p.keys()
    r = next(f"x{i}" for i in range(100) if routing.partition_of(f"r:res:x{i}", 4) != home.partition)
    j = job("j1")._replace(type="resource", payload=codec.dumps({"r": r}), resource_key=f"res:{r}",
                           limits=f"1 r:res:{r}")
    entry = codec.dumps(job_entry("fast", j))
    assert list(rt.scripts.tick(home, "s", j, mode="fire", tick_ms=NOW, digest="d1", born_ms=NOW, overlap="allow",
                                missed=0, late_ms=0, now_ms=NOW, away=entry)) == [1, "j1", "queued"]
    assert last_jobs(rt.redis, rt.scripts, [(home, "s")], rt.parts) == ["j1 relaying"]
    there = rt.parts["fast"][routing.partition_of(f"r:res:{r}", 4)]
    assert outbox.place(rt, [entry]) == [entry]
    assert outbox.place(rt, [entry]) == [entry]  # the ticker and the relay both: placed once
    assert rt.redis.lrange(there.ready, 0, -1) == ["j1"] and rt.redis.exists(there.limit(f"r:res:{r}") + ":at")
    assert last_jobs(rt.redis, rt.scripts, [(home, "s")], rt.parts) == ["j1 relaying"]
    outbox.remove(rt, home, [entry])
    assert rt.redis.llen(home.outbox) == 0
    assert last_jobs(rt.redis, rt.scripts, [(home, "s")], rt.parts) == ["j1 queued"]


def test_another_definition_is_refused(p: Project) -> None:
    """A tick under a definition the state does not hold (a newer deploy's, or a removed
    schedule's tombstone) enqueues nothing."""
    assert tick(p, "j1", NOW)[0] == 1
    assert tick(p, "j2", NOW + MIN, digest="old") == [-3, "d1", "superseded"]
    k = p.keys()
    assert p.runtime.scripts.adopt(k, NOW + 10, 60_000, [], ["s"]) == [1]
    assert tick(p, "j3", NOW + 2 * MIN) == [-3, "", "superseded"]
    assert structures(p)["ready"] == ["j1"]


def test_manual_trigger_ignores_order_and_overlap(p: Project) -> None:
    assert tick(p, "j1", NOW, overlap="skip")[0] == 1
    assert tick(p, "m1", NOW - MIN, mode="manual", overlap="skip") == [1, "m1", "queued"]
    st = state(p)
    assert st["job"] == "m1" and st["tick"] == str(NOW) and st["n_manual"] == "1"


def test_adopt_first_seen_wins_and_retires_what_it_no_longer_defines(p: Project) -> None:
    """The definition first seen most recently takes over; an older one is told it lost,
    also when its worker adopts again later; a schedule the newest code removed is
    retired (a tombstone that expires) once its holders are quiet, unless a still newer
    definition holds it."""
    k, sc, r = p.keys(), p.runtime.scripts, p.runtime.redis
    assert sc.adopt(k, NOW, 60_000, [("s", "d1"), ("t", "d1")], []) == [1, NOW, "d1", 1, NOW, "d1"]
    assert r.hgetall(k.schedules) == {"s": "d1", "t": "d1"}
    tick(p, "j1", NOW + MIN)
    # The same definition again (a restart): the floor is its last handled tick.
    assert sc.adopt(k, NOW + 5, 60_000, [("s", "d1")], []) == [1, NOW + MIN, "d1"]
    # A deploy changes s and removes t: it takes over from the tick it was born at; t's
    # holders live (an older release that never knew t looks the same), so t is kept ...
    assert sc.adopt(k, NOW + 2 * MIN, 60_000, [("s", "d2")], ["t"]) == [1, NOW + 2 * MIN, "d2", 0]
    assert r.hget(k.schedule("t"), "def") == "d1"
    # ... until they have been quiet since before stale_before: then it is retired.
    assert sc.adopt(k, NOW + 2 * MIN, 60_000, [], ["t"], stale_before_ms=NOW + MIN, now_ms=NOW + 3 * MIN) == [1]
    assert sc.adopt(k, NOW + 2 * MIN, 60_000, [], ["t"], stale_before_ms=NOW + MIN, now_ms=NOW + 3 * MIN) == [-1]
    assert r.hgetall(k.schedules) == {"s": "d2"}
    assert 0 < r.pttl(k.schedule("t")) <= 60_000 and r.pttl(k.schedule("s")) == -1
    # A worker still on the old code adopts again, before t's retirement: it lost both.
    assert sc.adopt(k, NOW + 3 * MIN - 1, 60_000, [("s", "d1"), ("t", "d1")], []) == [
        0, NOW + 2 * MIN, "d2", 0, NOW + 3 * MIN, ""]
    # Born after d2 (restarted during the deploy, or a rollback), d1 was still first seen
    # before d2: s stays d2's. t, retired as no living worker's, comes back: this worker
    # lives and defines it (retired again once it is gone, standby.py).
    assert sc.adopt(k, NOW + 4 * MIN, 60_000, [("s", "d1"), ("t", "d1")], []) == [
        0, NOW + 2 * MIN, "d2", 1, NOW + 4 * MIN, "d1"]
    assert r.pttl(k.schedule("t")) == -1
    # d1 takes s back once d2's holders are quiet (a rollback completed).
    assert sc.adopt(k, NOW + 5 * MIN, 60_000, [("s", "d1")], [], stale_before_ms=NOW + 3 * MIN,
                    now_ms=NOW + 5 * MIN) == [1, NOW + 2 * MIN, "d1"]
    # Retiring is refused where a newer definition holds the schedule.
    assert sc.adopt(k, NOW + 2 * MIN, 60_000, [], ["s"]) == [0]


def test_a_definition_first_seen_earlier_never_wins_by_adopting_later(p: Project) -> None:
    """Each definition records when Redis first saw it; adopting it again later (a worker
    of that release restarted mid-deploy) never makes it newer than one first seen after."""
    k, sc, r = p.keys(), p.runtime.scripts, p.runtime.redis
    assert sc.adopt(k, NOW, 60_000, [("s", "aa:01")], [])[0] == 1  # release A
    assert sc.adopt(k, NOW + MIN, 60_000, [("s", "aa:02")], [])[0] == 1  # release B takes over
    assert sc.adopt(k, NOW + 5 * MIN, 60_000, [("s", "aa:01")], []) == [0, NOW, "aa:02"]  # A restarts
    assert r.hget(k.schedule("s"), "first:aa:01") == str(NOW)
    assert r.hget(k.schedule("s"), "first:aa:02") == str(NOW + MIN)
    assert sc.adopt(k, NOW + 6 * MIN, 60_000, [("s", "aa:03")], [])[0] == 1  # release C, never seen
    assert sc.adopt(k, NOW + 7 * MIN, 60_000, [("s", "aa:02")], [])[0] == 0  # B restarts after C
    assert r.hget(k.schedule("s"), "def") == "aa:03"


def test_adopt_keeps_the_timeline_of_a_definition_with_the_same_timing(p: Project) -> None:
    """A digest is "<timing>:<whole>": a newer definition with the same timing (a new
    payload) takes over from the last handled tick, so the ticks missed while the deploy
    restarted are caught up; a new timing starts at its born time."""
    k, sc = p.keys(), p.runtime.scripts
    assert sc.adopt(k, NOW, 60_000, [("s", "aa:01")], []) == [1, NOW, "aa:01"]
    tick(p, "j1", NOW + MIN, digest="aa:01")
    assert sc.adopt(k, NOW + 5 * MIN, 60_000, [("s", "aa:02")], []) == [1, NOW + MIN, "aa:02"]
    assert sc.adopt(k, NOW + 6 * MIN, 60_000, [("s", "bb:03")], []) == [1, NOW + 6 * MIN, "bb:03"]
    # The first definition again (a restart of the older release): first seen before, it lost.
    assert sc.adopt(k, NOW + 7 * MIN, 60_000, [("s", "aa:01")], []) == [0, NOW + 6 * MIN, "bb:03"]
    # Back to the first timing in a new definition: a timeline of its own again, from its born time.
    assert sc.adopt(k, NOW + 8 * MIN, 60_000, [("s", "aa:04")], []) == [1, NOW + 8 * MIN, "aa:04"]


def test_an_older_release_born_later_never_retires_what_living_workers_hold(p: Project) -> None:
    """A newer release adds t; a worker of the older release (born later: a restart in a
    rolling deploy, or `runner dev` from an older checkout) lacks t and asks to retire it:
    t's holders live, so it stays. A reload of the worker that defined t removes it at
    once (forced); a schedule whose holders never said they live is retired by born."""
    k, sc, r = p.keys(), p.runtime.scripts, p.runtime.redis
    sc.adopt(k, NOW, 60_000, [("s", "aa:01")], [])
    sc.adopt(k, NOW + MIN, 60_000, [("s", "aa:01"), ("t", "aa:01")], [])  # the newer release adds t
    sc.alive(k, NOW + 2 * MIN, [("s", "aa:01"), ("t", "aa:01")])
    assert sc.adopt(k, NOW + 3 * MIN, 60_000, [("s", "aa:01")], ["t"]) == [1, NOW, "aa:01", 0]
    assert r.hgetall(k.schedules) == {"s": "aa:01", "t": "aa:01"} and r.hget(k.schedule("t"), "def") == "aa:01"
    # Quiet since 2 min, but stale_before is older: kept.
    assert sc.adopt(k, NOW + 3 * MIN, 60_000, [], ["t"], stale_before_ms=NOW + MIN, now_ms=NOW + 4 * MIN) == [0]
    assert sc.adopt(k, NOW + 4 * MIN, 60_000, [], ["t"], forced=1) == [1]  # the reload that removed t
    assert r.hgetall(k.schedules) == {"s": "aa:01"}
    sc.adopt(k, NOW + 5 * MIN, 60_000, [("u", "aa:01")], [])
    r.hdel(k.schedules_seen, "u")  # a holder of a version that never says it lives
    assert sc.adopt(k, NOW + 6 * MIN, 60_000, [], ["u"]) == [1]


def test_alive_stamps_only_what_it_holds_and_names_what_it_lost(p: Project) -> None:
    """A ticker's heartbeat stamps the seen time of the schedules whose state holds its
    digest, never the winner's for it, and returns the others with the winning digest."""
    k, sc, r = p.keys(), p.runtime.scripts, p.runtime.redis
    sc.adopt(k, NOW, 60_000, [("s", "aa:01"), ("t", "aa:01")], [])
    sc.adopt(k, NOW + MIN, 60_000, [("s", "aa:02")], ["t"], forced=1)  # a reload removed t
    assert sc.alive(k, NOW + 2 * MIN, [("s", "aa:01"), ("t", "aa:01"), ("new", "aa:01")]) == [
        ("s", "aa:02"), ("t", "")]
    assert r.hgetall(k.schedules_seen) == {"s": str(NOW + MIN), "new": str(NOW + 2 * MIN)}
    assert sc.alive(k, NOW + 3 * MIN, [("s", "aa:02")]) == []
    assert r.hget(k.schedules_seen, "s") == str(NOW + 3 * MIN)


def test_a_takeover_wins_only_from_holders_gone_quiet(p: Project) -> None:
    """An older definition takes a schedule back (stale_before given) only when the
    winner's holders were last seen before stale_before: not while they say they live,
    not when they never said so (a version that does not), not a removed schedule."""
    k, sc, r = p.keys(), p.runtime.scripts, p.runtime.redis
    sc.adopt(k, NOW, 60_000, [("s", "aa:01"), ("t", "aa:01")], [])
    sc.adopt(k, NOW + MIN, 60_000, [("s", "aa:02"), ("t", "aa:02")], [])  # the canary; seen = its born
    tick(p, "j1", NOW + 2 * MIN, digest="aa:02")
    later = NOW + 10 * MIN
    sc.alive(k, later - 30_000, [("s", "aa:02")])  # s's canary said it lives 30 s ago; t's not since its start
    assert sc.adopt(k, later, 60_000, [("s", "aa:01"), ("t", "aa:01")], [], stale_before_ms=later - MIN) == [
        0, NOW + 2 * MIN, "aa:02", 1, NOW, "aa:01"]
    assert state(p)["def"] == "aa:02" and r.hget(k.schedules, "t") == "aa:01"
    assert r.hget(k.schedules_seen, "t") == str(later)
    r.hdel(k.schedules_seen, "s")  # a holder that never says it lives: left alone
    assert sc.adopt(k, later, 60_000, [("s", "aa:01")], [], stale_before_ms=later - MIN)[0] == 0
    sc.adopt(k, later + 1, 60_000, [], ["s"], forced=1)  # removed by a newer deploy
    r.hset(k.schedules_seen, "s", NOW)
    assert sc.adopt(k, later + 2, 60_000, [("s", "aa:01")], [], stale_before_ms=later)[0] == 0


def test_a_takeover_leaves_a_rollback_that_never_says_it_lives_alone(p: Project) -> None:
    """A rollback to a version that does not say it lives takes the schedule over (a plain
    digest, born later); the newer code's lingering standby finds only its own release's
    old stamp (seen before the rollback won) and must not take it back."""
    k, sc, r = p.keys(), p.runtime.scripts, p.runtime.redis
    sc.adopt(k, NOW, 60_000, [("s", "aa:02")], [])
    sc.alive(k, NOW + 30_000, [("s", "aa:02")])
    r.hset(k.schedule("s"), mapping={"def": "0123456789abcdef", "def_at": NOW + MIN})  # the rollback's adopt
    later = NOW + 3 * MIN
    assert sc.adopt(k, NOW, 60_000, [("s", "aa:02")], [], stale_before_ms=later - MIN, now_ms=later)[0] == 0
    assert sc.adopt(k, NOW, 60_000, [("s", "aa:02")], [], now_ms=later)[0] == 0  # nor by born: it is older
    assert r.hget(k.schedule("s"), "def") == "0123456789abcdef"


def test_after_a_takeover_the_newest_living_definition_wins_by_born(p: Project) -> None:
    """v0, v1 (a rolling deploy) and a canary v2 were born in that order; the canary is
    withdrawn and v0's standby takes over first. It writes its own born, so v1, newer and
    still running, wins the schedule at its next look, and v0 stands by again."""
    k, sc, r = p.keys(), p.runtime.scripts, p.runtime.redis
    sc.adopt(k, NOW, 60_000, [("s", "aa:00")], [])
    sc.adopt(k, NOW + MIN, 60_000, [("s", "aa:01")], [])
    sc.adopt(k, NOW + 2 * MIN, 60_000, [("s", "aa:02")], [])
    later = NOW + 10 * MIN
    assert sc.adopt(k, NOW, 60_000, [("s", "aa:00")], [], stale_before_ms=later - MIN, now_ms=later)[0] == 1
    assert r.hget(k.schedule("s"), "def_at") == str(NOW)
    assert sc.adopt(k, NOW + MIN, 60_000, [("s", "aa:01")], [], now_ms=later + 1000)[0] == 1
    assert sc.adopt(k, NOW, 60_000, [("s", "aa:00")], [], now_ms=later + 2000)[0] == 0
    assert r.hget(k.schedule("s"), "def") == "aa:01"


def test_a_takeover_from_another_timing_keeps_the_gap_for_missed(p: Project) -> None:
    """A canary with another cron held the schedule and last ticked at +3 min; taking it
    back keeps the timeline: the floor is that tick, so the ticks of the gap are missed
    ticks, run under MISSED, not dropped."""
    k, sc = p.keys(), p.runtime.scripts
    sc.adopt(k, NOW, 60_000, [("s", "aa:01")], [])
    tick(p, "j1", NOW + MIN, digest="aa:01")
    sc.adopt(k, NOW + 2 * MIN, 60_000, [("s", "bb:02")], [])
    tick(p, "j2", NOW + 3 * MIN, digest="bb:02", born=NOW + 2 * MIN)
    later = NOW + 10 * MIN
    assert sc.adopt(k, NOW, 60_000, [("s", "aa:01")], [], stale_before_ms=later - MIN, now_ms=later) == [
        1, NOW + 3 * MIN, "aa:01"]


def test_a_standbys_rejoin_never_brings_back_a_removed_or_lost_schedule(p: Project) -> None:
    """A standby adopts again at each heartbeat (stale_before -1: a rejoin). It wins a
    schedule held by an older definition, never one a newer deploy removed, nor one whose
    state is gone (the removal's tombstone expired after 7 days, or data was lost): that
    would fire a schedule the newest code no longer defines."""
    k, sc, r = p.keys(), p.runtime.scripts, p.runtime.redis
    sc.adopt(k, NOW, 60_000, [("s", "aa:01")], [])
    sc.adopt(k, NOW + MIN, 60_000, [("s", "bb:02")], [])  # a canary: the first stands by
    assert sc.adopt(k, NOW + 2 * MIN, 60_000, [], ["s"], forced=1) == [1]  # a newer deploy removes s
    assert sc.adopt(k, NOW, 60_000, [("s", "aa:01")], [], stale_before_ms=-1, now_ms=NOW + 3 * MIN) == [
        0, NOW + 2 * MIN, ""]
    r.delete(k.schedule("s"))  # the tombstone expires
    assert sc.adopt(k, NOW, 60_000, [("s", "aa:01")], [], stale_before_ms=-1, now_ms=NOW + 9 * MIN)[0] == 0
    assert not r.exists(k.schedule("s"))
    # Held by an older definition (a takeover wrote its own born): the newer one rejoins,
    # its other timing starting now, not at its own load time.
    sc.adopt(k, NOW - MIN, 60_000, [("s", "cc:00")], [])
    assert sc.adopt(k, NOW, 60_000, [("s", "aa:01")], [], stale_before_ms=-1, now_ms=NOW + 10 * MIN) == [
        1, NOW + 10 * MIN, "aa:01"]
