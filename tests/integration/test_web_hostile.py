"""Hostile HTTP input through a real gunicorn: every malformed request gets a clear 4xx
problem body, nothing is written to Redis, and the server keeps serving."""

from __future__ import annotations

import contextlib
import re
import socket
import time
from collections.abc import Iterator

import pytest
import requests
from test_web_support import Web, gunicorn, served

from runner.store import records
from runner.store.embedded import Server

from conftest import SCAN_COUNT, Project

TOKEN = "hostile-t0ken"


CONFIG = "\n[api]\nmax_body_bytes = 65536\n"


@pytest.fixture
def web(project: Project) -> Iterator[Web]:
    project.write_config(extra=CONFIG)
    with gunicorn(project, token=TOKEN) as w:
        yield w


@pytest.fixture(scope="module")
def _shared(tmp_path_factory: pytest.TempPathFactory, server: Server) -> Iterator[tuple[Project, Web]]:
    """One project and one server for the requests that are refused and write nothing."""
    with served(tmp_path_factory, server, lambda p: p.write_config(extra=CONFIG), token=TOKEN) as served_web:
        yield served_web


@pytest.fixture
def refused(_shared: tuple[Project, Web]) -> Iterator[tuple[Project, Web]]:
    """The shared project and server; a job a test let through is removed after it (that
    test fails on it), so the next test starts from nothing written."""
    project, _ = _shared
    yield _shared
    r = project.runtime.redis
    for key in list(r.scan_iter(count=SCAN_COUNT, match=f"{project.prefix}:*job:*")):
        r.delete(key)


def post_raw(web: Web, body: bytes, content_type: str = "application/json", path: str = "/jobs/record",
             headers: dict[str, str] | None = None) -> requests.Response:
    h = {"Content-Type": content_type, **(headers or {})}
    return web.post(path, data=body, headers=h)


def nothing_written(project: Project) -> bool:
    return not list(project.runtime.redis.scan_iter(count=SCAN_COUNT, match=f"{project.prefix}:*job:*"))


@pytest.mark.parametrize("body,needle", [
    (b"[" * 5000 + b"]" * 5000, "depth"),                         # deep nesting
    (b'{"n": "\xff\xfe"}', "UTF-8"),                               # not UTF-8
    (b'{"n": "\\ud800"}', "surrogate"),                             # lone surrogate
    (b'{"n": 1e400}', "infinity"),                                  # giant float
    (b'{"n": 123456789012345678901234567890}', "64 bits"),          # giant integer
    (b'{"n": NaN}', "unexpected character"),
    (b'{"n": 1,}', "JSON"),
    (b"", "empty"),
    (b"\x00\x01\x02", "JSON"),
])
def test_malformed_json_is_a_400_and_writes_nothing(refused: tuple[Project, Web], body: bytes, needle: str) -> None:
    project, web = refused
    r = post_raw(web, body)
    assert r.status_code == 400, r.text
    assert r.headers["Content-Type"] == "application/problem+json"
    assert needle in r.json()["detail"]
    assert nothing_written(project)


@pytest.mark.parametrize("content_type", [
    "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/xml",
])
def test_wrong_content_type_is_a_415(refused: tuple[Project, Web], content_type: str) -> None:
    project, web = refused
    r = post_raw(web, b'{"n": 1}', content_type)
    assert r.status_code == 415
    assert nothing_written(project)


def test_valid_json_of_the_wrong_shape_is_a_422(refused: tuple[Project, Web]) -> None:
    project, web = refused
    for body in (b"null", b"[1, 2]", b'"text"', b'{"n": 1.5}', b'{"n": 18446744073709551615000}'):
        r = post_raw(web, body)
        assert r.status_code in (400, 422), (body, r.text)
    assert nothing_written(project)


def test_duplicate_keys_keep_the_last_value_and_store_one(project: Project, web: Web) -> None:
    r = post_raw(web, b'{"n": 1, "n": 2}')
    assert r.status_code == 202
    stored = web.get(f"/jobs/{r.json()['id']}").json()
    assert stored["payload"] == {"n": 2}
    stored_rec = records.parse(project.runtime.redis.get(project.keys().job(r.json()["id"])))
    assert stored_rec is not None and stored_rec["payload"] == '{"n":2}'


