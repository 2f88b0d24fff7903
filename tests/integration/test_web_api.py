"""The HTTP API through a real gunicorn: enqueue to result, idempotency, dead-letter
operations, and every error status with its problem+json body."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import falcon.testing
import pytest
import requests
from openapi_spec_validator import validate as validate_openapi
from test_web_support import Web, gunicorn

from runner.catalog.registry import Registry
from runner.store.embedded import Server
from runner.web import create_app

from conftest import Project, make_project, wait_for

TOKEN = "t0ken-for-tests"
PROBLEM = "application/problem+json"


def assert_problem(r: requests.Response, status: int, slug: str) -> dict[str, Any]:
    """One stable shape for every error."""
    assert r.status_code == status, r.text
    assert r.headers["Content-Type"] == PROBLEM
    body: dict[str, Any] = r.json()
    assert body["type"] == f"urn:runner:problem:{slug}", body
    assert body["status"] == status
    assert body["title"] and body["detail"] and body["instance"].startswith("/")
    return body


def job_when(web: Web, job_id: str, statuses: tuple[str, ...] = ("done", "dead")) -> dict[str, Any]:
    def settled() -> dict[str, Any] | None:
        rec: dict[str, Any] = web.get(f"/jobs/{job_id}").json()
        return rec if rec["status"] in statuses else None

    out: dict[str, Any] = wait_for(settled, timeout=20, interval=0.02, what=f"job {job_id} in {statuses}")
    return out


@pytest.fixture
def web(project: Project) -> Iterator[Web]:
    project.write_config(extra="\n[api]\nmax_body_bytes = 2048\n")
    with gunicorn(project, token=TOKEN) as w:
        yield w


def test_enqueue_runs_and_the_job_shows_its_result(project: Project, web: Web) -> None:
    """POST /jobs/{type} -> 202 with the job; a worker runs it; GET /jobs/{id} shows it done
    with its result, attempts and history."""
    r = web.post("/jobs/record", json={"n": 7})
    assert r.status_code == 202, r.text
    job = r.json()
    assert job == {"id": job["id"], "type": "record", "version": 1, "queue": "fast", "status": "queued",
                   "duplicate": False}
    assert r.headers["Location"] == f"/jobs/{job['id']}"
    delayed = web.post("/jobs/record?delay=0.3&version=1", json={"n": 8}).json()
    assert delayed["status"] == "scheduled"
    assert web.get(f"/jobs/{job['id']}").json()["payload"] == {"n": 7}  # kept while the job is live
    project.spawn_worker("fast")
    rec = job_when(web, job["id"])
    assert rec["status"] == "done" and rec["result"] == {"n": 7, "attempt": 1}
    assert rec["attempt"] == 1 and [h["outcome"] for h in rec["history"]] == ["done"]
    assert rec["payload"] is None and rec["started_at"] >= rec["enqueued_at"]  # done keeps no payload
    assert rec["max_attempts"] is None  # nor its attempt budget: not known, not a 0
    assert job_when(web, delayed["id"])["result"] == {"n": 8, "attempt": 1}
    assert len(project.runs(job["id"])) == 1


def test_duplicate_key_returns_the_first_job_and_another_payload_conflicts(web: Web) -> None:
    """Same Idempotency-Key and payload -> 200 with the first id; another payload -> 409
    naming the job that holds the key. The function's own template works the same way."""
    first = web.post("/jobs/record", json={"n": 1}, headers={"Idempotency-Key": "order-1"})
    assert first.status_code == 202
    again = web.post("/jobs/record", json={"n": 1}, headers={"Idempotency-Key": "order-1"})
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"] and again.json()["duplicate"] is True
    clash = web.post("/jobs/record", json={"n": 2}, headers={"Idempotency-Key": "order-1"})
    body = assert_problem(clash, 409, "idempotency-conflict")
    assert body["job_id"] == first.json()["id"] and body["idempotency_key"] == "order-1"
    t1 = web.post("/jobs/idem", json={"k": "a", "v": 1})
    t2 = web.post("/jobs/idem", json={"k": "a", "v": 1})
    assert (t1.status_code, t2.status_code) == (202, 200) and t1.json()["id"] == t2.json()["id"]
    assert_problem(web.post("/jobs/idem", json={"k": "a", "v": 2}), 409, "idempotency-conflict")


