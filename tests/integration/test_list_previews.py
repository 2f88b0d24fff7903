"""Job lists stay small and quick whatever the payloads: a listed job's payload, result
or checkpoint past listing.PREVIEW_BYTES comes as a preview cut by Redis, with a marker
(``truncated``), and ``GET /jobs/{id}`` still gives it whole. A page of big jobs never
holds the web process's event loop: /healthz answers meanwhile."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from test_web_support import Web, gunicorn, served

from runner.store import records
from runner.store.embedded import Server
from runner.store.listing import PREVIEW_BYTES

from conftest import Project

BIG = {"a": list(range(150_000))}  # ~0.9 MiB of JSON, slow to parse and to encode again


@pytest.fixture
def web(project: Project) -> Iterator[Web]:
    project.write_config(extra="\n[api]\nmax_body_bytes = 4194304\n")
    with gunicorn(project) as w:
        yield w


@pytest.fixture(scope="module")
def one(tmp_path_factory: pytest.TempPathFactory, server: Server) -> Iterator[tuple[Project, Web]]:
    """One project and server for the tests that read their own jobs by id (the ones that
    count a whole list have a server each): a server each was most of their time."""
    with served(tmp_path_factory, server, lambda p: None) as project_web:
        yield project_web


def _kill(project: Project, job_id: str) -> None:
    """Make a queued job dead, as a last failure would (its record and state stay)."""
    r, k = project.runtime.redis, project.keys()
    r.lrem(k.ready, 0, job_id)
    r.hset(k.state(job_id), mapping={"status": "dead", "reason": "planned",
                                     "error": '{"type":"RuntimeError","message":"planned"}'})
    r.zadd(k.dead, {job_id: time.time() * 1000})


# Probes /healthz from a process of its own until its stdin closes, then prints each
# answer's time: a thread of the test's process would share a GIL with the threads
# reading the big pages, and measure its own wait for that lock as the server's.
_PROBE = """
import http.client, json, sys, threading, time
host, port = sys.argv[1], int(sys.argv[2])
stop, out = threading.Event(), []
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
conn = http.client.HTTPConnection(host, port, timeout=60)
while not stop.is_set():
    t = time.monotonic()
    conn.request("GET", "/healthz")
    response = conn.getresponse()
    response.read()
    assert response.status == 200, response.status
    out.append(time.monotonic() - t)
    if len(out) == 1:
        print("up", flush=True)
    time.sleep(0.01)
print(json.dumps(out))
"""


@contextmanager
def _healthz_times(web: Web) -> Iterator[list[float]]:
    host, port = web.url.removeprefix("http://").split(":")
    prober = subprocess.Popen([sys.executable, "-c", _PROBE, host, port], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    times: list[float] = []
    try:
        # Its first answer comes before the load (a fixed 0.2 s was not enough for its
        # start on a loaded host: it then measured nothing at all).
        assert prober.stdout is not None and prober.stdout.readline() == "up\n", "the probe never answered"
        yield times
    finally:
        out, _ = prober.communicate("", timeout=120)
    assert prober.returncode == 0, prober.returncode
    times.extend(json.loads(out))


def test_a_list_of_big_jobs_shows_previews_and_keeps_healthz_quick(project: Project, web: Web) -> None:
    """25 jobs of ~1 MiB: /jobs and /dead/{queue} answer with a preview of each payload
    (null payload, ``payload_preview`` of PREVIEW_BYTES, ``truncated`` giving the full
    size), small jobs whole, and /healthz answers in under a second while the pages are
    read again and again. Before, every page parsed and re-encoded 25 MiB on the loop."""
    c = project.client
    big = [c.enqueue("record", BIG).id for _ in range(25)]
    small = c.enqueue("record", {"n": 1}).id
    full = len(records.parse(project.runtime.redis.get(project.keys().job(big[0])))["payload"])  # type: ignore[index]

    page = web.get("/jobs?status=queued&limit=50").json()
    by_id = {j["id"]: j for j in page["jobs"]}
    assert by_id[small]["payload"] == {"n": 1} and "truncated" not in by_id[small]
    entry = by_id[big[0]]
    assert entry["payload"] is None and entry["truncated"] == {"payload": full}
    assert len(entry["payload_preview"].encode()) == PREVIEW_BYTES
    assert entry["payload_preview"].startswith('{"a":[0,1,2,')
    assert web.get(f"/jobs/{big[0]}").json()["payload"] == BIG

    for job_id in big:
        _kill(project, job_id)
    dead = web.get("/dead/fast?limit=50").json()
    assert dead["total"] == 25 and all(j["truncated"] == {"payload": full} for j in dead["jobs"])
    assert len(web.get("/dead/fast?limit=50").content) < 25 * 2 * PREVIEW_BYTES

    with _healthz_times(web) as latencies:
        for _ in range(4):
            assert web.get("/jobs?status=dead&limit=500").status_code == 200
            assert web.get("/dead/fast?limit=500").status_code == 200
    assert latencies and max(latencies) < 1.0, max(latencies)


def test_a_big_result_is_a_preview_in_the_done_list(one: tuple[Project, Web]) -> None:
    """A done job's result past the bound is a preview in the list and whole in its view."""
    project, web = one
    k = project.keys()
    r = project.runtime.redis
    job_id = project.client.enqueue("record", {"n": 2}).id
    result = '{"s":"' + "x" * 100_000 + '"}'
    r.lrem(k.ready, 0, job_id)
    r.delete(k.job(job_id), k.state(job_id))
    r.hset(k.done(0), job_id, f"record 1 1 {int(time.time() * 1000)} +5\n\n{result}\n\n")
    r.rpush(k.done(0) + ":log", job_id)
    entry = next(j for j in web.get("/jobs?status=done").json()["jobs"] if j["id"] == job_id)
    assert entry["result"] is None and entry["truncated"] == {"result": len(result)}
    assert entry["result_preview"] == result[:PREVIEW_BYTES]
    assert web.get(f"/jobs/{job_id}").json()["result"] == {"s": "x" * 100_000}


