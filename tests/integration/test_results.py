"""What a handler returns: JSON, kept with the done job, and bounded in size.

A result is stored in Redis with the finished job and kept for the done retention (a day
by default). A handler that returns a 20 MB string used to be stored whole and served
back by GET /jobs/{id}; now a result over ``[worker] max_result_bytes`` (1 MiB by default,
as a request body) fails the attempt with an error that says so and how to go on, in
threads and in child processes alike, and nothing of it reaches Redis.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from runner.store.embedded import Server

from conftest import SCAN_COUNT, Project, assert_no_job_in_two_structures, make_project, wait_for

RETURNS = '''
import dataclasses

QUEUE = "fast"
ISOLATION = "{isolation}"


@dataclasses.dataclass
class Metrics:
    count: int = 0
    mean: float = float("nan")  # the mean of an empty list


def handle(payload, ctx):
    n = payload["n"]
    if payload.get("kind") == "nan-dataclass":
        return {{"m": Metrics()}}
    if payload.get("kind") == "object":
        return {{"when": object()}}
    if payload.get("kind") == "keys":
        return {{200: 3, 1.5: "a", None: [10**30], True: -(2**70)}}
    if payload.get("kind") == "big":
        return {{"n": 2**70 + 1, "m": [-(10**30) - 7], "s": "12345678901234567890123"}}
    if payload.get("kind") == "nan":
        return {{"v": [1.5, float("nan")], "w": float("inf")}}
    if payload.get("kind") == "nan-key":
        return {{"ok": {{float("nan"): 1}}}}
    if payload.get("kind") == "keyed-object":
        return {{200: {{"when": object()}}}}
    return "x" * n
'''


def _add_returns(p: Project, isolation: str = "thread", name: str = "returns") -> None:
    (p.root / "functions" / f"{name}.py").write_text(RETURNS.format(isolation=isolation))
    schema = p.root / "schemas" / name
    schema.mkdir(parents=True, exist_ok=True)
    (schema / "v1.json").write_text(json.dumps({"type": "object", "required": ["n"]}))


def _big_values(p: Project, limit: int) -> list[str]:
    """Keys of the test's prefix holding a string or hash field longer than ``limit``."""
    r = p.runtime.redis
    out = []
    for key in r.scan_iter(match=f"{p.prefix}*", count=SCAN_COUNT):
        kind = r.type(key)
        big_string = kind in ("string", b"string") and r.strlen(key) > limit
        big_field = kind in ("hash", b"hash") and any(r.hstrlen(key, f) > limit for f in r.hkeys(key))
        if big_string or big_field:
            out.append(key)
    return out


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory, server: Server) -> Iterator[Project]:
    """One project on the default config and its worker for the tests that read only their
    own jobs: ``returns`` and ``saves`` in each isolation (returns_thread, saves_process,
    ...), there before the worker starts. Nothing of any of them may leave a big value in
    Redis, so each test's scan of the prefix holds for all. A worker per test (and a first
    child for each process test) was most of such a test's time."""
    project = make_project(tmp_path_factory.mktemp("results") / "project", server)
    for isolation in ("thread", "process"):
        _add_returns(project, isolation, f"returns_{isolation}")
        _add_saves(project, isolation, f"saves_{isolation}")
    project.write_config(concurrency=2)  # each test's job or two: two children, not eight
    project.spawn_worker("fast")
    yield project
    project.close()


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_result_over_the_limit_fails_the_attempt_and_stays_out_of_redis(shared: Project, isolation: str) -> None:
    """2 MB returned under the default limit: the job is dead at its first attempt (running
    it again would only redo its work and side effects); its last error names the size,
    the setting and what to do; no value near that size is in Redis."""
    project = shared
    c = project.client
    job = c.enqueue(f"returns_{isolation}", {"n": 2_000_000})
    rec = c.wait(job.id, timeout_s=30).as_dict()
    assert rec["status"] == "dead", rec["status"]
    assert (rec["reason"], rec["attempt"]) == ("permanent failure", 1)
    err = rec["last_error"]
    assert err["type"] == "ResultTooLarge"
    assert "2,000,002 bytes" in err["message"]
    assert "max_result_bytes = 1,048,576" in err["message"]
    assert "return a reference" in err["message"]
    assert rec["result"] is None
    assert _big_values(project, 1_000_000) == []
    assert_no_job_in_two_structures(project)


def test_a_raised_limit_keeps_a_large_result_whole(project: Project) -> None:
    """With the limit raised in runner.toml, the same 2 MB result is kept and read back."""
    project.write_config(worker="max_result_bytes = 4_000_000")
    _add_returns(project)
    c = project.client
    job = c.enqueue("returns", {"n": 2_000_000})
    project.spawn_worker("fast")
    rec = c.wait(job.id, timeout_s=30).as_dict()
    assert rec["status"] == "done"
    assert rec["result"] == "x" * 2_000_000


