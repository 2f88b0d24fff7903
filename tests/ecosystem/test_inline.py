"""run_inline on the shipped example functions: the worker's own validation, upgrade and
classification, in the test's process, with no Redis; and ctx.enqueue, progress and
cancel through a real worker (threads and child processes)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest

from runner.errors import JobNotFound
from runner.testing import run_inline
from runner.testing.inline import load_project

from conftest import REPO, Project, wait_for

REGISTRY = load_project(REPO)[1]
EMAIL_V2 = {"user_id": 7, "to": ["ada@example.com"], "name": "Ada", "template": "welcome"}


@pytest.fixture(autouse=True)
def _outbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTBOX_DIR", str(tmp_path / "outbox"))


def test_a_valid_job_returns_the_handlers_result() -> None:
    out = run_inline("send_email", EMAIL_V2, project=REPO)
    assert out.status == "done" and out.ok
    assert out.result == {"sent_to": ["ada@example.com"], "via": "outbox"}


def test_an_older_version_is_upgraded_before_the_handler_sees_it() -> None:
    out = run_inline("send_email", {"user_id": 7, "to": "bo@example.com", "template": "reset"}, version=1,
                     registry=REGISTRY)
    assert out.status == "done"
    assert out.payload["to"] == ["bo@example.com"] and out.payload["name"] == "bo"


def test_retry_carries_the_delay_the_handler_asked_for() -> None:
    busy = {"order_id": "o-1", "amount_cents": 990, "card": "4000000000000119"}
    out = run_inline("charge_card", busy, registry=REGISTRY)
    assert (out.status, out.delay) == ("retry", 1.0)
    assert out.error is not None and out.error["type"] == "Retry"
    # The pretend provider lets the third attempt through.
    assert run_inline("charge_card", busy, registry=REGISTRY, attempt=3).status == "done"


def test_permanent_failure_is_dead_with_its_reason() -> None:
    out = run_inline("charge_card", {"order_id": "o-2", "amount_cents": 1, "card": "4000000000000002"},
                     registry=REGISTRY)
    assert (out.status, out.reason) == ("dead", "permanent failure")
    assert "declined" in out.error["message"]


def test_the_last_attempt_of_a_retry_is_dead() -> None:
    busy = {"order_id": "o-3", "amount_cents": 1, "card": "4000000000000119"}
    out = run_inline("charge_card", busy, registry=REGISTRY, attempt=2, max_attempts=2)
    assert (out.status, out.reason) == ("dead", "max attempts reached")


def test_an_invalid_payload_never_reaches_the_handler(tmp_path: Path) -> None:
    out = run_inline("send_email", {"user_id": "seven"}, registry=REGISTRY)
    assert (out.status, out.reason) == ("dead", "invalid payload")
    assert {e["path"] for e in out.error["errors"]} >= {"$.user_id", "$"}
    assert not (tmp_path / "outbox").exists()


def test_an_unknown_version_is_dead_inline() -> None:
    out = run_inline("send_email", EMAIL_V2, version=9, registry=REGISTRY)
    assert (out.status, out.reason) == ("dead", "unknown version")


def test_an_unknown_override_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match="attemtp"):
        run_inline("send_email", EMAIL_V2, registry=REGISTRY, attemtp=2)


def test_a_follow_up_of_an_old_version_with_no_upgrade_is_refused_as_a_worker_refuses_it(tmp_path: Path) -> None:
    """ctx.enqueue(type, payload, version=OLD) where OLD has no upgrade() path fails the
    handler with ValidationFailed, as a worker's ctx.enqueue does (it was recorded and the
    job reported done, while every production run of it failed)."""
    (tmp_path / "runner.toml").write_text("[queues.fast]\n")
    (tmp_path / "functions").mkdir()
    (tmp_path / "functions" / "noup.py").write_text('QUEUE = "fast"\ndef handle(p, ctx):\n    return 1\n')
    (tmp_path / "functions" / "parent.py").write_text(
        'QUEUE = "fast"\ndef handle(p, ctx):\n    ctx.enqueue("noup", {}, version=1)\n    return "ok"\n')
    for name, versions in {"noup": (1, 2), "parent": (1,)}.items():
        (tmp_path / "schemas" / name).mkdir(parents=True)
        for v in versions:
            (tmp_path / "schemas" / name / f"v{v}.json").write_text('{"type":"object"}')
    out = run_inline("parent", {}, project=tmp_path)
    assert out.status == "retry" and out.enqueued == ()
    assert out.error is not None and out.error["type"] == "ValidationFailed"
    assert "no upgrade()" in str(out.error)
    # The newest version, or an upgrade() in the file, is accepted.
    (tmp_path / "functions" / "noup.py").write_text(
        'QUEUE = "fast"\ndef upgrade(p, v):\n    return p\ndef handle(p, ctx):\n    return 1\n')
    assert run_inline("parent", {}, project=tmp_path).status == "done"


CTX_FN = '''
QUEUE = "{queue}"
ISOLATION = "{isolation}"

def handle(payload, ctx):
    start = ctx.checkpoint or 0
    for i in range(start, payload["n"]):
        ctx.save_checkpoint(i + 1)
        ctx.progress({{"done": i + 1, "of": payload["n"]}})
    if ctx.cancelled:
        return {{"cancelled": True}}
    if payload.get("follow"):
        job = ctx.enqueue("noop", {{"from": ctx.job_id}})
        return {{"follow_up": job.id}}
    return {{"from": start}}
'''


def _ctx_project(root: Path, isolation: str) -> None:
    queue = "fast" if isolation == "thread" else "slow"
    (root / "functions").mkdir(exist_ok=True)
    (root / "functions" / "counter.py").write_text(CTX_FN.format(queue=queue, isolation=isolation))
    (root / "schemas" / "counter").mkdir(parents=True, exist_ok=True)
    (root / "schemas" / "counter" / "v1.json").write_text(
        '{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object",'
        '"properties":{"n":{"type":"integer"},"follow":{"type":"boolean"}},"required":["n"]}')


def test_inline_records_checkpoints_progress_follow_ups_and_cancel(tmp_path: Path) -> None:
    _ctx_project(tmp_path, "thread")
    (tmp_path / "runner.toml").write_text("[queues.fast]\n")
    (tmp_path / "functions" / "noop.py").write_text('QUEUE = "fast"\ndef handle(p, ctx):\n    return None\n')
    (tmp_path / "schemas" / "noop").mkdir()
    (tmp_path / "schemas" / "noop" / "v1.json").write_text('{"type":"object"}')
    out = run_inline("counter", {"n": 3, "follow": True}, project=tmp_path, job_id="j-1")
    assert out.checkpoints == (1, 2, 3)
    assert out.progress == ({"done": 1, "of": 3}, {"done": 2, "of": 3}, {"done": 3, "of": 3})
    assert [(f.type, f.payload) for f in out.enqueued] == [("noop", {"from": "j-1"})]
    resumed = run_inline("counter", {"n": 3}, project=tmp_path, checkpoint=2)
    assert resumed.result == {"from": 2} and resumed.checkpoints == (3,)
    assert run_inline("counter", {"n": 0}, project=tmp_path, cancelled=True).result == {"cancelled": True}


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_ctx_enqueue_in_a_worker_enqueues_a_real_job(project: Project, isolation: str) -> None:
    """The same handler in a real worker: ctx.enqueue validates and enqueues the follow-up
    (from a child process, through its parent), and progress never fails the job."""
    _ctx_project(project.root, isolation)
    toml = project.root / "runner.toml"  # done jobs keep their payloads, to check the follow-up's
    toml.write_text(toml.read_text().replace("[retention]\n", "[retention]\ndone_payload = true\n"))
    project.spawn_worker("fast", "slow")
    job = project.client.enqueue("counter", {"n": 2, "follow": True})
    done = wait_for(lambda: (j := project.client.get(job.id)).status == "done" and j, timeout=30)
    follow_id = done.as_dict()["result"]["follow_up"]
    assert follow_id == f"{job.id}.0"  # the same id on every attempt: written once, with the ack

    def follow_done() -> Any:
        # On the slow queue the follow-up goes to the fast one through the outbox and its relay.
        with contextlib.suppress(JobNotFound):
            got = project.client.get(follow_id)
            return got.status == "done" and got
        return False

    follow = wait_for(follow_done, timeout=15, what="the follow-up to run")
    assert follow.as_dict()["payload"] == {"from": job.id}


def test_a_result_is_held_to_the_projects_max_result_bytes(tmp_path: Path) -> None:
    """Inline, a result is bounded as a worker bounds it: by the project's runner.toml."""
    (tmp_path / "functions").mkdir()
    (tmp_path / "schemas" / "big").mkdir(parents=True)
    (tmp_path / "functions" / "big.py").write_text('QUEUE = "q"\n\ndef handle(payload, ctx):\n'
                                                   '    return "x" * payload["n"]\n')
    (tmp_path / "schemas" / "big" / "v1.json").write_text('{"type": "object"}')
    (tmp_path / "runner.toml").write_text("[queues.q]\n[worker]\nmax_result_bytes = 1000\n")
    assert run_inline("big", {"n": 990}, project=tmp_path).status == "done"
    out = run_inline("big", {"n": 1000}, project=tmp_path)
    assert out.status == "dead" and out.reason == "permanent failure"
    assert out.error is not None and out.error["type"] == "ResultTooLarge"
    assert "1,002 bytes" in out.error["message"] and "max_result_bytes = 1,000" in out.error["message"]


