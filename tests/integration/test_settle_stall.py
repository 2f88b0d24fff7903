"""Another client's command waits about one script call beside a worker settling big
results, even after a pause: a round trip of calls goes out in writes of at most
transport.WRITE_BYTES, each sent once the last is answered. Redis goes on reading a client
it holds back (CLIENT PAUSE WRITE, a failover's pause), and when it lets it go, runs
every call of its query buffer back to back: 160 results of 1 MB parked through an outage
and sent again in one write into a paused server held a PING 1.1-1.4 s (21 calls, the
longest 0.08-0.26 s). Timed against the longest call, so a slow machine moves both."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from runner.client import Request
from runner.store.embedded import Server

from conftest import Project, done_ids, make_project, wait_for

JOBS = 160
BIG = '''"""Waits for the gate file, then returns about 1 MB."""
import os
import time
from pathlib import Path

QUEUE = "fast"


def handle(payload, ctx):
    records = Path(os.environ["RECORD_DIR"])
    (records / f"ran-{payload['i']}").touch()
    deadline = time.monotonic() + 60
    while not (records / "gate").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    result = "r" * 1_000_000 + str(payload["i"])
    (records / f"ended-{payload['i']}").touch()
    return result
'''


@pytest.fixture
def own(tmp_path: Path) -> Iterator[Project]:
    """A server of the test's own (it is paused, and keeps 160 MB of results)."""
    s = Server(tmp_path / "redis", appendonly=False, extra=["--save", ""]).start()
    p = make_project(tmp_path / "p", s)
    p.add_function("big", BIG)
    p.write_config(concurrency=JOBS, prefetch=0, batch=JOBS, vt=60)
    try:
        yield p
    finally:
        p.stop_all()
        if p._runtime is not None:
            p._runtime.close()
        s.stop(kill=True)


def _others(r: Any, mine: set[int]) -> list[dict[str, Any]]:
    return [c for c in r.client_list() if int(c["id"]) not in mine]


def _held(r: Any, mine: set[int]) -> int:
    """The bytes Redis read of the other clients and has not run: the commands parsed and
    held (argv-mem) and those behind them (qbuf)."""
    return sum(int(c["qbuf"]) + int(c["argv-mem"]) for c in _others(r, mine))


class Pinger:
    """PINGs every 5 ms on a connection of its own, and keeps the longest wait."""

    def __init__(self, url: str) -> None:
        self.r = redis.Redis.from_url(url)
        self.worst = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.monotonic()
            self.r.ping()
            self.worst = max(self.worst, time.monotonic() - t)
            self._stop.wait(0.005)

    def __enter__(self) -> Pinger:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _park_into_pause(p: Project, r: Any, mine: set[int]) -> int:
    """Writes paused, the handlers end and the settler's round trip waits in the pause; the
    worker's connections are then cut, as by a brief outage, so its settlements are parked
    and, after the backoff, sent again together into the paused server. Returns the bytes
    Redis read of them meanwhile (it reads a paused client on)."""
    r.execute_command("CLIENT", "PAUSE", 120_000, "WRITE")
    (p.records / "gate").touch()
    wait_for(lambda: len(list(p.records.glob("ended-*"))) == JOBS, timeout=60, what="every handler to end")
    wait_for(lambda: _held(r, mine) > 1_000_000, timeout=30, what="a settlement to wait in the pause")
    for c in _others(r, mine):
        r.client_kill_filter(_id=c["id"])
    seen: list[int] = []

    def sent() -> bool:  # the worker's writes since, as read into its query buffer
        seen.append(_held(r, mine))
        return len(seen) > 20 and seen[-1] > 1_000_000 and seen[-1] == seen[-20]

    wait_for(sent, timeout=30, interval=0.05, what="the parked settlements to be sent again")
    return seen[-1]


def test_a_ping_waits_about_one_call_beside_big_results_sent_into_a_paused_server(own: Project) -> None:
    p = own
    r = redis.Redis.from_url(p.server.url)
    ids = [j.id for j in p.client.enqueue_many([Request("big", {"i": i}) for i in range(JOBS)])]
    r.config_set("slowlog-log-slower-than", 1000)
    r.config_set("slowlog-max-len", 100_000)
    p.spawn_worker("fast")
    wait_for(lambda: len(list(p.records.glob("ran-*"))) == JOBS, timeout=60, what="every handler to start")
    with Pinger(p.server.url) as pinger:
        mine = {r.client_id(), pinger.r.client_id()}
        try:
            buffered = _park_into_pause(p, r, mine)
        finally:
            r.execute_command("CLIENT", "UNPAUSE")
        wait_for(lambda: len(done_ids(r, p.keys())) == JOBS, timeout=60, interval=0.1, what="every job to be done")
    calls = [int(e["duration"]) / 1e6 for e in r.slowlog_get(100_000)
             if bytes(e["command"]).upper().startswith(b"EVAL")]
    longest = max(calls)
    # Back to back, the calls read in the pause held the PING for all of them (20 of 8 MiB);
    # now for the one call each write holds at most (with room for a loaded machine).
    assert pinger.worst < 2 * longest + 0.1, (round(pinger.worst, 3), round(longest, 3), len(calls), buffered)
    assert {p.client.get(i).status for i in ids} == {"done"}
