"""NaN and the infinities have no JSON form: orjson wrote them as null, so the Python
client stored a value the producer never sent (and a typed schema refused "null"). Every
entry that takes a caller's value through the one encoder refuses them, naming the path,
as HTTP and the CLI refuse them at the parse."""

from __future__ import annotations

import pytest

from runner.errors import ValidationFailed

from conftest import SCAN_COUNT, Project

VALUES = [float("nan"), float("inf"), float("-inf")]


def _no_job(project: Project) -> bool:
    return not list(project.runtime.redis.scan_iter(count=SCAN_COUNT, match=f"{project.prefix}:*job:*"))


@pytest.mark.parametrize("value", VALUES)
def test_the_client_refuses_nan_and_infinity(project: Project, value: float) -> None:
    c = project.client
    with pytest.raises(ValidationFailed, match=r"\$\.x\[0\] is (nan|inf|-inf), which JSON cannot hold"):
        c.enqueue("record", {"x": [value], "y": None})
    with pytest.raises(ValidationFailed, match=r"\$\.d is (nan|inf|-inf)"):
        c.emit("order.placed", {"d": value})
    with pytest.raises(ValueError, match=r"\$\.s is (nan|inf|-inf)"):
        c.signal("somejob", "go", {"s": value})
    assert _no_job(project)
    # A null the caller sent is a null: stored and read back as one.
    job = c.enqueue("record", {"x": None, "t": (1, None)})
    assert c.get(job.id).as_dict()["payload"] == {"x": None, "t": [1, None]}


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_ctx_enqueue_of_nan_fails_the_job_once_naming_the_path(project: Project, isolation: str) -> None:
    """Under a thread, ctx.enqueue wrote null in its place and the job ended done."""
    project.write_config(concurrency=1)  # one job: one child under process isolation, not eight
    project.add_function("nanout", f'''
QUEUE = "fast"
MAX_ATTEMPTS = 3
ISOLATION = "{isolation}"


def handle(payload, ctx):
    ctx.enqueue("record", {{"n": float("nan")}})
''')
    job = project.client.enqueue("nanout", {})
    project.spawn_worker("fast")
    rec = project.client.wait(job.id, timeout_s=60).as_dict()
    assert (rec["status"], rec["reason"], rec["attempt"]) == ("dead", "permanent failure", 1), rec
    assert "$.n is nan" in rec["last_error"]["message"], rec["last_error"]


@pytest.mark.parametrize("isolation", ["thread", "process"])
@pytest.mark.parametrize("call", ["enqueue", "invoke"])
def test_a_queue_of_either_isolation_refuses_nan_in_a_follow_up(project: Project, call: str, isolation: str) -> None:
    """The child sent the payload to its parent with a plain encoding, NaN as null: the
    follow-up was stored and ran with null. Refused in the child now, as under a thread."""
    project.write_config(fast=f'isolation = "{isolation}"', concurrency=1)  # one job: one child, not eight
    project.add_function("nanout", '''
QUEUE = "fast"
MAX_ATTEMPTS = 3


def handle(payload, ctx):
    if payload["call"] == "enqueue":
        return ctx.enqueue("record", {"amount": 1, "list": [float("-inf")]}).id
    return ctx.invoke("record", {"amount": float("nan")})
''')
    job = project.client.enqueue("nanout", {"call": call})
    project.spawn_worker("fast")
    rec = project.client.wait(job.id, timeout_s=60).as_dict()
    assert rec["status"] == "dead", rec
    assert ("$.list[0] is -inf" if call == "enqueue" else "$.amount is nan") in rec["last_error"]["message"], rec


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_ctx_invoke_of_nan_fails_the_job_once_naming_the_path(project: Project, isolation: str) -> None:
    """Under a thread, ctx.invoke's refusal was a ValidationFailed, an ordinary error: the
    job was retried to its last attempt, each building the same payload again."""
    project.write_config(concurrency=1)  # one job: one child under process isolation, not eight
    project.add_function("naninvoke", f'''
QUEUE = "fast"
MAX_ATTEMPTS = 3
ISOLATION = "{isolation}"


def handle(payload, ctx):
    return ctx.invoke("record", {{"amount": 1, "parts": [2.5, float("inf")]}})
''')
    job = project.client.enqueue("naninvoke", {})
    project.spawn_worker("fast")
    rec = project.client.wait(job.id, timeout_s=60).as_dict()
    assert (rec["status"], rec["reason"], rec["attempt"]) == ("dead", "permanent failure", 1), rec
    message = rec["last_error"]["message"]
    assert "ctx.invoke('record')" in message and "$.parts[1] is inf" in message, rec["last_error"]