DURABLE_FN = '''
import runner
QUEUE = "fast"
calls = []

def handle(payload, ctx):
    a = ctx.step("a", lambda: calls.append("a") or 1)
    ctx.sleep("nap", 3600)
    try:
        go = ctx.wait_for_signal("go", timeout=60)
    except runner.SignalTimeout:
        go = None
    b = ctx.step("b", lambda: calls.append("b") or 2)
    return {"sum": a + b, "go": go, "calls": list(calls)}
'''


def test_inline_runs_durable_calls_skips_sleeps_and_answers_waits(tmp_path: Path) -> None:
    """run_inline: steps run and record, a sleep returns at once, a wait answers from
    signals= (none: SignalTimeout), and steps= replays an earlier run's log without
    calling the recorded steps' functions."""
    (tmp_path / "runner.toml").write_text("[queues.fast]\n")
    (tmp_path / "functions").mkdir()
    (tmp_path / "functions" / "durable.py").write_text(DURABLE_FN)
    (tmp_path / "schemas" / "durable").mkdir(parents=True)
    (tmp_path / "schemas" / "durable" / "v1.json").write_text('{"type":"object"}')
    first = run_inline("durable", {}, project=tmp_path, signals={"go": {"ok": True}})
    assert first.status == "done" and first.result["sum"] == 3 and first.result["go"] == {"ok": True}
    assert [(s["name"], s["kind"]) for s in first.steps] == [("a", "step"), ("nap", "sleep"), ("go", "signal"),
                                                              ("b", "step")]
    assert run_inline("durable", {}, project=tmp_path).result["go"] is None  # no signal given: timed out
    replayed = run_inline("durable", {}, project=tmp_path, steps=first.steps)
    assert replayed.result["sum"] == 3 and replayed.result["go"] == {"ok": True}
    assert len(replayed.steps) == 4