def test_a_result_that_is_not_json_fails_the_attempt_with_a_clear_error(shared: Project) -> None:
    """A return value JSON cannot hold (an object) sends the job to the dead letters at
    once, as an oversized one does (the same code returns the same kind of value), and its
    message says what was wrong."""
    c = shared.client
    job = c.enqueue("returns_thread", {"n": 1, "kind": "object"})
    rec = c.wait(job.id, timeout_s=30).as_dict()
    assert rec["status"] == "dead"
    assert (rec["reason"], rec["attempt"]) == ("permanent failure", 1)
    assert rec["last_error"]["type"] == "ResultNotJSON"
    assert "the handler's return value is not JSON" in rec["last_error"]["message"]


SAVES = '''
import os
import time
from decimal import Decimal

QUEUE = "fast"
TIMEOUT = 15
ISOLATION = "{isolation}"


def handle(payload, ctx):
    if payload.get("odd"):  # values JSON cannot hold: the reports are dropped, the job goes on
        ctx.progress(Decimal(1) / 4 * 100)
        ctx.progress(50, "reading " + os.fsdecode(b"report-\\xff.csv"))
        return "went on"
    if payload.get("progress"):
        ctx.progress(50, "m" * payload["n"])
        ctx.progress({{"blob": "b" * payload["n"]}})  # not a percentage: over the bound, dropped
        deadline = time.time() + 12
        while not ctx.cancelled and time.time() < deadline:
            time.sleep(0.02)
        return None
    if payload.get("deep"):  # past the nesting limit: no retry could ever read it back
        v = 1
        for _ in range(payload["deep"]):
            v = {{"a": v}}
        ctx.save_checkpoint(v)
    ctx.save_checkpoint({{"cursor": "c" * payload["n"]}})
    return "saved"
'''


def _add_saves(p: Project, isolation: str = "thread", name: str = "saves") -> None:
    (p.root / "functions" / f"{name}.py").write_text(SAVES.format(isolation=isolation))
    schema = p.root / "schemas" / name
    schema.mkdir(parents=True, exist_ok=True)
    (schema / "v1.json").write_text(json.dumps({"type": "object", "required": ["n"]}))


def test_a_checkpoint_nested_past_the_limit_is_refused_at_save(shared: Project) -> None:
    """A checkpoint 200 levels deep was saved, then every retry failed before its handler
    ran: it is refused at save, naming the limit, and the job is dead at once."""
    c = shared.client
    deep, at = c.enqueue("saves_thread", {"n": 1, "deep": 200}), c.enqueue("saves_thread", {"n": 1, "deep": 120})
    rec = c.wait(deep.id, timeout_s=30).as_dict()
    assert (rec["status"], rec["reason"], rec["attempt"]) == ("dead", "permanent failure", 1), rec
    assert rec["checkpoint"] is None and rec["last_error"]["type"] == "CheckpointTooLarge"
    assert "120 levels" in rec["last_error"]["message"], rec["last_error"]
    done = c.wait(at.id, timeout_s=30).as_dict()
    assert (done["status"], done["result"]) == ("done", "saved"), done


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_checkpoint_over_the_limit_is_refused_with_a_clear_error(shared: Project, isolation: str) -> None:
    """A checkpoint is kept in Redis with the job, under the same bound as a result: a 2 MB
    one is not saved and the job is dead at once (a retry would resume from the checkpoint
    before and grow it again), with an error that says what to keep instead; a small one
    is saved and the handler goes on."""
    project = shared
    c = project.client
    big, small = c.enqueue(f"saves_{isolation}", {"n": 2_000_000}), c.enqueue(f"saves_{isolation}", {"n": 10})
    rec = c.wait(big.id, timeout_s=30).as_dict()
    assert rec["status"] == "dead" and rec["checkpoint"] is None
    assert (rec["reason"], rec["attempt"]) == ("permanent failure", 1)
    assert rec["last_error"]["type"] == "CheckpointTooLarge"
    assert "checkpoint of 2,000,013 bytes" in rec["last_error"]["message"]
    assert "max_result_bytes = 1,048,576" in rec["last_error"]["message"]
    assert _big_values(project, 1_000_000) == []
    done = c.wait(small.id, timeout_s=30).as_dict()
    assert (done["status"], done["result"]) == ("done", "saved")  # its save went through


def test_a_long_progress_message_is_cut_and_an_oversized_report_dropped(project: Project) -> None:
    """Progress never fails a job: a 100,000-character message is shown cut to its first
    1,000 characters, and a report whose JSON is over 4 KiB (not a percentage and a
    message) is dropped, leaving the last one that fit."""
    project.write_config(grace=1)
    _add_saves(project)
    c = project.client
    job = c.enqueue("saves", {"n": 100_000, "progress": True})
    project.spawn_worker("fast")
    wait_for(lambda: c.get(job.id).as_dict().get("progress") is not None, timeout=15, what="a progress report")
    shown = c.get(job.id).as_dict()["progress"]
    assert shown["percent"] == 50
    assert shown["message"] == "m" * 1000 + "…"
    assert _big_values(project, 5_000) == []
    c.cancel(job.id)
    c.settle(job.id, 15)


