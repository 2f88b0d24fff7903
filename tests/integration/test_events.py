"""GET /events, the live feed as server-sent events: the figures first and then as they
change, watched jobs as they change, the token and its read scope as for every route;
one read loop per web process whatever the number of pages; a page that goes away is
dropped, and a graceful shutdown ends the streams rather than waiting on them."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import queue
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import requests
from test_web_support import gunicorn, runner_web

from runner.web import create_app, events, hub
from runner.web.offload import Offload
from runner.web.server import DevServer

from conftest import Project, wait_for

TOKEN = "events-token"
READER = "reader-token"
PRODUCER = "producer-token"
SCOPED = f"""
[api.tokens.reader]
hash = "sha256:{hashlib.sha256(READER.encode()).hexdigest()}"
scopes = ["read"]

[api.tokens.producer]
hash = "sha256:{hashlib.sha256(PRODUCER.encode()).hexdigest()}"
scopes = ["enqueue"]
"""


class Feed:
    """The events of one open stream, parsed on a thread as they arrive."""

    def __init__(self, resp: requests.Response) -> None:
        self.resp = resp
        self.events: queue.Queue[tuple[str, Any] | None] = queue.Queue()
        self.retry_ms: int | None = None
        self.figures: dict[str, Any] = {}  # each queue as the events so far left it
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        name, data = "message", []
        try:
            for raw in self.resp.iter_lines(decode_unicode=True):
                if raw == "":
                    if data:
                        self.events.put((name, json.loads("\n".join(data))))
                    name, data = "message", []
                elif raw.startswith("event: "):
                    name = raw[7:]
                elif raw.startswith("data: "):
                    data.append(raw[6:])
                elif raw.startswith("retry: "):
                    self.retry_ms = int(raw[7:])
        except (requests.RequestException, AttributeError):  # AttributeError: closed under the reader
            pass
        self.events.put(None)  # the stream ended

    def take(self, timeout: float = 10) -> tuple[str, Any]:
        try:
            item = self.events.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no event within {timeout} s") from None
        if item is None:
            raise AssertionError("the stream ended")
        if item[0] == "queues":
            self.figures.update((q["name"], q) for q in item[1]["queues"])
        return item

    def next(self, name: str, timeout: float = 10, pred: Any = None) -> Any:
        """The data of the next event called ``name`` (that ``pred`` accepts), skipping others."""
        deadline = time.monotonic() + timeout
        while True:
            kind, data = self.take(max(0.01, deadline - time.monotonic()))
            if kind == name and (pred is None or pred(data)):
                return data

    def ended(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.events.get(timeout=max(0.01, deadline - time.monotonic())) is None:
                    return True
            except queue.Empty:
                return False
        return False


@contextmanager
def feed(url: str, token: str | None, query: str = "") -> Iterator[Feed]:
    headers = {"Accept": "text/event-stream", **({"Authorization": f"Bearer {token}"} if token else {})}
    resp = requests.get(f"{url}/events{query}", headers=headers, stream=True, timeout=30)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/event-stream")
    try:
        yield Feed(resp)
    finally:
        # Its socket shut first: the reader thread's read returns at once. A close alone
        # waited for the buffer's lock, held by that read until the next heartbeat (5 s).
        with contextlib.suppress(AttributeError, OSError):
            resp.raw._fp.fp.raw._sock.shutdown(socket.SHUT_RDWR)
        resp.close()


def fast(data: dict[str, Any]) -> dict[str, Any] | None:
    return next((q for q in data["queues"] if q["name"] == "fast"), None)


def test_the_stream_pushes_the_figures_as_they_change_and_the_watched_jobs(project: Project) -> None:
    """First the health and every queue's figures; an enqueue then arrives as a change of
    that queue only, without asking. A watched job comes first as it is, then each time its
    view changes, until done; a watched id that is no job is said to be gone."""
    with gunicorn(project, token=TOKEN) as web:
        job = web.post("/jobs/record", json={"n": 1}).json()["id"]
        with feed(web.url, TOKEN, f"?job={job}&job=no-such-job") as f:
            assert f.next("health") == {"redis": "ok"}
            first = f.next("queues")
            assert first["full"] is True and [q["name"] for q in first["queues"]] == ["fast", "slow"]
            assert fast(first)["ready"] == 1  # type: ignore[index]
            watched = dict(f.take() for _ in range(2))  # the watched ids, in either order
            assert watched["job-gone"] == {"id": "no-such-job"}
            assert watched["job"]["id"] == job and watched["job"]["status"] == "queued"
            assert f.retry_ms == events.RETRY_MS

            web.post("/jobs/record", json={"n": 2})
            change = f.next("queues", pred=lambda d: (fast(d) or {}).get("ready") == 2)
            assert change["full"] is False and [q["name"] for q in change["queues"]] == ["fast"]

            project.spawn_worker("fast")
            done = f.next("job", timeout=20, pred=lambda j: j["status"] == "done")
            assert done["id"] == job and done["result"] == {"n": 1, "attempt": 1}
            # A success's figures reach Redis within a second of its ack (metrics.FLUSH_S), and
            # the feed pushes them as a change of the queue.
            f.next("queues", timeout=5, pred=lambda d: ((fast(d) or {}).get("functions", {}).get(
                "record", {}).get("succeeded", 0) >= 1))
            assert f.figures["fast"]["functions"]["record"]["succeeded"] >= 1


def test_the_stream_asks_for_a_token_with_the_read_scope(project: Project) -> None:
    """As every route: no token is a 401, a token without read a 403 naming it, and a
    token in the URL is refused; too many watched ids (or an empty one) are a 400."""
    project.write_config(extra=SCOPED)
    with gunicorn(project) as web:
        assert requests.get(web.url + "/events", timeout=10).status_code == 401
        assert requests.get(web.url + f"/events?token={READER}", timeout=10).status_code == 401
        denied = requests.get(web.url + "/events", headers={"Authorization": f"Bearer {PRODUCER}"}, timeout=10)
        assert denied.status_code == 403 and denied.json()["scope"] == "read"
        many = "&".join(f"job=j{i}" for i in range(events.MAX_JOBS + 1))
        for query in (many, "job=", "other=1"):
            r = requests.get(f"{web.url}/events?{query}", headers={"Authorization": f"Bearer {READER}"}, timeout=10)
            assert r.status_code == 400, (query, r.text)
        with feed(web.url, READER) as f:
            assert f.next("health") == {"redis": "ok"}


def test_one_read_loop_serves_every_stream_of_a_process(project: Project) -> None:
    """Twenty pages open on one process cost one read of the figures per tick, not one
    per page; each page still gets the whole figures first and its own watched job. With
    the last page gone the loop stops, and nothing is read while no page is open."""
    client = project.client
    job = client.enqueue("record", {"n": 1}).id
    reads: list[list[str]] = []

    async def scenario() -> None:
        feed_hub = hub.Hub(client, Offload(2), tick_s=0.05)
        read = feed_hub._read

        def counted(ids: list[str]) -> Any:
            reads.append(ids)
            return read(ids)

        feed_hub._read = counted  # type: ignore[method-assign]
        streams = [feed_hub.open([job] if i % 2 else []) for i in range(20)]
        await asyncio.sleep(0.5)
        ticks = len(reads)
        assert 3 <= ticks <= 12, ticks  # about 0.5 / 0.05, not 20 times that
        assert all(ids == [job] for ids in reads)  # the watched ids of every page, read once
        for i, s in enumerate(streams):
            got = []
            while not s.events.empty():
                got.append(s.events.get_nowait())
            names = [e[0] for e in got if e is not None]
            # Each event's data comes encoded, once for every stream.
            assert names[:2] == ["health", "queues"] and json.loads(got[1][1])["full"] is True  # type: ignore[index]
            assert ("job" in names) == bool(i % 2)
        for s in streams:
            feed_hub.close(s)
        task = feed_hub._task
        assert task is not None
        await asyncio.wait_for(task, 1)  # the loop ends with its last stream
        settled = len(reads)
        await asyncio.sleep(0.2)
        assert len(reads) == settled

    asyncio.run(scenario())


def test_a_page_that_goes_away_is_dropped(project: Project, monkeypatch: Any) -> None:
    """A page that closes its connection leaves the process's feed within a heartbeat;
    with none left the read loop stops."""
    monkeypatch.setattr(events, "HEARTBEAT_S", 0.1)
    app = create_app(project.runtime)
    server = DevServer(app, "127.0.0.1", 0)
    server.start()
    try:
        url = f"http://127.0.0.1:{server.port}"
        with feed(url, None) as f:
            f.next("queues")
            assert len(app.app.hub.streams) == 1
        wait_for(lambda: not app.app.hub.streams, timeout=5, what="the stream to be dropped")
        wait_for(lambda: app.app.hub._task is not None and app.app.hub._task.done(), timeout=5, what="the loop to stop")
    finally:
        server.stop()


def test_a_graceful_shutdown_ends_the_open_streams(project: Project) -> None:
    """SIGTERM to `runner web`: its open event streams end at once (the page reconnects
    elsewhere), so the shutdown does not wait out its graceful timeout on them."""
    with runner_web(project, "events-shutdown", workers=1) as web, feed(web.url, "t") as f:
        f.next("queues")
        started = time.monotonic()
        web.proc.send_signal(signal.SIGTERM)
        assert f.ended(timeout=5)
        web.proc.wait(timeout=10)
        assert time.monotonic() - started < 10  # the graceful timeout is 20 s


def test_a_process_watches_a_bounded_number_of_jobs(project: Project, monkeypatch: Any) -> None:
    """Past the process's bound on watched jobs a new stream is a 503 with Retry-After
    (the ids are read every tick); ids already watched by another page cost nothing more."""
    monkeypatch.setattr(hub, "MAX_WATCHED", 2)
    monkeypatch.setattr(events, "HEARTBEAT_S", 0.2)  # a closed page is noticed at once, not in 5 s each
    app = create_app(project.runtime)
    server = DevServer(app, "127.0.0.1", 0)
    server.start()
    try:
        url = f"http://127.0.0.1:{server.port}"
        with feed(url, None, "?job=a&job=b") as f:
            f.next("job-gone")
            wait_for(lambda: len(app.app.hub.streams) == 1, timeout=5, what="the first stream")
            refused = requests.get(url + "/events?job=c", timeout=10)
            assert refused.status_code == 503 and refused.headers["Retry-After"] == "10", refused.text
            with feed(url, None, "?job=b") as same:
                assert same.next("job-gone") == {"id": "b"}
    finally:
        server.stop()


def test_watched_jobs_are_shared_fairly_between_tokens(project: Project, monkeypatch: Any) -> None:
    """A token may watch more than its fair part of the process's bound only while the
    others leave room: alone it takes 5 of 8 (before, a fixed quarter refused its third).
    Once four other tokens fill the rest, a newcomer watching one job still gets its fair
    part (8 / 5 tokens): the stream of the token most over its part ends to make room
    (before: a 503, as four tokens at a quarter each filled the process). That token asking
    for its 5 again gets the 503 naming its fair share, and within its part it is served."""
    monkeypatch.setattr(hub, "MAX_WATCHED", 8)
    monkeypatch.setattr(events, "HEARTBEAT_S", 0.2)  # a closed page is noticed at once
    names = [f"r{i}" for i in range(5)]
    project.write_config(extra="".join(f'\n[api.tokens.{n}]\nenv = "{n.upper()}_T"\nscopes = ["read"]\n'
                                       for n in names))
    from runner import config as config_mod
    from runner.runtime import Runtime

    env = {**project.env, **{f"{n.upper()}_T": f"{n}-secret" for n in names}}
    rt = Runtime.create(config_mod.load(project.root / "runner.toml", env=env))
    app = create_app(rt)
    server = DevServer(app, "127.0.0.1", 0)
    server.start()
    try:
        url = f"http://127.0.0.1:{server.port}"
        with contextlib.ExitStack() as opened:
            greedy = opened.enter_context(feed(url, "r0-secret", "?job=a&job=b&job=c&job=d&job=e"))
            greedy.next("job-gone")
            for n, job in zip(names[1:4], "fgh", strict=True):
                opened.enter_context(feed(url, f"{n}-secret", f"?job={job}")).next("job-gone")
            wait_for(lambda: len(app.app.hub.streams) == 4, timeout=5, what="four streams")
            newcomer = opened.enter_context(feed(url, "r4-secret", "?job=i"))
            assert newcomer.next("job-gone") == {"id": "i"}
            assert greedy.ended(timeout=5), "the stream over its fair part should end"
            again = requests.get(url + "/events?job=a&job=b&job=c&job=d&job=e",
                                 headers={"Authorization": "Bearer r0-secret"}, timeout=10)
            assert again.status_code == 503 and "fair share" in again.json()["detail"], again.text
            within = opened.enter_context(feed(url, "r0-secret", "?job=j"))
            assert within.next("job-gone") == {"id": "j"}
    finally:
        server.stop()
        rt.close()


def _token_app(project: Project) -> tuple[Any, Any, DevServer]:
    """A dev server of an app with two read tokens: reader-secret and ops-secret."""
    project.write_config(extra='\n[api.tokens.reader]\nenv = "READER_T"\nscopes = ["read"]\n'
                               '[api.tokens.ops]\nenv = "OPS_T"\nscopes = ["read", "operate"]\n')
    from runner import config as config_mod
    from runner.runtime import Runtime

    env = {**project.env, "READER_T": "reader-secret", "OPS_T": "ops-secret"}
    rt = Runtime.create(config_mod.load(project.root / "runner.toml", env=env))
    app = create_app(rt)
    server = DevServer(app, "127.0.0.1", 0)
    server.start()
    return rt, app, server


def test_a_tokens_share_counts_each_streams_watched_jobs(project: Project, monkeypatch: Any) -> None:
    """A token's share of watched jobs counts each stream's ids, not the distinct ids: a
    stream costs a view per watched job per tick whatever another stream watches, so a
    token could open streams on the same job without end. Past its share (alone: the
    whole bound): the 503."""
    monkeypatch.setattr(hub, "MAX_WATCHED", 4)
    monkeypatch.setattr(events, "HEARTBEAT_S", 0.2)  # a closed page is noticed at once
    rt, app, server = _token_app(project)
    try:
        url = f"http://127.0.0.1:{server.port}"
        with feed(url, "reader-secret", "?job=a&job=b") as f, feed(url, "reader-secret", "?job=a&job=b") as g:
            f.next("job-gone")
            g.next("job-gone")
            wait_for(lambda: len(app.app.hub.streams) == 2, timeout=5, what="the reader's streams")
            again = requests.get(url + "/events?job=a", headers={"Authorization": "Bearer reader-secret"},
                                 timeout=10)
            assert again.status_code == 503 and "fair share" in again.json()["detail"], again.text
    finally:
        server.stop()
        rt.close()


def test_one_token_opens_a_bounded_number_of_streams(project: Project, monkeypatch: Any) -> None:
    """Each stream holds a connection: a token past STREAMS_PER_TOKEN open streams gets a
    429 with Retry-After saying to close a page (1,005 streams of one token filled the
    server's connection cap), and another token still opens its own."""
    monkeypatch.setattr(hub, "STREAMS_PER_TOKEN", 3)
    monkeypatch.setattr(events, "HEARTBEAT_S", 0.2)  # closed streams are let go at once, not in 5 s each
    rt, app, server = _token_app(project)
    try:
        url = f"http://127.0.0.1:{server.port}"
        with contextlib.ExitStack() as opened:
            for _ in range(3):
                opened.enter_context(feed(url, "reader-secret")).next("queues")
            wait_for(lambda: len(app.app.hub.streams) == 3, timeout=5, what="three streams")
            refused = requests.get(url + "/events", headers={"Authorization": "Bearer reader-secret"}, timeout=10)
            assert refused.status_code == 429, refused.text
            assert int(refused.headers["Retry-After"]) > 0
            assert "close" in refused.json()["detail"] and "3" in refused.json()["detail"]
            with feed(url, "ops-secret") as other:
                other.next("queues")
    finally:
        server.stop()
        rt.close()


def test_a_tick_encodes_each_watched_view_once_for_every_stream(project: Project, monkeypatch: Any) -> None:
    """Fifty streams watching the same twenty jobs: one tick encodes each job's view once
    (and each queues event once), not once per stream, and every stream gets them."""
    from runner.store import codec, records

    calls = [0]
    real = codec.dumpb_view

    def counting(obj: Any) -> bytes:
        calls[0] += 1
        return real(obj)

    monkeypatch.setattr(codec, "dumpb_view", counting)
    ids = [f"j{i}" for i in range(20)]
    jobs = {i: records.Job(i, "fast", {"type": "record", "payload": '{"n":1}', "status": "queued"}) for i in ids}

    async def tick() -> list[hub.Stream]:
        h = hub.Hub(project.client, Offload(1))
        streams = [hub.Stream(frozenset(ids), owner=f"t{n}") for n in range(50)]
        h.streams.update(streams)
        reading = h._reading([], jobs)
        h._fan_out(reading)
        return streams

    streams = asyncio.run(tick())
    assert calls[0] <= len(ids) + 3, calls[0]
    assert all(s.events.qsize() == 2 + len(ids) for s in streams)


def test_one_token_follows_a_bounded_number_of_logs_and_streams(project: Project, monkeypatch: Any) -> None:
    """A follow (GET /jobs/{id}/logs?follow=1, /stream) holds a connection and polls Redis
    as long as its job runs: a token past its share of them gets the 429 an event stream
    gets, a closed one frees its place, and another token still follows."""
    from runner.web import watching

    monkeypatch.setattr(watching, "STREAMS_PER_TOKEN", 2)
    monkeypatch.setattr(watching, "HEARTBEAT_S", 0.2)  # a closed follow is noticed at once, not in 5 s
    rt, _app, server = _token_app(project)
    job = project.client.enqueue("record", {"n": 1}).id  # no worker: it stays queued
    try:
        url = f"http://127.0.0.1:{server.port}"

        def follow(token: str, path: str) -> requests.Response:
            return requests.get(url + path, headers={"Authorization": f"Bearer {token}"}, stream=True, timeout=10)

        first = follow("reader-secret", f"/jobs/{job}/logs?follow=1")
        second = follow("reader-secret", f"/jobs/{job}/stream")
        assert first.status_code == second.status_code == 200
        next(first.iter_lines())
        next(second.iter_lines())  # both counted once their first event is out
        refused = follow("reader-secret", f"/jobs/{job}/logs?follow=1")
        assert refused.status_code == 429 and int(refused.headers["Retry-After"]) > 0, refused.text
        assert "close one" in refused.json()["detail"]
        other = follow("ops-secret", f"/jobs/{job}/stream")
        assert other.status_code == 200
        other.close()
        first.close()
        wait_for(lambda: follow("reader-secret", f"/jobs/{job}/stream").status_code == 200, timeout=15,
                 what="a closed follow to free its place")
        second.close()
        assert requests.get(url + f"/jobs/{job}/stream?after=%D9%A3.1",
                            headers={"Authorization": "Bearer reader-secret"}, timeout=10).status_code == 400
    finally:
        server.stop()
        rt.close()
