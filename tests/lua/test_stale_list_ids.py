"""A worker of an earlier release wakes, signals or cancels a suspended or delayed job
without knowing the list indexes (delayed, sleeping, waiting), so it leaves the job's id
there. A list page skips such an id and takes it off its index in the same step; an id
whose job came back to the index's status before that step keeps its place."""

from __future__ import annotations

from typing import Any

import pytest
from test_scripts import NOW, enqueue, new
from test_suspended_lists import _suspend

from conftest import Project, assert_suspended_indexed, keep_functions


@pytest.fixture
def p(project: Project) -> Project:
    return keep_functions(project)  # (the scripts read no function)


def _woken_by_an_earlier_release(p: Project, job_id: str) -> None:
    """What an earlier release's promote or signal writes: off scheduled, queued, on
    ready; the list indexes it does not know are left as they were."""
    r, k = p.runtime.redis, p.keys()
    pipe = r.pipeline(transaction=True)
    pipe.zrem(k.scheduled, job_id)
    pipe.hset(k.state(job_id), "status", "queued")
    pipe.lpush(k.ready, job_id)
    pipe.execute()


def _seed(p: Project) -> dict[str, list[str]]:
    sleepers = [f"s{n:02d}" for n in range(12)]
    waiters = [f"w{n:02d}" for n in range(12)]
    _suspend(p, sleepers, "sleep", lambda i: NOW + 100_000 + int(i[1:]))
    _suspend(p, waiters, "wait", lambda i: NOW + 200_000 + int(i[1:]))
    delayed = [f"d{n:02d}" for n in range(12)]
    enqueue(p, *(new(i, delay=300_000 + n) for n, i in enumerate(delayed)))
    return {"sleeping": sleepers, "waiting": waiters, "scheduled": delayed}


def _listed(p: Project, status: str, limit: int) -> list[str]:
    shown: list[str] = []
    cursor: str | None = None
    while True:
        page = p.client.jobs(status, queue="fast", limit=limit, cursor=cursor)
        shown += [j.id for j in page.jobs]
        cursor = page.cursor
        if cursor is None:
            return shown


@pytest.mark.parametrize("status,index", [("sleeping", "sleeping"), ("waiting", "waiting"),
                                          ("scheduled", "delayed")])
def test_a_page_takes_off_the_stale_ids_it_skips(p: Project, status: str, index: str) -> None:
    """Every other job of an index woken by an earlier release: the list shows the ones
    that stayed, once each; the stale ids are off the index after the read, the others
    are all still there, and the indexes match the scheduled set again."""
    r, k = p.runtime.redis, p.keys()
    ids = _seed(p)[status]
    stale = ids[::2]
    for job_id in stale:
        _woken_by_an_earlier_release(p, job_id)
    key: Any = getattr(k, index)
    assert set(stale) <= set(r.zrange(key, 0, -1))  # the leak
    shown = _listed(p, status, limit=4)
    assert sorted(shown) == sorted(set(ids) - set(stale))
    assert len(shown) == len(set(shown))
    assert sorted(r.zrange(key, 0, -1)) == sorted(set(ids) - set(stale))
    assert_suspended_indexed(p)


def test_an_id_whose_job_came_back_keeps_its_place(p: Project) -> None:
    """The check of the status and the removal are one step: of two ids a page skipped,
    the one whose job is sleeping again by then stays in the sleeping index, at its due
    time; the one still gone leaves."""
    r, k, s = p.runtime.redis, p.keys(), p.runtime.scripts
    sleepers = _seed(p)["sleeping"]
    back, gone = sleepers[0], sleepers[1]
    due = r.zscore(k.sleeping, back)
    for job_id in (back, gone):
        _woken_by_an_earlier_release(p, job_id)
    # It sleeps again before the prune (as suspend would leave it: scheduled, sleeping).
    r.lrem(k.ready, 0, back)
    r.hset(k.state(back), "status", "sleeping")
    r.zadd(k.scheduled, {back: due})
    assert s.prune(k.sleeping, k, [back, gone], ("sleeping",)) == 1
    assert r.zscore(k.sleeping, back) == due
    assert r.zscore(k.sleeping, gone) is None
    assert_suspended_indexed(p)