def test_a_batch_enqueues_every_payload_or_none(project: Project, web: Web) -> None:
    """POST /jobs/{type}/batch: 202 with one answer per payload, in order, and every job
    runs once. One invalid payload is a 422 naming each error by index, with nothing
    enqueued; the function's key template keys each job, so a held key answers that job
    with its first id (a duplicate) or a 409 problem while the others go in."""
    r = web.post("/jobs/record/batch", json=[{"n": i} for i in range(150)])
    assert r.status_code == 202, r.text
    jobs = r.json()["jobs"]
    assert [j["type"] for j in jobs] == ["record"] * 150 and len({j["id"] for j in jobs}) == 150
    assert {(j["status"], j["duplicate"]) for j in jobs} == {("queued", False)}
    later = web.post("/jobs/record/batch?delay=30", json=[{"n": 1000}]).json()["jobs"]
    assert later[0]["status"] == "scheduled"
    body = assert_problem(web.post("/jobs/record/batch", json=[{"n": 1}, {"n": "x"}, {"n": 2, "sleep": "s"}]),
                          422, "invalid-payload")
    assert sorted(e["path"] for e in body["errors"]) == ["$[1].n", "$[2].sleep"]
    assert web.get("/queues").json()["queues"][0]["ready"] == 150
    first = web.post("/jobs/idem", json={"k": "a", "v": 1}).json()
    keyed = web.post("/jobs/idem/batch", json=[{"k": "a", "v": 1}, {"k": "b", "v": 1}, {"k": "a", "v": 2}])
    assert keyed.status_code == 202, keyed.text
    dup, fresh, clash = keyed.json()["jobs"]
    assert dup["id"] == first["id"] and dup["duplicate"] is True
    assert fresh["status"] == "queued" and fresh["duplicate"] is False
    assert clash["status"] == 409 and clash["type"] == "urn:runner:problem:idempotency-conflict"
    assert clash["job_id"] == first["id"]
    # Refused whole: not an array, empty, too long, a header key, an unknown type or version.
    for bad in ('{"n": 1}', "[]", "[" + ",".join(["0"] * 1001) + "]"):  # the last in 2,048 bytes
        assert_problem(web.post("/jobs/record/batch", data=bad, headers={"Content-Type": "application/json"}),
                       400, "invalid-batch")
    assert_problem(web.post("/jobs/record/batch", json=[{}], headers={"Idempotency-Key": "k"}),
                   400, "invalid-header")
    assert_problem(web.post("/jobs/nope/batch", json=[{}]), 404, "unknown-function")
    assert_problem(web.post("/jobs/record/batch?version=9", json=[{}]), 422, "unknown-version")
    assert web.get("/queues").json()["queues"][0]["ready"] == 152
    sent = {j["id"]: int(web.get(f"/jobs/{j['id']}").json()["payload"]["n"]) for j in jobs[::30]}
    project.spawn_worker("fast")
    for job_id, n in sent.items():
        assert job_when(web, job_id)["result"]["n"] == n
    wait_for(lambda: web.get("/queues").json()["queues"][0]["ready"] == 0, timeout=20, what="drained")
    assert all(len(project.runs(j["id"])) == 1 for j in jobs[::10])


