"""Per-job logs: every ctx.logger line (and, under process isolation, what the handler
printed) is kept with its job, bounded by [retention] logs, written with the settlement,
readable through the client, `runner logs` and GET /jobs/{id}/logs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runner.client import watching
from runner.errors import RedisUnavailable
from runner.store.embedded import Server

from conftest import Project, make_project, wait_for

LOGGER = '''"""Logs a few lines (and prints some), then fails or not as asked."""
import sys
from typing import Any
{extra}

def handle(payload, ctx):
    for i in range(payload.get("n", 3)):
        ctx.logger.info("line %d of %s", i, ctx.job_id)
    ctx.logger.debug("not kept: below INFO")
    print("printed \\x1b[31mred\\x1b[0m")
    print("to stderr", file=sys.stderr)
    if payload.get("fail"):
        raise ValueError("boom")
    return {{"ok": True}}
'''

QUIET = '''"""Logs nothing."""

def handle(payload, ctx):
    return 1
'''


def _add(project: Project, isolation: str, bounds: str = "", vt: float = 2, concurrency: int = 8) -> None:
    project.add_function("logger", LOGGER.format(extra=_iso(isolation)))
    project.add_function("quiet", QUIET)
    project.write_config(vt=vt, concurrency=concurrency)
    if bounds:
        _bound(project, bounds)


def _bound(project: Project, bounds: str) -> None:
    """The project's [retention] logs bounds ("lines = L, bytes = B")."""
    toml = project.root / "runner.toml"
    toml.write_text(toml.read_text().replace("[retention]\n", f"[retention]\nlogs = {{ {bounds} }}\n", 1))


def _msgs(project: Project, job_id: str) -> list[str]:
    return [str(line["msg"]) for line in project.client.logs(job_id)["lines"]]


def _iso(isolation: str) -> str:
    return 'ISOLATION = "process"' if isolation == "process" else ""


def _shared(root: Path, server: Server, functions: dict[str, str], bounds: str = "",
            env: dict[str, str] | None = None, **config: Any) -> Iterator[Project]:
    """One project, and one worker serving all its queues, for the tests of a module that
    need no config of their own: each test enqueues its own jobs (of functions named for
    its isolation) and reads only their logs, chunks and keys, as users' jobs share a
    worker. A worker per test (its start, imports and first claim) was most of such a
    test's cost. Every function is there before the worker starts, which loads them all."""
    project = make_project(root, server)
    for name, source in functions.items():
        project.add_function(name, source)
    project.write_config(**config)
    if bounds:
        _bound(project, bounds)
    project.spawn_worker(env=env)
    yield project
    project.close()


def _both(name: str, source: str) -> dict[str, str]:
    """A function's thread and process forms, as ``<name>_thread`` and ``<name>_process``."""
    return {f"{name}_{iso}": source.format(extra=_iso(iso)) for iso in ("thread", "process")}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, server: Server) -> Iterator[Project]:
    """The shared project on the default config (grace 1 s: the cancels' tests), both queues."""
    functions = {**_both("logger", LOGGER), "quiet": QUIET, **_both("live", LIVE), **_both("streamer", STREAMER),
                 **_both("bigchunk", BIG_CHUNK), "printer": SURROGATE_PRINT, "idioms": STREAM_IDIOMS,
                 "napper": NAPPER, "later": RETRY_LATER, **_both("replayed", REPLAYED), **_both("runs", RUNS),
                 "longprints": LONG_PRINTS}
    yield from _shared(tmp_path_factory.mktemp("served"), server, functions, grace=1)


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory, server: Server) -> Iterator[Project]:
    """The shared project whose logs keep 50 lines (1 MiB), visibility 30 s (floods, and
    2,000 lines: a renewal starved on a loaded machine must start no second run), two
    executor slots (its tests run one job at a time; each process slot warms a child)."""
    yield from _shared(tmp_path_factory.mktemp("bounded"), server, _both("logger", LOGGER),
                       "lines = 50, bytes = 1048576", vt=30, concurrency=2)


@pytest.fixture(scope="module")
def roomy(tmp_path_factory: pytest.TempPathFactory, server: Server) -> Iterator[Project]:
    """The shared project whose logs keep 100,000 lines (16 MiB), visibility 30 s (a
    renewal starved on a loaded machine must not start a second run beside the first: its
    lines would be lines of the log too), its worker's own output at WARNING (the lines
    are not echoed there), two executor slots (one job at a time)."""
    functions = {**_both("tenk", TEN_THOUSAND), "ticker": TICKER}
    yield from _shared(tmp_path_factory.mktemp("roomy"), server, functions, "lines = 100000, bytes = 16777216",
                       env={"RUNNER_LOG_LEVEL": "WARNING"}, vt=30, concurrency=2)


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_jobs_log_lines_are_kept_with_it(served: Project, isolation: str) -> None:
    """Each ctx.logger line at INFO and above is kept in order; a child's prints go to
    the log too (stdout and stderr told apart); a job that logs nothing keeps no log key."""
    project = served
    client = project.client
    job = client.enqueue(f"logger_{isolation}", {"n": 3})
    quiet = client.enqueue("quiet", {})
    assert client.settle(job.id, 30).status == "done"
    assert client.settle(quiet.id, 30).status == "done"
    got = client.logs(job.id)
    assert got["status"] == "done"
    msgs = [line["msg"] for line in got["lines"] if line["src"] == "log"]
    assert msgs == [f"line {i} of {job.id}" for i in range(3)]
    assert all(line["level"] == "INFO" and isinstance(line["ts"], int) for line in got["lines"])
    if isolation == "process":
        by_src = {line["src"]: line["msg"] for line in got["lines"] if line["src"] != "log"}
        assert by_src == {"stdout": "printed \x1b[31mred\x1b[0m", "stderr": "to stderr"}
    k = project.keys("fast")
    assert project.runtime.redis.exists(k.log(quiet.id)) == 0
    assert client.logs(quiet.id)["lines"] == []
    ttl = project.runtime.redis.pttl(k.log(job.id))
    assert 0 < ttl <= project.runtime.config.retention.done_s * 1000


