"""The queued list followed page by page while, between two pages, random cancels (of
jobs just shown, of the next ones not yet shown, of any), claims from the consumer end
and new jobs at the head change the ready list, on a real server (hypothesis). However
they mix, a traversal ends, shows no job twice, and shows every job that stayed queued
from its first page to its last: a bulk cancel of every id the cursor keeps is not a
drain past them."""

from __future__ import annotations

import contextlib
import itertools
import uuid
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runner.client import Client, Request
from runner.errors import JobEnded
from runner.runtime import Runtime
from runner.worker.fetcher import CLAIM_FIELDS

from conftest import Project, size

# Between two pages: cancel the page's jobs and the next n not shown, cancel n of the
# next not shown, cancel the i-th job of the list, claim n, enqueue n.
STEP = st.one_of(
    st.tuples(st.just("cancel_page"), st.integers(0, 4)),
    st.tuples(st.just("cancel_next"), st.integers(1, 4)),
    st.tuples(st.just("cancel_at"), st.integers(0, 60)),
    st.tuples(st.just("claim"), st.integers(1, 6)),
    st.tuples(st.just("push"), st.integers(1, 4)),
)


def test_the_queued_list_holds_under_cancels_claims_and_pushes_between_pages(project: Project) -> None:
    """Random pages (1 to 6 jobs) over 10 to 40 queued jobs, with 0 to 3 random steps
    between every two pages (STEP): every traversal ends, shows no job twice and shows
    each job queued before it began that was neither cancelled nor claimed."""
    base = project.config()
    seq = itertools.count()

    @settings(max_examples=int(size("MODEL_EXAMPLES", 25, 300)), deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(jobs=st.integers(10, 40), limit=st.integers(1, 6),
           steps=st.lists(st.lists(STEP, max_size=3), max_size=40))
    def traverse(jobs: int, limit: int, steps: list[list[tuple[str, int]]]) -> None:
        cfg = replace(base, redis=replace(base.redis, prefix=f"m{uuid.uuid4().hex[:10]}"))
        rt = Runtime.create(cfg)
        try:
            c, k, r = Client(rt), rt.keys["fast"], rt.redis
            first = [m.id for m in c.enqueue_many([Request("record", {"n": i}) for i in range(jobs)])]  # type: ignore[union-attr]
            left: set[str] = set()  # cancelled or claimed during the traversal
            seen: list[str] = []
            cursor: str | None = None
            for n in range(500):
                page = c.jobs("queued", queue="fast", limit=limit, cursor=cursor)
                shown = [j.id for j in page.jobs]
                seen += shown
                cursor = page.cursor
                if cursor is None:
                    break
                for kind, arg in steps[n] if n < len(steps) else []:
                    ready = r.lrange(k.ready, 0, -1)
                    past = ready[ready.index(shown[-1]) + 1:] if shown and shown[-1] in ready else []
                    if kind == "cancel_page":
                        targets = [*shown, *past[:arg]]
                    elif kind == "cancel_next":
                        targets = past[:arg]
                    elif kind == "cancel_at":
                        targets = ready[arg:arg + 1]
                    elif kind == "claim":
                        reply = rt.scripts.claim(k, n=arg, start=arg, lease_ms=600_000,
                                                 token_base=f"w.{next(seq)}", dead_ttl_ms=10**9, done_ttl_ms=10**9)
                        left.update(reply[i] for i in range(2, len(reply), CLAIM_FIELDS))
                        continue
                    else:
                        c.enqueue_many([Request("record", {"new": i}) for i in range(arg)])
                        continue
                    for job_id in targets:
                        with contextlib.suppress(JobEnded):  # (cancelled by an earlier step)
                            if c.cancel(job_id) == "cancelled":
                                left.add(job_id)
            else:
                raise AssertionError("the cursor did not end")
            assert len(seen) == len(set(seen)), f"shown twice: {sorted({i for i in seen if seen.count(i) > 1})}"
            missed = set(first) - left - set(seen)
            assert not missed, f"{len(missed)} jobs that stayed queued never shown"
        finally:
            rt.redis.delete(*rt.redis.keys(f"{cfg.redis.prefix}:*") or ["-"])
            rt.close()

    traverse()


def test_a_long_chain_of_cancelled_ids_is_followed_over_bounded_calls(project: Project) -> None:
    """The first id not yet shown and the 1,499 after it were each taken out of ready by a
    cancel, each leaving the next in its place: one call follows at most 1,000 of them and
    hands back where it stopped (no ids), and the next goes on to the job still queued."""
    rt, k, r = project.runtime, project.keys(), project.runtime.redis
    chain = [f"x{n:04d}" for n in range(1500)]
    r.rpush(k.ready, "new", "stays")
    pipe = r.pipeline(transaction=False)
    for here, nxt in itertools.pairwise([*chain, "stays"]):
        pipe.hset(k.state(here), mapping={"status": "cancelled", "list_next": nxt})
    pipe.execute()
    place, ids, _ = rt.scripts.seek_list(k, k.ready, 10, (1500, chain[0], "shown"), ready=True)
    assert ids == [] and place is not None and place[1] in chain[1:] and place[2] == "shown"
    place, ids, _ = rt.scripts.seek_list(k, k.ready, 10, place, ready=True)
    assert ids == ["stays"] and place is None


def test_a_deferred_page_finds_its_place_past_many_woken_jobs_sent_back_to_the_head(project: Project) -> None:
    """A limit's waiters list (oldest at the head) is paged from its tail; between two
    pages 1,200 woken jobs that lost their reserved slots go back to its head (as
    parking.lua does: LPUSH, counted in the list's :heads), more than the page's search
    looked past from the head. The next page goes on just before the last id shown.
    (It found neither id within its reach, and the list counted as read.)"""
    rt, k, r = project.runtime, project.keys(), project.runtime.redis
    key = k.waiters("lim")
    r.rpush(key, *[f"d{n:04d}" for n in range(300)])
    pipe = r.pipeline(transaction=False)
    for n in range(300):
        pipe.hset(k.state(f"d{n:04d}"), mapping={"status": "deferred"})
    pipe.execute()
    place, ids, pushed = rt.scripts.seek_list(k, key, 50, None)
    assert ids == [f"d{n:04d}" for n in range(299, 249, -1)] and place is not None
    back = [f"w{n:04d}" for n in range(1_200)]
    for i in range(0, len(back), 400):
        r.lpush(key, *back[i:i + 400])
    r.incrby(key + ":heads", len(back))
    place, ids, _ = rt.scripts.seek_list(k, key, 50, place, pushed=pushed)
    assert ids == [f"d{n:04d}" for n in range(249, 199, -1)]
