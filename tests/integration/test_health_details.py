"""/healthz is public, but what it says of Redis (its address, a refused password) is
for callers with a token."""

from __future__ import annotations

import falcon.testing

from runner import config as config_mod
from runner.runtime import Runtime
from runner.store.embedded import free_port
from runner.web import create_app

from conftest import Project


def test_an_unreachable_redis_is_detailed_only_to_a_token(project: Project) -> None:
    port = free_port()
    env = {**project.env, "REDIS_URL": f"redis://127.0.0.1:{port}/0", "RUNNER_API_TOKEN": "health-t0ken"}
    rt = Runtime.create(config_mod.load(project.root / "runner.toml", env=env), lazy=True)
    try:
        client = falcon.testing.TestClient(create_app(rt))
        anonymous = client.simulate_get("/healthz")
        assert anonymous.status_code == 503
        assert str(port) not in anonymous.text and "127.0.0.1" not in anonymous.text, anonymous.text
        assert anonymous.json["checks"] == {"web": "ok", "redis": "unreachable"}
        wrong = client.simulate_get("/healthz", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 503 and str(port) not in wrong.text
        known = client.simulate_get("/healthz", headers={"Authorization": "Bearer health-t0ken"})
        assert known.status_code == 503 and str(port) in known.text, known.text
    finally:
        rt.close()