def test_a_big_error_keeps_its_type_and_the_start_of_its_message_in_lists(one: tuple[Project, Web]) -> None:
    """An error whose JSON passes PREVIEW_BYTES (a message quoting a payload: quotes and
    non-ASCII text) still shows what failed in the dead letters, the job list and
    `runner dead ls`: its type and the start of its message, where the entry's
    ``last_error`` was null and the dashboard's rows and the CLI showed nothing."""
    import subprocess
    import sys

    from runner.store import codec

    project, web = one
    job_id = project.client.enqueue("record", {"n": 1}).id
    message = 'bad order "é"ü ' * 400
    error = codec.dumps({"type": "OrderError", "message": message, "traceback": "x" * 1000})
    assert len(error.encode()) > PREVIEW_BYTES
    _kill(project, job_id)
    project.runtime.redis.hset(project.keys().state(job_id), "error", error)
    for path in ("/dead/fast?limit=50", "/jobs?status=dead&limit=50"):
        [entry] = [j for j in web.get(path).json()["jobs"] if j["id"] == job_id]
        err = entry["last_error"]
        assert err["type"] == "OrderError" and err["cut"] is True, (path, err)
        assert err["message"].startswith('bad order "é"ü bad order') and err["message"].endswith(" ..."), err
        assert entry["truncated"]["last_error"] == len(error.encode())
        assert entry["last_error_preview"].startswith('{"type":"OrderError"')
    assert project.client.get(job_id).as_dict()["last_error"]["message"] == message
    cli = subprocess.run([sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"),
                          "dead", "ls", "--queue", "fast"], env=project.env, capture_output=True, text=True,
                         timeout=30)
    [row] = [line for line in cli.stdout.splitlines() if job_id in line]
    assert "OrderError" in row and "bad order" in row, row


def test_a_preview_cut_inside_a_character_keeps_whole_characters(one: tuple[Project, Web]) -> None:
    """A preview is the first PREVIEW_BYTES of JSON text, cut at a character boundary:
    never over that many bytes, never ending in a replacement character for the bytes
    of a character cut in two (2-byte and 4-byte characters at odd offsets)."""
    project, web = one
    ids = [project.client.enqueue("record", {"p": "b" + "é" * 5000}).id,
           project.client.enqueue("record", {"p": "bb" + "\U0001F600" * 2000}).id,
           project.client.enqueue("record", {"p": "b" + "\U0001F600" * 2000}).id]
    by_id = {j["id"]: j for j in web.get("/jobs?status=queued&limit=50").json()["jobs"]}
    for job_id in ids:
        preview = by_id[job_id]["payload_preview"]
        assert PREVIEW_BYTES - 3 <= len(preview.encode()) <= PREVIEW_BYTES, len(preview.encode())
        assert "\ufffd" not in preview, preview[-5:]