class _Monitor:
    """Every command the server runs (MONITOR), scripts' own commands among them, in the
    order it runs them."""

    def __init__(self, redis: Any) -> None:
        import threading
        import uuid

        self.redis = redis
        self.marker = f"monitor-end-{uuid.uuid4().hex}"
        self.conn = redis.connection_pool.make_connection()
        self.conn.connect()
        self.conn.send_command("MONITOR")
        assert self.conn.read_response() in (b"OK", "OK")
        self.lines: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        # Once stopped, what the server ran before is still read (a loaded host's reader
        # lags the server): up to the marker close() sends, at most 10 s more.
        end = None
        while end is None or time.monotonic() < end:
            if self.stop.is_set() and end is None:
                end = time.monotonic() + 10
            if self.conn.can_read(timeout=0.05):
                got = self.conn.read_response()
                line = got.decode() if isinstance(got, bytes) else str(got)
                self.lines.append(line)
                if self.marker in line:
                    return

    def close(self) -> list[str]:
        self.redis.echo(self.marker)
        self.stop.set()
        self.thread.join()
        self.conn.disconnect()
        return self.lines


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_whoever_sees_a_job_ended_sees_its_whole_log(project: Project, isolation: str) -> None:
    """Many jobs log while readers wait for each one's end and read its log at once: the
    server writes each job's last log lines before the settlement that ends it, and every
    read has every line; also on the first settlements after Redis lost its scripts (a
    restart, a flush) while another job's settlement loaded the settle's own script
    again. (The log's write was then answered NOSCRIPT and sent again after the settle
    had run: a reader saw the job done with an empty log.)"""
    import threading

    _add(project, isolation)
    project.write_config(concurrency=2)  # (two children to start, on a loaded machine)
    client = project.client
    project.spawn_worker("fast")
    assert client.settle(client.enqueue("quiet", {}).id, 30).status == "done"
    bad: list[tuple[str, list[str]]] = []

    def read(job_id: str) -> None:
        if client.settle(job_id, 30).status != "done":
            bad.append((job_id, ["not done"]))
            return
        msgs = [m for m in _msgs(project, job_id) if m.startswith("line ")]
        if msgs != [f"line {i} of {job_id}" for i in range(3)]:
            bad.append((job_id, msgs))

    monitor = _Monitor(project.runtime.redis)
    jobs: list[str] = []
    try:
        for _ in range(4):
            project.runtime.redis.script_flush()
            # Another job's settlement loads the settle's script again, not the log's.
            assert client.settle(client.enqueue("quiet", {}).id, 30).status == "done"
            batch = [client.enqueue("logger", {"n": 3}).id for _ in range(6)]
            jobs += batch
            readers = [threading.Thread(target=read, args=(j,)) for j in batch]
            for t in readers:
                t.start()
            for t in readers:
                t.join()
    finally:
        ran = monitor.close()
    assert not bad, f"read ended without its whole log: {bad}"
    # In the order the server ran them: a job's record deleted (its success) only after
    # the last write of its log lines.
    late = []
    for j in jobs:
        logged = max(i for i, c in enumerate(ran) if '"RPUSH"' in c and f':log:{j}"' in c)
        ended = min(i for i, c in enumerate(ran) if '"DEL"' in c and f':job:{j}"' in c)
        if logged > ended:
            late.append(j)
    assert not late, f"log lines written after the job ended: {late}"


def test_a_flood_is_bounded_and_the_worker_goes_on(project: Project) -> None:
    """A handler logging far past the bounds keeps only the newest lines within them, with
    a line that says how many were dropped; the next job runs as usual."""
    # 20,000 lines take about 0.5 s on a quiet machine, past the default 2 s TIMEOUT on a
    # loaded one: the bounds are under test here, not the speed.
    _add(project, "thread", "lines = 50, bytes = 4096", vt=30)
    client = project.client
    flood = client.enqueue("logger", {"n": 20_000})
    project.spawn_worker("fast")
    assert client.settle(flood.id, 60).status == "done"
    lines = client.logs(flood.id)["lines"]
    assert len(lines) <= 50
    assert sum(len(json.dumps(x, ensure_ascii=False)) for x in lines) <= 4096 + 1024
    assert lines[-1]["msg"] == f"line 19999 of {flood.id}"
    assert any("dropped" in str(x["msg"]) for x in lines) or len(lines) < 50
    after = client.enqueue("logger", {"n": 1})
    assert client.settle(after.id, 30).status == "done"
    assert _msgs(project, after.id) == [f"line 0 of {after.id}"]


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_floods_marker_counts_every_line_it_lost(bounded: Project, isolation: str) -> None:
    """A flood leaves one line ("[N earlier line(s) dropped ...]") at the head of its log,
    and N is every line the log lost since it began: those the worker dropped before they
    were sent, those a child dropped before it handed the rest over (the worker's bounds
    pushed out the child's own marker, and the worker's counted only its drops: 2 said
    for 2,501 lost), and those sent and then trimmed in Redis."""
    project = bounded
    client = project.client
    flood = client.enqueue(f"logger_{isolation}", {"n": 20_000})
    assert client.settle(flood.id, 60).status == "done"
    msgs = _msgs(project, flood.id)
    kept = sum(1 for m in msgs if m.startswith("line "))
    markers = [m for m in msgs if "earlier line(s) dropped" in m]
    assert len(markers) == 1 and msgs[0] == markers[0], msgs[:3]
    said = int(markers[0].split()[0].strip("[").replace(",", ""))
    assert said == 20_000 - kept, (said, kept, msgs[:3])


TRICKLE = '''"""Logs a few lines at a time, slower than the renewals send them."""
import time

TIMEOUT = 9


def handle(payload, ctx):
    for i in range(payload["n"]):
        ctx.logger.info("trickle %d", i)
        if i % 5 == 4:
            time.sleep(0.1)
    return 1
'''


def test_lines_sent_live_and_then_trimmed_are_counted_by_the_marker(project: Project) -> None:
    """Lines a running job's renewals sent, then pushed out of the log by newer ones, are
    lost too: the log keeps a marker that counts them (none was written when the worker
    itself had dropped nothing unsent, so whether a reader learnt of the loss hung on the
    logging rate)."""
    project.add_function("trickle", TRICKLE)
    project.write_config(vt=1)
    _bound(project, "lines = 50, bytes = 1048576")
    client = project.client
    job = client.enqueue("trickle", {"n": 120})  # (over 2 s of renewals, over twice the 50 kept)
    project.spawn_worker("fast")
    assert client.settle(job.id, 60).status == "done"
    msgs = _msgs(project, job.id)
    assert msgs[-1] == "trickle 119"
    kept = sum(1 for m in msgs if m.startswith("trickle "))
    markers = [m for m in msgs if "earlier line(s) dropped" in m]
    assert markers == msgs[:1], msgs[:3]
    assert markers[0].startswith(f"[{120 - kept:,} earlier line(s) dropped"), (markers, kept)


def test_a_retried_job_keeps_every_attempts_lines(served: Project) -> None:
    """A failed attempt's lines stay: the log spans the job's attempts, up to its dead letter,
    and is kept as long as a dead letter is."""
    project = served
    client = project.client
    job = client.enqueue("logger_thread", {"n": 1, "fail": True})
    wait_for(lambda: client.get(job.id).status == "dead", timeout=60, what="the dead letter")
    msgs = _msgs(project, job.id)
    assert msgs.count(f"line 0 of {job.id}") == project.runtime.config.queues["fast"].max_attempts
    ttl = project.runtime.redis.pttl(project.keys("fast").log(job.id))
    dead_ms = project.runtime.config.retention.dead_s * 1000
    assert dead_ms - 60_000 < ttl <= dead_ms


