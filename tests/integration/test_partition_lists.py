"""Job lists across a change of ``partitions``: during a rolling 6 -> 4 deploy, or with web
processes on two counts behind a load balancer, a client follows one cursor whose pages
are served by processes on different counts. Each knows every recorded tag (its own
count's and the other's, draining), but numbers them in its own order; the cursor names
its partition by tag, and every reader visits the partitions in one order, so the pages
show each job that stays put once (docs/http.md, "Cursors")."""

from __future__ import annotations

import base64
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runner.client import Client
from runner.runtime import Runtime
from runner.store.embedded import Server
from runner.store.keys import partition_tags

from conftest import Project, make_project, wait_for


@pytest.fixture
def counts(project: Project) -> Iterator[tuple[Client, Client]]:
    """Two clients of one queue, on 6 and on 4 partitions, each knowing the other's tags."""
    project.write_config(fast="partitions = 6")
    six = project.config()
    project.write_config(fast="partitions = 4")  # (the folder's config: a worker runs on 4)
    four = project.config()
    a = Runtime.create(six, record=True)
    b = Runtime.create(four, record=True)
    a.discover()  # learns the tags b recorded after it started
    try:
        tags_a, tags_b = [k.tag for k in a.parts["fast"]], [k.tag for k in b.parts["fast"]]
        assert set(tags_a) == set(tags_b) == set(partition_tags("fast", 6)) | set(partition_tags("fast", 4))
        assert tags_a != tags_b  # the same index names another partition on each
        yield Client(a), Client(b)
    finally:
        a.close()
        b.close()


def _alternate(readers: list[Client], status: str, limit: int = 7, most: int = 200) -> Counter[str]:
    """Every id shown to a client following one cursor, its pages read by each reader in turn."""
    seen: Counter[str] = Counter()
    cursor = None
    for n in range(most):
        page = readers[n % len(readers)].jobs(status, queue="fast", limit=limit, cursor=cursor)
        seen.update(j.id for j in page.jobs)
        cursor = page.cursor
        if cursor is None:
            return seen
    raise AssertionError(f"the cursor went on past {most} pages")


def _spread(c6: Client, c4: Client, n: int, **kw: Any) -> list[str]:
    """n jobs from each client (keyless: each call goes to the next partition)."""
    return [c.enqueue("record", {"n": i}, **kw).id for c in (c6, c4) for i in range(n)]


def _once(seen: Counter[str], ids: list[str]) -> None:
    missing, twice = set(ids) - set(seen), [i for i, v in seen.items() if v > 1]
    assert not missing and not twice, f"{len(missing)} never shown, {len(twice)} shown twice of {len(ids)}"
    assert set(seen) == set(ids)


def test_scheduled_queued_and_cancelled_lists_page_alike_on_two_counts(counts: tuple[Client, Client]) -> None:
    """60 jobs from each count, scheduled an hour out, then 60 queued and 20 of them
    cancelled: each list, in pages of 7 served in turn by the process on 6 and the one on
    4, shows every job once; so does each process alone."""
    c6, c4 = counts
    scheduled = _spread(c6, c4, 60, delay=3600)
    queued = _spread(c6, c4, 30)
    cancelled = queued[::3]
    for job_id in cancelled:
        c6.cancel(job_id)
    queued = [i for i in queued if i not in cancelled]
    for readers in ([c6], [c4], [c6, c4], [c4, c6]):
        _once(_alternate(readers, "scheduled"), scheduled)
        _once(_alternate(readers, "queued"), queued)
        _once(_alternate(readers, "cancelled", limit=3), cancelled)


def test_done_and_dead_lists_page_alike_on_two_counts(project: Project, counts: tuple[Client, Client]) -> None:
    """Jobs done and dead in every partition of both counts (a worker on 4 drains the
    other count's tags too): the done and dead lists page alike on either reader, and so
    does the dead-letter list by offset (GET /dead/{queue}) when deaths share a time."""
    c6, c4 = counts
    done = _spread(c6, c4, 30)
    dead = [c.enqueue("perm", {"i": i}).id for c in (c6, c4) for i in range(30)]
    project.spawn_worker("fast")
    wait_for(lambda: all(c4.get(i).status == "done" for i in done)
             and all(c4.get(i).status == "dead" for i in dead), timeout=60, what="every job to end")
    for readers in ([c6, c4], [c4, c6]):
        _once(_alternate(readers, "done"), done)
        _once(_alternate(readers, "dead"), dead)
    # Deaths of one millisecond in several partitions (one settle each): the merged
    # list's order must not depend on the reader's order of partitions.
    r = c4.runtime.redis
    for k in c4.runtime.parts["fast"]:
        if r.zcard(k.dead):
            r.zadd(k.dead, dict.fromkeys(r.zrange(k.dead, 0, -1), 1_700_000_000_000), xx=True)
    seen: Counter[str] = Counter()
    for n, offset in enumerate(range(0, len(dead), 7)):
        total, page = (c6, c4)[n % 2].dead("fast", offset, 7)
        assert total == len(dead)
        seen.update(j.id for j in page)
    _once(seen, dead)