def test_every_error_status_has_its_problem_body(web: Web) -> None:
    """400, 401, 404, 405, 409 (above), 413, 415 and 422, all application/problem+json."""
    # 401: missing, wrong and non-bearer credentials; /healthz and the dashboard shell are open.
    r = web.get("/queues", auth=False)
    assert_problem(r, 401, "unauthorized")
    assert r.headers["WWW-Authenticate"].startswith("Bearer")
    assert_problem(web.get("/queues", headers={"Authorization": "Bearer nope"}), 401, "unauthorized")
    assert_problem(web.get("/queues", headers={"Authorization": f"Basic {TOKEN}"}), 401, "unauthorized")
    assert_problem(web.get("/no/such/path", auth=False), 401, "unauthorized")
    assert_problem(web.get("/metrics", auth=False), 401, "unauthorized")
    assert_problem(web.post("/jobs/record", auth=False, json={}), 401, "unauthorized")
    assert web.get("/healthz", auth=False).status_code == 200
    assert web.get("/", auth=False).headers["Content-Type"].startswith("text/html")
    # 404: unknown function, job, queue, path.
    assert assert_problem(web.post("/jobs/nope", json={}), 404, "unknown-function")["function"] == "nope"
    assert assert_problem(web.get("/jobs/0123abc"), 404, "job-not-found")["job_id"] == "0123abc"
    assert_problem(web.get("/functions/nope"), 404, "unknown-function")
    assert_problem(web.get("/dead/nope"), 404, "unknown-queue")
    assert_problem(web.get("/no/such/path"), 404, "not-found")
    # 405, with the methods that are allowed.
    r = web.call("DELETE", "/queues")
    assert "GET" in assert_problem(r, 405, "method-not-allowed")["allowed_methods"]
    assert "GET" in r.headers["Allow"]
    # 415 and 400.
    assert_problem(web.post("/jobs/record", data="{}", headers={"Content-Type": "text/plain"}),
                   415, "unsupported-media-type")
    assert_problem(web.post("/jobs/record", data=b"{}"), 415, "unsupported-media-type")
    json_ct = {"Content-Type": "application/json"}
    assert_problem(web.post("/jobs/record", data="{not json", headers=json_ct), 400, "invalid-json")
    assert_problem(web.post("/jobs/record", data="", headers=json_ct), 400, "invalid-json")
    assert_problem(web.post("/jobs/record", data=b"\xff\xfe", headers=json_ct), 400, "invalid-json")
    for query in ("delay=-1", "delay=abc", "delay=inf", "version=x", "version=0", "delay=1&run_at=5"):
        assert_problem(web.post(f"/jobs/record?{query}", json={}), 400, "invalid-parameter")
    assert_problem(web.get("/dead/fast?limit=0"), 400, "invalid-parameter")
    assert_problem(web.post("/jobs/record", json={}, headers={"Idempotency-Key": "k" * 600}),
                   400, "invalid-header")
    # 422: every validation error with its JSON path; an unknown version lists the known ones.
    body = assert_problem(web.post("/jobs/record", json={"n": "x", "fail_times": [1]}), 422, "invalid-payload")
    assert sorted(e["path"] for e in body["errors"]) == ["$.fail_times", "$.n"]
    assert all(e["message"] for e in body["errors"])
    body = assert_problem(web.post("/jobs/idem", json=[]), 422, "invalid-payload")
    assert body["errors"][0]["path"] == "$"
    assert assert_problem(web.post("/jobs/record?version=9", json={}), 422,
                          "unknown-version")["known_versions"] == [1]
    # Nothing refused above reached Redis.
    assert web.get("/queues").json()["queues"][0]["ready"] == 0


def test_numeric_query_parameters_are_read_strictly(web: Web) -> None:
    """A number in the query string is ASCII digits (a seconds value: one dot, an
    exponent): Python's int() and float() read "1_0" as 10, " 5" as 5 and a fullwidth
    or Arabic-Indic digit as a digit, so ?delay=1_0 delayed a job 10 s. Each is a 400
    naming the parameter, and nothing is enqueued."""
    for query in ("delay=1_0", "delay=%201", "delay=1%20", "delay=%EF%BC%91", "delay=+1", "delay=0x1",
                  "delay=1.", "delay=.", "delay=1e", "delay=1..0", "version=1_0", "version=%201",
                  "version=+1", "version=%D9%A1", "priority=0_1", "priority=-0"):
        body = assert_problem(web.post(f"/jobs/record?{query}", json={}), 400, "invalid-parameter")
        assert body["parameter"] == query.split("=")[0], (query, body)
    assert assert_problem(web.get("/dead/fast?limit=1_0"), 400, "invalid-parameter")["parameter"] == "limit"
    for query in ("delay=1.5", "delay=0.5e1", "delay=2E-1", "delay=.5", "delay=10", "version=1", "priority=9"):
        assert web.post(f"/jobs/record?{query}", json={}).status_code == 202, query
    assert web.get("/dead/fast?limit=10&offset=0").status_code == 200