@pytest.mark.parametrize("query", ["delay=abc&delay=", "delay=60&delay=0", "version=1&version=9",
                                   "run_at=1&run_at=2", "delay=&delay=&run_at=90588647157"])
def test_a_query_parameter_given_twice_is_refused(refused: tuple[Project, Web], query: str) -> None:
    """``?delay=abc&delay=`` used to pass as no delay at all (one of the two was read, the
    other ignored): a job the caller meant to delay would run at once. A repeated
    parameter is a 400 naming it, on one job and on a batch, and nothing is written."""
    project, web = refused
    name = query.split("=", 1)[0]
    for path, body in ((f"/jobs/record?{query}", b'{"n": 1}'), (f"/jobs/record/batch?{query}", b'[{"n": 1}]')):
        r = post_raw(web, body, path=path)
        assert r.status_code == 400, (path, r.status_code, r.text)
        assert r.json()["parameter"] == name and "once" in r.json()["detail"], r.text
    assert nothing_written(project)


@pytest.mark.parametrize("query", ["delay=", "run_at=", "version=", "delay=&run_at=90588647157"])
def test_an_empty_number_parameter_is_refused(refused: tuple[Project, Web], query: str) -> None:
    """``?delay=`` names no number: it was read as no delay at all, beside a run_at too,
    though the API document calls it a number. A 400 naming it, and nothing is written."""
    project, web = refused
    name = query.split("=", 1)[0]
    for path, body in ((f"/jobs/record?{query}", b'{"n": 1}'), (f"/jobs/record/batch?{query}", b'[{"n": 1}]')):
        r = post_raw(web, body, path=path)
        assert r.status_code == 400, (path, r.status_code, r.text)
        assert r.json()["parameter"] == name, r.text
    assert web.get("/jobs?limit=").status_code == 400
    assert nothing_written(project)


def test_oversized_idempotency_key_is_refused(refused: tuple[Project, Web]) -> None:
    project, web = refused
    r = post_raw(web, b'{"n": 1}', headers={"Idempotency-Key": "k" * 5000})
    assert r.status_code == 400
    assert r.headers["Content-Type"] == "application/problem+json"
    assert "Idempotency-Key" in r.json()["detail"]
    assert nothing_written(project)