def test_a_progress_report_json_cannot_hold_never_fails_the_job(shared: Project) -> None:
    """A Decimal percentage, a message with an undecodable file name in it: each report is
    dropped (a warning in the job's log) and the handler goes on to its result."""
    c = shared.client
    job = c.enqueue("saves_thread", {"n": 1, "odd": True})
    rec = c.wait(job.id, timeout_s=30).as_dict()
    assert (rec["status"], rec["result"]) == ("done", "went on"), rec["last_error"]


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_result_json_can_hold_is_stored_as_json_would_store_it(shared: Project, isolation: str) -> None:
    """Integer, float, None and boolean keys become strings and integers past 64 bits keep
    their digits, as Python's json writes them: the job is done, not dead after its side
    effects. A value JSON cannot hold fails with the path of the offending part."""
    project = shared
    c = project.client
    good = c.enqueue(f"returns_{isolation}", {"n": 0, "kind": "keys"})
    bad = c.enqueue(f"returns_{isolation}", {"n": 0, "kind": "keyed-object"})
    rec = c.wait(good.id, timeout_s=30).as_dict()
    assert rec["status"] == "done", rec
    assert rec["result"]["200"] == 3 and rec["result"]["1.5"] == "a" and rec["result"]["true"] == -(2**70)
    r = project.runtime.redis
    stored = "".join(str(r.hget(k, good.id)) for k in r.scan_iter(count=SCAN_COUNT, match=f"{project.prefix}*:done:*")
                     if r.type(k) == "hash")
    assert str(10**30) in stored  # every digit, as json writes it (a reader may take it as a float)
    dead = c.wait(bad.id, timeout_s=30).as_dict()
    assert dead["status"] == "dead"
    assert "$.200.when" in dead["last_error"]["message"], dead["last_error"]


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_result_holding_nan_is_refused_as_not_json(shared: Project, isolation: str) -> None:
    """NaN and infinities are not JSON (a reader's JSON.parse refuses them, and ctx.stream
    refuses them too): a result holding one used to be stored with null in its place,
    without a word. It fails as not JSON, naming the path, in both isolations."""
    c = shared.client
    job = c.enqueue(f"returns_{isolation}", {"n": 0, "kind": "nan"})
    rec = c.wait(job.id, timeout_s=30).as_dict()
    assert rec["status"] == "dead", rec
    assert rec["last_error"]["type"] == "ResultNotJSON", rec["last_error"]
    assert "$.v[1]" in rec["last_error"]["message"] and "nan" in rec["last_error"]["message"], rec["last_error"]


def test_a_result_holding_a_dataclass_with_nan_is_refused_as_not_json(shared: Project) -> None:
    """A metrics dataclass whose mean came from an empty list: the result was stored as
    {"m": {"count": 0, "mean": null}} and the job ended done (the fallback encoding wrote
    the dataclass with orjson, NaN as null). It fails as not JSON, naming the path."""
    c = shared.client
    job = c.enqueue("returns_thread", {"n": 0, "kind": "nan-dataclass"})
    rec = c.wait(job.id, timeout_s=30).as_dict()
    assert (rec["status"], (rec["last_error"] or {}).get("type")) == ("dead", "ResultNotJSON"), rec
    assert "$.m.mean" in rec["last_error"]["message"], rec["last_error"]


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_result_with_a_nan_key_says_what_was_refused_and_what_to_do(shared: Project, isolation: str) -> None:
    """A number key is written as json writes it, but NaN has no JSON form: the job used
    to go dead with nothing said of what was refused ("not JSON: ; ..."). Its error names
    the key and its path, and says to use a string key."""
    c = shared.client
    job = c.enqueue(f"returns_{isolation}", {"n": 0, "kind": "nan-key"})
    rec = c.wait(job.id, timeout_s=30).as_dict()
    assert rec["status"] == "dead", rec
    message = rec["last_error"]["message"]
    assert rec["last_error"]["type"] == "ResultNotJSON", rec["last_error"]
    assert "the key nan at $.ok" in message and "use a string key" in message, message


def test_a_result_with_integers_past_64_bits_reads_back_with_every_digit(shared: Project) -> None:
    """Python's json keeps an integer's digits when it stores a result: the client, the job
    view and ``runner job --json`` read them back as integers, never floats."""
    from test_web_support import gunicorn

    project = shared
    c = project.client
    job = c.enqueue("returns_thread", {"n": 0, "kind": "big"})
    want = {"n": 2**70 + 1, "m": [-(10**30) - 7], "s": "12345678901234567890123"}
    assert c.wait(job.id, timeout_s=30).as_dict()["status"] == "done"
    assert c.get(job.id).as_dict()["result"] == want
    with gunicorn(project, token="big-t0ken") as web:
        got = web.get(f"/jobs/{job.id}")
        assert got.status_code == 200, got.text[:300]
        assert json.loads(got.text)["result"] == want, got.text[:300]
    cli = subprocess.run([sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"),
                          "job", job.id, "--json"], env=project.env, capture_output=True, text=True, timeout=30)
    assert cli.returncode == 0, cli.stderr[-400:]
    assert json.loads(cli.stdout)["result"] == want, cli.stdout