def _head_only(web: Web, headers: str) -> bytes:
    """POST the head of a request to /jobs/record (with ``headers``) and never its body;
    what the server answers, read until the 413's problem type."""
    host, port = web.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(
            f"POST /jobs/record HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\n{headers}\r\n".encode()
        )
        raw = b""
        while b"payload-too-large" not in raw:
            chunk = s.recv(65536)
            assert chunk, raw
            raw += chunk
    return raw


def test_body_limit_is_checked_before_reading_and_while_reading(web: Web) -> None:
    """413 from Content-Length alone, before one byte of the body is sent; and a chunked
    body with no length is cut off once it passes api.max_body_bytes."""
    # The body is never sent: a server that waited for it would time this out.
    raw = _head_only(web, "Content-Length: 50000000\r\n")
    text = raw.decode("latin-1")
    assert text.startswith("HTTP/1.1 413"), text
    assert PROBLEM in text

    def chunks() -> Iterator[bytes]:
        yield b'{"n": 1, "pad": "'
        for _ in range(8):
            yield b"x" * 1024
        yield b'"}'

    r = web.post("/jobs/record", data=chunks(), headers={"Content-Type": "application/json"})
    assert assert_problem(r, 413, "payload-too-large")["max_body_bytes"] == 2048

    def small() -> Iterator[bytes]:
        yield b'{"n": '
        yield b"5}"

    assert web.post("/jobs/record", data=small(), headers={"Content-Type": "application/json"}).status_code == 202


def test_an_oversized_body_awaiting_100_continue_gets_its_413_instead(web: Web) -> None:
    """A client that announces a body over the limit and waits for ``100 Continue`` gets
    the 413 as the first and only answer: it is never invited to send the body."""
    raw = _head_only(web, "Content-Length: 4096\r\nExpect: 100-continue\r\n")
    assert raw.startswith(b"HTTP/1.1 413"), raw[:200]
    assert b"100 Continue" not in raw


def test_the_app_follows_a_swapped_registry(project: Project) -> None:
    """Hot reload swaps runtime.registry whole: the next request, /functions, the enqueue
    route and /openapi.json all see the new set of functions."""
    rt = project.runtime
    client = falcon.testing.TestClient(create_app(rt))
    assert client.simulate_post("/jobs/noop", json={}).status_code == 202
    assert "/jobs/noop" in client.simulate_get("/openapi.json").json["paths"]
    rt.registry = Registry.of(rt.registry.get("record"))
    assert [f["type"] for f in client.simulate_get("/functions").json["functions"]] == ["record"]
    assert client.simulate_post("/jobs/noop", json={}).status_code == 404
    paths = client.simulate_get("/openapi.json").json["paths"]
    assert "/jobs/noop" not in paths and "/jobs/record" in paths


