"""Any language can enqueue: a TypeScript client generated with openapi-typescript from the
OpenAPI document a real `runner web` serves, compiled with tsc, enqueues a job there.

The npm packages are pinned by tests/ts/package-lock.json and installed once into
tests/ts/node_modules (kept between runs)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from runner.store.embedded import Server, free_port

from conftest import Project, make_project, wait_for

TS = Path(__file__).parents[1] / "ts"
TOKEN = "ts-test-token"


def _npm_ready() -> None:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not installed (apt-get install nodejs npm runs this): "
                    "the TypeScript client cannot be built here")
    if not (TS / "node_modules" / ".bin" / "tsc").exists():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=TS, check=True, timeout=300,
                       capture_output=True)


@contextmanager
def _web(project: Project) -> Iterator[str]:
    """`runner web` (one process) for ``project``, with the token; yields its URL."""
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


@dataclass
class Built:
    """The module's project and its web server's URL, the folder the client was generated
    and compiled in, and tsc's run over both programs."""

    project: Project
    web: str
    work: Path
    tsc: subprocess.CompletedProcess[str]

    def errors(self, program: str) -> list[str]:
        """tsc's diagnostics that name ``program`` (each line of one begins with its file)."""
        return [line for line in self.tsc.stdout.splitlines() if line.startswith(f"{program}(")]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, server: Server) -> Iterator[Built]:
    """One project and its `runner web`, the client generated once from the OpenAPI document
    served there, and one tsc run over both programs: main.ts as shipped and bad.ts, the
    same with a payload field of the wrong type (tsc checks each file on its own, names the
    file in each diagnostic, and writes out/main.js whatever bad.ts holds). A web server, a
    generation and a compiler run per test were most of these tests' CPU."""
    _npm_ready()
    project = make_project(tmp_path_factory.mktemp("typescript") / "project", server)
    try:
        with _web(project) as web:
            work = project.root.parent / "ts"
            work.mkdir()
            (work / "node_modules").symlink_to(TS / "node_modules")
            (work / "package.json").write_text('{"type": "module"}')
            shutil.copy(TS / "main.ts", work / "main.ts")
            (work / "bad.ts").write_text((TS / "main.ts").read_text().replace("v: 42", 'v: "forty-two"'))
            doc = requests.get(f"{web}/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
            assert doc.status_code == 200
            (work / "openapi.json").write_text(doc.text)
            bins = TS / "node_modules" / ".bin"
            subprocess.run([str(bins / "openapi-typescript"), "openapi.json", "-o", "api.d.ts"], cwd=work,
                           check=True, capture_output=True, text=True, timeout=180)
            tsc = subprocess.run([str(bins / "tsc"), "--strict", "--module", "nodenext", "--moduleResolution",
                                  "nodenext", "--target", "es2022", "--skipLibCheck", "--outDir", "out", "main.ts",
                                  "bad.ts"], cwd=work, capture_output=True, text=True, timeout=180)
            yield Built(project, web, work, tsc)
    finally:
        project.close()


def test_a_generated_typescript_client_enqueues_a_job(built: Built) -> None:
    """main.ts compiles against the generated client (every diagnostic of the run is
    bad.ts's) and, run with node, enqueues a job that runner then holds as sent."""
    assert built.errors("bad.ts"), built.tsc.stdout + built.tsc.stderr  # (the run did check)
    others = [line for line in built.tsc.stdout.splitlines() if line.strip() and not line.startswith((" ", "bad.ts("))]
    assert not others and not built.tsc.stderr, built.tsc.stdout + built.tsc.stderr
    out = subprocess.run(["node", "out/main.js", built.web, TOKEN], cwd=built.work, check=True, capture_output=True,
                         text=True, timeout=180)
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    assert answer["status"] == 202, answer
    job = built.project.client.get(answer["data"]["id"]).as_dict()
    assert (job["type"], job["payload"], job["idempotency_key"]) == ("idem", {"k": "from-typescript", "v": 42}, "ts-1")


def test_the_compiler_refuses_a_payload_the_schema_does_not_allow(built: Built) -> None:
    """The generated types carry the schema: a wrong field type does not compile."""
    assert built.tsc.returncode != 0
    assert any("string" in line for line in built.errors("bad.ts")), built.tsc.stdout
