"""One job's payload is bounded from every producer, not only over HTTP.

A request body is capped at ``[api] max_body_bytes`` (1 MiB by default, a 413), but a
producer that enqueued from Python (``Client.enqueue`` and its batch and group forms,
``ctx.enqueue`` in a handler, `runner enqueue`, a requeue with an edited payload) had no
bound at all: a 20 MB payload was written whole into Redis, kept with the job and handed
to a worker. Now a payload whose JSON is over that setting is a validation error (path
"$") that gives the size, the limit, the setting and what to do, and nothing of the
refused job reaches Redis; one exactly at the limit goes in.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from runner.cli import cli
from runner.client import Enqueued, Request
from runner.errors import InvalidGroup, ValidationFailed
from runner.worker.worker import Worker

from conftest import SCAN_COUNT, Project, wait_for

LIMIT = 1_048_576  # the default [api] max_body_bytes
BIG = {"blob": "a" * 2_000_000}  # 2,000,011 bytes of JSON
BIG_BYTES = "2,000,011 bytes"

Invoke = Callable[..., Result]


def redis_keys(project: Project) -> list[str]:
    return sorted(project.runtime.redis.scan_iter(count=SCAN_COUNT, match=f"{project.prefix}:*"))


def big_values(project: Project, limit: int = 1_000_000) -> list[str]:
    """Keys of the test's prefix holding a string, hash field or list item longer than ``limit``."""
    r = project.runtime.redis
    out = []
    for key in r.scan_iter(match=f"{project.prefix}*", count=SCAN_COUNT):
        kind = r.type(key)
        big_string = kind == "string" and r.strlen(key) > limit
        big_field = kind == "hash" and any(r.hstrlen(key, f) > limit for f in r.hkeys(key))
        big_item = kind == "list" and any(len(v) > limit for v in r.lrange(key, 0, -1))
        if big_string or big_field or big_item:
            out.append(key)
    return out


def assert_too_large(exc: ValidationFailed, size: str = BIG_BYTES, path: str = "$") -> None:
    """The refusal names the size, the limit and its setting, and what to do next."""
    [err] = exc.errors
    assert err.path == path
    assert_message(err.message, size)


def assert_message(message: str, size: str = BIG_BYTES) -> None:
    assert f"{size} of JSON" in message, message
    assert "[api] max_body_bytes = 1,048,576" in message, message
    assert "pass a reference" in message and "raise" in message, message


def at_limit(limit: int) -> dict[str, str]:
    """A payload whose JSON is exactly ``limit`` bytes ({"blob":"..."} is 11 bytes around it)."""
    return {"blob": "a" * (limit - 11)}


@pytest.fixture
def run(project: Project) -> Invoke:
    """Invoke the CLI in-process, as a user in the project folder would."""

    def invoke(*args: str, input: str | None = None) -> Result:
        return CliRunner().invoke(cli, ["--config", str(project.root / "runner.toml"), *args],
                                  input=input, env=project.env, catch_exceptions=False)

    return invoke


# --- the client ------------------------------------------------------------------------


def test_enqueue_refuses_an_oversized_payload_and_writes_nothing(project: Project) -> None:
    """Client.enqueue and aenqueue of a 2 MB payload raise ValidationFailed at "$" with the
    size, the limit, the setting and what to do; Redis holds nothing of either."""
    c = project.client
    with pytest.raises(ValidationFailed) as err:
        c.enqueue("noop", BIG)
    assert (err.value.type, err.value.version) == ("noop", 1)
    assert_too_large(err.value)
    with pytest.raises(ValidationFailed) as aerr:
        asyncio.run(c.aenqueue("noop", BIG))
    assert_too_large(aerr.value)
    with pytest.raises(ValidationFailed):
        c.call("noop", BIG, timeout=1)
    assert redis_keys(project) == []


def test_a_payload_exactly_at_the_limit_goes_in_and_one_byte_more_does_not(project: Project) -> None:
    """The bound is on the payload's JSON bytes: exactly max_body_bytes is enqueued and
    kept whole; one byte more is refused. A multi-byte character counts as its UTF-8 bytes."""
    c = project.client
    job = c.enqueue("noop", at_limit(LIMIT))
    assert c.get(job.id).as_dict()["payload"] == at_limit(LIMIT)
    with pytest.raises(ValidationFailed) as err:
        c.enqueue("noop", at_limit(LIMIT + 1))
    assert_too_large(err.value, "1,048,577 bytes")
    # 'é' is two bytes: 524,283 of them make 1,048,577 bytes of JSON in 524,294 characters.
    with pytest.raises(ValidationFailed) as wide:
        c.enqueue("noop", {"blob": "é" * 524_283})
    assert_too_large(wide.value, "1,048,577 bytes")
    assert c.stats()["fast"]["ready"] == 1


