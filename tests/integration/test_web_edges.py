"""The HTTP API's edges that a review found answered wrongly: a path segment echoed into a
403's challenge, a forged list cursor, a compressed request body, paging the dead letters
while an operator requeues, and an unknown queue in the job list. Every test runs a real
`runner web` (gunicorn + uvicorn worker) on a real Redis."""

from __future__ import annotations

import base64
import gzip
import json
import os
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import requests
from test_access import ENV, SECRETS, TOKENS, dead_jobs
from test_web_support import RunnerWeb, runner_web

from conftest import Project


@contextmanager
def serving(project: Project, name: str) -> Iterator[RunnerWeb]:
    project.write_config(extra=TOKENS)
    with runner_web(project, name, workers=1, env=ENV) as web:
        yield web


def call(web: RunnerWeb, who: str, method: str, path: str, **kw: object) -> requests.Response:
    return requests.request(method, web.url + path, headers={"Authorization": f"Bearer {SECRETS[who]}",
                            **kw.pop("headers", {})}, timeout=10, **kw)  # type: ignore[arg-type]


def raw_request(web: RunnerWeb, request: bytes) -> bytes:
    """Send one raw HTTP/1.1 request and read the answer until the server closes or 5 s pass."""
    with socket.create_connection(("127.0.0.1", web.port), timeout=5) as s:
        s.sendall(request)
        data = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
                if b"\r\n\r\n" in data:
                    head, _, body = data.partition(b"\r\n\r\n")
                    length = [int(ln.split(b":", 1)[1]) for ln in head.split(b"\r\n")
                              if ln.lower().startswith(b"content-length:")]
                    if length and len(body) >= length[0]:
                        break
        except TimeoutError:
            pass
        return data


def queued_ids(project: Project) -> list[str]:
    r = project.runtime.redis
    k = project.keys("fast")
    return list(r.lrange(k.ready, 0, -1)) + list(r.zrange(k.prio, 0, -1))


# --- 1. the 403 of a scoped producer puts the raw path into a response header --------------


