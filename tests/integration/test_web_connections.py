"""What the HTTP layer answers itself, and what a connection may hold of a process:
requests the parser refuses get a JSON problem; a connection that sends nothing, half a
head or half a body is closed after its timeout; and thousands of idle connections
cannot lock a real client out of a process limited to 1,024 open files."""

from __future__ import annotations

import concurrent.futures
import contextlib
import random
import resource
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest
import requests
from test_web_support import _NO_CONTROL, Web, gunicorn, served

from runner.store.embedded import Server, free_port

from conftest import Project, wait_for

TOKEN = "conn-t0ken"


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory, server: Server) -> Iterator[tuple[Project, Web]]:
    """One server (header_timeout = 1, idle_timeout = 1) for the tests of what a single
    connection gets: each opens its own connections and reads only their answers, and
    the log from its own start (``log_since``). A server each was most of such a test's
    time (its start, and its stop after the test)."""
    def setup(p: Project) -> None:
        p.write_config(extra="\n[api]\nheader_timeout = 1\nidle_timeout = 1\n")

    with served(tmp_path_factory, server, setup, token=TOKEN) as project_web:
        yield project_web


@pytest.fixture
def web(shared: tuple[Project, Web]) -> Web:
    return shared[1]


@pytest.fixture
def log_since(shared: tuple[Project, Web]) -> Callable[[], bytes]:
    """What the shared server logged since the test began."""
    logs = sorted(shared[0].root.glob("gunicorn-*.log"))
    start = {p: p.stat().st_size for p in logs}
    return lambda: b"".join(p.read_bytes()[start[p]:] for p in logs)


def _port(web: Web) -> int:
    return int(web.url.rsplit(":", 1)[1])


def _answer(port: int, raw: bytes, timeout: float = 10) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(raw)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


@pytest.mark.parametrize("raw", [
    b"GET /healthz\r\n\r\n",                                                     # no HTTP version
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: a\x01b\r\n\r\n",                  # a control character
    b"POST /jobs/record HTTP/1.1\r\nHost: x\r\nContent-Length: 1x\r\n\r\n",      # a bad Content-Length
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: a\r\n folded\r\n\r\n",            # a folded header
])
def test_requests_the_parser_refuses_get_a_json_400(web: Web, log_since: Callable[[], bytes], raw: bytes) -> None:
    out = _answer(_port(web), raw)
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), out[:300]
    assert b"content-type: application/problem+json" in head.lower(), out[:300]
    assert b'"status":400' in body
    assert web.get("/healthz").status_code == 200
    log = log_since()
    assert b"Traceback" not in log, log[-2000:]


def test_silent_and_half_sent_connections_are_closed_after_their_timeout(web: Web) -> None:
    """header_timeout = 1 and idle_timeout = 1: a connection that sends nothing is closed
    without a word, half a head gets a 408 problem, half a body is dropped; all within a
    few seconds, and the server serves on."""
    port = _port(web)
    half_head = b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
    half_body = (b"POST /jobs/record HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode()
                 + b"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"n\"")
    socks = []
    for raw in (b"", half_head, half_body):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        if raw:
            s.sendall(raw)
        socks.append(s)
    t0 = time.monotonic()
    answers = []
    for s in socks:
        out = b""
        with s:
            while chunk := s.recv(65536):
                out += chunk
        answers.append(out)
    assert time.monotonic() - t0 < 8
    assert answers[0] == b""
    assert answers[1].startswith(b"HTTP/1.1 408") and b"problem+json" in answers[1], answers[1][:300]
    assert b"202" not in answers[2][:20]
    assert web.get("/healthz").status_code == 200


def _limit_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))