def test_runner_logs_prints_lines_with_control_characters_escaped(served: Project) -> None:
    """`runner logs ID` prints one line per log line; a producer's control characters are
    shown escaped, never sent to the terminal; --json gives the lines as they are kept."""
    project = served
    client = project.client
    job = client.enqueue("logger_process", {"n": 1})
    assert client.settle(job.id, 30).status == "done"
    base = [sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml")]
    shown = subprocess.run([*base, "logs", job.id], env=project.env, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "\x1b" not in shown.stdout
    assert "printed \\x1b[31mred\\x1b[0m" in shown.stdout
    assert f"line 0 of {job.id}" in shown.stdout
    as_json = subprocess.run([*base, "logs", job.id, "--json"], env=project.env, capture_output=True, text=True,
                             timeout=60)
    assert json.loads(as_json.stdout)["lines"][0]["msg"] == f"line 0 of {job.id}"
    missing = subprocess.run([*base, "logs", "nope"], env=project.env, capture_output=True, text=True, timeout=60)
    assert missing.returncode != 0 and "nope" in missing.stderr


LIVE = '''"""Logs a line, then runs until cancelled."""
import time
QUEUE = "slow"
TIMEOUT = 60
{extra}

def handle(payload, ctx):
    ctx.logger.info("started")
    print("said on stdout")
    while not ctx.cancelled:
        time.sleep(0.02)
    ctx.logger.warning("stopping")
    ctx.raise_if_cancelled()
'''


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_running_jobs_log_is_visible_while_it_runs(served: Project, isolation: str) -> None:
    """Lines reach the log within a lease renewal or so while the handler still runs, and
    a follower gets each line once, in order, and stops when the job ends."""
    project = served
    client = project.client
    job = client.enqueue(f"live_{isolation}", {})
    wait_for(lambda: "started" in _msgs(project, job.id), timeout=30, what="the first line while it runs")
    assert client.get(job.id).status == "processing"
    if isolation == "process":
        wait_for(lambda: "said on stdout" in _msgs(project, job.id), timeout=10, what="the print")
    followed: list[str] = []
    follower = __import__("threading").Thread(
        target=lambda: followed.extend(str(x["msg"]) for x in client.follow_logs(job.id, timeout_s=30)))
    follower.start()
    client.cancel(job.id)
    follower.join(40)
    assert not follower.is_alive()
    assert followed[0] == "started" and followed[-1] == "stopping"
    assert len(followed) == len(set(followed))


def _events(body: str) -> list[tuple[str, str]]:
    out = []
    for block in body.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line and not line.startswith(":"))
        if "event" in fields:
            out.append((fields["event"], fields.get("data", "")))
    return out


def test_get_jobs_id_logs_reads_and_follows_the_log(served: Project) -> None:
    """GET /jobs/{id}/logs answers the lines as JSON (404 for no such job, 401 without a
    token); ?follow=1 streams each line once as server-sent events and ends with the job."""
    from test_web_support import gunicorn

    project = served
    with gunicorn(project, token="t0ken-for-logs") as web:
        job_id = web.post("/jobs/live_thread", json={}).json()["id"]
        wait_for(lambda: "started" in _msgs(project, job_id), timeout=30, what="the first line")
        got = web.get(f"/jobs/{job_id}/logs").json()
        assert got["status"] == "processing" and [x["msg"] for x in got["lines"]] == ["started"]
        assert web.get("/jobs/nope/logs").status_code == 404
        assert web.get(f"/jobs/{job_id}/logs", auth=False).status_code == 401
        assert web.get(f"/jobs/{job_id}/logs?follow=2").status_code == 400
        project.client.cancel(job_id)
        r = web.get(f"/jobs/{job_id}/logs?follow=1")
        assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        events = _events(r.text)
        assert [json.loads(d)["msg"] for e, d in events if e == "line"] == ["started", "stopping"]
        assert events[-1][0] == "end" and json.loads(events[-1][1])["status"] == "cancelled"


STREAMER = '''"""Streams chunks, waiting for a cancel in the middle."""
import time
QUEUE = "slow"
TIMEOUT = 60
{extra}

def handle(payload, ctx):
    for i in range(payload["n"]):
        ctx.stream({{"token": i}})
    ctx.stream("half")
    while not ctx.cancelled and not payload.get("quick"):
        time.sleep(0.02)
    ctx.stream("last")
    return "ok"
'''


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_ctx_stream_reaches_a_follower_and_a_late_reader(served: Project, isolation: str) -> None:
    """client.stream yields each chunk once, in order, while the job runs and after; it
    ends with the job. GET /jobs/{id}/stream gives the same chunks as server-sent events
    to a reader who comes after the end, then "end"."""
    from test_web_support import gunicorn

    project = served
    client = project.client
    job = client.enqueue(f"streamer_{isolation}", {"n": 50})
    seen: list[object] = []
    for chunk in client.stream(job.id, timeout_s=60):
        seen.append(chunk)
        if chunk == "half":
            client.cancel(job.id)
    assert seen == [{"token": i} for i in range(50)] + ["half", "last"]
    assert client.get(job.id).status == "done"
    with gunicorn(project, token="t0ken-for-streams") as web:
        r = web.get(f"/jobs/{job.id}/stream")
        assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        events = _events(r.text)
        assert [json.loads(d)["data"] for e, d in events if e == "chunk"] == seen
        assert events[-1] == ("end", json.dumps({"id": job.id, "status": "done"}))
        later = _events(web.get(f"/jobs/{job.id}/stream?after=1.49").text)
        assert [json.loads(d)["data"] for e, d in later if e == "chunk"] == ["half", "last"]
        assert web.get(f"/jobs/{job.id}/stream?after=x").status_code == 400
        assert web.get("/jobs/nope/stream").status_code == 404


BIG_CHUNK = '''
QUEUE = "slow"
{extra}


def handle(payload, ctx):
    try:
        ctx.stream("x" * 200_000)
    except ValueError as exc:
        ctx.stream(str(exc))
    return "ok"
'''


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_one_stream_chunk_is_bounded(served: Project, isolation: str) -> None:
    """A chunk over 64 KiB is refused with a ValueError saying what to do, so no reader is
    served one huge chunk that the bytes bound could never trim; the run goes on."""
    client = served.client
    job = client.enqueue(f"bigchunk_{isolation}", {})
    seen = list(client.stream(job.id, timeout_s=60))
    assert client.get(job.id).status == "done"
    assert len(seen) == 1 and "over the limit of 65,536" in str(seen[0]) and "smaller pieces" in str(seen[0]), seen


SURROGATE_PRINT = '''
QUEUE = "slow"
ISOLATION = "process"


def handle(payload, ctx):
    name = b"report-\\xff.csv".decode("utf-8", "surrogateescape")
    print("opening " + name)
    ctx.logger.info("still here")
    ctx.stream("chunk " + name)
    return "ok"
'''


def test_a_lone_surrogate_in_a_childs_output_is_kept_with_a_replacement(served: Project) -> None:
    """A handler printing a name decoded with surrogateescape: the line is kept with
    U+FFFD in its place, the lines beside it too, and the job ends done (the child's
    channel refused the line, and every attempt died)."""
    client = served.client
    job = client.enqueue("printer", {})
    wait_for(lambda: client.get(job.id).status in ("done", "dead"), timeout=30, what="the job to end")
    assert client.get(job.id).status == "done", client.get(job.id).as_dict()["last_error"]
    msgs = [ln["msg"] for ln in client.logs(job.id)["lines"]]
    assert "opening report-\ufffd.csv" in msgs and "still here" in msgs, msgs
    assert list(client.stream(job.id, timeout_s=5)) == ["chunk report-\ufffd.csv"]


STREAM_IDIOMS = '''"""Uses sys.stdout and sys.stderr as handler code does with real streams."""
import subprocess
import sys
from typing import Any
import click
ISOLATION = "process"

def handle(payload, ctx):
    click.echo("hello from click")  # probes write(b"") for a binary stream first
    print("next line")
    try:
        sys.stdout.write(b"raw bytes\\n")
        bytes_write = "accepted"
    except TypeError:
        bytes_write = "TypeError"
    sys.stdout.reconfigure(line_buffering=True)
    sys.stdout.buffer.write("raw bytes \\u00e9\\n".encode())
    print("encoding", sys.stdout.encoding, sys.stdout.errors)
    subprocess.run(["sh", "-c", "echo from a tool; echo tool error >&2"], stdout=sys.stdout,
                   stderr=sys.stderr, check=True)
    sys.stderr.buffer.write(b"bad byte \\xff\\n")
    return {"tty": sys.stdout.isatty(), "bytes_write": bytes_write, "name": sys.stdout.name,
            "line_buffering": sys.stdout.line_buffering}
'''


def test_a_childs_captured_output_behaves_as_a_real_stream(served: Project) -> None:
    """Under process isolation the captured sys.stdout and sys.stderr keep what handler code
    relies on: ``buffer`` (bytes go to the log, bad ones replaced), ``encoding`` and
    ``errors``, and the real ``fileno()`` for a subprocess (its output goes to the worker's
    output, not to the job's log). A text stream refuses bytes in write() with TypeError, as
    click.echo (and typer) probe for: they then write to ``buffer``, and the line lands
    whole, not as a bytes repr merged with the next print; ``name``, ``line_buffering`` and
    ``reconfigure`` are there as on the real stream."""
    project = served
    client = project.client
    job = client.enqueue("idioms", {})
    done = client.settle(job.id, 30)
    assert done.status == "done", done.as_dict()
    assert done.as_dict()["result"] == {"tty": False, "bytes_write": "TypeError", "name": "<stdout>",
                                        "line_buffering": True}
    by_src = [(x["src"], x["msg"]) for x in client.logs(job.id)["lines"]]
    assert by_src[:2] == [("stdout", "hello from click"), ("stdout", "next line")], by_src
    assert ("stdout", "raw bytes \u00e9") in by_src
    assert any(src == "stdout" and msg.startswith("encoding ") for src, msg in by_src)
    assert ("stderr", "bad byte \ufffd") in by_src
    assert not any("tool" in msg for _, msg in by_src)  # the descriptor's writes: the worker's output
    assert "from a tool" in (project.root / "worker-0.log").read_text()


TEN_THOUSAND = '''
QUEUE = "slow"
{extra}


def handle(payload, ctx):
    for i in range(10_000):
        ctx.stream(i)
    try:
        ctx.stream({{"score": float("nan")}})
    except TypeError as exc:
        ctx.logger.info("refused: %s", exc)
    for i in range(9_000):
        ctx.logger.info("line %d", i)
    return "ok"
'''


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_ten_thousand_chunks_in_one_write_are_kept_and_nan_is_refused(roomy: Project, isolation: str) -> None:
    """A quick handler streaming 10,000 chunks (the kept bound) and logging 9,000 lines
    hands each over in one write: a late reader gets every chunk and every line, however
    many one write carries. NaN is refused with a TypeError, never sent to a reader's
    JSON parser."""
    project = roomy
    client = project.client
    job = client.enqueue(f"tenk_{isolation}", {})
    assert client.settle(job.id, 60).status == "done"
    assert list(client.stream(job.id, timeout_s=5)) == list(range(10_000))
    msgs = _msgs(project, job.id)
    assert msgs[0].startswith("refused: ctx.stream takes text or JSON") and "NaN" in msgs[0]
    assert msgs[1:] == [f"line {i}" for i in range(9_000)]


IDLE_STREAMER = '''
import time
QUEUE = "slow"
TIMEOUT = 60


def handle(payload, ctx):
    for i in range(3_000):
        ctx.stream(i)
        ctx.logger.info("line %d", i) if i < 400 else None
    ctx.stream("idle")
    while not ctx.cancelled:
        time.sleep(0.02)
    return "ok"
'''


def test_an_idle_follower_does_not_read_the_whole_log_or_stream_again(project: Project) -> None:
    """A follower of a long log or stream that has nothing new asks Redis two small reads
    per poll, not the whole list again (32 idle followers of a long stream once held a web
    process at 60% CPU)."""
    import threading

    project.add_function("idle", IDLE_STREAMER)
    project.write_config(grace=1)
    client = project.client
    job = client.enqueue("idle", {})
    project.spawn_worker("slow")
    seen: list[object] = []
    lines: list[dict[str, object]] = []
    idle = threading.Event()

    def follow_stream() -> None:
        for chunk in client.stream(job.id, timeout_s=60):
            seen.append(chunk)
            if chunk == "idle":
                idle.set()

    def follow_logs() -> None:
        lines.extend(client.follow_logs(job.id, timeout_s=60))

    threads = [threading.Thread(target=follow_stream), threading.Thread(target=follow_logs)]
    for t in threads:
        t.start()
    assert idle.wait(30)
    wait_for(lambda: len(lines) >= 400, timeout=10, what="the log's lines")
    r = project.runtime.redis

    def lranges() -> int:
        return int(r.info("commandstats").get("cmdstat_lrange", {}).get("calls", 0))

    before = lranges()
    import time
    time.sleep(1.5)  # about 6 polls of each follower
    during = lranges() - before
    client.cancel(job.id)
    for t in threads:
        t.join(30)
    assert seen == [*range(3_000), "idle"]
    assert [x["msg"] for x in lines] == [f"line {i}" for i in range(400)]
    assert during <= 2, f"{during} full reads while nothing landed"


def test_a_follow_goes_on_across_a_redis_restart(tmp_path: Path) -> None:
    """GET /jobs/{id}/logs?follow=1 and /stream keep following while Redis is away (a
    comment line says so) instead of ending with an unknown status, and end with the
    job's own status once it ends after Redis is back, every line and chunk sent once."""
    import threading

    import requests
    from test_web_support import gunicorn

    from runner.store.embedded import Server

    srv = Server(tmp_path / "redis", appendonly=True).start()
    project = make_project(tmp_path / "p", srv)
    try:
        project.add_function("live", LIVE.format(extra=""))
        project.write_config(grace=1)
        with gunicorn(project, token="t0ken-for-logs") as web:
            job_id = web.post("/jobs/live", json={}).json()["id"]
            project.spawn_worker("slow")
            wait_for(lambda: "started" in _msgs(project, job_id), timeout=30, what="the first line")
            got: dict[str, list[str]] = {"logs": [], "stream": []}

            def follow(kind: str, path: str) -> None:
                with requests.get(web.url + path, headers={"Authorization": "Bearer t0ken-for-logs"},
                                  stream=True, timeout=60) as r:
                    for raw in r.iter_lines(decode_unicode=True):
                        got[kind].append(raw)

            followers = [threading.Thread(target=follow, args=("logs", f"/jobs/{job_id}/logs?follow=1")),
                         threading.Thread(target=follow, args=("stream", f"/jobs/{job_id}/stream"))]
            for t in followers:
                t.start()
            wait_for(lambda: any(x.startswith("data:") and "started" in x for x in got["logs"]), timeout=20,
                     what="the first line followed")
            srv.stop()
            for kind in got:
                wait_for(lambda kind=kind: any("Redis unavailable" in x for x in got[kind]), timeout=20,
                         what=f"the {kind} follower to say Redis is away")
            assert all(t.is_alive() for t in followers)
            srv.start()

            def cancelled() -> bool:
                try:
                    project.client.cancel(job_id)
                    return True
                except RedisUnavailable:  # a pooled connection to the server before
                    return False

            wait_for(cancelled, timeout=20, what="the cancel")
            for t in followers:
                t.join(40)
                assert not t.is_alive()
        for kind in got:
            events = _events("\n".join(got[kind]) + "\n\n")
            assert events[-1][0] == "end" and json.loads(events[-1][1])["status"] == "cancelled", (kind, events)
        assert [json.loads(d)["msg"] for e, d in _events("\n".join(got["logs"]))
                if e == "line"] == ["started", "stopping"]
    finally:
        project.stop_all()
        srv.stop(kill=True)


def test_the_clients_followers_go_on_across_a_redis_restart(tmp_path: Path) -> None:
    """client.follow_logs and client.stream (and so `runner logs --follow`) of a found
    job carry on while Redis is away, as the job does, and end once it ends after Redis is
    back, every line once (they raised RedisUnavailable at the first poll that failed)."""
    import threading

    from runner.store.embedded import Server

    srv = Server(tmp_path / "redis", appendonly=True).start()
    project = make_project(tmp_path / "p", srv)
    try:
        project.add_function("live", LIVE.format(extra=""))
        project.write_config(grace=1)
        client = project.client
        job_id = client.enqueue("live", {}).id
        project.spawn_worker("slow")
        wait_for(lambda: "started" in _msgs(project, job_id), timeout=30, what="the first line")
        lines: list[str] = []
        errors: list[BaseException] = []

        def follow(kind: str) -> None:
            try:
                if kind == "logs":
                    lines.extend(x["msg"] for x in client.follow_logs(job_id, timeout_s=60))
                else:
                    list(client.stream(job_id, timeout_s=60))
            except BaseException as exc:  # the assertion below names it
                errors.append(exc)

        followers = [threading.Thread(target=follow, args=(kind,), daemon=True) for kind in ("logs", "stream")]
        for t in followers:
            t.start()
        wait_for(lambda: "started" in lines, timeout=20, what="the first line followed")
        srv.stop()
        time.sleep(2)  # several polls of each follower, every one failing
        assert all(t.is_alive() for t in followers) and not errors, errors
        srv.start()

        def cancelled() -> bool:
            try:
                client.cancel(job_id)
                return True
            except RedisUnavailable:  # a pooled connection to the server before
                return False

        wait_for(cancelled, timeout=20, what="the cancel")
        for t in followers:
            t.join(40)
            assert not t.is_alive()
        assert not errors, errors
        assert [m for m in lines if m in ("started", "stopping")] == ["started", "stopping"], lines
    finally:
        project.stop_all()
        srv.stop(kill=True)


NAPPER = '''"""Logs and streams, then sleeps or waits past the retention."""
QUEUE = "fast"

def handle(payload, ctx):
    ctx.logger.info("charged the card")
    ctx.stream("charged")
    if payload.get("wait"):
        ctx.wait_for_signal("go", timeout=payload["wait"])
    else:
        ctx.sleep("nap", payload["sleep"])
    ctx.logger.info("after the sleep")
'''


def test_a_sleeping_or_waiting_jobs_log_lives_until_it_wakes(served: Project) -> None:
    """A durable job's log and stream are kept while it sleeps or waits: suspending it
    keeps them until its wake time plus the retention, however much longer the sleep is
    than the retention."""
    project = served
    c = project.client
    k = project.keys("fast")
    r = project.runtime.redis
    retention_ms = max(project.runtime.config.retention.done_s, project.runtime.config.retention.dead_s) * 1000
    day_ms = 86_400_000
    slept = c.enqueue("napper", {"sleep": 86_400}).id
    waiting = c.enqueue("napper", {"wait": 86_400}).id
    wait_for(lambda: c.get(slept).status == "sleeping" and c.get(waiting).status == "waiting", timeout=30,
             what="the jobs to sleep and wait")
    for job in (slept, waiting):
        assert [x["msg"] for x in c.logs(job)["lines"]] == ["charged the card"]
        for key in (k.log(job), k.stream(job)):
            ttl = r.pttl(key)
            assert day_ms + retention_ms - 60_000 < ttl <= day_ms + retention_ms, (key, ttl)


def test_an_idle_follower_of_a_partitioned_queue_polls_only_the_jobs_home(project: Project) -> None:
    """A follower finds the job's home (queue and partition) once, then polls the two small
    reads of its log and, about once a second, the job's status there: not a lookup in
    every queue partition on every poll (with 4 x 4 partitions, 648 commands a second for
    one idle page)."""
    import threading

    project.add_function("napper", NAPPER)
    project.write_config(fast="partitions = 4")
    c = project.client
    worker = project.spawn_worker("fast")
    job = c.enqueue("napper", {"sleep": 600}).id
    wait_for(lambda: c.get(job).status == "sleeping", timeout=30, what="the job to sleep")
    worker.kill()
    worker.wait(10)
    r = project.runtime.redis
    follower = threading.Thread(target=lambda: list(c.follow_logs(job, timeout_s=60, poll_s=0.02)))

    def calls() -> dict[str, int]:
        return {k: int(v["calls"]) for k, v in r.info("commandstats").items()}

    follower.start()
    before = calls()
    wait_for(lambda: calls().get("cmdstat_llen", 0) - before.get("cmdstat_llen", 0) >= 40, timeout=30,
             what="40 polls")
    after = calls()
    polls = after["cmdstat_llen"] - before.get("cmdstat_llen", 0)
    spent = sum(after.values()) - sum(before.values())
    c.cancel(job)
    follower.join(30)
    assert not follower.is_alive()
    assert spent / polls <= 8, f"{spent} commands in {polls} polls"


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_flood_is_bounded_in_the_workers_own_output_too(bounded: Project, isolation: str) -> None:
    """At INFO a worker echoes a job's ctx.logger lines to its own output only within the
    job log's bounds, then says once that the rest are in the job's log: a flood does not
    go whole to the worker's output (a PaaS log drain)."""
    project = bounded
    client = project.client
    flood = client.enqueue(f"logger_{isolation}", {"n": 3_000})
    (worker,) = project.procs
    assert client.settle(flood.id, 60).status == "done"
    assert f"line 2999 of {flood.id}" in _msgs(project, flood.id)
    log = project.root / f"worker-{project.procs.index(worker)}.log"
    echoed = [x for x in log.read_text(errors="replace").splitlines() if "line " in x and flood.id in x]
    assert 40 <= len(echoed) <= 60, len(echoed)
    said = [x for x in log.read_text(errors="replace").splitlines() if "its own log only" in x and flood.id in x]
    assert len(said) == 1 and f"job {flood.id}: {3_000 - len(echoed)} more ctx.logger line(s)" in said[0], said


BATCH_FLOOD = '''"""A batch that logs a flood through the batch's ctx.logger."""
{extra}
BATCH = {{"size": 2, "wait": 0.2}}
TIMEOUT = 60


def handle_batch(payloads, ctx):
    for i in range(payloads[0]["n"]):
        ctx.logger.info("batch line %d", i)
    return [1] * len(payloads)
'''


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_batchs_flood_is_bounded_in_the_workers_own_output(project: Project, isolation: str) -> None:
    """A batch's shared ctx.logger echoes to the worker's output within the bounds of a
    job's log, as a single job's does (it echoed every line: 20,000 lines of 1 KB put
    22.7 MB in the worker's output), and says once how many more are in the jobs' logs."""
    extra = 'ISOLATION = "process"' if isolation == "process" else ""
    project.add_function("batchflood", BATCH_FLOOD.format(extra=extra))
    project.write_config(vt=30, concurrency=2)  # two jobs: two children, not eight
    _bound(project, "lines = 50, bytes = 1048576")
    client = project.client
    worker = project.spawn_worker("fast")
    jobs = [client.enqueue("batchflood", {"n": 3_000}).id for _ in range(2)]
    for j in jobs:
        assert client.settle(j, 60).status == "done"
        assert "batch line 2999" in _msgs(project, j)
    log = project.root / f"worker-{project.procs.index(worker)}.log"
    wait_for(lambda: "its own log only" in log.read_text(errors="replace"), timeout=10, what="the echo's end line")
    echoed = [x for x in log.read_text(errors="replace").splitlines() if "batch line " in x]
    assert len(echoed) <= 2 * 60, len(echoed)


RETRY_LATER = '''"""Logs a line, then asks to run again a month later."""
from runner import Retry


def handle(payload, ctx):
    ctx.logger.info("attempt %d", ctx.attempt)
    ctx.stream("out")
    raise Retry(delay=30 * 86_400)
'''


def test_a_retrying_jobs_log_lives_until_its_retry_is_due(served: Project) -> None:
    """A job that retries later than the log's retention keeps its log and stream until
    the retry is due plus that retention (they expired with the longer of the done and
    dead retentions, gone before the next attempt ran)."""
    project = served
    c = project.client
    k = project.keys("fast")
    r = project.runtime.redis
    retention_ms = max(project.runtime.config.retention.done_s, project.runtime.config.retention.dead_s) * 1000
    job = c.enqueue("later", {}).id
    wait_for(lambda: c.get(job).status == "retrying", timeout=30, what="the retry")
    assert [x["msg"] for x in c.logs(job)["lines"]] == ["attempt 1"]
    month_ms = 30 * 86_400_000
    for key in (k.log(job), k.stream(job)):
        ttl = r.pttl(key)
        assert month_ms + retention_ms - 60_000 < ttl <= month_ms + retention_ms, (key, ttl)


def test_a_follower_misses_no_line_of_a_run_of_identical_lines(project: Project) -> None:
    """The same line twice in the same millisecond is two lines: a follower whose last
    poll ended inside such a run resumes after the right one (it looked for the last line
    seen by value, from the end, and skipped the lines written since)."""
    from runner.client.watching import new_lines
    from runner.worker.joblog import line, marker

    project.add_function("quiet", QUIET)  # (no worker: the log is written here, as a worker's writes do)
    project.write_config()
    client, sc, k = project.client, project.runtime.scripts, project.keys("fast")
    job_id = client.enqueue("quiet", {}).id
    tick = line("INFO", "tick", ts_ms=1_767_225_600_123)

    def write(n: int) -> None:
        sc.append_log(k, job_id, [tick] * n, 500, 262_144, 60_000, marker=marker(500, 262_144))

    write(2)
    seen = client.logs(job_id)["lines"]
    write(3)
    now = client.logs(job_id)["lines"]
    assert len(new_lines(seen, now)) == 3
    write(600)  # past the bounds: the lines seen are trimmed, and a marker says so
    later = client.logs(job_id)["lines"]
    fresh = new_lines(now, later)
    assert len(fresh) == len(later) and "earlier line(s) dropped" in fresh[0]["msg"]
    assert [x["msg"] for x in fresh[1:]] == ["tick"] * (len(later) - 1)


TICKER = '''"""Logs the same line in a tight loop."""
TIMEOUT = 60
MAX_ATTEMPTS = 1


def handle(payload, ctx):
    for _ in range(payload["n"]):
        ctx.logger.info("tick")
    return 1
'''


def test_a_follower_yields_every_line_of_a_tight_loop(roomy: Project) -> None:
    """A handler logging the same line in a tight loop writes many identical lines a
    millisecond, and each live write ends inside such a run: the follower yields every
    line the log holds, none skipped at a write's seam."""
    project = roomy  # (visibility 30 s, room for every line, no echo of them)
    client = project.client
    for _ in range(4):  # (a seam inside such a run is likely in each, not certain)
        job = client.enqueue("ticker", {"n": 50_000}).id
        followed = list(client.follow_logs(job, timeout_s=90, poll_s=0.05))
        assert client.get(job).status == "done"
        kept = client.logs(job)["lines"]
        # Every line the log holds, each once, in order: none skipped, none repeated.
        assert [x["n"] for x in followed] == [x["n"] for x in kept] == list(range(50_000))


SLOW_CHILD = '''
import os, time
QUEUE = "fast"
ISOLATION = "process"
import __main__
if getattr(getattr(__main__, "__spec__", None), "name", "") == "runner.worker.child":
    time.sleep(2)  # heavy imports, in the child only

def handle(payload, ctx):
    ctx.logger.info("first line")
'''


def test_a_fresh_childs_first_lines_are_not_stamped_before_its_start(project: Project) -> None:
    """A job run by a child that took 2 s to start: its log lines carry the server's time
    at the handler's run, not seconds before its own start (the child took its clock from
    a server time sent to it, aged by its start-up)."""
    project.add_function("slowchild", SLOW_CHILD)
    project.write_config(concurrency=1, prefetch=0)
    c = project.client
    job = c.enqueue("slowchild", {}).id
    project.spawn_worker("fast")
    view = c.wait(job, 60).as_dict()
    assert view["status"] == "done", view
    (line,) = [x for x in c.logs(job)["lines"] if x["msg"] == "first line"]
    assert line["ts"] / 1000 >= view["started_at"] - 0.25, (line, view["started_at"])
    assert line["ts"] / 1000 <= view["finished_at"] + 0.25, (line, view["finished_at"])


REPLAYED = '''"""Logs, prints and streams a line, sleeps, then does it again."""
QUEUE = "fast"
{extra}

def handle(payload, ctx):
    ctx.logger.info("before")
    print("printed before")
    ctx.stream("before")
    ctx.step("first", lambda: 1)
    if payload.get("fail") and ctx.attempt == 1:
        raise RuntimeError("transient, once")
    ctx.logger.info("between")
    ctx.sleep("nap", 0.2)
    ctx.logger.info("after")
    print("printed after")
    ctx.stream("after")
    return "ok"
'''


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_durable_functions_replay_writes_no_line_or_chunk_again(served: Project, isolation: str) -> None:
    """A durable function logs, prints and streams, sleeps, and after the wake-up replays
    from the top: what it wrote before the sleep is in its log and stream once, not again
    from the replay, and what it writes after the wake-up follows in order (the chunks'
    positions rise). A retry after a recorded step replays it quietly too."""
    client = served.client
    name = f"replayed_{isolation}"
    jobs = [client.enqueue(name, {}).id, client.enqueue(name, {"fail": True}).id]
    for job in jobs:
        assert client.settle(job, 60).status == "done"
        lines = client.logs(job)["lines"]
        assert [line["msg"] for line in lines if line["src"] == "log"] == ["before", "between", "after"]
        if isolation == "process":
            assert [line["msg"] for line in lines if line["src"] == "stdout"] == ["printed before", "printed after"]
        chunks = watching.stream_chunks(client, job)["chunks"]
        assert [c["data"] for c in chunks] == ["before", "after"]
        positions = [(c["a"], c["i"]) for c in chunks]
        assert positions == sorted(set(positions)), positions
        assert list(client.stream(job, timeout_s=5)) == ["before", "after"]
    assert client.get(jobs[1]).as_dict()["attempt"] == 2


KILLED_AFTER_A_STEP = '''"""Logs and streams a line, records a step, and the first time kills its worker at once."""
import os, signal
QUEUE = "fast"
{extra}

def handle(payload, ctx):
    ctx.logger.info("before")
    ctx.stream("before")
    ctx.step("first", lambda: 1)
    mark = os.path.join(os.environ["RECORD_DIR"], ctx.job_id + ".killed")
    if not os.path.exists(mark):
        open(mark, "w").close()
        # The worker, before any renewal or settle took the lines above.
        os.kill(os.getpid() if {thread} else os.getppid(), signal.SIGKILL)
    ctx.logger.info("after")
    return "ok"
'''


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_replay_after_a_kill_keeps_the_lines_written_before_its_recorded_step(
        project: Project, isolation: str) -> None:
    """The worker is killed right after a step is recorded: the run after the reclaim
    replays that step quietly, so the lines and chunks written before it must already be
    in Redis (they were lost for good: held in the killed worker, and not written again)."""
    extra = 'ISOLATION = "process"' if isolation == "process" else ""
    project.add_function("killed", KILLED_AFTER_A_STEP.format(extra=extra, thread=isolation == "thread"))
    project.write_config(vt=1, concurrency=1)  # one job: one child per worker, not eight
    client = project.client
    job = client.enqueue("killed", {}).id
    first = project.spawn_worker("fast")
    assert first.wait(60) != 0  # killed by its handler
    project.spawn_worker("fast")
    assert client.settle(job, 60).status == "done"
    assert [line["msg"] for line in client.logs(job)["lines"] if line["src"] == "log"] == ["before", "after"]
    assert [c["data"] for c in watching.stream_chunks(client, job)["chunks"]] == ["before"]


RUNS = '''"""Streams and logs three pieces, then fails for good or not as asked."""
from runner import PermanentFailure
{extra}


def handle(payload, ctx):
    for i in range(3):
        ctx.stream(f"{{payload['run']}}-{{i}}")
        ctx.logger.info("%s line %d", payload["run"], i)
    if payload.get("fail"):
        raise PermanentFailure("not this time")
    return 1
'''


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_requeued_jobs_new_run_follows_the_old_one_in_its_stream_and_log(served: Project, isolation: str) -> None:
    """A dead job requeued runs again from attempt 1: its new chunks come after the
    old run's for a reader that read those (the chunks of each run had the same places,
    so a follower skipped every chunk of the new run), and so do its log lines."""
    client = served.client
    job = client.enqueue(f"runs_{isolation}", {"run": "first", "fail": True})
    assert client.settle(job.id, 30).status == "dead"
    old = watching.stream_chunks(client, job.id)["chunks"]
    assert [c["data"] for c in old] == ["first-0", "first-1", "first-2"]
    lines = client.logs(job.id)["lines"]
    client.requeue("fast", job.id, {"run": "second"})
    assert client.settle(job.id, 30).status == "done"
    new = watching.stream_chunks(client, job.id, watching.position(old[-1]))["chunks"]
    assert [c["data"] for c in new] == ["second-0", "second-1", "second-2"]
    assert watching.position(new[0]) > watching.position(old[-1]) and new[0]["a"] == 1
    after = max(line["n"] for line in lines)
    fresh = [str(line["msg"]) for line in client.logs(job.id)["lines"] if line["n"] > after]
    assert fresh == ["second line 0", "second line 1", "second line 2"]


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_lines_n_counts_the_lines_dropped_before_they_were_sent(bounded: Project, isolation: str) -> None:
    """2,000 lines in a log that keeps 50: the last line's n is 1,999, its place among
    every line the handler wrote, counting those the worker (or the child) dropped before
    they were sent as well as those trimmed since (it was 49, its place among the kept)."""
    project = bounded
    client = project.client
    job = client.enqueue(f"logger_{isolation}", {"n": 2000})
    assert client.settle(job.id, 60).status == "done"
    lines = client.logs(job.id)["lines"]
    numbers = {str(line["msg"]): line["n"] for line in lines}
    assert numbers[f"line 1999 of {job.id}"] == 1999, lines[-3:]
    kept = [line for line in lines if str(line["msg"]).startswith("line ")]
    assert all(line["n"] == int(str(line["msg"]).split()[1]) for line in kept), kept[:3]
    said = int(str(lines[0]["msg"]).split()[0].strip("[").replace(",", ""))
    assert lines[0]["n"] < kept[0]["n"] and said == 2000 - len(kept)


DIES = '''"""Logs and prints a few lines, then its child process dies without a word."""
import os
import signal
import sys

ISOLATION = "process"
MAX_ATTEMPTS = 1


def handle(payload, ctx):
    for i in range(3):
        ctx.logger.info("before the crash %d", i)
        print("printed before the crash", i)
        print("to stderr before the crash", i, file=sys.stderr)
    ctx.logger.warning("the last line before the crash")
    os.kill(os.getpid(), signal.SIGKILL)
'''


def test_a_crashed_childs_last_lines_are_in_its_log_and_the_output(project: Project) -> None:
    """A process-isolated handler that logs and then dies at once (SIGKILL, a segfault, the
    OOM killer) leaves every line it wrote in its job's log, the last one too, and its
    ctx.logger lines in the worker's output: a line is with the worker before the
    handler goes past it (the child held them up to 0.5 s, and its echo 50 ms)."""
    project.add_function("dies", DIES)
    project.write_config(vt=5, concurrency=1)  # one job: one child, not eight
    client = project.client
    job = client.enqueue("dies", {})
    worker = project.spawn_worker("fast")
    wait_for(lambda: client.get(job.id).status == "dead", timeout=60, what="the crashed job's dead letter")
    wanted = [m for i in range(3) for m in (f"before the crash {i}", f"printed before the crash {i}",
                                            f"to stderr before the crash {i}")]
    got = _msgs(project, job.id)
    log = project.root / f"worker-{project.procs.index(worker)}.log"
    out = log.read_text(errors="replace")
    assert all(f"before the crash {i}" in out for i in range(3)), out
    assert "the last line before the crash" in out, out
    assert got == [*wanted, "the last line before the crash"]


FLOODS_AND_DIES = '''"""Logs and prints a flood past the child's send rate, then its child dies at once."""
import os
import signal

ISOLATION = "process"
MAX_ATTEMPTS = 1


def handle(payload, ctx):
    for i in range(payload["n"]):
        ctx.logger.info("flood %d", i)
        if i % 10 == 0:
            print("printed", i)
    ctx.logger.warning("the last line before the crash")
    os.kill(os.getpid(), signal.SIGKILL)
'''


def test_a_child_that_dies_after_a_flood_leaves_its_last_lines_in_its_log(project: Project) -> None:
    """A process-isolated handler that logs 3,000 lines at once (past the 200 a child
    hands its worker each 0.5 s; the rest wait in the child) and then dies (SIGKILL):
    its log ends with the last lines it wrote, in order, the very last too, and says how
    many earlier ones it lost. (It kept the first 200 and lost the lines that explain the
    crash.)"""
    project.add_function("floods_and_dies", FLOODS_AND_DIES)
    project.write_config(vt=5, concurrency=1)  # one job: one child, not eight
    client = project.client
    job = client.enqueue("floods_and_dies", {"n": 3000})
    project.spawn_worker("fast")
    wait_for(lambda: client.get(job.id).status == "dead", timeout=60, what="the crashed job's dead letter")
    got = _msgs(project, job.id)
    assert got[-1] == "the last line before the crash", got[-5:]
    floods = [m for m in got if m.startswith("flood ")]
    assert floods[-3:] == ["flood 2997", "flood 2998", "flood 2999"], floods[-5:]
    tail = [int(m.split()[1]) for m in floods[-100:]]
    assert tail == sorted(tail) and len(set(tail)) == len(tail), tail
    assert "dropped" in got[0], got[0]


OWN_HANDLER = '''"""Logs through ctx.logger and through a logger of its own with its own handler."""
import logging
import sys

mine = logging.getLogger("app.mine")
if not mine.handlers:  # (made as the function loads, as an application's logging setup is)
    out = logging.StreamHandler(sys.stderr)
    out.setFormatter(logging.Formatter("MINE %(message)s"))
    mine.addHandler(out)
    mine.propagate = False


def handle(payload, ctx):
    for i in range(5):
        ctx.logger.info("ECHO%d", i)
        mine.warning("OWN%d", i)
    return 1
'''


def test_a_handler_made_as_the_functions_load_writes_after_the_echoed_lines(project: Project) -> None:
    """A function's module that gives a logger a handler of its own on the worker's stderr
    as it loads (before the worker sets up its output): in the worker's output each of its
    lines comes after the ctx.logger line logged before it (it came ahead, 20 rounds in 20)."""
    project.add_function("ownhandler", OWN_HANDLER)
    project.write_config()
    job = project.client.enqueue("ownhandler", {})
    worker = project.spawn_worker("fast")
    assert project.client.settle(job.id, 30).status == "done"
    log = project.root / f"worker-{project.procs.index(worker)}.log"
    wait_for(lambda: "OWN4" in log.read_text(errors="replace"), timeout=10, what="the last line")
    order = re.findall(r"\b((?:ECHO|OWN)\d)\b", log.read_text(errors="replace"))
    assert order == [f"{k}{i}" for i in range(5) for k in ("ECHO", "OWN")], order


ECHOES = '''"""Logs three lines and returns its process id."""
import os
{extra}


def handle(payload, ctx):
    for i in range(3):
        ctx.logger.info("line %d", i)
    return {{"pid": os.getpid()}}
'''


def _unwritable_worker(project: Project, how: str) -> subprocess.Popen[bytes]:
    """A worker whose output cannot be written: on /dev/full (ENOSPC, a full disk), or on
    a pipe whose reader has gone (EPIPE, a log shipper that died)."""
    args = [sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"), "worker"]
    if how == "full":
        with open("/dev/full", "wb") as out:
            proc = subprocess.Popen(args, cwd=project.root, env=project.env, stdout=out, stderr=out)
    else:
        r, w = os.pipe()
        proc = subprocess.Popen(args, cwd=project.root, env=project.env, stdout=w, stderr=w)
        os.close(w)
        os.close(r)
    project.procs.append(proc)
    return proc


@pytest.mark.parametrize("how", ["full", "pipe"])
@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_job_that_logs_is_done_with_its_log_when_the_output_cannot_be_written(
        project: Project, isolation: str, how: str) -> None:
    """The worker's output cannot be written (a full disk, a reader gone): a ctx.logger
    line's echo there fails, and that never fails the job (a process-isolated job died of
    ENOSPC or BrokenPipeError) nor costs its log (a thread's job lost every line of it);
    the next job in the same child is done too."""
    extra = 'ISOLATION = "process"' if isolation == "process" else ""
    project.add_function("echoes", ECHOES.format(extra=extra))
    project.write_config(vt=5, concurrency=1, prefetch=0, max_attempts=1)
    worker = _unwritable_worker(project, how)
    pids = []
    for _ in range(2):
        job = project.client.enqueue("echoes", {}).id
        got = project.client.settle(job, 60).as_dict()
        assert got["status"] == "done", got["last_error"]
        pids.append(got["result"]["pid"])
        lines = project.client.logs(job)["lines"]
        assert [line["msg"] for line in lines if line["src"] == "log"] == ["line 0", "line 1", "line 2"], lines
    assert worker.poll() is None
    if isolation == "process":
        assert pids[0] == pids[1]


LONG_PRINTS = '''"""Prints lines longer than a job log's line bound."""
import sys

ISOLATION = "process"


def handle(payload, ctx):
    for i in range(3):
        print(str(i) * 10_000)
    sys.stdout.write("a" * 9_000)
    sys.stdout.write("b" * 10 + "\\n")
    print("short")
    return 1
'''


def test_a_printed_line_past_the_line_bound_adds_no_empty_line(served: Project) -> None:
    """A printed line longer than a line's bound (8,192 characters) is one line, cut,
    never followed by an empty one (print writes its newline apart, and that made a line
    of its own: half of a flood of long prints was blank lines); a long line written in
    pieces goes on in the next line."""
    project = served
    job = project.client.enqueue("longprints", {})
    assert project.client.settle(job.id, 30).status == "done"
    got = _msgs(project, job.id)
    assert [m[:3] for m in got] == ["000", "111", "222", "aaa", "bbb", "sho"], [m[:20] for m in got]
    assert got[0].endswith("... [1,808 characters cut]") and got[3] == "a" * 8_192 + "... [808 characters cut]"
    assert got[4] == "b" * 10


def _sse_read(web: Any, path: str, n: int, headers: dict[str, str] | None = None) -> list[tuple[str | None, str, str]]:
    """(id, event, data) of the first ``n`` events with data of a follow, read as they come
    and then left (the connection closed, as a client that drops does)."""
    out: list[tuple[str | None, str, str]] = []
    fields: dict[str, str] = {}
    with web.session.get(web.url + path, headers={"Authorization": f"Bearer {web.token}", **(headers or {})},
                         stream=True, timeout=10) as r:
        assert r.status_code == 200, r.text
        for raw in r.iter_lines(chunk_size=1, decode_unicode=True):
            if raw == "":
                if "data" in fields:
                    out.append((fields.get("id"), fields.get("event", "message"), fields["data"]))
                fields = {}
                if len(out) >= n:
                    break
            elif not raw.startswith(":"):
                name, _, value = raw.partition(":")
                fields[name] = value[1:] if value.startswith(" ") else value
    return out


def test_a_follow_resumes_after_the_last_event_a_client_saw(project: Project) -> None:
    """Each line of a log follow and each chunk of a stream carries an SSE id (the line's
    number, the chunk's place), and a reconnect that sends it back (Last-Event-ID, as an
    EventSource does, or ?after=) resumes right after it: no line or chunk twice and none
    missed, also when the line last seen was trimmed off the front meanwhile. A standard
    client got the whole log or stream again on every reconnect (no id, Last-Event-ID
    ignored, no ?after= for logs)."""
    from test_web_support import gunicorn

    from runner.worker.joblog import line, marker

    project.add_function("quiet", QUIET)  # (no worker: the log is written here, as a worker's writes do)
    project.write_config()
    client, sc, k = project.client, project.runtime.scripts, project.keys("fast")
    job_id = client.enqueue("quiet", {}).id  # queued, so every follow stays open

    def write(first: int, count: int) -> None:
        sc.append_log(k, job_id, [line("INFO", f"line {i}") for i in range(first, first + count)], 50, 1 << 20,
                      60_000, marker=marker(50, 1 << 20))

    def chunks(first: int, count: int) -> None:
        sc.append_log(k, job_id, [json.dumps({"a": 1, "i": i, "ts": 1_767_225_600_000, "data": f"c{i}"})
                                  for i in range(first, first + count)], 10_000, 1 << 20, 60_000,
                      key=k.stream(job_id))

    write(0, 30)
    chunks(0, 30)
    with gunicorn(project, token="t0ken-for-resumes") as web:
        seen = _sse_read(web, f"/jobs/{job_id}/logs?follow=1", 30)
        assert [(i, json.loads(d)["msg"]) for i, _, d in seen] == [(str(n), f"line {n}") for n in range(30)]
        write(30, 49)  # past the 50 kept: lines 0-29 trimmed, the last one seen too; a marker heads the rest
        kept = client.logs(job_id)["lines"]
        assert kept[0]["n"] == 29 and "dropped" in kept[0]["msg"] and kept[1]["n"] == 30, kept[:2]
        after = [f"line {n}" for n in range(30, 79)]
        for how in ({"headers": {"Last-Event-ID": "29"}}, {"path": "&after=29"},
                    {"path": "&after=3", "headers": {"Last-Event-ID": "29"}}):  # (the reconnect's id wins)
            again = _sse_read(web, f"/jobs/{job_id}/logs?follow=1{how.get('path', '')}", 49, how.get("headers"))
            assert [json.loads(d)["msg"] for _, _, d in again] == after, how
            assert [i for i, _, _ in again] == [str(n) for n in range(30, 79)]
        assert [x["msg"] for x in web.get(f"/jobs/{job_id}/logs?after=29").json()["lines"]] == after
        # Lines lost while away (trimmed before they were read): the marker says so, first.
        lost = _sse_read(web, f"/jobs/{job_id}/logs?follow=1", 50, {"Last-Event-ID": "10"})
        assert "dropped" in json.loads(lost[0][2])["msg"] and lost[0][0] == "29"
        assert [json.loads(d)["msg"] for _, _, d in lost[1:]] == after

        first = _sse_read(web, f"/jobs/{job_id}/stream", 20)
        assert [(i, json.loads(d)["data"]) for i, _, d in first] == [(f"1.{n}", f"c{n}") for n in range(20)]
        chunks(30, 5)
        rest = _sse_read(web, f"/jobs/{job_id}/stream", 15, {"Last-Event-ID": first[-1][0] or ""})
        assert [(i, json.loads(d)["data"]) for i, _, d in rest] == [(f"1.{n}", f"c{n}") for n in range(20, 35)]

        for path, header in ((f"/jobs/{job_id}/logs?follow=1", "1.5"), (f"/jobs/{job_id}/stream", "x")):
            r = web.get(path, headers={"Last-Event-ID": header})
            assert r.status_code == 400 and r.json()["header"] == "Last-Event-ID", r.text
        assert web.get(f"/jobs/{job_id}/logs?after=-1").status_code == 400
