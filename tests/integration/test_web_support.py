"""A real gunicorn serving ``runner.web.wsgi:app`` for a test project, shared by the web,
metrics and dashboard tests; plus the smoke test that the command line works as the
Procfile uses it (cwd = the project, configuration from the environment)."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import gunicorn.config
import requests

from runner.embedded import free_port

from conftest import Project, wait_for


@dataclass
class Web:
    """A running gunicorn; ``call`` sends the bearer token when one is set."""

    url: str
    proc: subprocess.Popen[bytes]
    token: str | None
    session: requests.Session

    def call(self, method: str, path: str, *, auth: bool = True, **kw: Any) -> requests.Response:
        headers = dict(kw.pop("headers", None) or {})
        if auth and self.token and "Authorization" not in headers:
            headers["Authorization"] = f"Bearer {self.token}"
        return self.session.request(method, self.url + path, headers=headers, timeout=10, **kw)

    def get(self, path: str, **kw: Any) -> requests.Response:
        return self.call("GET", path, **kw)

    def post(self, path: str, **kw: Any) -> requests.Response:
        return self.call("POST", path, **kw)


# Newer gunicorn opens a control socket at one fixed path per user; parallel test servers
# would fight over it.
_NO_CONTROL = (["--no-control-socket"]
               if any(s.name == "control_socket_disable" for s in gunicorn.config.KNOWN_SETTINGS) else [])


@contextmanager
def gunicorn(project: Project, token: str | None = None, env: dict[str, str] | None = None,
             threads: int = 4) -> Iterator[Web]:
    port = free_port()
    full_env = {**project.env, "RUNNER_CONFIG": str(project.root / "runner.toml"), **(env or {})}
    if token:
        full_env["RUNNER_API_TOKEN"] = token
    log = open(project.root / f"gunicorn-{port}.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-b", f"127.0.0.1:{port}", "-w", "1", "-k", "gthread",
         "--threads", str(threads), "--graceful-timeout", "2", *_NO_CONTROL, "runner.web.wsgi:app"],
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
        proc.send_signal(signal.SIGINT)  # quick shutdown: the tests hold no request open
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_gunicorn_serves_the_app_from_the_project_folder(project: Project) -> None:
    """`gunicorn runner.web.wsgi:app` in a project folder serves its functions; the app
    is built lazily in the worker, from runner.toml and the environment."""
    with gunicorn(project) as web:
        r = web.get("/functions")
        assert r.status_code == 200
        names = [f["type"] for f in r.json()["functions"]]
        assert "record" in names and "slow" in names
        health = web.get("/healthz")
        assert health.json() == {"status": "ok", "checks": {"web": "ok", "redis": "ok"}}
