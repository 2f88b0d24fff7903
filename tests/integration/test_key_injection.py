"""Producer data never reaches the separators of a job record: a key rendered from a
payload (IDEMPOTENCY_KEY, RESOURCE_KEY, keyed CONCURRENCY and RATE_LIMIT) and an explicit
idempotency key are refused when they hold a control character, with an error naming the
field, at every entry (HTTP, a batch, the client, ``ctx.enqueue``), and nothing is written.

A record is "1" and ten fields joined by \\x1f, and its limits are "<n> <key>" lines: a
newline in a rate-limit key added a limit line of the producer's choosing (another
account's token bucket pushed a year ahead), and a \\x1f in an idempotency key shifted the
record's fields (another user's resource lock, then a dead "malformed record"). A record
already in Redis with such bytes (written before the rule) still renders in every view."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from test_web_support import Web, gunicorn, served

from runner import ValidationFailed
from runner.store import records
from runner.store.embedded import Server

from conftest import SCAN_COUNT, Project, wait_for

CALL_API = '''QUEUE = "fast"
RATE_LIMIT = {"key": "api:{account}", "limit": 5, "period": 1}
RESOURCE_KEY = "user:{account}"


def handle(payload, ctx):
    return {"account": payload["account"]}
'''
ORDER = '''QUEUE = "fast"
IDEMPOTENCY_KEY = "{order_id}"


def handle(payload, ctx):
    return None
'''
ACCOUNT = '{"type": "object", "required": ["account"], "properties": {"account": {"type": "string"}}}'
ORDER_ID = '{"type": "object", "required": ["order_id"], "properties": {"order_id": {"type": "string"}}}'

# The reviewer's payloads, and one of each other control character a record could split on.
LIMIT_LINE = "evil\n1/31536000000 qk:api:victim"
RECORD_FIELDS = "o1\x1fH\x1fuser:victim\x1f1 r:user:victim"
HOSTILE = [LIMIT_LINE, RECORD_FIELDS, "a\rb", "a\x00b", "a\tb", "a\x7fb", "a\x9bb"]


@pytest.fixture
def keyed(project: Project) -> Project:
    project.add_function("call_api", CALL_API, ACCOUNT)
    project.add_function("order", ORDER, ORDER_ID)
    return project


@pytest.fixture
def web(keyed: Project) -> Iterator[Web]:
    with gunicorn(keyed) as w:
        yield w


@pytest.fixture(scope="module")
def keyed_web(tmp_path_factory: pytest.TempPathFactory, server: Server) -> Iterator[tuple[Project, Web]]:
    """One keyed project and its server for the HTTP refusals: each test compares what is
    written before and after its own requests."""
    def setup(p: Project) -> None:
        p.add_function("call_api", CALL_API, ACCOUNT)
        p.add_function("order", ORDER, ORDER_ID)

    with served(tmp_path_factory, server, setup) as served_web:
        yield served_web


def _written(project: Project) -> list[str]:
    """Every key of the project's prefix in Redis (a refused job leaves none)."""
    return sorted(k.decode() if isinstance(k, bytes) else k
                  for k in project.runtime.redis.scan_iter(match=f"{project.prefix}*", count=SCAN_COUNT))


def _key_errors(problem: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in problem.get("errors", []) if "control character" in e.get("message", "")]


@pytest.mark.parametrize("value", HOSTILE)
def test_http_refuses_a_control_character_in_a_rendered_key(keyed_web: tuple[Project, Web], value: str) -> None:
    """POST /jobs/{type} with a payload value that a key template renders: 422 naming the
    payload field and what to do, and nothing in Redis; a clean value still gets its 202."""
    keyed, web = keyed_web
    before = _written(keyed)
    for fn, field in (("call_api", "account"), ("order", "order_id")):
        r = web.post(f"/jobs/{fn}", data=json.dumps({field: value}),
                     headers={"Content-Type": "application/json"})
        assert r.status_code == 422, (fn, r.status_code, r.text)
        errors = _key_errors(r.json())
        assert errors and errors[0]["path"] == f"$.{field}", r.json()
        assert "remove" in errors[0]["message"], errors
    assert _written(keyed) == before
    ok = web.post("/jobs/call_api", data=json.dumps({"account": "victim"}),
                  headers={"Content-Type": "application/json"})
    assert ok.status_code == 202, ok.text


