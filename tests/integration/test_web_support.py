"""A real gunicorn (with runner's uvicorn worker) serving ``runner.web.asgi:app`` for a test project, shared by the web,
metrics and dashboard tests; plus the smoke test that the command line works as the
Procfile uses it (cwd = the project, configuration from the environment)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gunicorn.config
import pytest
import requests

from runner.store.embedded import Server, free_port

from conftest import Project, make_project, wait_for


@dataclass
class Web:
    """A running gunicorn; ``call`` sends the bearer token when one is set."""

    url: str
    proc: subprocess.Popen[bytes]
    token: str | None
    session: requests.Session

    last: float = 0.0  # when the session's connection was last used

    def call(self, method: str, path: str, *, auth: bool = True, **kw: Any) -> requests.Response:
        headers = dict(kw.pop("headers", None) or {})
        if auth and self.token and "Authorization" not in headers:
            headers["Authorization"] = f"Bearer {self.token}"
        # The server closes a connection idle for its keep-alive (5 s): one idle nearly that
        # long is dropped here first, or a request sent as the server closes it fails
        # (RemoteDisconnected), and a POST is not sent again.
        if time.monotonic() - self.last > 4.0:
            self.session.close()
        try:
            return self.session.request(method, self.url + path, headers=headers, timeout=10, **kw)
        finally:
            self.last = time.monotonic()

    def get(self, path: str, **kw: Any) -> requests.Response:
        return self.call("GET", path, **kw)

    def post(self, path: str, **kw: Any) -> requests.Response:
        return self.call("POST", path, **kw)


# Newer gunicorn opens a control socket at one fixed path per user; parallel test servers
# would fight over it.
_NO_CONTROL = (["--no-control-socket"]
               if any(s.name == "control_socket_disable" for s in gunicorn.config.KNOWN_SETTINGS) else [])


def _interrupt(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGINT: gunicorn's quick shutdown (the tests hold no request open); killed if it lingers."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def open_api(project: Project) -> None:
    """``[api] auth = false`` in the project's runner.toml, unless it names tokens: the
    app refuses to serve without a token unless auth is switched off explicitly."""
    path = project.root / "runner.toml"
    text = path.read_text()
    if "[api.tokens." in text or re.search(r"^auth\s*=", text, re.M):
        return
    if re.search(r"^\[api\]\s*$", text, re.M):
        text = re.sub(r"^\[api\]\s*$", "[api]\nauth = false", text, count=1, flags=re.M)
    else:
        text += "\n[api]\nauth = false\n"
    path.write_text(text)


@contextmanager
def gunicorn(project: Project, token: str | None = None, env: dict[str, str] | None = None) -> Iterator[Web]:
    if not token and "RUNNER_API_TOKEN" not in (env or {}):
        open_api(project)
    port = free_port()
    full_env = {**project.env, "RUNNER_CONFIG": str(project.root / "runner.toml"), **(env or {})}
    if token:
        full_env["RUNNER_API_TOKEN"] = token
    log = open(project.root / f"gunicorn-{port}.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-b", f"127.0.0.1:{port}", "-w", "1", "-k", "runner.web.server.Worker",
         "--graceful-timeout", "2", *_NO_CONTROL, "runner.web.asgi:app"],
        cwd=project.root, env=full_env, stdout=log, stderr=subprocess.STDOUT,
    )
    web = Web(f"http://127.0.0.1:{port}", proc, token, requests.Session())

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"gunicorn exited with {proc.returncode}; see {log.name}")
        try:
            # The first request builds the app in the worker: slow on a busy machine.
            return web.session.get(web.url + "/healthz", timeout=10).status_code == 200
        except (requests.ConnectionError, requests.Timeout):
            return False

    try:
        wait_for(up, timeout=20, interval=0.05, what="gunicorn to answer /healthz")
        yield web
    finally:
        web.session.close()
        _interrupt(proc, timeout=10)
        log.close()


def test_gunicorn_serves_the_app_from_the_project_folder(project: Project) -> None:
    """`gunicorn -k runner.web.server.Worker runner.web.asgi:app` in a project folder serves its functions; the app
    is built lazily in the worker, from runner.toml and the environment."""
    with gunicorn(project) as web:
        r = web.get("/functions")
        assert r.status_code == 200
        names = [f["type"] for f in r.json()["functions"]]
        assert "record" in names and "slow" in names
        health = web.get("/healthz")
        assert health.json() == {"status": "ok", "checks": {"web": "ok", "redis": "ok"}}


def _data_segments_in(sock: socket.socket) -> int:
    """The TCP segments with data that ``sock`` received (Linux: tcp_info.tcpi_data_segs_in)."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)
    if len(info) < 156:
        pytest.skip("this kernel's tcp_info has no count of data segments")
    return int(struct.unpack_from("I", info, 152)[0])


