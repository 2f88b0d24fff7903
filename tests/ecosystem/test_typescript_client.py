"""Any language can enqueue: a TypeScript client generated with openapi-typescript from the
OpenAPI document a real `runner web` serves, compiled with tsc, enqueues a job there.

The npm packages are pinned by tests/ts/package-lock.json and installed once into
tests/ts/node_modules (kept between runs)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from runner.store.embedded import free_port

from conftest import Project, wait_for

TS = Path(__file__).parents[1] / "ts"
TOKEN = "ts-test-token"


def _npm_ready() -> None:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not installed (apt-get install nodejs npm runs this): "
                    "the TypeScript client cannot be built here")
    if not (TS / "node_modules" / ".bin" / "tsc").exists():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=TS, check=True, timeout=300,
                       capture_output=True)


@pytest.fixture
def web(project: Project) -> Iterator[str]:
    port = free_port()
    env = {**project.env, "PORT": str(port), "RUNNER_API_TOKEN": TOKEN}
    proc = subprocess.Popen([sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"),
                             "web", "--workers", "1"], cwd=project.root, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return requests.get(f"{base}/healthz", timeout=1).status_code == 200
        except (requests.ConnectionError, requests.Timeout):  # accepted, not yet serving
            return False

    try:
        wait_for(up, timeout=30, what="runner web")
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_generated_typescript_client_enqueues_a_job(project: Project, web: str, tmp_path: Path) -> None:
    _npm_ready()
    work = tmp_path / "ts"
    work.mkdir()
    (work / "node_modules").symlink_to(TS / "node_modules")
    (work / "package.json").write_text('{"type": "module"}')
    shutil.copy(TS / "main.ts", work / "main.ts")
    doc = requests.get(f"{web}/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    assert doc.status_code == 200
    (work / "openapi.json").write_text(doc.text)
    bins = TS / "node_modules" / ".bin"
    run = {"cwd": work, "check": True, "capture_output": True, "text": True, "timeout": 180}
    subprocess.run([str(bins / "openapi-typescript"), "openapi.json", "-o", "api.d.ts"], **run)  # type: ignore[call-overload]
    tsc = subprocess.run([str(bins / "tsc"), "--strict", "--module", "nodenext", "--moduleResolution", "nodenext",
                          "--target", "es2022", "--skipLibCheck", "--outDir", "out", "main.ts"],
                         cwd=work, capture_output=True, text=True, timeout=180)
    assert tsc.returncode == 0, tsc.stdout + tsc.stderr
    out = subprocess.run(["node", "out/main.js", web, TOKEN], **run)  # type: ignore[call-overload]
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    assert answer["status"] == 202, answer
    job = project.client.get(answer["data"]["id"]).as_dict()
    assert (job["type"], job["payload"], job["idempotency_key"]) == ("idem", {"k": "from-typescript", "v": 42}, "ts-1")


def test_the_compiler_refuses_a_payload_the_schema_does_not_allow(project: Project, web: str,
                                                                    tmp_path: Path) -> None:
    """The generated types carry the schema: a wrong field type does not compile."""
    _npm_ready()
    work = tmp_path / "ts"
    work.mkdir()
    (work / "node_modules").symlink_to(TS / "node_modules")
    doc = requests.get(f"{web}/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    (work / "openapi.json").write_text(doc.text)
    bins = TS / "node_modules" / ".bin"
    subprocess.run([str(bins / "openapi-typescript"), "openapi.json", "-o", "api.d.ts"], cwd=work, check=True,
                   capture_output=True, timeout=180)
    (work / "bad.ts").write_text((TS / "main.ts").read_text().replace("v: 42", 'v: "forty-two"'))
    tsc = subprocess.run([str(bins / "tsc"), "--strict", "--noEmit", "--module", "nodenext", "--moduleResolution",
                          "nodenext", "--target", "es2022", "--skipLibCheck", "bad.ts"],
                         cwd=work, capture_output=True, text=True, timeout=180, env={**os.environ})
    assert tsc.returncode != 0 and "string" in tsc.stdout