def test_header_injection_is_refused_by_the_server(project: Project, web: Web) -> None:
    """A CR/LF smuggled into a header never reaches the app as a second header."""
    host, port = web.url.split("//")[1].split(":")
    body = b'{"n": 1}'
    req = (
        f"POST /jobs/record HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
        "Content-Type: application/json\r\nIdempotency-Key: a\rX-Evil: 1\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(req)
        reply = s.recv(4096)
    assert reply.startswith(b"HTTP/1.1 400"), reply[:200]
    assert nothing_written(project)


def test_unknown_paths_and_types_are_404_problems(web: Web) -> None:
    for path in ("/jobs/..%2f..%2fetc%2fpasswd", "/jobs/__init__", "/jobs/record/extra", "/nope"):
        r = web.post(path, json={"n": 1})
        assert r.status_code in (404, 405), (path, r.status_code)
        assert r.headers["Content-Type"] == "application/problem+json"


def test_wrong_tokens_are_401_and_the_server_keeps_serving(project: Project, web: Web) -> None:
    for header in ("Bearer wrong", "Bearer " + TOKEN + "x", "Basic " + TOKEN, TOKEN, "Bearer", ""):
        r = web.post("/jobs/record", json={"n": 1}, auth=False, headers={"Authorization": header})
        assert r.status_code == 401, header
    assert nothing_written(project)
    assert web.post("/jobs/record", json={"n": 1}).status_code == 202


def _head(web: Web, head: bytes) -> bytes:
    """Send a raw request head (and no body); what the server answers before it closes."""
    host, port = web.url.split("//")[1].split(":")
    out = b""
    with socket.create_connection((host, int(port)), timeout=5) as s:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(head)  # refused mid-send: the answer, if any, is still to be read
        try:
            while chunk := s.recv(65536):
                out += chunk
                if b"\r\n\r\n" in out and b"connection: close" not in out.lower():
                    break
        except (ConnectionResetError, TimeoutError):
            pass
    return out


def test_oversized_request_heads_get_a_431_and_nothing_is_held(project: Project, web: Web) -> None:
    """Too many header fields, or a head past 64 KiB (here a single 8 MB header, sent in
    one go), get a 431 problem; a head just under the cap is served."""
    start = f"GET /queues HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n".encode()
    many = _head(web, start + b"".join(b"X-%d: 1\r\n" % i for i in range(150)) + b"\r\n")
    assert many.startswith(b"HTTP/1.1 431"), many[:200]
    assert b"urn:runner:problem:headers-too-large" in many
    huge = _head(web, start + b"X-Big: " + b"a" * 8_000_000 + b"\r\n\r\n")
    assert huge == b"" or huge.startswith(b"HTTP/1.1 431"), huge[:200]
    fine = _head(web, start + b"X-Big: " + b"a" * 60_000 + b"\r\n\r\n")
    assert fine.startswith(b"HTTP/1.1 200"), fine[:200]
    assert web.get("/healthz").status_code == 200


def test_a_head_past_the_cap_is_refused_however_it_arrives(web: Web) -> None:
    """The first chunk a connection read was never counted against the 64 KiB cap: a head
    of 70 KB got a 200, sent in one write or in 16 KiB writes, and so did 130 KB in one
    write. Each gets a 431 now; a head under the cap is served, however it is split."""
    host, port = web.url.split("//")[1].split(":")
    start = f"GET /queues HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n".encode()

    def head(pad: int) -> bytes:
        return start + b"X-Pad: " + b"a" * pad + b"\r\n\r\n"

    def status(data: bytes, piece: int) -> bytes:
        with socket.create_connection((host, int(port)), timeout=5) as s:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                for i in range(0, len(data), piece):
                    s.sendall(data[i:i + piece])
            out = b""
            with contextlib.suppress(ConnectionResetError, TimeoutError):
                while b"\r\n" not in out and (chunk := s.recv(4096)):
                    out += chunk
        return out.split(b"\r\n", 1)[0]

    for pad, piece in ((70_000, 1 << 30), (70_000, 16_384), (130_000, 1 << 30)):
        assert status(head(pad), piece).startswith(b"HTTP/1.1 431"), (pad, piece)
    assert status(head(60_000), 1 << 30).startswith(b"HTTP/1.1 200")
    assert status(head(60_000), 16_384).startswith(b"HTTP/1.1 200")


def test_the_head_cap_holds_for_every_head_of_a_connection(web: Web) -> None:
    """A pipelined head that began inside a read, behind an earlier request, was counted
    only by what the parser handed over: the blanks before a header's value were left out,
    so a head of 64 KiB and 200 KB of such blanks, in the same write as a small GET, was
    served. So was a head that ended in the read after the one it began in. Now every head
    of a connection is held to the cap, whoever sent what before it and however its bytes
    are split: the requests before it are answered, in order, and then it gets the 431.
    Heads under the cap are served in each of the same arrangements."""
    host, port = web.url.split("//")[1].split(":")
    auth = f"Authorization: Bearer {TOKEN}\r\n".encode()
    small = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    post = (b"POST /jobs/no-such-type HTTP/1.1\r\nHost: x\r\n" + auth
            + b"Content-Type: application/json\r\nContent-Length: 8\r\n\r\n{\"n\": 1}")
    chunked = (b"POST /jobs/no-such-type HTTP/1.1\r\nHost: x\r\n" + auth + b"Content-Type: application/json\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n4\r\n{\"n\"\r\n4\r\n: 1}\r\n0\r\n\r\n")

    def padded(blanks: int, fill: int) -> bytes:
        """A head of ``fill`` bytes of field values plus ``blanks`` blanks before one of them."""
        return (b"GET /queues HTTP/1.1\r\nHost: x\r\n" + auth + b"X-Blank:" + b" " * blanks + b"v\r\n"
                + b"".join(b"X-F%d: %s\r\n" % (i, b"a" * 4000) for i in range(fill // 4000)) + b"\r\n")

    def statuses(writes: list[bytes], count: int) -> list[bytes]:
        """The statuses of the answers to ``writes`` (each its own read: a pause between
        them), in order, framed by their Content-Length."""
        out, got = b"", []
        with socket.create_connection((host, int(port)), timeout=10) as s:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                for i, data in enumerate(writes):
                    if i:
                        time.sleep(0.05)
                    s.sendall(data)
            while len(got) < count:
                head, blank, rest = out.partition(b"\r\n\r\n")
                length = int(head.lower().partition(b"content-length:")[2].split(b"\r")[0] or 0)
                if blank and len(rest) >= length:
                    got.append(head.split(b" ", 2)[1])
                    out = rest[length:]
                    continue
                try:
                    chunk = s.recv(65536)
                except (ConnectionResetError, TimeoutError):
                    break
                if not chunk:
                    break
                out += chunk
        return got

    heads = [(padded(200_000, 64_000), b"431"), (padded(150_000, 64_000), b"431"), (padded(20_000, 40_000), b"200")]
    assert len(heads[1][0]) > 210_000 and len(heads[2][0]) < 64_000
    for head, expected in heads:
        blanks_at = head.index(b"X-Blank:") + 1000
        # (what is sent before the head, their statuses, where the writes are cut)
        for name, before, answers, cut in (
            ("behind a GET, in one write", small, [b"200"], None),
            ("behind a body, in one write", post, [b"404"], None),
            ("behind a chunked body, in one write", chunked, [b"404"], None),
            ("behind a GET, its end in a later read", small, [b"200"], len(small) + blanks_at),
            ("behind two, its end in a later read", small + post, [b"200", b"404"], len(small + post) + blanks_at),
            ("alone, its end in a later read", b"", [], blanks_at),
        ):
            data = before + head
            writes = [data] if cut is None else [data[:cut], data[cut:]]
            got = statuses(writes, len(answers) + 1)
            assert got == [*answers, expected], (name, len(head), got)
        pieces = [head[i:i + 1000] for i in range(0, 20_000, 1000)] + [head[20_000:]]
        assert statuses(pieces, 1) == [expected], ("in small writes", len(head))
    assert web.get("/healthz").status_code == 200


def test_a_chunked_bodys_trailer_fields_are_held_to_the_head_cap(web: Web) -> None:
    """The trailer fields after a chunked body's last chunk had no cap: the parser gathers
    a field whole by copying (quadratic), and one endless trailer field held the process
    for seconds (its other connections' /healthz waited 11 s; the worker was killed for a
    missed heartbeat). They now count against the 64 KiB head cap: a 431 problem and the
    close; trailers under the cap are served, and the request before a refused one on the
    connection still gets its answer."""
    host, port = web.url.split("//")[1].split(":")
    chunked = (b"POST /jobs/record HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode()
               + b"\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n8\r\n{\"n\": 1}\r\n0\r\n")
    small = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"

    def statuses(data: bytes) -> list[bytes]:
        with socket.create_connection((host, int(port)), timeout=10) as s:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                for i in range(0, len(data), 65536):
                    s.sendall(data[i:i + 65536])
            out = b""
            with contextlib.suppress(ConnectionResetError, TimeoutError):
                while chunk := s.recv(65536):
                    out += chunk
                    if out.count(b"HTTP/1.1 ") >= 2:
                        break
        return re.findall(rb"HTTP/1\.1 (\d{3}) ", out)

    endless = chunked + b"X-Trailer: " + b"a" * 400_000
    assert statuses(endless) == [b"431"]
    assert statuses(small + endless) == [b"200", b"431"]
    assert statuses(chunked + b"X-T: " + b"a" * 70_000 + b"\r\n\r\n") == [b"431"]
    assert statuses(chunked + b"X-T: " + b"a" * 30_000 + b"\r\n\r\n" + small) == [b"202", b"200"]
    assert web.get("/healthz").status_code == 200