@pytest.mark.parametrize("idle", [
    pytest.param(1200, id="bounded"),
    pytest.param(2000, id="full", marks=pytest.mark.slow),
])
def test_idle_connections_cannot_lock_out_a_real_client(project: Project, idle: int) -> None:
    """`runner web` (one worker process) limited to 1,024 open files: `idle` connections
    that send nothing or half a head are opened first, yet a real client's request is
    answered at once; the process keeps within its files."""
    port = free_port()
    env = {**project.env, "RUNNER_API_TOKEN": TOKEN, "PORT": str(port), "WEB_CONCURRENCY": "1",
           "GUNICORN_CMD_ARGS": " ".join(_NO_CONTROL)}
    log = open(project.root / "web.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"),
                             "web", "--host", "127.0.0.1"], cwd=project.root, env=env, stdout=log,
                            stderr=subprocess.STDOUT, preexec_fn=_limit_files)
    held: list[socket.socket] = []
    try:
        def up() -> bool:
            assert proc.poll() is None, (project.root / "web.log").read_text()[-2000:]
            try:
                return requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
            except requests.ConnectionError:
                return False

        wait_for(up, timeout=30, what="runner web to answer")
        for i in range(idle):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            if i % 2:
                with contextlib.suppress(OSError):  # not connected yet: it stays silent
                    s.send(b"GET /healthz HTTP/1.1\r\n")
            held.append(s)
        t0 = time.monotonic()
        r = requests.post(f"http://127.0.0.1:{port}/jobs/record", json={"n": 1},
                          headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
        assert r.status_code == 202, r.text
        assert time.monotonic() - t0 < 5
        assert proc.poll() is None
    finally:
        for s in held:
            s.close()
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _slow_body(port: int, sent: bytes = b'{"n"') -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"POST /jobs/record HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode()
              + b"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n" + sent)
    return s


