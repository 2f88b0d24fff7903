"""The dead-letter list and the audit trail paged while they move (docs/http.md,
"Cursors"): jobs die at the front of the list while a client pages, and others are
requeued or deleted behind it; actions land on the trail, are folded into earlier
entries and the oldest are trimmed. A client that follows the cursor sees every entry
that stays put the whole time exactly once, and the traversal ends."""

from __future__ import annotations

import base64
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import falcon.testing
import pytest

from runner.client import Client
from runner.runtime import Runtime
from runner.store import audit as audit_log
from runner.store import codec, keys
from runner.web import create_app

from conftest import Project, wait_for


@pytest.fixture
def four(project: Project) -> Iterator[Project]:
    project.write_config(fast="partitions = 4")
    yield project


def _in_thread(work: Callable[[Client, random.Random], None], project: Project, stop: threading.Event,
               errors: list[BaseException], seed: int) -> threading.Thread:
    """``work`` over and over on a client of its own until ``stop``."""

    def run() -> None:
        rt = Runtime.create(project.config())
        try:
            c, rng = Client(rt), random.Random(seed)
            while not stop.is_set():
                work(c, rng)
        except BaseException as exc:  # (the test fails on it below)
            errors.append(exc)
        finally:
            rt.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _by(raw: str) -> str:
    """The "by" of an entry shown unparsable (no JSON: another writer's)."""
    return raw.split('"by":"', 1)[1].split('"', 1)[0]


