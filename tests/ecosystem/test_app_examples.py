"""The framework examples in examples/ run as a user runs them, against a real server:
the Django project's own tests (enqueue_on_commit, its system check), SQLAlchemy's
enqueue_on_commit, and the FastAPI app end to end with a real worker."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner import ValidationFailed
from runner.client import Client
from runner.contrib import shared
from runner.store.embedded import Server

from conftest import REPO, wait_for

EXAMPLES = REPO / "examples"


def _env(server: Server, tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}
    env.update({"REDIS_URL": server.url, "RUNNER_REDIS_PREFIX": f"t{uuid.uuid4().hex[:10]}",
                "OUTBOX_DIR": str(tmp_path / "outbox"), "PYTHONUNBUFFERED": "1", **extra})
    return env


def test_django_example_enqueues_only_on_commit(server: Server, tmp_path: Path) -> None:
    """Its tests: a rolled-back transaction enqueues nothing, a committed one once, an
    invalid payload fails at the call, and `manage.py check` includes runner's checks."""
    pytest.importorskip("django")
    app = EXAMPLES / "django_app"
    env = _env(server, tmp_path, PYTHONPATH=os.pathsep.join([str(REPO), str(app)]))
    proc = subprocess.run([sys.executable, "manage.py", "test", "orders", "-v", "2"], cwd=app, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Ran 5 tests" in proc.stderr and "OK" in proc.stderr


def test_django_check_reports_a_broken_function(server: Server, tmp_path: Path) -> None:
    pytest.importorskip("django")
    app = EXAMPLES / "django_app"
    broken = tmp_path / "functions"
    shutil.copytree(REPO / "functions", broken)
    (broken / "send_email.py").write_text('QUEUE = "nowhere"\ndef handle(p, ctx):\n    pass\n')
    env = _env(server, tmp_path, PYTHONPATH=os.pathsep.join([str(REPO), str(app)]),
               RUNNER_FUNCTIONS_DIR=str(broken))
    proc = subprocess.run([sys.executable, "manage.py", "check"], cwd=app, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "runner.E001" in proc.stderr and "nowhere" in proc.stderr


SETTINGS_PROBE = """
import json, sys
from django.conf import settings
settings.configure(INSTALLED_APPS=["runner.contrib.django"], RUNNER=json.loads(sys.argv[1]))
import django
django.setup()
from runner.contrib.django import client
cfg = client().runtime.config
print(json.dumps([cfg.redis.url, cfg.redis.prefix, cfg.source]))
"""


@pytest.mark.parametrize("from_env", [True, False], ids=["environment", "settings"])
def test_django_settings_give_way_to_the_environment(tmp_path: Path, from_env: bool) -> None:
    """settings.RUNNER's REDIS_URL, PREFIX and CONFIG are defaults: REDIS_URL,
    RUNNER_REDIS_PREFIX and RUNNER_CONFIG win over them, as for every other setting (a
    platform's REDIS_URL over a development URL in settings.py); without them the
    settings apply. The settings won, and enqueue_on_commit went to their server."""
    pytest.importorskip("django")
    for name in ("env.toml", "settings.toml"):
        (tmp_path / name).write_text("[queues.default]\n")
    settings = {"CONFIG": str(tmp_path / "settings.toml"), "REDIS_URL": "redis://127.0.0.1:9/0",
                "PREFIX": "fromsettings"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_") and k != "REDIS_URL"}
    env["PYTHONPATH"] = str(REPO)
    if from_env:
        env.update({"REDIS_URL": "redis://127.0.0.1:7/0", "RUNNER_REDIS_PREFIX": "fromenv",
                    "RUNNER_CONFIG": str(tmp_path / "env.toml")})
    proc = subprocess.run([sys.executable, "-c", SETTINGS_PROBE, json.dumps(settings)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    url, prefix, source = json.loads(proc.stdout)
    if from_env:
        assert (url, prefix, Path(source).name) == ("redis://127.0.0.1:7/0", "fromenv", "env.toml")
    else:
        assert (url, prefix, Path(source).name) == ("redis://127.0.0.1:9/0", "fromsettings", "settings.toml")


@pytest.fixture
def client(server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Client]:
    for k, v in _env(server, tmp_path).items():
        if k in ("REDIS_URL", "RUNNER_REDIS_PREFIX", "OUTBOX_DIR"):
            monkeypatch.setenv(k, v)
    c = shared.shared_client(EXAMPLES / "fastapi_app" / "runner.toml")
    yield c
    shared.close_all()


def test_sqlalchemy_enqueue_on_commit(client: Client) -> None:
    """A job enqueued on a session is sent once when it commits, never when it rolls back."""
    sa = pytest.importorskip("sqlalchemy")
    from sqlalchemy.orm import Session

    from runner.contrib.sqlalchemy import enqueue_on_commit

    engine = sa.create_engine("sqlite://")
    with engine.begin() as conn:
        conn.execute(sa.text("create table orders (id integer primary key, email text)"))
    email = {"user_id": 1, "to": ["ada@example.com"], "name": "Ada", "template": "receipt"}

    def ready() -> int:
        return int(client.stats()["fast"]["ready"])

    with Session(engine) as session:
        session.execute(sa.text("insert into orders (email) values ('a@b.c')"))
        enqueue_on_commit(session, "send_email", email, client=client)
        session.rollback()
        assert ready() == 0
        session.execute(sa.text("insert into orders (email) values ('d@e.f')"))
        enqueue_on_commit(session, "send_email", {**email, "user_id": 2}, client=client)
        assert ready() == 0
        session.commit()
        assert ready() == 1
        session.commit()  # nothing pending: nothing sent again
        assert ready() == 1
        with pytest.raises(ValidationFailed):
            enqueue_on_commit(session, "send_email", {"user_id": "x"}, client=client)


def test_fastapi_example_end_to_end(server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """POST /signup enqueues through the shared client's aenqueue; a real worker runs the
    job; the app's status route sees it done."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    env = _env(server, tmp_path)
    for k in ("REDIS_URL", "RUNNER_REDIS_PREFIX", "OUTBOX_DIR"):
        monkeypatch.setenv(k, env[k])
    config = EXAMPLES / "fastapi_app" / "runner.toml"
    monkeypatch.setenv("RUNNER_CONFIG", str(config))
    monkeypatch.syspath_prepend(str(EXAMPLES / "fastapi_app"))
    worker = subprocess.Popen([sys.executable, "-m", "runner.cli", "--config", str(config), "worker",
                               "--queue", "fast"], env={**env, "PYTHONPATH": str(REPO)}, cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import app as example  # examples/fastapi_app/app.py

        with TestClient(example.app) as http:
            bad = http.post("/signup", json={"user_id": 1, "email": "not-an-email", "name": "Ada"})
            assert bad.status_code == 422
            r = http.post("/signup", json={"user_id": 1, "email": "ada@example.com", "name": "Ada"})
            assert r.status_code == 202, r.text
            job_id = r.json()["job"]
            done = wait_for(lambda: (j := http.get(f"/jobs/{job_id}").json())["status"] == "done" and j,
                            timeout=30, what="the signup email")
            assert done["result"] == {"sent_to": ["ada@example.com"], "via": "outbox"}
            now = http.post("/signup/now", json={"user_id": 2, "email": "bo@example.com", "name": "Bo"})
            assert now.status_code == 200, now.text
            assert now.json() == {"result": {"sent_to": ["bo@example.com"], "via": "outbox"}}
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        shared.close_all()
