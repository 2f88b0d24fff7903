"""REDIS_URL as PaaS add-ons hand it out: rediss:// with a password and a self-signed
certificate. The certificate is checked by default (and refused), accepted with
RUNNER_REDIS_TLS_VERIFY=false or when its CA is given with RUNNER_REDIS_CA_CERT, and a
job enqueued over TLS is run by a `runner worker` process over TLS."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from runner import config as config_mod
from runner.client import Client
from runner.runtime import Runtime
from runner.store.embedded import Server, debian_binary, free_port

from conftest import Project, wait_for

PASSWORD = "pa55-word"


@pytest.fixture
def tls_url(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    binary = debian_binary()
    if binary is None or shutil.which("openssl") is None:
        pytest.skip("needs Debian's redis-server (built with TLS) and openssl (apt-get install redis-server openssl)")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    tls_port = free_port()
    s = Server(tmp_path / "tls", binary=binary, extra=[
        "--tls-port", str(tls_port), "--tls-cert-file", str(cert), "--tls-key-file", str(key),
        "--tls-auth-clients", "no"]).start()
    # The password goes on after start: the start-up probe speaks plain, unauthenticated.
    redis.Redis(port=s.port).config_set("requirepass", PASSWORD)
    yield f"rediss://:{PASSWORD}@localhost:{tls_port}/0", cert
    s.stop(kill=True)


def cli(project: Project, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"),
                           *args], env={**project.env, **env}, capture_output=True, timeout=60)


def test_rediss_with_a_password_and_a_self_signed_certificate(project: Project,
                                                              tls_url: tuple[str, Path]) -> None:
    url, cert = tls_url
    verified = cli(project, {"REDIS_URL": url}, "stats")
    assert verified.returncode == 3, verified.stderr  # self-signed: refused by default
    assert b"certificate verify failed" in verified.stderr

    insecure = {"REDIS_URL": url, "RUNNER_REDIS_TLS_VERIFY": "false"}
    assert cli(project, insecure, "check").returncode == 0
    with_ca = {"REDIS_URL": url, "RUNNER_REDIS_CA_CERT": str(cert)}
    enq = cli(project, with_ca, "enqueue", "record", '{"n": 3}', "--json")
    assert enq.returncode == 0, enq.stderr
    job_id = json.loads(enq.stdout)["id"]

    project.spawn_worker("fast", env=insecure)
    rt = Runtime.create(config_mod.load(project.root / "runner.toml", env={**project.env, **with_ca}))
    try:
        wait_for(lambda: Client(rt).get(job_id).status == "done", timeout=30, interval=0.05,
                 what="the job to run over TLS")
    finally:
        rt.close()