def test_dead_letter_list_requeue_and_delete(project: Project, web: Web) -> None:
    """GET /dead/{queue} is newest first and paginated; an invalid edited payload gets a 422
    and the job stays dead; a valid one is requeued and runs; DELETE removes a dead job."""
    ids = [web.post("/jobs/perm", json={}).json()["id"] for _ in range(3)]
    flaky = web.post("/jobs/record", json={"n": 3, "fail_times": 99}).json()["id"]
    project.spawn_worker("fast")
    for i in [*ids, flaky]:
        job_when(web, i)
    page = web.get("/dead/fast?limit=2").json()
    assert page["total"] == 4 and page["limit"] == 2 and len(page["jobs"]) == 2
    rest = web.get("/dead/fast?limit=2&offset=2").json()["jobs"]
    listed = [j["id"] for j in page["jobs"] + rest]
    assert sorted(listed) == sorted([*ids, flaky])
    died = [j["finished_at"] for j in page["jobs"] + rest]
    assert died == sorted(died, reverse=True)
    rec = next(j for j in page["jobs"] + rest if j["id"] == flaky)
    assert rec["reason"] == "max attempts reached" and rec["attempt"] == 4
    assert rec["last_error"]["type"] == "RuntimeError" and rec["payload"]["fail_times"] == 99

    bad = web.post(f"/dead/fast/{flaky}/requeue", json={"payload": {"n": "three"}})
    assert assert_problem(bad, 422, "invalid-payload")["errors"][0]["path"] == "$.n"
    assert_problem(web.post(f"/dead/fast/{flaky}/requeue", json={"payload": {}, "version": 5}),
                   422, "unknown-version")
    assert_problem(web.post(f"/dead/fast/{flaky}/requeue", json={"paylod": {}}), 422, "invalid-payload")
    assert web.get(f"/jobs/{flaky}").json()["status"] == "dead"

    ok = web.post(f"/dead/fast/{flaky}/requeue", json={"payload": {"n": 3, "fail_times": 0}})
    assert ok.status_code == 200 and ok.json()["attempt"] in (0, 1)  # a worker may have it already
    done = job_when(web, flaky, ("done",))
    assert done["result"] == {"n": 3, "attempt": 1}
    assert_problem(web.post(f"/dead/fast/{flaky}/requeue"), 404, "job-not-found")

    plain = web.post(f"/dead/fast/{ids[0]}/requeue")  # no body: the stored payload as it is
    assert plain.status_code == 200
    job_when(web, ids[0], ("dead",))
    assert web.call("DELETE", f"/dead/fast/{ids[1]}").status_code == 204
    assert_problem(web.call("DELETE", f"/dead/fast/{ids[1]}"), 404, "job-not-found")
    assert_problem(web.get(f"/jobs/{ids[1]}"), 404, "job-not-found")


def test_openapi_document_is_valid_and_generated_from_the_functions(web: Web) -> None:
    """/openapi.json validates as OpenAPI 3.1 and has one enqueue operation per function,
    whose request body is that function's newest schema."""
    doc = web.get("/openapi.json").json()
    validate_openapi(doc)
    assert doc["openapi"].startswith("3.1")
    functions = [f["type"] for f in web.get("/functions").json()["functions"]]
    for name in functions:
        op = doc["paths"][f"/jobs/{name}"]["post"]
        assert op["operationId"] == f"enqueue_{name}"
        batch = doc["paths"][f"/jobs/{name}/batch"]["post"]["requestBody"]["content"]["application/json"]
        assert batch["schema"]["items"] == op["requestBody"]["content"]["application/json"]["schema"]
        ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        schema = doc["components"]["schemas"][ref.rsplit("/", 1)[-1]]
        newest = web.get(f"/functions/{name}").json()["schemas"][-1]["schema"]
        assert schema == newest
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert doc["paths"]["/healthz"]["get"]["security"] == []


def test_redis_unreachable_is_a_503_with_nothing_half_written(tmp_path: Path) -> None:
    """With Redis down, enqueue answers 503 (and /healthz says so) and writes nothing; once
    Redis is back the same web process serves again without a restart."""
    with Server(tmp_path / "redis") as own:
        project = make_project(tmp_path / "project", own)
        try:
            with gunicorn(project) as web:
                first = web.post("/jobs/record", json={"n": 1}).json()["id"]
                own.stop()
                r = web.post("/jobs/record", json={"n": 2})
                body = assert_problem(r, 503, "redis-unavailable")
                assert r.headers["Retry-After"] == "1"
                assert "not confirmed" in body["detail"] and "Idempotency-Key" in body["detail"]
                assert_problem(web.get("/healthz"), 503, "redis-unavailable")
                read = assert_problem(web.get("/queues"), 503, "redis-unavailable")
                # A read has no outcome to be unsure of, and no key to retry with.
                assert "Idempotency-Key" not in read["detail"] and "Retry shortly" in read["detail"]
                assert "runner_redis_up 0.0" in web.get("/metrics").text
                own.start()
                third = wait_for(lambda: web.post("/jobs/record", json={"n": 3}), timeout=10,
                                 what="enqueue to work again")
                assert third.status_code == 202
                ready = project.runtime.redis.lrange(project.keys("fast").ready, 0, -1)
                assert ready == [third.json()["id"], first]
        finally:
            if project._runtime is not None:
                project._runtime.close()