def test_a_raised_setting_lets_a_larger_payload_in(project: Project) -> None:
    """[api] max_body_bytes is the one setting: raised to 4 MB, the 2 MB payload goes in
    whole; the message of a refusal quotes the setting as configured."""
    project.write_config(extra="\n[api]\nmax_body_bytes = 4_000_000\n")
    c = project.client
    job = c.enqueue("noop", BIG)
    assert c.get(job.id).as_dict()["payload"] == BIG
    with pytest.raises(ValidationFailed) as err:
        c.enqueue("noop", {"blob": "a" * 4_000_000})
    assert "[api] max_body_bytes = 4,000,000" in err.value.errors[0].message


def test_enqueue_many_refuses_the_oversized_one_and_enqueues_the_rest(project: Project) -> None:
    """enqueue_many answers the oversized request with its error, in its place, and
    enqueues the others."""
    c = project.client
    reqs = [Request("noop", {"i": 0}), Request("noop", BIG), Request("noop", {"i": 2})]
    out = c.enqueue_many(reqs)
    assert isinstance(out[0], Enqueued) and isinstance(out[2], Enqueued)
    assert isinstance(out[1], ValidationFailed)
    assert_too_large(out[1])
    assert c.stats()["fast"]["ready"] == 2
    assert big_values(project) == []


def test_enqueue_all_refuses_the_whole_batch_naming_the_index(project: Project) -> None:
    """enqueue_all with one oversized payload among valid ones refuses the batch, as for
    an invalid payload: the error's path is its index ("$[3]"), and nothing is sent."""
    c = project.client
    reqs = [Request("noop", {"i": i}) for i in range(5)]
    reqs[3] = Request("noop", BIG)
    with pytest.raises(ValidationFailed) as err:
        c.enqueue_all(reqs)
    assert_too_large(err.value, path="$[3]")
    assert redis_keys(project) == []


def test_a_group_refuses_an_oversized_member_or_then_payload(project: Project) -> None:
    """Client.group validates every job first: an oversized member or then payload is an
    InvalidGroup naming it, and nothing of the group is written."""
    c = project.client
    members = [Request("noop", {"i": 0}), Request("noop", BIG)]
    with pytest.raises(InvalidGroup) as err:
        c.group(members, Request("noop", {}))
    assert [e.path for e in err.value.errors] == ["$.members[1].payload"]
    assert_message(err.value.errors[0].message)
    with pytest.raises(InvalidGroup) as then:
        c.group([Request("noop", {"i": 0})], Request("noop", BIG))
    assert [e.path for e in then.value.errors] == ["$.then.payload"]
    assert "of JSON, over [api] max_body_bytes" in then.value.errors[0].message
    assert redis_keys(project) == []


def test_enqueue_on_commit_refuses_an_oversized_payload_at_the_call(project: Project) -> None:
    """SQLAlchemy's enqueue_on_commit validates at the call: an oversized payload raises
    there (the request fails, not a callback after the commit) and nothing is sent."""
    sa = pytest.importorskip("sqlalchemy")
    from sqlalchemy.orm import Session

    from runner.contrib.sqlalchemy import enqueue_on_commit

    engine = sa.create_engine("sqlite://")
    with Session(engine) as session:
        with pytest.raises(ValidationFailed) as err:
            enqueue_on_commit(session, "noop", BIG, client=project.client)
        assert_too_large(err.value)
        session.commit()
    assert redis_keys(project) == []


# --- ctx.enqueue ------------------------------------------------------------------------