def test_slow_bodies_time_out_and_give_way_to_a_real_client(project: Project) -> None:
    """body_timeout = 2: a body that trickles a byte at a time, never pausing long enough
    for idle_timeout, gets a 408 problem after 2 s. And at max_connections, connections
    still receiving a body are closed to make room (the slowest first) when none is idle,
    so a real client is served at once."""
    project.write_config(extra="\n[api]\nheader_timeout = 30\nidle_timeout = 30\nbody_timeout = 2\n"
                               "max_connections = 12\n")
    with gunicorn(project, token=TOKEN) as web:
        port = _port(web)
        trickle = _slow_body(port)
        t0 = time.monotonic()
        trickle.settimeout(0.3)
        out = b""
        while time.monotonic() - t0 < 8 and not out:
            with contextlib.suppress(OSError):
                trickle.sendall(b" ")
            with contextlib.suppress(TimeoutError):
                out = trickle.recv(65536)
        trickle.close()
        assert out.startswith(b"HTTP/1.1 408") and b"problem+json" in out, out[:300]
        assert 1.5 < time.monotonic() - t0 < 6
        held = [_slow_body(port) for _ in range(12)]
        try:
            t1 = time.monotonic()
            r = requests.post(web.url + "/jobs/record", json={"n": 1},
                              headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
            assert r.status_code == 202, r.text
            assert time.monotonic() - t1 < 1.5
        finally:
            for s in held:
                s.close()


def _waiting(port: int, raw: bytes) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(raw)
    return s


def _answered(s: socket.socket, within: float) -> bytes:
    """What the server sent within ``within`` seconds (b"": nothing yet, the request is held)."""
    s.settimeout(within)
    try:
        return s.recv(65536)
    except TimeoutError:
        return b""
    except ConnectionResetError:
        return b"reset"


def test_held_waits_cannot_lock_out_a_real_client(project: Project) -> None:
    """A ?wait= holds its connection for up to [api] max_wait: one token holds at most an
    eighth of max_connections in waits (the process half). Past it, POST ?wait= answers
    at once as without the wait (202, the job enqueued) and GET ?wait= is a 429 with
    Retry-After. So a producer sending more call-and-wait requests than the process has
    connections (of delayed jobs: none ends within the wait) leaves an operator's
    GET /queues and /healthz answered at once (before, every other connection was reset
    for the wait's 30 s)."""
    project.write_config(extra="\n[api]\nmax_connections = 40\nheader_timeout = 30\nidle_timeout = 30\n"
                               '[api.tokens.producer]\nenv = "PROD_T"\nscopes = ["enqueue:record"]\n'
                               '[api.tokens.reader]\nenv = "READER_T"\nscopes = ["read"]\n')
    with gunicorn(project, token=TOKEN, env={"PROD_T": "prod-secret", "READER_T": "reader-secret"}) as web:
        port = _port(web)
        post = (b"POST /jobs/record?delay=600&wait=30 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer prod-secret\r\n"
                b"Content-Type: application/json\r\nContent-Length: 8\r\n\r\n{\"n\": 1}")
        # In waves of 15, each answered connection closed: 45 opened at once would pass the
        # 40 connections before any answer came, and the server resets what it cannot take.
        held: list[socket.socket] = []
        answers: list[bytes] = []
        for _ in range(3):
            wave = [_waiting(port, post) for _ in range(15)]
            for sock in wave:
                got = _answered(sock, 0.5)
                answers.append(got)
                if got:
                    sock.close()
                else:
                    held.append(sock)
        try:
            at_once = [a for a in answers if a]
            assert len(at_once) == 45 - 5 and len(held) == 5, [a[:40] for a in answers]
            assert all(a.startswith(b"HTTP/1.1 202") for a in at_once), \
                [a[:60] for a in at_once if not a.startswith(b"HTTP/1.1 202")]
            job_id = at_once[0].partition(b"location: /jobs/")[2].split(b"\r")[0].decode()
            t0 = time.monotonic()
            assert web.get("/queues").status_code == 200
            assert web.get("/healthz", auth=False).status_code == 200
            assert time.monotonic() - t0 < 1.5
            get = (f"GET /jobs/{job_id}?wait=30 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer reader-secret\r\n"
                   "\r\n").encode()
            reads = [_waiting(port, get) for _ in range(5)]
            held += reads
            assert not any(_answered(s, 0.3) for s in reads)  # the reader's own share: held
            refused = web.get(f"/jobs/{job_id}?wait=30", headers={"Authorization": "Bearer reader-secret"})
            assert refused.status_code == 429 and int(refused.headers["Retry-After"]) > 0, refused.text
            assert "wait" in refused.json()["detail"]
            assert web.get(f"/jobs/{job_id}?wait=0.1").json()["status"] == "scheduled"  # another token waits
        finally:
            for s in held:
                s.close()
        assert web.get("/queues").status_code == 200


def _responses(s: socket.socket, n: int, within: float = 5.0) -> list[tuple[bytes, bytes]]:
    """Up to ``n`` whole responses (status line, body) read off ``s``, framed by their
    Content-Length; fewer when the server stops answering within ``within`` seconds."""
    s.settimeout(within)
    buf, got = b"", []
    while len(got) < n:
        head_end = buf.find(b"\r\n\r\n")
        if head_end >= 0:
            head = buf[:head_end]
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            end = head_end + 4 + length
            if len(buf) >= end:
                got.append((head.split(b"\r\n", 1)[0], buf[head_end + 4:end]))
                buf = buf[end:]
                continue
        try:
            chunk = s.recv(65536)
        except (TimeoutError, ConnectionResetError):
            break
        if not chunk:
            break
        buf += chunk
    return got


def test_pipelined_requests_are_all_answered_in_order(web: Web) -> None:
    """HTTP/1.1 requests sent back to back on one connection, before any answer (two and
    three in one write, one followed by the start of the next, its rest in a second
    write, and two behind a request asking to upgrade to h2c): each gets its answer, in
    the order sent, and the connection serves on."""
    port = _port(web)
    health = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    queues = f"GET /queues HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode()
    missing = f"GET /no-such-page HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode()
    post = (f"POST /jobs/record HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            "Content-Type: application/json\r\nContent-Length: 8\r\n\r\n{\"n\": 7}").encode()
    # An upgrade the server does not take is answered as HTTP/1.1 (the requests behind it
    # in the same read were dropped: never answered).
    h2c = (b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
           b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n")
    cases: list[tuple[str, list[bytes], list[bytes]]] = [
        ("two in one write", [health + queues], [b"200", b"200"]),
        ("three in one write", [queues + missing + health], [b"200", b"404", b"200"]),
        ("a body, then two", [post + missing + health], [b"202", b"404", b"200"]),
        ("one and the start of the next", [health + missing[:9], missing[9:]], [b"200", b"404"]),
        ("a head split mid-field", [queues + health[:20], health[20:] + missing], [b"200", b"200", b"404"]),
        ("two behind an upgrade to h2c", [h2c + missing + health], [b"200", b"404", b"200"]),
        ("40 in one write (more than are parsed ahead)", [(health + missing) * 20], [b"200", b"404"] * 20),
    ]
    for name, writes, expected in cases:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            for i, data in enumerate(writes):
                if i:
                    time.sleep(0.2)  # the first request's answer is on its way before the rest arrives
                s.sendall(data)
            got = _responses(s, len(expected))
            statuses = [line.split(b" ")[1] for line, _ in got]
            assert statuses == expected, (name, got)
            if expected[0] == b"200" and writes[0].startswith(b"GET /queues"):
                assert b"queues" in got[0][1], (name, got[0])
            # And the connection is still open for one more.
            s.sendall(health)
            again = _responses(s, 1)
            assert [line.split(b" ")[1] for line, _ in again] == [b"200"], (name, again)


def test_requests_sent_before_a_half_close_are_all_answered_in_order(web: Web) -> None:
    """A client that sends its requests and then shuts its side down (a FIN after the last
    one: `printf ... | nc -N`, a socket's shutdown(SHUT_WR)) still gets every answer, in
    order, and then the server closes; a request left half-sent at the FIN is dropped.
    Before, the FIN closed the connection at once: none of 1, 2 or 3 pipelined requests
    was answered."""
    port = _port(web)
    health = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    missing = f"GET /no-such-page HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode()
    post = (f"POST /jobs/record HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            "Content-Type: application/json\r\nContent-Length: 8\r\n\r\n{\"n\": 7}").encode()
    cases: list[tuple[str, bytes, list[bytes]]] = [
        ("one", health, [b"200"]),
        ("two", health + missing, [b"200", b"404"]),
        ("three", missing + post + health, [b"404", b"202", b"200"]),
        ("one and the start of the next", health + missing[:20], [b"200"]),
        ("40 (more than are parsed ahead)", (health + missing) * 20, [b"200", b"404"] * 20),
    ]
    for name, data, expected in cases:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            got = _responses(s, len(expected) + 1)  # one more than sent: none comes, the server closes
            assert [line.split(b" ")[1] for line, _ in got] == expected, (name, got)
            s.settimeout(5)
            assert s.recv(1) == b"", name  # closed after the last answer, not left to the keep-alive timer
    half_body = post[:-3]  # the FIN comes before the body is whole: nothing to answer
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(half_body)
        s.shutdown(socket.SHUT_WR)
        assert _responses(s, 1) == []
    assert web.get("/healthz").status_code == 200


def _held_request(delay_wait: float) -> bytes:
    """A request the app holds for ``delay_wait`` seconds: a ?wait= on a delayed job, answered 202."""
    return (f"POST /jobs/record?delay=600&wait={delay_wait:g} HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: 8\r\n\r\n"
            "{\"n\": 1}").encode()


def test_a_request_left_partial_behind_one_on_the_app_waits_for_its_answer(web: Web) -> None:
    """header_timeout = 1, idle_timeout = 1: a request held on the app for 3 s, followed on
    its connection by the first bytes of a second request and then nothing. Before, the
    second request's timeout ran while the first was answered: at 1 to 2 s the 408 went
    out (or, for a head sent whole and half a body, the connection was dropped) and the
    first request's answer was lost. Now the first answer comes whole, then the 408 for an
    unfinished head (its timeout counted from that answer), then the close; a body queued
    behind it is timed from when its request starts."""
    port = _port(web)
    head = (f"POST /jobs/record HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            "Content-Type: application/json\r\nContent-Length: 8\r\n\r\n").encode()

    def case(name: str, rest: bytes, expected: list[bytes]) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            t0 = time.monotonic()
            s.sendall(_held_request(3) + rest)
            got = _responses(s, 2, within=10)
            assert [line.split(b" ")[1] for line, _ in got] == expected, (name, got)
            assert b'"id"' in got[0][1], (name, got)
            assert time.monotonic() - t0 > 3.5, name  # the second's timeout started at the answer (3 s)
            if len(expected) > 1:
                assert b"request-timeout" in got[1][1], got
            s.settimeout(5)
            with contextlib.suppress(ConnectionResetError):
                assert s.recv(1) == b"", name

    # The two connections at once (each on its own timeline; a failure in either is raised).
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(case, *c) for c in (
            ("half a head", b"GET /healthz HTTP/1.1\r\nHo", [b"202", b"408"]),
            ("a head and half a body", head + b"{\"n\"", [b"202"]),
        )]
        for f in futures:
            f.result()
    assert web.get("/healthz").status_code == 200


def test_a_connection_with_a_request_on_the_app_is_not_closed_to_make_room(project: Project) -> None:
    """max_connections = 40: a connection whose request is on the app (held 3 s) and that
    has sent the first bytes of the next one was taken for one holding no request, and
    was the first closed when the 41st connection came: its answer was lost. Now a silent
    connection gives way instead, and the held request is answered."""
    project.write_config(extra="\n[api]\nmax_connections = 40\nheader_timeout = 30\nidle_timeout = 30\n")
    with gunicorn(project, token=TOKEN) as web:
        port = _port(web)
        held = _waiting(port, _held_request(3) + b"GET /healthz HTTP/1.1\r\nHo")
        assert _answered(held, 0.3) == b""
        silent = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(39)]
        try:
            assert web.get("/healthz", auth=False).status_code == 200  # the 41st (and 42nd) connection
            got = _responses(held, 1, within=10)
            assert [line.split(b" ")[1] for line, _ in got] == [b"202"], got
        finally:
            held.close()
            for s in silent:
                s.close()


def test_pipelined_requests_of_every_framing_cut_anywhere_are_all_answered(web: Web) -> None:
    """The server cuts what it reads where each request ends (a head at its blank line, a
    body after its Content-Length or its last chunk) to count each head against the cap:
    requests of each framing (no body, a Content-Length, chunks with an extension and a
    trailer field, a blank line between two requests), sent back to back and cut at
    random points into reads of their own, are each answered, in order, and the
    connection serves on."""
    port = _port(web)
    auth = f"Authorization: Bearer {TOKEN}\r\n".encode()
    health = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    post = (b"POST /jobs/record HTTP/1.1\r\nHost: x\r\n" + auth
            + b"Content-Type: application/json\r\nContent-Length: 10\r\n\r\n{\"n\":\r\n 1}")
    chunked = (b"POST /jobs/record HTTP/1.1\r\nHost: x\r\n" + auth + b"Content-Type: application/json\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n3;x=1\r\n{\"n\r\n6\r\n\":\r\n\r\n\r\n2\r\n2}\r\n0\r\nX-T: v\r\n\r\n")
    stream = health + post + b"\r\n" + chunked + health + chunked + post
    expected = [b"200", b"202", b"202", b"200", b"202", b"202"]
    rnd = random.Random(47)
    for _ in range(12):
        cuts = sorted(rnd.sample(range(1, len(stream)), 5))
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
                s.sendall(stream[start:end])
                time.sleep(0.01)  # a read of its own
            got = _responses(s, len(expected))
            assert [line.split(b" ")[1] for line, _ in got] == expected, (cuts, got)
            s.sendall(health)
            assert [line.split(b" ")[1] for line, _ in _responses(s, 1)] == [b"200"], cuts


def _server_sockets(port: int) -> int:
    """The sockets still open at the server's end of connections to ``port`` (Linux:
    /proc/net/tcp; those the server cut or closed are gone or closing)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                if int(local.rsplit(":", 1)[1], 16) == port and state == "01":  # established
                    count += 1
    return count


def _slow_reader(port: int, count: int = 300) -> socket.socket:
    """A connection that pipelines ``count`` cheap public requests (the dashboard's
    31 KB script, no token) and never reads an answer."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    s.settimeout(10)
    s.connect(("127.0.0.1", port))
    s.sendall(b"GET /static/app.js HTTP/1.1\r\nHost: x\r\n\r\n" * count)
    return s


def test_clients_that_never_read_cannot_lock_out_a_real_client(project: Project) -> None:
    """max_connections = 20, idle_timeout = 2: 30 connections each pipeline 300 requests
    for the dashboard's script (no token needed) and never read an answer. Before, each
    answer waited for a drain that never came, such a connection was never closed to make
    room (a request on the app) and nothing timed out a stalled write: 20 of them refused
    every real client for as long as they stayed open. Now a connection whose answers
    back up gives way to a new one, a write that makes no progress for idle_timeout is
    cut (the socket freed, not left to flush), and the requests read ahead of their
    answers are bounded."""
    project.write_config(extra="\n[api]\nmax_connections = 20\nheader_timeout = 30\nidle_timeout = 2\n")
    with gunicorn(project, token=TOKEN) as web:
        port = _port(web)
        readers = []
        try:
            for _ in range(30):
                with contextlib.suppress(OSError):
                    readers.append(_slow_reader(port))
                time.sleep(0.05)
            time.sleep(1)  # each has its answers backed up
            for _ in range(5):
                with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    got = _responses(s, 1, within=10)
                assert [line.split(b" ")[1] for line, _ in got] == [b"200"], got
            # And each stalled connection is cut within a few seconds of its timeout (not left to flush).
            wait_for(lambda: _server_sockets(port) == 0, timeout=20, interval=0.5,
                     what="the stalled connections to be cut")
        finally:
            for s in readers:
                s.close()
        assert web.get("/healthz").status_code == 200


def test_a_bad_body_or_a_fin_behind_answered_requests_comes_after_their_answers(web: Web) -> None:
    """A request queued behind others whose body is cut short by a FIN, or whose chunks
    are malformed: before, the FIN closed at once and the 400 went out at once, and the
    answers to the whole requests before it were lost (an enqueue was written, its 202
    never sent: a client retrying without an idempotency key enqueued twice). Now those
    answers go out first, in order; then the 400 (for bad chunks) and the close."""
    port = _port(web)
    health = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    post = (f"POST /jobs/record HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            "Content-Type: application/json\r\nContent-Length: 8\r\n\r\n{\"n\": 7}").encode()
    chunked = (f"POST /jobs/record HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
               "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n").encode()
    cases: list[tuple[str, bytes, bool, list[bytes]]] = [
        ("a bad chunk size behind a GET", health + chunked + b"ZZ\r\nhello\r\n0\r\n\r\n", False, [b"200", b"400"]),
        ("chunk data without its CRLF", health + chunked + b"5\r\nhelloXX0\r\n\r\n", False, [b"200", b"400"]),
        ("a bad chunk size behind an enqueue", post + chunked + b"ZZ\r\n", False, [b"202", b"400"]),
        ("a FIN in a body behind a GET", health + post[:-3], True, [b"200"]),
        ("a FIN in chunks behind two", health + post + chunked + b"8\r\n{\"n\"", True, [b"200", b"202"]),
    ]
    for name, data, fin, expected in cases:
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(data)
                if fin:
                    s.shutdown(socket.SHUT_WR)
                got = _responses(s, len(expected) + 1)
                assert [line.split(b" ")[1] for line, _ in got] == expected, (name, got)
                s.settimeout(5)
                with contextlib.suppress(ConnectionResetError):
                    assert s.recv(1) == b"", name  # and then the close
    assert web.get("/healthz").status_code == 200


def test_a_client_gone_mid_answer_leaves_no_traceback(web: Web, log_since: Callable[[], bytes]) -> None:
    """Clients that pipeline requests (no token needed) and reset the connection at once:
    each answer still being made was written to the closed connection, and the log got an
    ERROR "Exception in ASGI application" traceback for each. Now such an answer is
    dropped quietly and the server serves on."""
    port = _port(web)
    data = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * 3 + b"GET /static/app.js HTTP/1.1\r\nHost: x\r\n\r\n" * 3
    for _ in range(40):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(data)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # a reset, not a FIN
        s.close()
    time.sleep(1)  # the answers under way are made (and dropped)
    assert web.get("/healthz").status_code == 200
    log = log_since()
    assert b"Traceback" not in log and b"ERROR" not in log, log[-3000:]