def _exchange(sock: socket.socket, request: bytes) -> bytes:
    """One request on a keep-alive connection, and its whole response (by Content-Length;
    none for a HEAD)."""
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0 if request.startswith(b"HEAD ") else int(
        next(v for k, _, v in (line.partition(b":") for line in head.split(b"\r\n")[1:])
             if k.strip().lower() == b"content-length"))
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def test_each_answer_leaves_the_server_in_one_write(project: Project) -> None:
    """A response's head and body go out together: the client receives each small answer
    (an enqueue's 202 from the fast lane, a 404 problem from the falcon app, a GET, and the
    head alone of a HEAD, here a 405) as one TCP segment. uvicorn writes the head and the body apart,
    which is two packets and two wake-ups of the client per request."""
    with gunicorn(project, token="one-write") as web:
        port = int(web.url.rsplit(":", 1)[1])
        auth = b"Authorization: Bearer one-write\r\n"
        body = b'{"n": 1}'
        requests_ = [
            b"POST /jobs/record HTTP/1.1\r\nHost: x\r\n" + auth + b"Content-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body),
            b"POST /jobs/no_such_type HTTP/1.1\r\nHost: x\r\n" + auth + b"Content-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body),
            b"GET /queues HTTP/1.1\r\nHost: x\r\n" + auth + b"\r\n",
            b"HEAD /queues HTTP/1.1\r\nHost: x\r\n" + auth + b"\r\n",
        ]
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            for request, status in zip(requests_, (b"202", b"404", b"200", b"405"), strict=True):
                before = _data_segments_in(sock)
                answer = _exchange(sock, request)
                assert answer.split(b" ", 2)[1] == status, answer
                assert _data_segments_in(sock) - before == 1, (request[:30], answer)


@dataclass
class RunnerWeb:
    """`runner web` as the Procfile runs it (cwd = the project), answering on ``port``."""

    proc: subprocess.Popen[bytes]
    port: int
    cmd: list[str]
    env: dict[str, str]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def workers(self) -> list[int]:
        path = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        return [int(p) for p in path.read_text().split()] if path.exists() else []


@contextmanager
def runner_web(project: Project, name: str, workers: int = 2, env: dict[str, str] | None = None
               ) -> Iterator[RunnerWeb]:
    """Started and answering /healthz; SIGINT at the end (its workers SIGKILLed if a
    test left them orphaned). ``env`` adds to (or, with "", unsets) its environment."""
    port = free_port()
    env = {**project.env, "RUNNER_API_TOKEN": "t", "PORT": str(port), "WEB_CONCURRENCY": str(workers),
           "GUNICORN_CMD_ARGS": " ".join(_NO_CONTROL), **(env or {})}
    cmd = [sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"), "web",
           "--host", "127.0.0.1"]
    log = open(project.root / f"{name}.log", "ab")  # noqa: SIM115
    web = RunnerWeb(subprocess.Popen(cmd, cwd=project.root, env=env, stdout=log, stderr=subprocess.STDOUT),
                    port, cmd, env)
    children: list[int] = []
    try:
        def up() -> bool:
            assert web.proc.poll() is None, f"runner web exited; see {log.name}"
            try:
                return requests.get(web.url + "/healthz", timeout=5).status_code == 200
            except (requests.ConnectionError, requests.Timeout):  # accepted, not yet serving
                return False

        wait_for(up, timeout=20, interval=0.05, what="runner web to answer")
        children = wait_for(lambda: (c := web.workers()) and len(c) == workers and c, timeout=10,
                            what=f"{workers} workers")
        yield web
    finally:
        if web.proc.poll() is None:
            _interrupt(web.proc, timeout=15)
        for w in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(w, signal.SIGKILL)
        log.close()


