"""The sleeping and waiting lists page through their own jobs, not through the scheduled
set the waiting ones share with delayed jobs (sleeping ones wait in their own set): waiting jobs behind thousands of
sleepers come on the first page, and paging through the sleepers while some wake, some
are run now and some are cancelled shows every one that stayed asleep once, never one
twice, with no empty page before the last; the scheduled list does the same among
sleepers. The scripts keep each index equal to the scheduled ids of its status."""

from __future__ import annotations

from typing import Any

import pytest
from test_scripts import NOW, claim, enqueue, new

from runner.store.scripts import Suspension

from conftest import Project, assert_suspended_indexed, keep_functions

SLEEPERS, WAITERS = 3000, 5


@pytest.fixture
def p(project: Project) -> Project:
    return keep_functions(project)  # (the scripts read no function)


def _suspend(p: Project, ids: list[str], kind: str, due: Any) -> None:
    for start in range(0, len(ids), 500):
        chunk = ids[start:start + 500]
        enqueue(p, *(new(i) for i in chunk))
        claimed = {job[0]: job[1] for job in claim(p, n=len(chunk))}
        assert sorted(claimed) == sorted(chunk)
        batch = p.runtime.scripts.batch()
        for i in chunk:
            entry = f'{{"name":"{kind}","kind":"{kind if kind == "sleep" else "signal"}","status":"waiting"}}'
            s = Suspension(i, claimed[i], 0, entry, None, due(i), 1000, 4 << 20, "",
                           kind="sleep" if kind == "sleep" else "signal", signal="go")
            p.runtime.scripts.suspend(p.keys(), s, pipe=batch, now_ms=NOW + 1)
        assert all(list(code) == [1] for code in batch.execute())


def _seed(p: Project) -> tuple[list[str], list[str]]:
    sleepers = [f"s{n:05d}" for n in range(SLEEPERS)]
    waiters = [f"w{n}" for n in range(WAITERS)]
    # The waiters' timeouts fall before every sleeper's end: newest first, all the
    # sleepers come ahead of them in the scheduled set.
    _suspend(p, waiters, "wait", lambda i: NOW + 50_000 + int(i[1:]))
    _suspend(p, sleepers, "sleep", lambda i: NOW + 100_000 + int(i[1:]) * 10)
    return sleepers, waiters


def test_waiting_jobs_behind_thousands_of_sleepers_are_on_the_first_pages(p: Project) -> None:
    """5 waiters due before 3,000 sleepers: the waiting list shows them two a page, no
    page empty, and its last page says so (no cursor); the scheduled set holds the
    waiters, the sleeping set the sleepers."""
    _, waiters = _seed(p)
    assert p.runtime.redis.zcard(p.keys().scheduled) == WAITERS
    assert p.runtime.redis.zcard(p.keys().sleeping) == SLEEPERS
    shown: list[str] = []
    cursor: str | None = None
    for _ in range(WAITERS):
        page = p.client.jobs("waiting", queue="fast", limit=2, cursor=cursor)
        assert page.jobs, "an empty page before the last"
        assert all(j.fields["status"] == "waiting" for j in page.jobs)
        shown += [j.id for j in page.jobs]
        cursor = page.cursor
        if cursor is None:
            break
    assert shown == sorted(waiters, reverse=True)  # latest due first
    assert cursor is None
    assert_suspended_indexed(p)