def test_a_scoped_producer_posting_to_a_path_with_control_characters_gets_a_problem_not_a_dropped_connection(
        project: Project) -> None:
    """A token scoped to enqueue:record that posts to /jobs/<type with a CR/LF or NUL>
    (a buggy client building the URL from user input) must get a 4xx problem like any other
    wrong type. The 403 interpolates the path segment into its WWW-Authenticate header;
    uvicorn refuses the header value, and the client gets no answer at all."""
    with serving(project, "ctl-path") as web:
        body = b'{"n": 1}'
        for path in (b"/jobs/record%00", b"/jobs/x%0d%0aSet-Cookie:%20a=b"):
            answer = raw_request(web, b"POST " + path + b" HTTP/1.1\r\nHost: x\r\n"
                                 b"Authorization: Bearer producer-secret\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            assert answer.startswith(b"HTTP/1.1 4"), (path, answer[:300])
    assert queued_ids(project) == []


def test_the_403_scope_in_www_authenticate_is_a_proper_quoted_string(project: Project) -> None:
    """A double quote in the path segment ends up unescaped in the WWW-Authenticate
    header's quoted scope, so the caller can inject auth-params into the challenge
    (RFC 9110 quoted-string requires the quote be escaped)."""
    with serving(project, "quote-path") as web:
        r = call(web, "producer", "POST", '/jobs/x%22,%20error=%22forged', json={"n": 1})
        assert r.status_code == 403
        challenge = r.headers["WWW-Authenticate"]
        assert challenge.count("error=") == 1, challenge


# --- 2. a forged or stale cursor is a 500 -------------------------------------------------


def _cursor(obj: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")


def test_a_malformed_cursor_is_a_400_never_a_500(project: Project) -> None:
    """GET /jobs?cursor= with a cursor the server did not make must be a 400 problem
    naming the parameter (as "garbage" already is); a cursor whose numbers are out of
    range is a 500 internal error instead (Redis 'value is not an integer or out of
    range', and an IndexError for a negative index)."""
    project.client.enqueue("record", {"n": 1})
    with serving(project, "cursor") as web:
        assert call(web, "support", "GET", "/jobs?cursor=garbage").status_code == 400
        for status, cursor in (("queued", _cursor([0, 2**63, None])), ("queued", _cursor([0, 0, -5])),
                               ("dead", _cursor([0, 2**63, None]))):
            r = call(web, "support", "GET", "/jobs", params={"status": status, "cursor": cursor})
            assert r.status_code == 400, (status, cursor, r.status_code, r.text[:200])
            assert r.json()["parameter"] == "cursor"


# --- 3. Content-Encoding is ignored -------------------------------------------------------


def test_a_compressed_body_is_refused_for_its_content_encoding(project: Project) -> None:
    """The API does not decode request bodies, so a body with Content-Encoding must be a
    415 problem saying so (RFC 9110 15.5.16), and nothing enqueued. Instead a gzip body
    is a 400 'not valid UTF-8' (no hint at the encoding), and a body labelled br that
    happens to parse as JSON is enqueued as if the header were not there."""
    with serving(project, "encoding") as web:
        gz = call(web, "producer", "POST", "/jobs/record", data=gzip.compress(b'{"n": 1}'),
                  headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
        br = call(web, "producer", "POST", "/jobs/record", data=b'{"n": 2}',
                  headers={"Content-Type": "application/json", "Content-Encoding": "br"})
        assert queued_ids(project) == [], (br.status_code, br.text)
        for r in (gz, br):
            assert r.status_code == 415, (r.status_code, r.text[:200])
            assert "encoding" in r.json()["detail"].lower()


# --- 4. paging the dead list skips a job that never moved ---------------------------------


def test_paging_dead_jobs_never_skips_a_job_that_stayed_dead(project: Project) -> None:
    """An operator pages through GET /jobs?status=dead and requeues a job from page 1
    before asking for page 2 (what the dashboard's per-job Requeue button then Next does).
    Every job that stayed dead the whole time must appear on a page; the positional
    cursor shifts by the job removed and the first job of page 2 is never shown."""
    ids = dead_jobs(project, 5)
    with serving(project, "dead-pages") as web:
        everything = [j["id"] for j in call(web, "ops", "GET", "/jobs?status=dead&limit=500").json()["jobs"]]
        assert sorted(everything) == sorted(ids)
        first = call(web, "ops", "GET", "/jobs?status=dead&limit=2").json()
        shown = [j["id"] for j in first["jobs"]]
        assert call(web, "ops", "POST", f"/dead/fast/{shown[0]}/requeue").status_code == 200
        cursor = first["cursor"]
        while cursor:
            page = call(web, "ops", "GET", "/jobs", params={"status": "dead", "limit": 2, "cursor": cursor}).json()
            shown += [j["id"] for j in page["jobs"]]
            cursor = page["cursor"]
        stayed_dead = everything[1:]
        missing = [i for i in stayed_dead if i not in shown]
        assert missing == [], f"never listed though dead throughout: {missing}"


# --- 5. an unknown queue in the job list is a generic "not-found" ------------------------


def test_an_unknown_queue_filter_is_the_same_problem_as_everywhere_else(project: Project) -> None:
    """GET /dead/nope and POST /queues/nope/pause answer the problem type
    urn:runner:problem:unknown-queue with a "queue" member (as problems.py documents for
    404s); GET /jobs?queue=nope answers urn:runner:problem:not-found -- the type an unknown
    *path* gets -- with no "queue" member, so a client cannot tell "no such queue" from
    "no such route" by the stable type."""
    with serving(project, "unknown-queue") as web:
        dead = call(web, "ops", "GET", "/dead/nope").json()
        assert dead["type"] == "urn:runner:problem:unknown-queue" and dead["queue"] == "nope"
        listed = call(web, "ops", "GET", "/jobs?queue=nope")
        assert listed.json()["type"] == dead["type"], listed.text
        assert listed.json().get("queue") == "nope", listed.text


# --- 6. a secret mounted from a file ends in a newline -----------------------------------


def test_a_token_secret_with_a_trailing_newline_still_works(project: Project) -> None:
    """A secret put in the environment from a file (a mounted secret, `$(cat token)` kept
    with its newline) ends in a newline that no Authorization header can carry: the
    token is taken without the whitespace around it, as the caller presents it."""
    project.write_config(extra=TOKENS)
    env = {**ENV, "RUNNER_TOKEN_PRODUCER": SECRETS["producer"] + "\n", "RUNNER_TOKEN_OPS": f" {SECRETS['ops']}\r\n"}
    with runner_web(project, "newline", workers=1, env=env) as web:
        assert call(web, "producer", "POST", "/jobs/record", json={"n": 1}).status_code == 202
        assert call(web, "ops", "GET", "/queues").status_code == 200


def test_a_compressed_body_sent_whole_before_reading_gets_its_415(project: Project) -> None:
    """A client that sends a large compressed body whole before it reads (urllib) gets
    the 415 problem, not a connection reset, and the server serves on."""
    with serving(project, "encoding-whole") as web:
        body = gzip.compress(os.urandom(3_000_000))  # random: stays about 3 MB
        req = urllib.request.Request(web.url + "/jobs/record", data=body, method="POST", headers={
            "Content-Type": "application/json", "Content-Encoding": "gzip",
            "Authorization": f"Bearer {SECRETS['producer']}"})
        try:
            urllib.request.urlopen(req, timeout=30)
            raise AssertionError("a compressed body was accepted")
        except urllib.error.HTTPError as exc:
            assert exc.code == 415 and "encoding" in json.loads(exc.read())["detail"].lower()
        assert call(web, "producer", "POST", "/jobs/record", json={"n": 1}).status_code == 202
    assert len(queued_ids(project)) == 1
