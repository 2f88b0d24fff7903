"""A schema ``pattern`` never stalls a web process: a pattern the linear-time engine
takes runs there; one that needs backtracking (a lookaround, a backreference) is
matched after maxLength, within a time bound, off the event loop; and `runner check`
warns about it. The same holds for the key regexes of ``patternProperties`` and for
``propertyNames``, however many long names a payload has, at every entry: HTTP, the
client, ctx.enqueue, a requeue with an edit and the CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import requests
from test_cli_check import check
from test_web_support import Web, gunicorn, served

from runner.errors import ValidationFailed
from runner.store.embedded import Server

from conftest import Project, wait_for

# A common password rule: quadratic on a long string that fails it.
PASSWORD = "(?=.*[A-Z])(?=.*[0-9]).{8,}"
SCHEMA = json.dumps({"type": "object", "properties": {
    "capped": {"type": "string", "maxLength": 64, "pattern": PASSWORD},
    "free": {"type": "string", "pattern": PASSWORD},
    "plain": {"type": "string", "pattern": "^(a+)+$"},
}})
SOURCE = 'QUEUE = "fast"\n\n\ndef handle(payload, ctx):\n    return None\n'
# A key regex with a lookaround, alone and beside a value pattern (the compiler once took
# the second with its own backtracking engine, out of reach of any time bound: one
# request of long names held a process for 30 s); the same rule anchored (linear in any
# backtracking engine); a bound on every name.
KEYS = {"type": "object", "patternProperties": {PASSWORD: {"type": "integer"}}}
KEYS_BESIDE = {**KEYS, "properties": {"pw": {"type": "string", "pattern": PASSWORD}}}
ANCHORED = {"type": "object", "properties": {"pw": {"type": "string", "pattern": PASSWORD}},
            "patternProperties": {f"^{PASSWORD}$": {"type": "integer"}}}
NAMES = {"type": "object", "propertyNames": {"maxLength": 64}}
FUNCTIONS = {"keys": KEYS, "keys_beside": KEYS_BESIDE, "anchored": ANCHORED, "names": NAMES}
OVER = "took over 0.25 s (what matching may take per payload, or per batch or group): send fewer or shorter " \
    "property names"


def long_names(count: int = 100, length: int = 10_000) -> dict[str, int]:
    """Names with a digit and no capital, so each fails the password rule at its end:
    100 of 10,000 characters is a body just under the 1 MiB limit."""
    return {f"{i:05d}" + "a" * (length - 5): i for i in range(count)}


# Many short names each over the propertyNames bound: each error once held the whole
# object, so collecting them grew with count x size.
MANY_NAMES = long_names(4000, 100)


def add_functions(project: Project) -> None:
    for name, schema in FUNCTIONS.items():
        project.add_function(name, SOURCE, json.dumps(schema))


def polled(web: Web, send: Callable[[], requests.Response]) -> tuple[requests.Response, float, float]:
    """(the answer to ``send``, its time, the slowest /healthz answered meanwhile)."""
    answer: list[requests.Response] = []
    took: list[float] = []

    def hostile() -> None:
        t0 = time.monotonic()
        answer.append(send())
        took.append(time.monotonic() - t0)

    t = threading.Thread(target=hostile)
    t.start()
    worst = 0.0
    while t.is_alive():
        t0 = time.monotonic()
        assert requests.get(web.url + "/healthz", timeout=60).status_code == 200
        worst = max(worst, time.monotonic() - t0)
    t.join()
    return answer[0], took[0], worst


@pytest.fixture(scope="module")
def web(tmp_path_factory: pytest.TempPathFactory, server: Server) -> Iterator[Web]:
    with served(tmp_path_factory, server, lambda p: p.add_function("signup", SOURCE, SCHEMA)) as (_, w):
        yield w


@pytest.mark.parametrize("field", ["capped", "free", "plain"])
def test_a_pathological_value_never_stalls_the_other_requests(web: Web, field: str) -> None:
    """While a 100,000-character value that fails the pattern is validated, /healthz and
    an ordinary enqueue answer as usual, and the hostile request gets its 422 soon."""
    value = "a" * 100_000 + ("!" if field == "plain" else "")
    answer: list[requests.Response] = []
    took: list[float] = []

    def hostile() -> None:
        t0 = time.monotonic()
        answer.append(requests.post(web.url + "/jobs/signup", json={field: value}, timeout=60))
        took.append(time.monotonic() - t0)

    t = threading.Thread(target=hostile)
    t.start()
    worst = 0.0
    while t.is_alive():
        t0 = time.monotonic()
        assert requests.get(web.url + "/healthz", timeout=30).status_code == 200
        worst = max(worst, time.monotonic() - t0)
    t.join()
    assert answer[0].status_code == 422, answer[0].text[:300]
    assert took[0] < 5, took
    assert worst < 1.0, worst
    ok = requests.post(web.url + "/jobs/signup", json={"capped": "Abcdefg1", "free": "Abcdefg1"}, timeout=10)
    assert ok.status_code == 202, ok.text[:300]
    bad = requests.post(web.url + "/jobs/signup", json={"free": "abcdefgh"}, timeout=10)
    assert bad.status_code == 422 and "does not match" in bad.text


def test_check_warns_about_a_backtracking_pattern(project: Project) -> None:
    project.add_function("signup", SOURCE, SCHEMA)
    out = check(project, "--offline")
    assert "needs a backtracking engine" in out.output and PASSWORD in out.output, out.output
    assert "^(a+)+$" not in out.output  # the linear engine takes it: no backtracking at all


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory, server: Server) -> Iterator[tuple[Project, Web]]:
    with served(tmp_path_factory, server, add_functions) as served_web:
        yield served_web


@pytest.fixture
def keys_web(keyed: tuple[Project, Web]) -> Web:
    return keyed[1]


@pytest.mark.parametrize(("function", "body", "status"), [
    ("keys", long_names(), 422), ("keys_beside", long_names(), 422), ("anchored", long_names(), 202),
    ("names", MANY_NAMES, 422),
])
def test_long_property_names_never_stall_the_other_requests(
    keys_web: Web, function: str, body: dict[str, int], status: int,
) -> None:
    """A body of many long names, failing a key regex with a lookaround or over a bound on
    names: /healthz answers as usual meanwhile, and the request gets its answer soon: 202
    when the names are matched within the budget (none matches), else a 422 naming the
    limit; a 422 naming the first name over the bound (the body is past what is listed in
    full: catalog/listing.py's LIST_BYTES)."""
    r, took, worst = polled(keys_web, lambda: requests.post(keys_web.url + f"/jobs/{function}", json=body, timeout=120))
    assert r.status_code == status, r.text[:300]
    assert took < 5, took
    assert worst < 1.0, worst
    if function == "names":  # past LIST_BYTES: the first name over the bound, and a note
        errors = r.json()["errors"]
        assert len(errors) == 2 and "longer than 64 characters" in errors[0]["message"], r.text[:2000]
        assert "only the first error" in errors[1]["message"], errors[1]
    elif status == 422:
        assert r.json()["errors"] == [{"path": "$", "message": r.json()["errors"][0]["message"]}], r.text[:300]
        assert OVER in r.text and PASSWORD in r.text, r.text[:300]
    ok = requests.post(keys_web.url + "/jobs/keys", json={"Abcdefg1": 1, "abc": "free"}, timeout=10)
    assert ok.status_code == 202, ok.text[:300]
    bad = requests.post(keys_web.url + "/jobs/keys_beside", json={"Abcdefg1": "x"}, timeout=10)
    assert bad.status_code == 422 and bad.json()["errors"] == [
        {"path": "$.Abcdefg1", "message": '"x" is not of type "integer"'}], bad.text[:300]


def test_a_batch_or_a_group_shares_one_budget(keys_web: Web) -> None:
    """40 payloads of one long name each, every one past a budget of its own: a batch or
    a group is refused in about one budget (not 40 of them, each holding a thread),
    naming the limit, while /healthz answers as usual."""
    payloads = [{f"{i:05d}" + "a" * 9995: i} for i in range(40)]
    group = {"members": [{"type": "keys", "payload": p} for p in payloads], "then": {"type": "keys", "payload": {}}}
    for path, body in (("/jobs/keys/batch", payloads), ("/groups", group)):
        r, took, worst = polled(keys_web, lambda p=path, b=body: requests.post(keys_web.url + p, json=b, timeout=300))
        assert r.status_code == 422 and OVER in r.text, (path, r.text[:300])
        assert took < 5 and worst < 1.0, (path, took, worst)


def test_the_client_bounds_long_property_names(project: Project) -> None:
    """client.enqueue: the same bodies are taken or refused soon, the one past the budget
    with an error naming the limit and what to send instead."""
    add_functions(project)
    c = project.client
    t0 = time.monotonic()
    assert c.enqueue("anchored", long_names()).id
    for function in ("keys", "keys_beside"):
        with pytest.raises(ValidationFailed, match=re.escape(OVER)):
            c.enqueue(function, long_names())
    with pytest.raises(ValidationFailed) as refused:
        c.enqueue("names", MANY_NAMES)
    assert [e.note for e in refused.value.errors] == [False, True], refused.value.errors
    assert "longer than 64 characters" in refused.value.errors[0].message
    assert time.monotonic() - t0 < 15


def test_ctx_enqueue_a_requeue_with_an_edit_and_the_cli_bound_long_property_names(project: Project) -> None:
    """A handler's ctx.enqueue, a dead job requeued with an edited payload (client and
    HTTP), and `runner enqueue`: each takes a body of long names soon, or refuses it
    naming the limit."""
    add_functions(project)
    project.add_function("spawner", """
import time

from runner import ValidationFailed

QUEUE = "fast"
MAX_ATTEMPTS = 1


def handle(payload, ctx):
    names = {f"{i:05d}" + "a" * 9995: i for i in range(100)}
    t0 = time.monotonic()
    ctx.enqueue("anchored", names)
    try:
        ctx.enqueue("keys", names)
        refused = None
    except ValidationFailed as exc:
        refused = str(exc)
    return {"took": time.monotonic() - t0, "refused": refused}
""")
    project.add_function("dies", 'from runner import PermanentFailure\n\nQUEUE = "fast"\n\n\n'
                         'def handle(payload, ctx):\n    raise PermanentFailure("no")\n', json.dumps(ANCHORED))
    c = project.client
    spawned = c.enqueue("spawner", {})
    dead = [c.enqueue("dies", {}).id for _ in range(2)]
    project.spawn_worker("fast")
    done = c.wait(spawned.id, timeout_s=60).as_dict()
    assert done["status"] == "done", done
    assert done["result"]["took"] < 5 and OVER in done["result"]["refused"], done["result"]
    for job_id in dead:
        wait_for(lambda j=job_id: c.get(j).status == "dead", timeout=30, what="the job to die")
    t0 = time.monotonic()
    assert c.requeue("fast", dead[0], payload=long_names())
    assert time.monotonic() - t0 < 5
    with gunicorn(project) as web:
        r, took, worst = polled(web, lambda: requests.post(
            web.url + f"/dead/fast/{dead[1]}/requeue", json={"payload": long_names()}, timeout=120))
        assert r.status_code == 200 and took < 5 and worst < 1.0, (r.text[:300], took, worst)
    body = project.root / "names.json"
    body.write_text(json.dumps(long_names()))
    t0 = time.monotonic()
    cli = subprocess.run([sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"),
                          "enqueue", "keys", f"@{body}"], env=project.env, capture_output=True, text=True,
                         timeout=120)
    assert cli.returncode == 1 and OVER in cli.stderr and "Traceback" not in cli.stderr, cli.stderr
    assert time.monotonic() - t0 < 10


def test_check_warns_about_each_backtracking_key_pattern(project: Project) -> None:
    add_functions(project)
    out = check(project, "--offline")
    warned = [line for line in out.output.splitlines() if "needs a backtracking engine" in line]
    assert any("keys/v1.json" in w and "patternProperties" in w and PASSWORD in w for w in warned), out.output
    assert any("anchored/v1.json" in w and "patternProperties" in w and f"^{PASSWORD}$" in w for w in warned)
    assert not any("names/v1.json" in w for w in warned), out.output


def test_a_bulk_requeue_shares_one_budget(keyed: tuple[Project, Web]) -> None:
    """40 dead jobs whose payloads (another producer's) each hold a long name past the
    budget: one bulk requeue answers in about one budget, not one per payload (40 x 0.25 s;
    500 of them held a thread for two minutes), each refused job staying dead and saying
    why, while /healthz answers as usual."""
    from runner.store import records

    project, keys_web = keyed
    r, k = project.runtime.redis, project.keys()
    ids = []
    for i in range(40):
        job_id = records.new_id()
        payload = json.dumps({f"{i:05d}" + "a" * 9995: i})
        r.set(k.job(job_id), records.encode({"type": "keys", "version": 1, "max_attempts": 3, "payload": payload}))
        r.hset(k.state(job_id), mapping={"status": "dead", "reason": "planned"})
        r.zadd(k.dead, {job_id: i})
        ids.append(job_id)
    body = {"action": "requeue", "jobs": [{"queue": "fast", "id": i} for i in ids]}
    answer, took, worst = polled(keys_web, lambda: requests.post(keys_web.url + "/bulk", json=body, timeout=300))
    assert answer.status_code == 200, answer.text[:300]
    outcomes = answer.json()["jobs"]
    refused = [j for j in outcomes if j["outcome"] == "refused"]
    assert len(refused) >= 30 and all("0.25 s" in j["error"] for j in refused), outcomes
    assert took < 5 and worst < 1.0, (took, worst)
    assert all(project.client.get(j["id"]).status == "dead" for j in refused)
