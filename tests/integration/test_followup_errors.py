"""A handler's ``ctx.enqueue`` refuses a bad follow-up with the same exception in a thread
and in a child process: ``ValidationFailed`` (with every error's path), ``UnknownFunction``
and ``UnknownVersion`` and their fields. Under ``ISOLATION = "process"`` the follow-up is
validated by the parent, and its refusal used to come back as a bare ``RunnerError``
carrying only the message, so ``except runner.ValidationFailed`` in a handler worked in
one isolation and not the other.
"""

from __future__ import annotations

import json

import pytest

from conftest import Project

HANDLER = '''
import runner

QUEUE = "fast"
ISOLATION = "{isolation}"


def refusal(type_, payload, **options):
    try:
        ctx_enqueue(type_, payload, **options)
    except runner.ValidationFailed as exc:
        return {{"kind": type(exc).__name__, "type": exc.type, "version": exc.version,
                 "errors": [e.as_dict() for e in exc.errors], "message": str(exc)}}
    except runner.UnknownFunction as exc:
        return {{"kind": type(exc).__name__, "type": exc.type, "known": exc.known, "message": str(exc)}}
    except runner.UnknownVersion as exc:
        return {{"kind": type(exc).__name__, "type": exc.type, "version": exc.version, "known": exc.known,
                 "message": str(exc)}}
    except runner.IdempotencyConflict as exc:
        return {{"kind": type(exc).__name__, "key": exc.key, "job_id": exc.job_id, "message": str(exc)}}
    except runner.RunnerError as exc:
        return {{"kind": "RunnerError", "message": str(exc)}}
    return None


def handle(payload, ctx):
    global ctx_enqueue
    ctx_enqueue = ctx.enqueue
    return {{
        "invalid": refusal("record", {{"n": "one", "sleep": "long"}}),
        "unknown": refusal("no_such_function", {{}}),
        "version": refusal("record", {{}}, version=7),
        "too_large": refusal("record", {{"blob": "a" * 2_000_000}}),
        "conflict": refusal("idem", {{"k": "x", "v": 2}}),
        "same": refusal("idem", {{"k": "x", "v": 1}}),
    }}
'''


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_ctx_enqueue_raises_the_same_refusals_in_a_thread_and_a_child(project: Project, isolation: str) -> None:
    """Every refusal keeps its class and fields across the child's pipe (an idempotency
    key another payload holds is refused at the call, as an enqueue's 409), and the job
    that caught them succeeds."""
    project.write_config(concurrency=1)  # one job: one child, not eight
    (project.root / "functions" / "chains.py").write_text(HANDLER.format(isolation=isolation))
    (project.root / "schemas" / "chains").mkdir()
    (project.root / "schemas" / "chains" / "v1.json").write_text(json.dumps({"type": "object"}))
    c = project.client
    holder = c.enqueue("idem", {"k": "x", "v": 1}, delay=60).id  # holds key x with another payload
    job = c.enqueue("chains", {})
    project.spawn_worker("fast")
    rec = c.wait(job.id, timeout_s=30).as_dict()
    assert rec["status"] == "done", rec["last_error"]
    out = rec["result"]

    invalid = out["invalid"]
    assert invalid["kind"] == "ValidationFailed", invalid
    assert (invalid["type"], invalid["version"]) == ("record", 1)
    assert sorted(e["path"] for e in invalid["errors"]) == ["$.n", "$.sleep"]
    assert invalid["message"].startswith("payload of record v1 is invalid: ")

    unknown = out["unknown"]
    assert unknown["kind"] == "UnknownFunction", unknown
    assert unknown["type"] == "no_such_function"
    assert "record" in unknown["known"] and "chains" in unknown["known"]

    version = out["version"]
    assert version["kind"] == "UnknownVersion", version
    assert (version["type"], version["version"], version["known"]) == ("record", 7, [1])

    large = out["too_large"]
    assert large["kind"] == "ValidationFailed", large
    assert [e["path"] for e in large["errors"]] == ["$"]
    assert "max_body_bytes" in large["errors"][0]["message"]

    conflict = out["conflict"]  # as an enqueue's 409, not a follow-up dropped at the ack
    assert conflict["kind"] == "IdempotencyConflict", conflict
    assert (conflict["key"], conflict["job_id"]) == ("x", holder)
    assert out["same"] is None  # the same payload: a duplicate, not refused
