"""Integers past 64 bits, wherever a producer or a handler hands one over: a payload, a
checkpoint, a follow-up and a group member's result are each refused once, clearly, with
the path named; a stored record holding one (another producer's, an older release's) is
refused by every requeue with a 4xx or a CLI error that says to send an edited payload,
never a 500 or a traceback."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
from test_web_support import Web, gunicorn

from runner.errors import ValidationFailed
from runner.store import records

from conftest import Project, wait_for

TOKEN = "wide-ints-t0ken"
WIDE = 2**70


@pytest.fixture
def web(project: Project) -> Iterator[Web]:
    with gunicorn(project, token=TOKEN) as w:
        yield w


def _fn(project: Project, name: str, src: str) -> None:
    project.add_function(name, textwrap.dedent(src))


def test_the_client_names_the_path_of_an_integer_past_64_bits(project: Project) -> None:
    """As HTTP and the CLI do: a ValidationFailed naming $.x, where a bare TypeError
    ("Integer exceeds 64-bit range") named nothing."""
    for value in (WIDE, -(2**63) - 1):
        with pytest.raises(ValidationFailed, match=r"\$\.x.*64 bits") as caught:
            project.client.enqueue("record", {"x": value})
        assert caught.value.errors[0].path == "$.x"
    with pytest.raises(ValidationFailed, match=r"\$\.a\[1\]"):
        project.client.enqueue("record", {"a": [1, WIDE]}, idempotency_key="k1")


def test_a_checkpoint_or_follow_up_past_64_bits_fails_once_naming_the_path(project: Project) -> None:
    """A handler's misuse, not a transient error: dead after one run (MAX_ATTEMPTS is 3),
    its message naming the path, where a bare TypeError was retried to the end."""
    for name, call in (("cpint", 'ctx.save_checkpoint({"n": 2**70})'),
                       ("cxint", 'ctx.enqueue("record", {"n": 2**70})')):
        _fn(project, name, f'''
            import os
            QUEUE = "fast"
            MAX_ATTEMPTS = 3
            BACKOFF = {{"base": 0.01, "cap": 0.02, "jitter": "full"}}

            def handle(payload, ctx):
                with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id), "a") as f:
                    f.write("ran\\n")
                {call}
        ''')
    ids = [project.client.enqueue(n, {}).id for n in ("cpint", "cxint")]
    project.spawn_worker("fast")
    for job_id in ids:
        rec = project.client.wait(job_id, timeout_s=20).as_dict()
        assert (rec["status"], rec["reason"], rec["attempt"]) == ("dead", "permanent failure", 1), rec
        assert "$.n" in rec["last_error"]["message"] and "64 bits" in rec["last_error"]["message"], rec
        assert project.runs(job_id) == ["ran"]


def test_a_group_member_result_past_64_bits_fails_the_member_not_the_then_job(project: Project) -> None:
    """A member's result becomes the then-job's payload, so it is held as an ON_SUCCESS
    result is: the member fails at once saying so, and the then-job runs with its outcome
    dead, its payload one any requeue can carry."""
    from runner.client import Request

    _fn(project, "wide", '''
        QUEUE = "fast"

        def handle(payload, ctx):
            return {"n": 2 ** 70}
    ''')
    _fn(project, "merged", '''
        QUEUE = "fast"

        def handle(payload, ctx):
            return payload["group"]["outcomes"]
    ''')
    c = project.client
    g = c.group([Request("wide", {})], then=Request("merged", {}))
    project.spawn_worker("fast")
    then = c.wait(g.then_id, timeout_s=20).as_dict()
    assert then["status"] == "done", then
    [member] = then["result"]
    assert member["status"] == "dead", member
    assert "64 bits" in member["error"]["message"] and "then-job" in member["error"]["message"], member


def test_every_requeue_of_a_stored_payload_past_64_bits_is_a_clear_refusal(project: Project, web: Web) -> None:
    """Another producer stored a payload holding 2**70 and the job died: the HTTP requeue
    answers 422 naming the path, the bulk requeue refuses it, and `runner dead requeue`
    exits 1 with the message, not a 500 or a traceback. An edited payload requeues it."""
    r, k = project.runtime.redis, project.keys()
    r.set(k.job("wide1"), records.encode({"type": "perm", "version": 1, "payload": f'{{"n":{WIDE}}}',
                                          "max_attempts": 1}))
    r.lpush(k.ready, "wide1")
    project.spawn_worker("fast")
    wait_for(lambda: project.client.get("wide1").status == "dead", timeout=20, what="the job to die")
    one = web.post("/dead/fast/wide1/requeue")
    assert one.status_code == 422, (one.status_code, one.text[:300])
    assert "$.n" in one.text and "edited payload" in one.text, one.text
    bulk = web.post("/bulk", json={"action": "requeue", "jobs": [{"queue": "fast", "id": "wide1"}]})
    assert bulk.status_code < 500 and "wide1" in bulk.text, bulk.text[:300]
    assert project.client.get("wide1").status == "dead"
    cli = subprocess.run([sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"),
                          "dead", "requeue", "wide1", "--queue", "fast"],
                         env=project.env, capture_output=True, text=True, timeout=30)
    assert cli.returncode == 1, (cli.returncode, cli.stdout, cli.stderr)
    assert "$.n" in cli.stderr and "Traceback" not in cli.stderr, cli.stderr
    assert project.client.get("wide1").status == "dead"
    edited = web.post("/dead/fast/wide1/requeue", json={"payload": {"n": "1180591620717411303424"}})
    assert edited.status_code == 200, edited.text[:300]