def _old_cursor(fields: list[Any]) -> str:
    """A cursor as an earlier release made it: [index of the partition in its own order,
    position, generation, ...]."""
    return base64.urlsafe_b64encode(json.dumps(fields).encode()).decode().rstrip("=")


def test_an_earlier_releases_cursor_is_refused_on_a_partitioned_queue(counts: tuple[Client, Client]) -> None:
    """A cursor of the earlier format holds an index into the order of the process that
    made it, which another count reads as another partition: refused with a message that
    says to start the list again, never read from the wrong place."""
    c6, _ = counts
    _spread(c6, c6, 10, delay=3600)
    with pytest.raises(ValueError, match="start the list again"):
        c6.jobs("scheduled", queue="fast", limit=7, cursor=_old_cursor([1, 3, None]))


def test_an_earlier_releases_cursor_still_pages_an_unpartitioned_queue(project: Project) -> None:
    """On queues of one partition an earlier cursor's index names a queue, as it did: it
    goes on where it was."""
    c = project.client
    ids = [c.enqueue("record", {"n": i}, delay=3600).id for i in range(10)]
    first = c.jobs("scheduled", queue="fast", limit=4)
    r = project.runtime.redis
    last = first.jobs[-1].id
    old = _old_cursor([0, 4, None, r.zscore(project.keys().delayed, last), last])
    rest = c.jobs("scheduled", queue="fast", limit=50, cursor=old)
    whole = [j.id for j in c.jobs("scheduled", queue="fast", limit=50).jobs]
    assert sorted(whole) == sorted(ids)
    assert [j.id for j in first.jobs + rest.jobs] == whole and rest.cursor is None


def test_two_web_processes_on_two_counts_page_one_cursor(tmp_path: Path, server: Server,
                                                        counts: tuple[Client, Client], project: Project) -> None:
    """GET /jobs through two web processes, one on each count, in turn: every job once;
    an earlier release's cursor on a partitioned queue is a 400 that says to start again."""
    from test_web_support import gunicorn

    c6, c4 = counts
    ids = _spread(c6, c4, 40, delay=3600)
    other = make_project(tmp_path / "six", server)
    other.prefix = project.prefix
    other.write_config(fast="partitions = 6")
    with gunicorn(project) as web4, gunicorn(other) as web6:
        seen: Counter[str] = Counter()
        cursor: str | None = None
        for n in range(100):
            q = "/jobs?status=scheduled&queue=fast&limit=9" + (f"&cursor={cursor}" if cursor else "")
            body = (web4, web6)[n % 2].get(q).json()
            seen.update(j["id"] for j in body["jobs"])
            cursor = body["cursor"]
            if cursor is None:
                break
        _once(seen, ids)
        old = web6.get(f"/jobs?status=scheduled&queue=fast&cursor={_old_cursor([2, 1, None])}")
        assert old.status_code == 400 and "start the list again" in old.json()["detail"]


def test_a_reader_goes_on_in_a_partition_it_does_not_know_yet(project: Project) -> None:
    """A process on 4 started before one on 6 recorded its tags: a cursor that stands in a
    tag of 6 alone goes on there on the process on 4 as on the process on 6, not at the
    next partition it knows."""
    from runner.store.listing import decode_cursor

    project.write_config(fast="partitions = 6")
    six = project.config()
    project.write_config(fast="partitions = 4")
    b = Runtime.create(project.config(), record=True)
    a = Runtime.create(six, record=True)
    try:
        c6, c4 = Client(a), Client(b)
        _spread(c6, c6, 30, delay=3600)
        unknown = {k.tag for k in a.parts["fast"]} - {k.tag for k in b.parts["fast"]}
        assert unknown
        cursor, compared = None, 0
        while True:
            page = c6.jobs("scheduled", queue="fast", limit=1, cursor=cursor)
            cursor = page.cursor
            if cursor is None:
                break
            tag = decode_cursor(cursor)[0]
            nxt = c6.jobs("scheduled", queue="fast", limit=1, cursor=cursor)
            # (past that tag's last job the process on 6 goes on to a tag the one on 4 has
            # not learned of yet: it does when it next looks, within tagset.RECORD_EVERY_S)
            if tag in unknown and nxt.cursor and decode_cursor(nxt.cursor)[0] == tag:
                assert [j.id for j in c4.jobs("scheduled", queue="fast", limit=1, cursor=cursor).jobs] \
                    == [j.id for j in nxt.jobs]
                compared += 1
        assert compared >= 6  # (30 jobs over 6 tags, 2 of them unknown)
    finally:
        a.close()
        b.close()