def test_the_enqueue_fast_lane_answers_as_the_route_does_and_never_writes_twice(project: Project) -> None:
    """A plain POST /jobs/{type} is answered by the fast lane (no falcon objects); the
    same request with a query parameter goes through the falcon route. Both give the same
    status, headers and body shape. A refusal found before the write (a bad payload, a
    wrong token) is the route's own answer; an error of the write itself (a key holding
    another payload) is rendered by the route without a second write."""
    rt = project.runtime
    lane = create_app(rt)
    inner, routed_to = lane.app, []

    async def counting(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            routed_to.append(scope["path"] + ("?" if scope.get("query_string") else ""))
        await inner(scope, receive, send)

    lane.app = counting
    client = falcon.testing.TestClient(lane)
    fast = client.simulate_post("/jobs/noop", json={})
    routed = client.simulate_post("/jobs/noop?version=1", json={})
    assert routed_to == ["/jobs/noop?"]  # the plain one never reached the route
    for r in (fast, routed):
        assert r.status_code == 202, r.text
        assert r.headers["location"] == f"/jobs/{r.json['id']}"
        assert r.headers["content-type"] == "application/json"
        assert r.headers["x-content-type-options"] == "nosniff"
    assert set(fast.json) == set(routed.json) and fast.json["status"] == "queued"
    assert {k.lower() for k in fast.headers} == {k.lower() for k in routed.headers}
    bad = client.simulate_post("/jobs/record", json={"n": "x"})
    assert bad.status_code == 422 and bad.headers["content-type"] == "application/problem+json"
    first = client.simulate_post("/jobs/idem", json={"k": "a", "v": 1})
    assert first.status_code == 202, first.text
    before = rt.redis.hgetall(rt.keys["fast"].census)
    clash = client.simulate_post("/jobs/idem", json={"k": "a", "v": 2})
    assert clash.status_code == 409 and clash.json["job_id"] == first.json["id"], clash.text
    assert rt.redis.hgetall(rt.keys["fast"].census) == before  # nothing written, once or twice
    same = client.simulate_post("/jobs/idem", json={"k": "a", "v": 1})
    assert same.status_code == 200 and same.json["duplicate"] and "location" not in same.headers
    assert routed_to == ["/jobs/noop?", "/jobs/record", "/jobs/idem"]  # the refusals; the clash


def test_the_fast_lane_leaves_a_request_with_two_authorization_headers_to_the_route(project: Project) -> None:
    """Falcon reads repeated Authorization headers joined by a comma, which is no token it
    knows: a 401. The fast lane must not judge the last one alone and enqueue."""
    project.write_config(extra='\n[api.tokens.good]\nenv = "GOOD_TOKEN"\nscopes = ["enqueue"]\n')
    import os

    os.environ["GOOD_TOKEN"] = "good-token-123"
    try:
        rt = project.runtime
        client = falcon.testing.TestClient(create_app(rt))
        ok = client.simulate_post("/jobs/noop", json={}, headers={"Authorization": "Bearer good-token-123"})
        assert ok.status_code == 202, ok.text
        before = rt.redis.llen(rt.keys["fast"].ready)
        both = client.simulate_request("POST", "/jobs/noop", body=b"{}", headers=[
            ("Content-Type", "application/json"), ("Authorization", "Bearer bad"),
            ("Authorization", "Bearer good-token-123")])
        assert both.status_code == 401, both.text
        assert rt.redis.llen(rt.keys["fast"].ready) == before
    finally:
        del os.environ["GOOD_TOKEN"]