def test_paging_sleepers_while_they_wake_run_now_and_cancel(p: Project) -> None:
    """Between pages of 400: the 150 due soonest wake (promote), one waiter is signalled,
    one sleeper not yet shown and one already shown are cancelled, one is run now. Every
    sleeper that stayed asleep is shown once, none twice, no page is empty before the
    last, and the indexes match scheduled after every move."""
    sleepers, waiters = _seed(p)
    r, k, s = p.runtime.redis, p.keys(), p.runtime.scripts
    gone: set[str] = set()
    shown: list[str] = []
    cursor: str | None = None
    pages = 0
    now = NOW + 100_000
    while True:
        page = p.client.jobs("sleeping", queue="fast", limit=400, cursor=cursor)
        pages += 1
        assert page.jobs or page.cursor is None, "an empty page with a cursor"
        shown += [j.id for j in page.jobs]
        cursor = page.cursor
        if cursor is None:
            break
        # The soonest due (the end of the list, newest first) wake.
        now += 150 * 10
        moved, _ = s.promote(k, 1000, now_ms=now)
        gone |= {i for i in sleepers if NOW + 100_000 + int(i[1:]) * 10 <= now}
        assert moved >= 1
        s.signal(k, waiters[pages % WAITERS], "go", "1")
        ahead = sorted(set(sleepers) - gone - set(shown), reverse=True)
        for job_id in (ahead[len(ahead) // 2], shown[-1]):
            code, _ = s.cancel(k, job_id, 60_000)
            assert code == 1
            gone.add(job_id)
        ahead.remove(ahead[len(ahead) // 2])
        code, _ = s.run_now(k, ahead[0])
        assert code == 1
        gone.add(ahead[0])
        assert_suspended_indexed(p)
    assert len(shown) == len(set(shown)), "a job shown twice"
    stayed = set(sleepers) - gone
    assert stayed <= set(shown), sorted(stayed - set(shown))[:5]
    assert pages <= SLEEPERS // 400 + 2
    assert r.zcard(k.sleeping) == len([i for i in sleepers if i not in gone])


def test_paging_scheduled_jobs_among_sleepers_while_they_move(p: Project) -> None:
    """1,200 delayed jobs between 1,200 sleepers (due times interleaved): the scheduled list
    pages through its own index. Between pages of 300 the 100 due soonest run (promote),
    one delayed job not yet shown and one shown are cancelled, one is run now. Every job
    that stayed scheduled is shown once, none twice, no page is empty before the last,
    and the indexes match scheduled after every move."""
    r, k, s = p.runtime.redis, p.keys(), p.runtime.scripts
    delayed = [f"d{n:05d}" for n in range(1200)]
    sleepers = [f"s{n:05d}" for n in range(1200)]
    _suspend(p, sleepers, "sleep", lambda i: NOW + 100_000 + int(i[1:]) * 10)
    enqueue(p, *(new(i, delay=100_005 + int(i[1:]) * 10) for i in delayed))
    gone: set[str] = set()
    shown: list[str] = []
    cursor: str | None = None
    now, moves = NOW + 100_000, 0
    while True:
        page = p.client.jobs("scheduled", queue="fast", limit=300, cursor=cursor)
        assert page.jobs or page.cursor is None, "an empty page with a cursor"
        assert all(j.fields["status"] == "scheduled" for j in page.jobs)
        shown += [j.id for j in page.jobs]
        cursor = page.cursor
        if cursor is None:
            break
        now += 100 * 10
        s.promote(k, 1000, now_ms=now)
        gone |= {i for i in delayed if NOW + 100_005 + int(i[1:]) * 10 <= now}
        ahead = sorted(set(delayed) - gone - set(shown), reverse=True)
        moves += len(ahead) >= 2
        if len(ahead) >= 2:
            for job_id in {ahead[len(ahead) // 2], shown[-1]} - gone:
                code, _ = s.cancel(k, job_id, 60_000)
                assert code == 1
                gone.add(job_id)
            ahead.remove(ahead[len(ahead) // 2])
            code, _ = s.run_now(k, ahead[0])
            assert code == 1
            gone.add(ahead[0])
        assert_suspended_indexed(p)
    assert moves >= 2
    assert len(shown) == len(set(shown)), "a job shown twice"
    stayed = set(delayed) - gone
    assert stayed <= set(shown), sorted(stayed - set(shown))[:5]
    assert r.zcard(k.delayed) == len(stayed)
