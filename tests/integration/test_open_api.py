"""The app itself refuses to serve without a token: ``runner.web.asgi:app`` under uvicorn
or gunicorn directly fails its start-up (or, without a lifespan, answers every request
with a 503 problem), unless auth is switched off explicitly in runner.toml."""

from __future__ import annotations

import subprocess
import sys

import requests
from test_web_support import _NO_CONTROL, open_api

from runner.store.embedded import free_port

from conftest import SCAN_COUNT, Project, wait_for


def _serve(project: Project, *args: str) -> subprocess.Popen[str]:
    env = {**project.env, "RUNNER_CONFIG": str(project.root / "runner.toml")}
    return subprocess.Popen([sys.executable, "-m", *args], cwd=project.root, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _uvicorn(port: int, *extra: str) -> tuple[str, ...]:
    return ("uvicorn", "--host", "127.0.0.1", "--port", str(port), *extra, "runner.web.asgi:app")


def _gunicorn(port: int) -> tuple[str, ...]:
    return ("gunicorn", "-b", f"127.0.0.1:{port}", "-w", "1", "-k", "runner.web.server.Worker", *_NO_CONTROL,
            "runner.web.asgi:app")


def _nothing_written(project: Project) -> bool:
    return not list(project.runtime.redis.scan_iter(count=SCAN_COUNT, match=f"{project.prefix}:*job:*"))


def test_uvicorn_and_gunicorn_refuse_to_start_without_a_token(project: Project) -> None:
    for args in (_uvicorn(free_port()), _gunicorn(free_port())):
        proc = _serve(project, *args)
        try:
            out, _ = proc.communicate(timeout=60)
        finally:
            proc.kill()
        assert proc.returncode != 0, out
        assert "refusing to serve the API without a token" in out, out


def test_without_a_lifespan_every_request_is_a_503_problem(project: Project) -> None:
    port = free_port()
    proc = _serve(project, *_uvicorn(port, "--lifespan", "off"))
    url = f"http://127.0.0.1:{port}"
    try:
        def up() -> bool:
            assert proc.poll() is None
            try:
                requests.get(url + "/healthz", timeout=5)
                return True
            except requests.ConnectionError:
                return False

        wait_for(up, timeout=30, what="uvicorn to listen")
        for method, path in (("GET", "/queues"), ("POST", "/jobs/record"), ("GET", "/healthz")):
            r = requests.request(method, url + path, json={"n": 1}, timeout=10)
            assert r.status_code == 503, (path, r.status_code, r.text)
            assert r.headers["Content-Type"] == "application/problem+json"
            assert "without a token" in r.json()["detail"]
        assert _nothing_written(project)
    finally:
        proc.kill()
        proc.communicate()


def test_auth_switched_off_in_runner_toml_serves(project: Project) -> None:
    open_api(project)
    port = free_port()
    proc = _serve(project, *_uvicorn(port))
    url = f"http://127.0.0.1:{port}"
    try:
        def up() -> bool:
            assert proc.poll() is None
            try:
                return requests.get(url + "/healthz", timeout=5).status_code == 200
            except requests.ConnectionError:
                return False

        wait_for(up, timeout=30, what="uvicorn to serve")
        assert requests.post(url + "/jobs/record", json={"n": 1}, timeout=10).status_code == 202
    finally:
        proc.kill()
        proc.communicate()