def test_concurrent_full_pages_of_big_entries_keep_healthz_quick(project: Project, web: Web) -> None:
    """520 dead jobs, each with a payload, a checkpoint and an error over PREVIEW_BYTES
    (three previews an entry: 8.5 MB a page of 500), read by 8 callers at once, 500 a page,
    from a one-process web: /healthz answers in under a second throughout, as a page's
    previews share a budget (listing.PAGE_PREVIEW_BYTES), and each page stays within it."""
    from concurrent.futures import ThreadPoolExecutor

    from runner.store import codec
    from runner.store.listing import PAGE_PREVIEW_BYTES

    c = project.client
    pad = "b" + "é" * 3000
    from runner.client import Request

    ids = [job.id for job in c.enqueue_many([Request("record", {"pad": pad, "i": i}) for i in range(520)])]
    r, k = project.runtime.redis, project.keys()
    error = codec.dumps({"type": "ValueError", "message": "could not import order: " + pad, "traceback": ""})
    pipe = r.pipeline(transaction=False)
    for job_id in ids:
        pipe.lrem(k.ready, 0, job_id)
        pipe.hset(k.state(job_id), mapping={"status": "dead", "reason": "planned", "error": error,
                                            "checkpoint": codec.dumps({"pad": pad})})
        pipe.zadd(k.dead, {job_id: time.time() * 1000})
    pipe.execute()
    page = web.get("/dead/fast?limit=500")
    assert page.status_code == 200 and len(page.json()["jobs"]) == 500
    assert len(page.content) < PAGE_PREVIEW_BYTES + 500 * 1024, len(page.content)
    entry = page.json()["jobs"][0]
    assert set(entry["truncated"]) == {"payload", "checkpoint", "last_error"}, entry["truncated"]
    assert entry["last_error"]["type"] == "ValueError"
    small = web.get("/dead/fast?limit=5").json()["jobs"][0]
    assert len(small["payload_preview"].encode()) > PREVIEW_BYTES - 4  # a small page keeps full previews

    paths = ["/dead/fast?limit=500", "/jobs?status=dead&limit=500"]
    with _healthz_times(web) as latencies, ThreadPoolExecutor(8) as pool:
        t = time.monotonic()
        codes = list(pool.map(lambda i: web.session.get(web.url + paths[i % 2], timeout=120).status_code,
                              range(16)))
        pages_s = time.monotonic() - t
    assert set(codes) == {200}, codes
    # Under two seconds (a tenth of that on a quiet machine; a machine loaded 13 on two
    # cores took one probe past a second); on a machine so busy that the pages take over
    # 8 s, under a quarter of their time (a probe queued behind them waited about half of
    # it). test_healthz_does_not_queue_behind_a_busy_pool pins the queueing itself.
    assert latencies and max(latencies) < max(2.0, pages_s / 4), (max(latencies), pages_s)


def test_healthz_does_not_queue_behind_a_busy_pool(project: Project) -> None:
    """With every thread of the web process's pool held by slow work (eight big pages, a
    hung read), /healthz still answers at once, and probes that arrive together while its
    ping is in flight share that one ping. Before, its ping waited for a free thread:
    a busy but healthy process answered its load balancer late."""
    import asyncio
    import threading

    import falcon.asgi
    import falcon.testing

    from runner.web.catalog import Health
    from runner.web.offload import Offload

    offload = Offload(8)
    health = Health(project.runtime, offload)
    release = threading.Event()
    pings: list[float] = []
    ping = health._ping

    def counted() -> bool:
        pings.append(time.monotonic())
        time.sleep(0.1)
        return ping()

    health._ping = counted  # type: ignore[method-assign]

    async def scenario() -> list[float]:
        held = [asyncio.ensure_future(offload(release.wait, 30)) for _ in range(8)]
        await asyncio.sleep(0.1)
        try:
            async def probe() -> float:
                t = time.monotonic()
                resp = falcon.asgi.Response()
                await health.on_get(falcon.testing.create_asgi_req(path="/healthz"), resp)
                assert resp.status in (200, "200 OK"), resp.status
                return time.monotonic() - t

            return list(await asyncio.wait_for(asyncio.gather(*(probe() for _ in range(5))), timeout=5))
        finally:
            release.set()
            await asyncio.gather(*held)

    took = asyncio.run(scenario())
    assert max(took) < 1.0, took
    assert len(pings) == 1, pings  # five probes at once, one ping


def test_healthz_answers_503_in_its_own_time_when_redis_stops_answering(project: Project,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A Redis that stops answering (SIGSTOP, a stalled host) makes /healthz a 503 within
    HEALTH_WAIT_S; before, the probe hung for the socket timeout (15 s), which a load
    balancer with a shorter timeout reads as a dead process. Its ping goes on, shared by
    the probes after it, and the next probe once Redis answers is a 200."""
    import asyncio
    import threading

    import falcon.asgi
    import falcon.testing

    from runner.web import catalog
    from runner.web.offload import Offload
    from runner.web.problems import Problem

    monkeypatch.setattr(catalog, "HEALTH_WAIT_S", 0.3)
    health = catalog.Health(project.runtime, Offload(2))
    answered = threading.Event()
    ping = health._ping
    health._ping = lambda: answered.wait(10) and ping()  # type: ignore[method-assign]

    async def probe() -> int:
        resp = falcon.asgi.Response()
        try:
            await health.on_get(falcon.testing.create_asgi_req(path="/healthz"), resp)
        except Problem as exc:
            return int(str(exc.status)[:3])
        return 200

    async def scenario() -> tuple[list[int], float, int]:
        t = time.monotonic()
        stalled = list(await asyncio.gather(probe(), probe()))
        took = time.monotonic() - t
        answered.set()
        await asyncio.sleep(0.1)
        return stalled, took, await probe()

    stalled, took, after = asyncio.run(scenario())
    assert stalled == [503, 503] and took < 2.0, (stalled, took)
    assert after == 200