def test_runner_web_listens_per_process_and_refuses_a_taken_port(project: Project) -> None:
    """`runner web` gives each gunicorn process a listening socket of its own
    (SO_REUSEPORT: the kernel spreads connections, so keep-alive clients cannot pile onto
    one process), and a second `runner web` on the same port is refused with exit 2
    instead of silently sharing the port."""
    with runner_web(project, "runner-web") as web:
        def listeners() -> int:
            # /proc/net/tcp: local address as hex ip:port, state 0A is LISTEN.
            rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
            return sum(1 for r in rows if r.split()[1].endswith(f":{web.port:04X}") and r.split()[3] == "0A")

        wait_for(lambda: listeners() == 2, timeout=10, what="one listening socket per process")
        second = subprocess.run(web.cmd, cwd=project.root, env=web.env, capture_output=True, text=True,
                                timeout=30)
        assert second.returncode == 2, second.stderr
        assert f"cannot listen on 127.0.0.1:{web.port}" in second.stderr
        assert requests.get(web.url + "/healthz", timeout=5).status_code == 200


def test_workers_of_a_killed_master_shut_down(project: Project) -> None:
    """SIGKILL to `runner web` (the gunicorn master) leaves its workers orphaned: they see
    it and exit within seconds instead of serving on, holding the port."""
    with runner_web(project, "runner-web-kill") as web:
        workers = web.workers()
        web.proc.kill()
        web.proc.wait()

        def gone() -> bool:
            return not any(Path(f"/proc/{w}").exists() and "zombie" not in _state(w) for w in workers)

        wait_for(gone, timeout=10, interval=0.1, what="the orphaned workers to exit")
        with pytest.raises(requests.ConnectionError):
            requests.get(web.url + "/healthz", timeout=2)


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_every_202_is_in_redis_when_the_web_process_stops_under_load(project: Project, how: str) -> None:
    """Eight clients enqueue as fast as they can while `runner web` is stopped: by SIGTERM
    (graceful) or by SIGKILL to the master and its workers (a crash). Every job answered
    202 is in the ready list (no worker runs here), and none twice; under SIGTERM no
    request in flight gets anything but its 202 (new connections are refused)."""
    accepted: list[str] = []
    refused: list[int] = []
    stop = threading.Event()

    with runner_web(project, f"runner-web-{how}") as web:
        def client() -> None:
            session = requests.Session()
            while not stop.is_set():
                try:
                    r = session.post(web.url + "/jobs/noop", json={}, timeout=5,
                                     headers={"Authorization": "Bearer t"})
                except requests.RequestException:
                    session = requests.Session()
                    time.sleep(0.005)
                    continue
                if r.status_code == 202:
                    accepted.append(r.json()["id"])
                else:
                    refused.append(r.status_code)

        threads = [threading.Thread(target=client) for _ in range(8)]
        for t in threads:
            t.start()
        wait_for(lambda: len(accepted) >= 300, timeout=20, what="300 jobs accepted")
        if how == "SIGTERM":
            web.proc.terminate()
        else:
            for pid in [*web.workers(), web.proc.pid]:
                os.kill(pid, signal.SIGKILL)
        web.proc.wait(timeout=30)
        time.sleep(0.3)
        stop.set()
        for t in threads:
            t.join(timeout=10)
    ready = project.runtime.redis.lrange(project.keys().ready, 0, -1)
    assert len(accepted) >= 300
    assert len(set(ready)) == len(ready)
    assert set(accepted) <= set(ready), f"{len(set(accepted) - set(ready))} accepted jobs are not in Redis"
    if how == "SIGTERM":
        assert refused == []


def _state(pid: int) -> str:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return "zombie"
    return next((ln for ln in status.splitlines() if ln.startswith("State:")), "").lower()


@contextmanager
def served(tmp_path_factory: pytest.TempPathFactory, server: Server, setup: Callable[[Project], None],
           token: str | None = None) -> Iterator[tuple[Project, Web]]:
    """A project of its own (``setup`` adds its functions and config) and its gunicorn, for
    a module whose tests share them: each test's checks are of its own requests."""
    p = make_project(tmp_path_factory.mktemp("served") / "project", server)
    setup(p)
    try:
        with gunicorn(p, token=token) as w:
            yield p, w
    finally:
        p.stop_all()
        if p._runtime is not None:
            p._runtime.close()