FOLLOWS = '''
QUEUE = "fast"
ISOLATION = "{isolation}"


def handle(payload, ctx):
    try:
        ctx.enqueue("noop", {{"blob": "a" * payload["n"]}})
    except Exception as exc:
        return {{"refused": str(exc)}}
    return {{"refused": None}}
'''


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_ctx_enqueue_refuses_an_oversized_follow_up(project: Project, isolation: str) -> None:
    """A handler's ctx.enqueue of a 2 MB payload raises in the handler, in a thread and in
    a child process alike, with the same message; no follow-up is written and nothing of
    it reaches Redis."""
    project.write_config(concurrency=1)  # one job: one child under process isolation, not eight
    (project.root / "functions" / "follows.py").write_text(FOLLOWS.format(isolation=isolation))
    (project.root / "schemas" / "follows").mkdir()
    (project.root / "schemas" / "follows" / "v1.json").write_text(json.dumps({"type": "object"}))
    c = project.client
    job = c.enqueue("follows", {"n": 2_000_000})
    project.spawn_worker("fast")
    rec = c.wait(job.id, timeout_s=30).as_dict()
    assert rec["status"] == "done", rec["last_error"]
    assert_message(rec["result"]["refused"])
    assert not rec.get("children")
    assert c.stats()["fast"]["counters"].get("followups|follows") is None
    assert big_values(project) == []


# --- the CLI ----------------------------------------------------------------------------


def test_cli_enqueue_refuses_an_oversized_payload(project: Project, run: Invoke, tmp_path: Path) -> None:
    """`runner enqueue` with a 2 MB payload (stdin or @file) exits 1 with the message, as
    for any invalid payload; --json carries the error at "$"; nothing is written."""
    text = json.dumps(BIG)
    human = run("enqueue", "noop", "-", input=text)
    assert human.exit_code == 1
    assert "invalid payload for noop v1" in human.stderr
    assert_message(human.stderr)
    (tmp_path / "big.json").write_text(text)
    as_json = run("enqueue", "noop", f"@{tmp_path / 'big.json'}", "--json")
    assert as_json.exit_code == 1
    [err] = json.loads(as_json.stdout)["errors"]
    assert err["path"] == "$"
    assert_message(err["message"])
    assert redis_keys(project) == []


def test_cli_jsonl_reports_an_oversized_line_and_enqueues_the_others(project: Project, run: Invoke,
                                                                    tmp_path: Path) -> None:
    """`runner enqueue --jsonl`: an oversized line is refused by its number with the
    message, the other lines go in, and the exit is 1 as for any refused line."""
    src = tmp_path / "lines.jsonl"
    src.write_text("\n".join([json.dumps({"i": 0}), json.dumps(BIG), json.dumps({"i": 2})]) + "\n")
    r = run("enqueue", "noop", "--jsonl", str(src), "--json")
    assert r.exit_code == 1
    report = json.loads(r.stdout)
    assert report["enqueued"] == 2
    [refused] = report["refused"]
    assert refused["line"] == 2 and refused["errors"][0]["path"] == "$"
    assert_message(refused["errors"][0]["message"])
    assert project.runtime.redis.llen(project.keys().ready) == 2
    assert big_values(project) == []


# --- requeue ----------------------------------------------------------------------------


def _dead_job(project: Project) -> str:
    c = project.client
    job_id = c.enqueue("perm", {"i": 1}).id
    w = Worker(project.runtime, ["fast"])
    w.start()
    try:
        wait_for(lambda: c.get(job_id).status == "dead", timeout=15, what="the job to go dead")
    finally:
        w.stop(2)
    return job_id


def test_requeue_with_an_oversized_edited_payload_leaves_the_job_dead(project: Project, run: Invoke,
                                                                     tmp_path: Path) -> None:
    """Requeueing a dead job with an edited payload over the limit raises ValidationFailed
    (Client.requeue) or exits 1 (`runner dead requeue --payload`); the job stays dead with
    its stored payload and nothing of the edit reaches Redis. One at the limit goes in."""
    c = project.client
    job_id = _dead_job(project)
    with pytest.raises(ValidationFailed) as err:
        c.requeue("fast", job_id, payload=BIG)
    assert_too_large(err.value)
    (tmp_path / "big.json").write_text(json.dumps(BIG))
    cli_refused = run("dead", "requeue", job_id, "--payload", f"@{tmp_path / 'big.json'}")
    assert cli_refused.exit_code == 1
    assert_message(cli_refused.stderr)
    rec = c.get(job_id).as_dict()
    assert rec["status"] == "dead" and rec["payload"] == {"i": 1}
    assert big_values(project) == []
    c.requeue("fast", job_id, payload=at_limit(LIMIT))
    requeued: dict[str, Any] = c.get(job_id).as_dict()
    assert requeued["status"] == "queued" and requeued["payload"] == at_limit(LIMIT)