def test_a_long_lived_reader_lists_a_partition_recorded_after_it_started(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """A web process on 1 partition started before another process recorded 3: its job
    lists and dead letters include the other count's partitions once it looks again (as
    its figures do), not only after a restart."""
    from runner import runtime as runtime_mod

    project.write_config(fast="partitions = 1")
    reader = Client(Runtime.create(project.config()))
    project.write_config(fast="partitions = 3")
    other = Runtime.create(project.config(), record=True)
    try:
        ids = [Client(other).enqueue("record", {"n": i}, delay=3600).id for i in range(12)]
        monkeypatch.setattr(runtime_mod, "READ_EVERY_S", 0.0)  # the next read looks again (a second in production)
        assert {j.id for j in reader.jobs("scheduled", queue="fast", limit=50).jobs} == set(ids)
    finally:
        other.close()
        reader.runtime.close()


def test_a_reader_finds_a_job_on_a_tag_it_has_not_read_yet(project: Project) -> None:
    """A web process on 4 partitions read the recorded tags a moment ago; a producer on 6
    starts and places jobs on tags only 6 has. Looking one up (GET /jobs/{id}, cancel, a
    signal) finds it at once, and the scheduled list shows every one: a miss reads the
    tags again. Before, each answered "no job" (404) for up to 10 s, and the list left
    them out, until the reader's next read of the tags."""
    project.write_config(fast="partitions = 4")
    four = Runtime.create(project.config(), record=True)
    project.write_config(fast="partitions = 6")
    six = Runtime.create(project.config(), record=True)
    try:
        reader, producer = Client(four), Client(six)
        assert {k.tag for k in four.parts["fast"]} == set(partition_tags("fast", 4))
        only_six = set(partition_tags("fast", 6)) - set(partition_tags("fast", 4))
        ids = [producer.enqueue("record", {"n": i}, delay=3600).id for i in range(24)]
        placed = {j: k.tag for k in six.parts["fast"] for j in six.redis.zrange(k.scheduled, 0, -1)}
        on_new = [j for j in ids if placed[j] in only_six]
        assert on_new, placed  # (24 jobs over 6 partitions: some land on the 2 new ones)
        assert {j: reader.get(j).status for j in on_new} == dict.fromkeys(on_new, "scheduled")
        seen: set[str] = set()
        cursor = None
        while True:
            page = reader.jobs("scheduled", queue="fast", limit=50, cursor=cursor)
            seen.update(j.id for j in page.jobs)
            if (cursor := page.cursor) is None:
                break
        assert set(ids) <= seen, set(ids) - seen
        assert reader.cancel(on_new[0]) is not None
        assert reader.get(on_new[0]).status == "cancelled"
    finally:
        four.close()
        six.close()


def test_a_miss_waits_a_bounded_time_for_the_tags_and_an_outage_a_second(project: Project,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A look-up that missed waits MISSED_WAIT_S at most for its read of the tags (a Redis
    Cluster master that holds them and stalls made every 404 wait out its 15 s socket
    timeout), and a miss while that read still waits starts no other. After a read that
    failed (Redis away), readers wait a second before the next: with the reader's
    one-second period, every request read them again first and waited out two timeouts."""
    import threading
    import time

    from runner import runtime as runtime_mod

    rt = Runtime.create(project.config())
    try:
        release = threading.Event()
        calls: list[float] = []

        def stalled(self: Runtime, **_: Any) -> list[Any]:
            calls.append(time.monotonic())
            release.wait(30)
            return []

        monkeypatch.setattr(runtime_mod, "MISSED_WAIT_S", 0.3)
        monkeypatch.setattr(Runtime, "discover_bounded", stalled)
        searched = [k for parts in rt.parts.values() for k in parts]
        t = time.monotonic()
        assert rt.discover_missed(searched) == []
        assert rt.discover_missed(searched) == []  # (waits for the same read)
        # (two waits of 0.3 s: 1.1 s on a loaded host; the stalled read holds 30 s)
        assert time.monotonic() - t < 2.0 and len(calls) == 1, (time.monotonic() - t, calls)
        release.set()
        monkeypatch.undo()

        def away(*_: Any, **__: Any) -> Any:
            raise ConnectionError("Redis away")

        from runner.store import tagset

        monkeypatch.setattr(tagset, "record_and_read_all", away)
        assert rt.discover() == []
        tried: list[int] = []
        monkeypatch.setattr(Runtime, "discover_bounded", lambda self, **_: tried.append(1) or [])
        assert rt.discover_due() == [] and not tried  # (within the second: not read again)
    finally:
        rt.close()


def test_a_read_waits_a_bounded_time_for_a_due_read_of_the_tags(project: Project,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader's read of the tags, when due (every second), waits MISSED_WAIT_S at most:
    with Redis stopped (SIGSTOP) every GET /jobs/{id} waited out the tags' socket timeout
    (15 s), then its own: 30 s to its 503. A read of them that answers at once is still
    seen by the read that started it."""
    import threading
    import time

    from runner import runtime as runtime_mod
    from runner.store import tagset

    client = project.client
    job = client.enqueue("record", {"n": 1}).id
    rt = client.runtime
    monkeypatch.setattr(runtime_mod, "READ_EVERY_S", 0.0)
    monkeypatch.setattr(runtime_mod, "MISSED_WAIT_S", 0.3)
    release = threading.Event()
    real = tagset.record_and_read_all

    def hung(*args: Any, **kw: Any) -> Any:
        release.wait(10)
        return real(*args, **kw)

    monkeypatch.setattr(tagset, "record_and_read_all", hung)
    try:
        t = time.monotonic()
        assert client.get(job).id == job
        assert client.get(job).id == job  # (its read still hangs: this one starts none)
        assert time.monotonic() - t < 1.5, time.monotonic() - t
    finally:
        release.set()
    assert rt._aside is not None
    rt._aside.join(5)


def test_a_miss_finds_a_job_on_a_tag_another_thread_read_meanwhile(project: Project,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """During a 4 -> 6 change, a look-up that missed looks again on every partition it did
    not search, whichever thread read their tags: a request that looked with the old tags
    while another thread's read of them was under way (a due read, or an earlier miss's)
    answered 404 for an accepted job, since its own read found nothing new to it, and a
    404 to a cancel left the job to run."""
    import threading
    import time

    from runner.store import tagset

    project.write_config(fast="partitions = 4")
    four = Runtime.create(project.config(), record=True)
    project.write_config(fast="partitions = 6")
    six = Runtime.create(project.config(), record=True)
    real = tagset.record_and_read_all
    gate = threading.Event()
    held = threading.Event()

    def first_read_waits(*args: Any, **kw: Any) -> Any:
        if not held.is_set():
            held.set()
            gate.wait(10)
        return real(*args, **kw)

    try:
        reader, producer = Client(four), Client(six)
        only_six = set(partition_tags("fast", 6)) - set(partition_tags("fast", 4))
        ids = [producer.enqueue("record", {"n": i}, delay=3600).id for i in range(24)]
        placed = {j: k.tag for k in six.parts["fast"] for j in six.redis.zrange(k.scheduled, 0, -1)}
        on_new = [j for j in ids if placed[j] in only_six]
        assert len(on_new) >= 2, placed
        monkeypatch.setattr(tagset, "record_and_read_all", first_read_waits)
        for start in (lambda: four.discover(), lambda: reader.get(on_new[0])):
            # another thread's read holds the tags (a due read, then an earlier miss's)
            held.clear()
            gate.clear()
            other = threading.Thread(target=start, daemon=True)
            other.start()
            assert held.wait(5)
            got: list[Any] = []
            looking = threading.Thread(target=lambda seen=got: seen.append(reader.get(on_new[1]).status),
                                       daemon=True)
            looking.start()
            time.sleep(0.5)  # (its look-up with the old tags missed; its read of them waits)
            gate.set()
            looking.join(10)
            other.join(10)
            assert got == ["scheduled"], got
            four.parts["fast"][:] = [k for k in four.parts["fast"] if k.tag not in only_six]  # old tags again
    finally:
        four.close()
        six.close()