def _follow(web: falcon.testing.TestClient, path: str, rows: str, limit: int, most: int = 400,
            between: Callable[[], None] = lambda: None) -> Counter[str]:
    """Every id shown to a client following the cursor of ``path`` from its first page."""
    seen: Counter[str] = Counter()
    cursor = None
    for _ in range(most):
        r = web.simulate_get(path, params={"limit": limit, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        seen.update(e["id"] if "id" in e else str(e["by"]) if "by" in e else _by(e["unparsable"])
                    for e in r.json[rows])
        cursor = r.json["cursor"]
        if cursor is None:
            return seen
        between()
    raise AssertionError(f"the cursor went on past {most} pages")


def test_the_dead_list_pages_by_cursor_while_jobs_die_and_leave(four: Project) -> None:
    """120 dead jobs over 4 partitions; while a client pages through them 7 at a time,
    other threads bury new jobs (each lands at the front) and requeue or delete some of
    the 120 (behind the client or ahead of it). Every job that stays dead the whole time
    is shown exactly once, no job is shown twice, and the traversal ends."""
    project = four
    c = project.client
    first = [c.enqueue("perm", {"i": i}).id for i in range(120)]
    project.spawn_worker("fast")
    wait_for(lambda: c.stats()["fast"]["dead"] == len(first), timeout=60, what="120 jobs dead")
    moved: set[str] = set()
    lock = threading.Lock()

    def bury(c: Client, rng: random.Random) -> None:
        c.enqueue("perm", {"later": rng.random()})
        time.sleep(0.005)

    def move(c: Client, rng: random.Random) -> None:
        with lock:
            left = [i for i in first if i not in moved]
            job_id = rng.choice(left)
            moved.add(job_id)  # before: a page read meanwhile may not show it
        if rng.random() < 0.5:
            c.requeue("fast", job_id)  # it runs again and dies again: a new death at the front
        else:
            c.delete_dead("fast", job_id)
        time.sleep(0.02)

    stop, errors = threading.Event(), []
    threads = [_in_thread(bury, project, stop, errors, 1), _in_thread(move, project, stop, errors, 2)]
    web = falcon.testing.TestClient(create_app(project.runtime))
    try:
        wait_for(lambda: len(moved) >= 5, timeout=20, what="the first moves")
        seen = _follow(web, "/dead/fast", "jobs", 7, between=lambda: time.sleep(0.03))
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert not errors, errors
    stayed = [i for i in first if i not in moved]
    assert len(stayed) > 60 and len(moved) > 10, (len(stayed), len(moved))
    twice = sorted(i for i, n in seen.items() if n > 1)
    missing = sorted(set(stayed) - set(seen))
    assert not twice and not missing, f"{len(twice)} shown twice, {len(missing)} of {len(stayed)} never shown"


def test_an_offset_still_pages_and_hands_over_to_a_cursor(four: Project) -> None:
    """?offset= still reads a page at that place (old clients); its answer carries the
    cursor that goes on after its last job, and a cursor page carries no offset."""
    project = four
    c = project.client
    ids = [c.enqueue("perm", {"i": i}).id for i in range(20)]
    project.spawn_worker("fast")
    wait_for(lambda: c.stats()["fast"]["dead"] == len(ids), timeout=60, what="20 jobs dead")
    web = falcon.testing.TestClient(create_app(project.runtime))
    whole = web.simulate_get("/dead/fast", params={"limit": 20}).json
    assert whole["cursor"] is None and whole["offset"] == 0 and len(whole["jobs"]) == 20
    order = [j["id"] for j in whole["jobs"]]
    page = web.simulate_get("/dead/fast", params={"offset": 5, "limit": 5}).json
    assert [j["id"] for j in page["jobs"]] == order[5:10] and page["offset"] == 5
    rest = web.simulate_get("/dead/fast", params={"cursor": page["cursor"], "limit": 50}).json
    assert [j["id"] for j in rest["jobs"]] == order[10:] and rest["cursor"] is None and "offset" not in rest
    assert c.dead("fast", 15, 10)[1] == [j for j in c.dead_page("fast", 50).jobs][15:]


def _b64(raw: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(raw).encode()).decode().rstrip("=")


@pytest.mark.parametrize("path", ["/dead/fast", "/audit"])
def test_a_forged_cursor_is_a_400(four: Project, path: str) -> None:
    """A cursor the list did not make (garbage, another list's, another queue's, a
    position of the wrong type, one too long) is a 400 naming the parameter, never a
    page read from elsewhere; so is a cursor beside an offset."""
    web = falcon.testing.TestClient(create_app(four.runtime))
    job_cursor = web.simulate_get("/jobs", params={"status": "dead"}).json["cursor"]
    forged = ["%%%", "bm90IGpzb24", _b64(["dead", "slow", 1, "x"]), _b64(["dead", "fast", "1", "x"]),
              _b64(["dead", "fast", 1, ""]), _b64(["audit", "x"]), _b64(["audit", [1, 2], [3]]),
              _b64(["audit", [-1, 0], [0, 0]]), _b64(["dead", "fast", 1, "x" * 5000]), _b64({"a": 1}),
              job_cursor or _b64(["fast", 0, None])]
    for cursor in forged:
        r = web.simulate_get(path, params={"cursor": cursor})
        assert r.status_code == 400, (cursor, r.status_code, r.text)
        assert r.json["parameter"] == "cursor", r.json
    r = web.simulate_get(path, params={"cursor": _b64(["dead", "fast", 1, "x"]), "offset": 3})
    assert r.status_code == 400 and r.json["parameter"] == "offset", r.text


def test_the_audit_trail_pages_by_cursor_while_actions_land(project: Project) -> None:
    """A trail of 150 entries and 40 pauses and resumes, 10 of them written by an earlier
    release (no place number); while a client pages through it 9 at a time, other
    threads put new actions on both trails, fold repeats into entries already there
    (each goes to the head, newest first by its last action), and the trail is trimmed
    to a bound that takes its oldest off. Every entry that keeps its place on the trail
    the whole time is shown exactly once, one folded into at most once, and the
    traversal ends."""
    rt = project.runtime
    key = keys.audit(rt.config.redis.prefix)
    r = rt.redis
    old = [f"old{i}" for i in range(10)]
    for i, by in enumerate(old):  # as an earlier release wrote them: no place number
        r.lpush(key, json.dumps({"by": by, "action": "purge", "queue": "fast", "at_ms": 1_700_000_000_000 + i}))
    main = [f"m{i}" for i in range(150)]
    flow = [f"f{i}" for i in range(40)]
    for i in range(max(len(main), len(flow))):
        if i < len(main):
            audit_log.record(rt.scripts, key, {"by": main[i], "action": "purge", "queue": "fast"})
        if i < len(flow):
            audit_log.record(rt.scripts, key, {"by": flow[i], "action": "pause", "queue": "fast"})
    most = 200  # the trail's bound in this test: the oldest entries leave as new ones land
    gone = set(old[:])  # the trimmed ones may go any time: not counted as staying
    moved: set[str] = set()  # folded into: at the head since, above the client's place

    def act(c: Client, rng: random.Random) -> None:
        n = rng.randrange(1_000_000)
        trail = key if rng.random() < 0.7 else audit_log.flow_key(key)
        action = "purge" if trail == key else "resume"
        c.runtime.scripts.audit(trail, json.dumps({"by": f"new{n}", "action": action, "queue": "fast"}), most,
                                audit_log.MAX_AGE_MS)
        # a repeat of an entry already there (same caller, action, queue): folded into it,
        # which goes to the head (a client that had not reached it does not see it)
        by = rng.choice(main)
        moved.add(by)
        c.runtime.scripts.audit(key, codec.dumps({"by": by, "action": "purge", "queue": "fast"}),
                                most, audit_log.MAX_AGE_MS, fold_ms=audit_log.FOLD_MS)
        time.sleep(0.003)

    # The oldest main entries may be trimmed while paging (200 kept, ~40 new): not counted.
    gone |= set(main[:60])
    stop, errors = threading.Event(), []
    t = _in_thread(act, project, stop, errors, 3)
    web = falcon.testing.TestClient(create_app(rt))
    try:
        time.sleep(0.05)
        seen = _follow(web, "/audit", "entries", 9, between=lambda: time.sleep(0.01))
    finally:
        stop.set()
        t.join(timeout=30)
    assert not errors, errors
    stayed = [b for b in [*main, *flow] if b not in gone | moved]
    assert len(stayed) > 50, len(stayed)
    twice = sorted(b for b, n in seen.items() if n > 1)
    missing = sorted(set(stayed) - set(seen))
    assert not twice and not missing, f"{twice[:5]} shown twice, {missing[:5]} of {len(stayed)} never shown"


def test_an_audit_entry_folded_into_while_a_client_pages_goes_to_the_head_and_is_shown_once(project: Project) -> None:
    """Ten entries paged 3 at a time; after the first page a repeat of one it showed (e9)
    and of one it has not reached (e2) fold into them: both go to the head. The client's
    later pages show each other entry once and neither of the two (the first showed e9;
    e2 is the newest now), and a new first page shows the two on top."""
    rt = project.runtime
    key = keys.audit(rt.config.redis.prefix)
    web = falcon.testing.TestClient(create_app(rt))

    def act(by: str) -> None:
        audit_log.record(rt.scripts, key, {"by": by, "action": "purge", "queue": "fast"})

    for i in range(10):
        act(f"e{i}")
    first = web.simulate_get("/audit", params={"limit": 3}).json
    assert [e["by"] for e in first["entries"]] == ["e9", "e8", "e7"]
    act("e9")
    act("e2")
    seen, cursor = [], first["cursor"]
    while cursor:
        page = web.simulate_get("/audit", params={"limit": 3, "cursor": cursor}).json
        seen += [e["by"] for e in page["entries"]]
        cursor = page["cursor"]
    assert seen == ["e6", "e5", "e4", "e3", "e1", "e0"], seen
    top = web.simulate_get("/audit", params={"limit": 3}).json["entries"]
    assert [(e["by"], e.get("repeats")) for e in top] == [("e2", 2), ("e9", 2), ("e8", None)], top


def _old_push(r: Any, key: str, by: str, most: int = 10_000) -> None:
    """An action as an earlier release's audit.lua writes it: no place number, pushed at
    the head, the trail trimmed to ``most`` from the tail."""
    now_ms = int(r.time()[0]) * 1000
    r.lpush(key, json.dumps({"by": by, "action": "purge", "queue": "fast", "at_ms": now_ms}))
    r.ltrim(key, 0, most - 1)


def test_the_audit_cursor_pages_a_trail_both_releases_write(project: Project) -> None:
    """A rolling deploy: the earlier release's entries (no place number) land at the head
    among the numbered ones, before and while a client pages 5 at a time. Every entry on
    the trail when the client starts is shown once, and the traversal ends."""
    rt = project.runtime
    key, r = keys.audit(rt.config.redis.prefix), rt.redis
    first = [f"e{i}" for i in range(40)]
    for i, by in enumerate(first):
        if i % 3 == 0:
            _old_push(r, key, by)
        else:
            audit_log.record(rt.scripts, key, {"by": by, "action": "purge", "queue": "fast"})
    k = [0]

    def between() -> None:
        for j in range(4):
            k[0] += 1
            if j % 2:
                _old_push(r, key, f"new{k[0]}")
            else:
                audit_log.record(rt.scripts, key, {"by": f"new{k[0]}", "action": "purge", "queue": "fast"})

    seen = _follow(falcon.testing.TestClient(create_app(rt)), "/audit", "entries", 5, between=between)
    twice = sorted(b for b in first if seen[b] > 1)
    missing = sorted(b for b in first if not seen[b])
    assert not twice and not missing, f"{twice} shown twice, {missing} never shown"


@pytest.mark.parametrize("numbered", [0, 5])
def test_the_audit_cursor_pages_old_entries_while_the_full_trail_trims(project: Project, numbered: int) -> None:
    """A trail at its bound, its tail an earlier release's entries (no place number):
    each new action trims one off the tail while a client pages 10 at a time. An entry
    that stays is shown once (with no entry of this release on the trail when the client
    starts, the first page's place is still a count from the tail: see docs/http.md)."""
    rt = project.runtime
    key, r = keys.audit(rt.config.redis.prefix), rt.redis
    most, now_ms = 300, int(r.time()[0]) * 1000
    for i in range(most - numbered):
        r.lpush(key, json.dumps({"by": f"old{i}", "action": "purge", "queue": "fast", "at_ms": now_ms - most + i}))
    for i in range(numbered):
        rt.scripts.audit(key, json.dumps({"by": f"cur{i}", "action": "purge", "queue": "fast"}), most,
                         audit_log.MAX_AGE_MS)
    before = set(json.loads(e)["by"] for e in r.lrange(key, 0, -1))
    k = [0]

    def between() -> None:
        k[0] += 1
        rt.scripts.audit(key, json.dumps({"by": f"new{k[0]}", "action": "purge", "queue": "fast"}), most,
                         audit_log.MAX_AGE_MS)

    seen = _follow(falcon.testing.TestClient(create_app(rt)), "/audit", "entries", 10, between=between)
    stayed = before & set(json.loads(e)["by"] for e in r.lrange(key, 0, -1))
    twice = sorted(b for b in before if seen[b] > 1)
    # (a place counted from the tail moves once, at the first page's trim, when no entry
    # of this release was there to hold it)
    assert len(twice) <= (1 if not numbered else 0), f"{len(twice)} shown twice: {twice[:5]}"
    assert not stayed - set(seen), sorted(stayed - set(seen))[:5]


def test_a_foreign_place_number_never_fails_or_stalls_the_audit_cursor(project: Project) -> None:
    """Another writer's entry with a place number past 2**64, or past 2**53: every page is
    a 200, the entries written after it get numbers of their own, and every entry is shown
    once."""
    rt = project.runtime
    key, r = keys.audit(rt.config.redis.prefix), rt.redis
    web = falcon.testing.TestClient(create_app(rt))

    def act(by: str) -> None:
        audit_log.record(rt.scripts, key, {"by": by, "action": "delete", "queue": "fast", "job_id": by})

    def crafted(by: str, n: str) -> None:
        now_ms = int(r.time()[0]) * 1000
        r.lpush(key, f'{{"by":"{by}","action":"delete","queue":"fast","job_id":"x","at_ms":{now_ms},"n":{n}}}')

    # (and numbers that are no whole number, read by their leading digits as 1: the page
    # after them went on from the trail's end, 41 of 110 never shown)
    # (and leading zeros or digits of other scripts, which Lua and Python read differently:
    # 60 never shown, or 49 twice)
    for n, limit in (("99999999999999999999", 50), ("99999999999999999999", 50), ("1e300", 7), ("1.5", 7),
                     ("5e3", 7), ("0000000000000000000999999999999999", 7), ("00000000000000000001", 7),
                     ("\uff11\uff17\uff19\uff16", 7), ("1796\u0661", 7)):
        for i in range(60):
            act(f"a{i}")
        crafted("huge", n)
        for i in range(49):
            act(f"b{i}")
        seen = _follow(web, "/audit", "entries", limit)
        assert seen["huge"] == 1 and len(seen) == 110 and set(seen.values()) == {1}, (n, len(seen), seen)
        r.delete(key)
    for i in range(5):
        act(f"c{i}")
    crafted("big", str(2**60))
    for i in range(120):
        act(f"d{i}")
    numbers = [int(json.loads(e)["n"]) for e in r.lrange(key, 0, 119)]
    assert len(set(numbers)) == 120 and max(numbers) < 2**53, numbers[:3]
    for lose in (0, 6):  # and with the crafted entry trimmed off
        r.rpop(key, lose) if lose else None
        seen = _follow(web, "/audit", "entries", 50)
        assert set(seen.values()) == {1} and len(seen) == r.llen(key), (len(seen), r.llen(key))


def test_foreign_dead_letters_page_by_cursor_and_offset(project: Project) -> None:
    """Another writer's members of the dead set: a time of death in ns, an id of 1,200
    characters, a score of 1e300 and of inf. Every member is shown once by the cursor,
    and the offset pages answer 200."""
    rt = project.runtime
    dead = keys.for_queue(rt.config.redis.prefix, "fast").dead
    r = rt.redis
    now_ms = int(r.time()[0]) * 1000
    members: dict[str, float] = {f"j{i}": now_ms - i for i in range(20)}
    members |= {f"ns{i}": now_ms * 1_000_000 - i for i in range(12)}
    members |= {str(i) + "L" * 1200: now_ms - 5 for i in range(3)}
    members |= {"e300a": 1e300, "e300b": 1e300, "infa": float("inf"), "infb": float("inf"), "neg": -1e300}
    r.zadd(dead, members)
    web = falcon.testing.TestClient(create_app(rt))
    for limit in (1, 3, 7):
        seen = _follow(web, "/dead/fast", "jobs", limit)
        assert set(seen) == set(members) and set(seen.values()) == {1}, (limit, sorted(set(members) - set(seen)))
    for offset in range(0, len(members) + 5, 5):
        got = web.simulate_get("/dead/fast", params={"limit": 5, "offset": offset})
        assert got.status_code == 200, got.text