def test_http_batch_refuses_a_control_character_and_writes_nothing(keyed_web: tuple[Project, Web]) -> None:
    """One hostile payload in a batch: 422 naming it by index, no job of the batch written."""
    keyed, web = keyed_web
    before = _written(keyed)
    r = web.post("/jobs/call_api/batch", data=json.dumps([{"account": "a"}, {"account": LIMIT_LINE}]),
                 headers={"Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    errors = _key_errors(r.json())
    assert errors and errors[0]["path"] == "$[1].account", r.json()
    assert _written(keyed) == before


# A tab, and U+009B (CSI) as UTF-8 (the bytes c2 9b, sent as latin-1 text).
@pytest.mark.parametrize("header", ["a\tb", "o1\xc2\x9bx"])
def test_http_refuses_a_control_character_in_the_idempotency_key_header(keyed_web: tuple[Project, Web],
                                                                         header: str) -> None:
    """An Idempotency-Key header the HTTP layer lets through (a tab, a C1 control) is a 400
    naming the header: the key lands in the record as the template's would."""
    keyed, web = keyed_web
    before = _written(keyed)
    r = web.post("/jobs/call_api", data=json.dumps({"account": "a"}),
                 headers={"Content-Type": "application/json", "Idempotency-Key": header})
    assert r.status_code == 400, r.text
    assert r.json().get("header") == "Idempotency-Key" and "control character" in r.json()["detail"], r.json()
    assert _written(keyed) == before


@pytest.mark.parametrize("value", HOSTILE)
def test_client_refuses_a_control_character_in_a_key(keyed: Project, value: str) -> None:
    """Client.enqueue: a rendered key (each template kind) and an explicit idempotency key
    (as --idempotency-key passes it) raise ValidationFailed naming the field; nothing written."""
    c = keyed.client
    before = _written(keyed)
    with pytest.raises(ValidationFailed) as rendered:
        c.enqueue("call_api", {"account": value})
    assert [e.path for e in rendered.value.errors] == ["$.account"]
    with pytest.raises(ValidationFailed) as explicit:
        c.enqueue("order", {"order_id": "o1"}, idempotency_key=value)
    assert "idempotency key" in str(explicit.value) and "control character" in str(explicit.value)
    assert _written(keyed) == before


FOLLOWUPS = '''
import runner

QUEUE = "fast"
ISOLATION = "{isolation}"


def refused(call):
    try:
        call()
    except runner.ValidationFailed as exc:
        return [e.as_dict() for e in exc.errors]
    return None


def handle(payload, ctx):
    return {{
        "rendered": refused(lambda: ctx.enqueue("call_api", {{"account": payload["bad"]}})),
        "record": refused(lambda: ctx.enqueue("order", {{"order_id": payload["fields"]}})),
        "explicit": refused(lambda: ctx.enqueue("order", {{"order_id": "o1"}}, idempotency_key=payload["bad"])),
    }}
'''


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_ctx_enqueue_refuses_a_control_character_in_a_key(keyed: Project, isolation: str) -> None:
    """A handler's follow-up with a hostile key raises ValidationFailed at the call, in a
    thread and in a child process, and no follow-up is written with the job's success."""
    keyed.write_config(concurrency=1)  # one job: one child under process isolation, not eight
    keyed.add_function("chain", FOLLOWUPS.format(isolation=isolation))
    job = keyed.client.enqueue("chain", {"bad": LIMIT_LINE, "fields": RECORD_FIELDS})
    keyed.spawn_worker("fast")
    done = keyed.client.wait(job.id, timeout_s=30).as_dict()
    assert done["status"] == "done", done["last_error"]
    out = done["result"]
    assert [e["path"] for e in out["rendered"]] == ["$.account"], out
    assert [e["path"] for e in out["record"]] == ["$.order_id"], out
    assert out["explicit"] and "control character" in out["explicit"][0]["message"], out
    assert done["children"] == []


def test_a_record_written_with_separators_in_its_keys_still_renders(keyed: Project, web: Web) -> None:
    """A record an older producer wrote with \\x1f in its idempotency key (its fields
    shifted) and a newline in its limits reads back in the job view and the job list
    (200, the shifted payload shown as unparsable), not a 500."""
    c = keyed.client
    job = c.enqueue("order", {"order_id": "o1"}, delay=3600)
    k = keyed.keys()
    raw = keyed.runtime.redis
    raw.set(k.job(job.id), records.encode({
        "type": "order", "version": 1, "max_attempts": 3, "idem_key": RECORD_FIELDS, "idem_hash": "h",
        "resource_key": "", "limits": "1 r:a\n1/31536000000 qk:api:victim", "meta": "",
        "payload": json.dumps({"order_id": RECORD_FIELDS}, ensure_ascii=False),
    }))
    one = web.get(f"/jobs/{job.id}")
    assert one.status_code == 200, one.text
    assert one.json()["id"] == job.id
    listed = wait_for(lambda: web.get("/jobs?status=scheduled&limit=25"), what="the job list")
    assert listed.status_code == 200, listed.text
    assert job.id in [j["id"] for j in listed.json()["jobs"]]
    assert c.get(job.id) is not None
