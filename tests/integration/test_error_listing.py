"""A payload with a huge number of validation errors never stalls a process: a 1 MB body
of 520,000 bad values (no regex involved) once took 25 s to list on the event loop, /healthz
included, and a union at its root far longer. The 422 lists every error of a payload up to
LIST_BYTES and the first error past it, with a note saying more may exist and how to see
them: at POST /jobs/{type}, a batch, a group and a requeue with an edit, and in-process
through client.enqueue. (The worker's claim of such a record: test_malformed_records.py.)"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
import requests
from test_web_support import Web, gunicorn

from runner.catalog.listing import LIST_BYTES
from runner.errors import ValidationFailed

from conftest import Project, wait_for

SOURCE = 'QUEUE = "fast"\n\n\ndef handle(payload, ctx):\n    return None\n'
ITEMS = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "string"}}}}
ANY = {"type": "object", "properties": {"a": {"type": "array", "items": {
    "anyOf": [{"type": "string"}, {"type": "object"}]}}}}
_BRANCH = {"type": "object", "properties": {"kind": {"const": "x"}, "a": ANY["properties"]["a"]}, "required": ["kind"]}
# A union at the root: the compiler builds every error of both branches for its one error.
UNION = {"oneOf": [_BRANCH, {**_BRANCH, "properties": {**_BRANCH["properties"], "kind": {"const": "y"}}}]}
SCHEMAS = {"items": ITEMS, "anyof": ANY, "union": UNION}
# 520,000 bad values: "0," each, just under the 1 MiB body limit encoded compactly.
COUNT = 520_000
FIRST = {"items": {"path": "$.a[0]", "message": '0 is not of type "string"'},
         "anyof": {"path": "$.a[0]",
                   "message": "0 is not valid under any of the schemas listed in the 'anyOf' keyword"}}


def hostile(function: str) -> dict[str, Any]:
    return {"kind": "z", "a": [0] * COUNT} if function == "union" else {"a": [0] * COUNT}


def post(web: Web, path: str, body: Any) -> requests.Response:
    """A compact JSON body (requests' own json= adds a space per value, past the limit)."""
    return requests.post(web.url + path, data=orjson.dumps(body), headers={"Content-Type": "application/json"},
                         timeout=120)


def polled(web: Web, send: Callable[[], requests.Response]) -> tuple[requests.Response, float]:
    """(the answer to ``send``, its time), while /healthz is polled and must answer each
    time within 1 s."""
    answer: list[requests.Response] = []
    took: list[float] = []

    def run() -> None:
        t0 = time.monotonic()
        answer.append(send())
        took.append(time.monotonic() - t0)

    t = threading.Thread(target=run, daemon=True)  # daemon: a stalled server is killed at teardown
    t.start()
    polls = 0
    while t.is_alive():
        assert requests.get(web.url + "/healthz", timeout=1.0).status_code == 200
        polls += 1
    t.join()
    assert polls, "the request answered before /healthz was asked once"
    return answer[0], took[0]


def assert_first_and_note(errors: list[dict[str, str]], function: str, prefix: str = "$") -> None:
    """The first error the validator meets, then the note at the payload's own path."""
    assert len(errors) == 2, errors[:5]
    if function in FIRST:
        assert errors[0] == {**FIRST[function], "path": prefix + FIRST[function]["path"][1:]}, errors[0]
    else:
        assert errors[0]["path"] == prefix and "is not valid under any of the schemas" in errors[0]["message"]
        assert len(errors[0]["message"]) < 200, errors[0]
    note = errors[1]
    assert note["path"] == prefix and "only the first error" in note["message"], note
    assert f"{LIST_BYTES // 1024} KiB" in note["message"] and f"schemas/{function}/v1.json" in note["message"]


@pytest.fixture
def web(project: Project) -> Iterator[Web]:
    for name, schema in SCHEMAS.items():
        project.add_function(name, SOURCE, json.dumps(schema))
    with gunicorn(project) as w:
        yield w


@pytest.mark.parametrize("function", list(SCHEMAS))
def test_one_payload_with_a_huge_number_of_errors_never_stalls_the_web(web: Web, function: str) -> None:
    """POST /jobs/{type} (the fast lane) and with ?version=1 (the route): /healthz answers
    within 1 s meanwhile, and the 422 comes soon with the first error and the note."""
    for path in (f"/jobs/{function}", f"/jobs/{function}?version=1"):
        r, took = polled(web, lambda p=path: post(web, p, hostile(function)))
        assert r.status_code == 422, r.text[:300]
        assert took < 5, (path, took)
        assert_first_and_note(r.json()["errors"], function)
        assert "first error" in r.json()["detail"], r.json()["detail"]
    ok = post(web, f"/jobs/{function}", {"kind": "x", "a": ["s"]})
    assert ok.status_code == 202, ok.text[:300]
    small = post(web, f"/jobs/{function}", {"kind": "x", "a": [0, "s", 0]})
    assert small.status_code == 422 and len(small.json()["errors"]) == (1 if function == "union" else 2), small.text


def test_a_batch_and_a_group_with_a_huge_number_of_errors_never_stall_the_web(web: Web) -> None:
    """The same payload in a batch and in a group: /healthz answers within 1 s meanwhile,
    and the 422 comes soon, its errors at the payload's index."""
    group = {"members": [{"type": "items", "payload": hostile("items")}], "then": {"type": "items", "payload": {}}}
    for path, body, prefix in (("/jobs/items/batch", [hostile("items")], "$[0]"),
                               ("/groups", group, "$.members[0].payload")):
        r, took = polled(web, lambda p=path, b=body: post(web, p, b))
        assert r.status_code == 422, (path, r.text[:300])
        assert took < 5, (path, took)
        assert_first_and_note(r.json()["errors"], "items", prefix)


def test_a_requeue_with_an_edit_with_a_huge_number_of_errors_never_stalls_the_web(project: Project) -> None:
    """A dead job requeued with such an edited payload: /healthz answers within 1 s
    meanwhile, the 422 comes soon, and the job stays dead."""
    project.add_function("items", 'from runner import PermanentFailure\n\nQUEUE = "fast"\n\n\n'
                         'def handle(payload, ctx):\n    raise PermanentFailure("no")\n', json.dumps(ITEMS))
    c = project.client
    job = c.enqueue("items", {"a": ["s"]})
    project.spawn_worker("fast")
    wait_for(lambda: c.get(job.id).status == "dead", timeout=30, what="the job to die")
    with gunicorn(project) as web:
        r, took = polled(web, lambda: post(web, f"/dead/fast/{job.id}/requeue", {"payload": hostile("items")}))
        assert r.status_code == 422 and took < 5, (r.text[:300], took)
        assert_first_and_note(r.json()["errors"], "items")
    assert c.get(job.id).status == "dead"


def test_the_client_refuses_a_huge_number_of_errors_soon(project: Project) -> None:
    """client.enqueue in-process: ValidationFailed soon, with the first error and the note;
    enqueue_all (a batch) likewise."""
    for name, schema in SCHEMAS.items():
        project.add_function(name, SOURCE, json.dumps(schema))
    c = project.client
    for function in SCHEMAS:
        t0 = time.monotonic()
        with pytest.raises(ValidationFailed) as refused:
            c.enqueue(function, hostile(function))
        assert time.monotonic() - t0 < 5, function
        assert_first_and_note([e.as_dict() for e in refused.value.errors], function)
