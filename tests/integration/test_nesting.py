"""One nesting limit (codec.MAX_DEPTH levels) at every entry, and every stored record
renders in every view: a deep payload is refused with a 400/422 naming the limit by the
HTTP API (one job, a batch, a group, a requeue with an edit), the client, ctx.enqueue and
the CLI; a record past the limit written by another producer is shown as unparseable and
goes to the dead letters as a malformed record, never a 500 or a retried error."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from test_web_support import Web, gunicorn

from runner.errors import ValidationFailed
from runner.store import codec, records

from conftest import Project, wait_for

TOKEN = "nesting-t0ken"
LIMIT = 120  # codec.MAX_DEPTH


def nest(levels: int, inner: Any = 1) -> Any:
    """``levels`` objects one inside the other, ``inner`` at the bottom."""
    v = inner
    for _ in range(levels):
        v = {"a": v}
    return v


def deep_body(levels: int, inner: bytes = b"1") -> bytes:
    return b'{"a":' * levels + inner + b"}" * levels


@pytest.fixture
def web(project: Project) -> Iterator[Web]:
    with gunicorn(project, token=TOKEN) as w:
        yield w


def _json(web: Web, path: str, body: bytes) -> requests.Response:
    return web.post(path, data=body, headers={"Content-Type": "application/json"})


def _names_the_limit(r: requests.Response) -> None:
    assert r.status_code in (400, 422), (r.status_code, r.text[:300])
    assert r.headers["Content-Type"] == "application/problem+json"
    assert f"{LIMIT} levels" in r.text, r.text[:300]


def test_deep_bodies_on_every_route_get_a_problem_naming_the_limit(project: Project, web: Web) -> None:
    """A payload one level in (the {"free": ...} field of an object payload) past the
    limit, and around a 20-digit integer, at each depth (the limit, 254, 600, 1023): one
    job, a batch, a group and a requeue with an edit all answer 400/422 naming the limit,
    and nothing is written."""
    depths = [LIMIT, 254, 600, 1023]
    for levels in depths:
        free = b'{"free":' + deep_body(levels) + b"}"
        around_int = b'{"free":' + deep_body(levels, b"12345678901234567890") + b"}"
        for body in (free, around_int):
            _names_the_limit(_json(web, "/jobs/record", body))
            _names_the_limit(_json(web, "/jobs/record/batch", b"[" + body + b"]"))
            group = b'{"members":[{"type":"record","payload":' + body + b'}],"then":{"type":"record","payload":{}}}'
            _names_the_limit(_json(web, "/groups", group))
    c = project.client
    assert c.enqueue("perm", {}).id
    job = c.enqueue("perm", {})
    project.spawn_worker("fast")
    wait_for(lambda: c.get(job.id).status == "dead", timeout=20, what="the job to die")
    for levels in depths:
        _names_the_limit(_json(web, f"/dead/fast/{job.id}/requeue", b'{"payload":{"free":' + deep_body(levels) + b"}}"))
    assert c.get(job.id).status == "dead"


def test_a_payload_at_the_limit_is_taken_and_renders_in_every_view(project: Project, web: Web) -> None:
    """A free-form field nested up to the limit: enqueued, shown by the job view, the
    lists and the dead letters, and requeued."""
    payload = {"n": 1, "fail_times": 99, "free": nest(LIMIT - 1)}
    r = _json(web, "/jobs/record", codec.dumpb(payload))
    assert r.status_code == 202, r.text[:300]
    job_id = r.json()["id"]
    assert web.get(f"/jobs/{job_id}").json()["payload"] == payload
    assert web.get("/jobs?queue=fast").status_code == 200
    project.spawn_worker("fast")
    wait_for(lambda: project.client.get(job_id).status == "dead", timeout=30, what="the job to die")
    dead = web.get("/dead/fast")
    assert dead.status_code == 200 and job_id in dead.text
    again = web.post(f"/dead/fast/{job_id}/requeue")
    assert again.status_code == 200, again.text[:300]


def test_client_ctx_and_cli_refuse_a_deep_payload(project: Project) -> None:
    c = project.client
    for levels in (LIMIT, 300):
        with pytest.raises(ValidationFailed, match=f"{LIMIT} levels"):
            c.enqueue("record", {"free": nest(levels)})
    cli = subprocess.run([sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"),
                          "enqueue", "record", deep_body(990, b"12345678901234567890").decode()],
                         env=project.env, capture_output=True, text=True, timeout=30)
    assert cli.returncode == 1, cli.stderr
    assert f"{LIMIT} levels" in cli.stderr and "Traceback" not in cli.stderr
    project.add_function("deeper", '''
QUEUE = "fast"
MAX_ATTEMPTS = 3


def handle(payload, ctx):
    v = 1
    for _ in range(200):
        v = {"a": v}
    ctx.enqueue("record", {"free": v})
''')
    job = project.client.enqueue("deeper", {})
    project.spawn_worker("fast")
    rec = project.client.wait(job.id, timeout_s=20).as_dict()
    # Every retry would build the same payload: dead at once, not retried.
    assert (rec["status"], rec["reason"], rec["attempt"]) == ("dead", "permanent failure", 1), rec
    assert f"{LIMIT} levels" in str(rec["last_error"]), rec["last_error"]


def test_one_limit_holds_at_every_entry(project: Project, web: Web) -> None:
    """The same value at the limit passes every entry and reads back through runner's own
    records; one level more is refused at each. noop returns its payload: at the limit it
    ends done with that result (a result is held to the same limit), and a group of such
    members hands their results to its then-job, 4 levels further in. A signal body at
    the limit is taken; one level more is a 400 naming the same limit. ctx.enqueue one
    level past it fails the job for good on its first attempt (above)."""
    at, over = nest(LIMIT), nest(LIMIT + 1)
    c = project.client
    project.spawn_worker("fast")
    r = _json(web, "/jobs/noop", codec.dumpb(at))
    assert r.status_code == 202, r.text[:300]
    done = c.wait(r.json()["id"], timeout_s=30).as_dict()
    assert (done["status"], done["result"]) == ("done", at), {k: done[k] for k in ("status", "reason")}
    _names_the_limit(_json(web, "/jobs/noop", codec.dumpb(over)))
    with pytest.raises(ValidationFailed, match=f"{LIMIT} levels"):
        c.enqueue("noop", over)
    from runner.client import Request

    group = c.group([Request("noop", at), Request("noop", at)], then=Request("record", {"n": 1}))
    then = c.wait(group.then_id, timeout_s=30).as_dict()
    assert then["status"] == "done", {k: then.get(k) for k in ("status", "reason", "last_error")}
    shown = web.get(f"/jobs/{group.then_id}")
    assert shown.status_code == 200 and "not shown" not in shown.text


def test_a_foreign_record_past_the_limit_renders_everywhere_and_dies_unparseable(project: Project,
                                                                                  web: Web) -> None:
    """Another producer wrote a payload 254 levels deep: the job view, the lists, the
    live feed and the dead letters all answer 200; a worker buries it as a malformed
    record at once (no retry), and a requeue without an edit says to send one."""
    r, k = project.runtime.redis, project.keys()
    r.set(k.job("deep1"), records.encode({"type": "record", "version": 1,
                                          "payload": deep_body(254).decode(), "max_attempts": 3}))
    r.lpush(k.ready, "deep1")
    view = web.get("/jobs/deep1")
    assert view.status_code == 200, view.text[:300]
    assert "unparsable" in view.json()["payload"]
    assert web.get("/jobs?queue=fast").status_code == 200
    project.spawn_worker("fast")
    rec = project.client.wait("deep1", timeout_s=20).as_dict()
    assert (rec["status"], rec["reason"], rec["attempt"]) == ("dead", "malformed record", 0), rec
    assert f"{codec.READ_DEPTH} levels" in rec["last_error"]["message"]
    for path in ("/jobs/deep1", "/dead/fast", "/jobs?queue=fast&status=dead"):
        got = web.get(path)
        assert got.status_code == 200, (path, got.status_code, got.text[:300])
    again = web.post("/dead/fast/deep1/requeue")
    assert again.status_code == 422 and "edited payload" in again.text, again.text[:300]


def test_integers_out_of_64_bits_are_refused_not_turned_into_floats(project: Project, web: Web) -> None:
    for number in (b"-9223372036854775809", b"-99999999999999999999", b"18446744073709551616"):
        r = _json(web, "/jobs/record", b'{"n": ' + number + b"}")
        assert r.status_code == 400 and "64 bits" in r.json()["detail"], (number, r.text)


def test_foreign_records_with_invalid_utf8_render_in_every_view(project: Project, web: Web) -> None:
    """Another producer wrote bytes that are not UTF-8 in a payload and in a type name: the
    job views, the lists, the dead letters, the queues (after a worker met the bad type)
    and ``runner job`` all answer, the bad bytes shown as replacement characters."""
    r, k = project.runtime.redis, project.keys()
    raw = records.encode({"type": "record", "version": 1, "payload": "{}", "max_attempts": 3}).encode()
    r.set(k.job("utf8p"), raw[:-2] + b'{"x":"\xff\xfe"}')
    r.set(k.job("utf8t"), raw.replace(b"record", b"rec\xfford", 1))
    r.lpush(k.ready, "utf8p", "utf8t")
    paths = ["/jobs/utf8p", "/jobs/utf8t", "/jobs?queue=fast", "/jobs?queue=fast&status=dead", "/dead/fast", "/queues",
             "/metrics"]

    def every_view_answers() -> None:
        for path in paths:
            got = web.get(path)
            assert got.status_code == 200, (path, got.status_code, got.text[:300])
        for jid in ("utf8p", "utf8t"):
            cli = subprocess.run([sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"),
                                  "job", jid], env=project.env, capture_output=True, text=True, errors="replace",
                                 timeout=30)
            assert cli.returncode == 0 and "Traceback" not in cli.stderr, (jid, cli.stderr[-400:])
            assert "\ufffd" in cli.stdout, cli.stdout

    every_view_answers()
    assert "\ufffd" in web.get("/jobs/utf8t").json()["type"]
    project.spawn_worker("fast")
    wait_for(lambda: project.client.get("utf8p").as_dict()["status"] == "dead", timeout=20)
    wait_for(lambda: r.llen(k.ready) == 0, timeout=20)
    every_view_answers()