def test_a_sleeper_whose_state_was_damaged_keeps_its_place(p: Project) -> None:
    """The sleeping set is a sleeping job's only structure: a page skips a sleeper whose
    state another writer damaged (another type, gone or without its status, the record
    still there), and the prune leaves it for promote to bury with the reason; it takes
    off only the ids whose job is elsewhere (a known status) or gone (no record, no state)."""
    r, k, s = p.runtime.redis, p.keys(), p.runtime.scripts
    sleepers = _seed(p)["sleeping"]
    typed, lost, blank, woken = sleepers[:4]
    r.delete(k.state(typed))
    r.set(k.state(typed), "garbage")
    r.delete(k.state(lost))
    r.hdel(k.state(blank), "status")
    _woken_by_an_earlier_release(p, woken)
    r.zadd(k.sleeping, {"gone": NOW + 100_000})
    _listed(p, "sleeping", limit=4)
    assert {typed, lost, blank} <= set(r.zrange(k.sleeping, 0, -1))
    s.prune(k.sleeping, k, [typed, lost, blank, woken, "gone"], ("sleeping",))
    assert {typed, lost, blank} <= set(r.zrange(k.sleeping, 0, -1))
    assert r.zscore(k.sleeping, woken) is None and r.zscore(k.sleeping, "gone") is None


def test_the_walk_indexes_jobs_delayed_before_the_index(p: Project) -> None:
    """Jobs delayed by a release before the scheduled list's index are in the scheduled set
    only; walking it (index_delayed.lua, 5 ids a call) puts every scheduled one in the index
    at its due time, not a sleeper or a waiter, while the soonest due are promoted between
    two calls, and the walk ends."""
    r, k, s = p.runtime.redis, p.keys(), p.runtime.scripts
    ids = _seed(p)
    r.delete(k.delayed)  # as the release before left it
    at, calls = 0, 0
    while at >= 0:
        at, _ = s.index_delayed(k, at, 5)
        calls += 1
        if calls == 2:  # the two soonest scheduled jobs (and every suspended one) run
            moved, _ = s.promote(k, 1000, now_ms=NOW + 300_001)
            assert moved == 26
    assert calls <= 9
    assert sorted(r.zrange(k.delayed, 0, -1)) == ids["scheduled"][2:]
    assert_suspended_indexed(p)


def test_the_walk_indexes_jobs_suspended_before_the_indexes(p: Project) -> None:
    """Sleeping and waiting jobs suspended by a release before their indexes were in the
    scheduled set only, and no list showed them until they woke: the walk indexes each
    in its own index at its due time, as it does delayed ones, and moves the sleeping
    ones out of scheduled into the sleeping set (where this release keeps them alone),
    walking every id although the set shrinks under it."""
    r, k, s = p.runtime.redis, p.keys(), p.runtime.scripts
    _seed(p)
    want = {n: dict(r.zrange(getattr(k, n), 0, -1, withscores=True)) for n in ("delayed", "sleeping", "waiting")}
    assert want["sleeping"] and want["waiting"]
    r.zadd(k.scheduled, want["sleeping"])  # as the release before left them
    for n in want:
        r.delete(getattr(k, n))
    at = 0
    while at >= 0:
        at, _ = s.index_delayed(k, at, 5)
    for n, entries in want.items():
        assert dict(r.zrange(getattr(k, n), 0, -1, withscores=True)) == entries, n
    assert not set(r.zrange(k.scheduled, 0, -1)) & set(want["sleeping"])
    assert_suspended_indexed(p)


def test_the_walk_ends_on_a_scheduled_key_of_another_type(p: Project) -> None:
    """A damaged scheduled key (a string) ends the walk at once, with nothing indexed: the
    scheduler does not fail a pass on it every time (the reclaim's check reports it)."""
    r, k, s = p.runtime.redis, p.keys(), p.runtime.scripts
    r.set(k.scheduled, "not a set")
    assert s.index_delayed(k, 0, 5) == (-1, 0)
    assert not r.exists(k.delayed)
