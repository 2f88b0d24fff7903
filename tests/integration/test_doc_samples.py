"""The samples of the README and docs/ that can run, run as written: the quickstart's
commands against `runner dev` on a project of the shipped examples (an email sent over
HTTP, shown by `runner job` and found in the outbox; a declined card in `runner dead ls`)
and the README's Python client beside them; and the `run_inline` test of
docs/functions.md, under pytest."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.store.embedded import Server, free_port

from conftest import REPO, Project, make_project, wait_for

README = (REPO / "README.md").read_text()


def quickstart_lines() -> list[str]:
    """The README quickstart's commands after the two install lines, continuation lines
    joined, comments dropped."""
    body = README.split("## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    lines = [line[4:] for line in body.splitlines() if line.startswith("    ")]
    joined = "\n".join(lines[2:]).replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            out.append(shlex.join(words))
    return out


@pytest.fixture
def examples(tmp_path: Path, server: Server) -> Iterator[Project]:
    p = make_project(tmp_path / "app", server, examples=True)
    yield p
    p.stop_all()
    if p._runtime is not None:
        p._runtime.close()


def test_the_quickstart_commands_run_as_written(examples: Project) -> None:
    """With `runner dev` serving the shipped examples, the README's commands do what its
    comments say: the curl enqueues send_email and answers with the documented fields,
    `runner job` shows the job done, the outbox holds the mail, and the declined card
    `runner enqueue` sends is in `runner dead ls`; its Python client enqueues and calls
    where dev's workers run the jobs."""
    commands = quickstart_lines()
    assert [c.split()[0] for c in commands] == ["curl", "runner", "ls", "runner", "runner"]
    port = free_port()
    log = examples.root / "dev.log"
    dev = subprocess.Popen([sys.executable, "-m", "runner.cli", "dev", "--port", str(port)], cwd=examples.root,
                           env=examples.env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    examples.procs.append(dev)
    wait_for(lambda: dev.poll() is None and "runner.dev: serving http://" in log.read_text(errors="replace"),
             timeout=30, interval=0.05, what="runner dev to serve")
    prelude = f'runner() {{ {shlex.quote(sys.executable)} -m runner.cli "$@"; }}\n'

    def sh(command: str) -> str:
        out = subprocess.run(["bash", "-c", prelude + command.replace("localhost:8000", f"localhost:{port}")],
                             cwd=examples.root, env=examples.env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, f"{command}\n{out.stdout}\n{out.stderr}\n{log.read_text()}"
        return out.stdout

    curl, job, ls, enqueue, dead = commands
    answer = json.loads(sh(curl))
    shown = re.search(r"# (\{.*)\.\.\.\}", README)
    assert shown is not None
    for field, value in json.loads(shown.group(1).replace('"01a2...",', '"",').rstrip(",") + "}").items():
        assert field in answer and (field == "id" or answer[field] == value), (field, answer)
    client = examples.client
    wait_for(lambda: client.get(answer["id"]).status == "done", timeout=15, what="the email to be sent")
    assert re.search(r"^ *status: done$", sh(job.replace("01a2...", answer["id"])), re.M)
    assert sh(ls).split() == ["7_welcome.json"]
    declined = sh(enqueue).split()[0]
    wait_for(lambda: client.get(declined).status == "dead", timeout=15, what="the declined card to die")
    listed = sh(dead)
    assert declined in listed and "declined" in listed

    (sample,) = [s for s in re.findall(r"```python\n(.*?)```", README, re.S) if "Client.from_config()" in s]
    (examples.root / "sample.py").write_text(sample)
    out = subprocess.run([sys.executable, "sample.py"], cwd=examples.root, env=examples.env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    status, receipt = out.stdout.splitlines()
    assert status in ("queued", "processing", "done")  # the curl's email: one key, one job
    assert "'amount_cents': 990" in receipt
    dev.terminate()
    assert dev.wait(timeout=30) == 0, log.read_text()


def test_the_run_inline_sample_passes_under_pytest(examples: Project) -> None:
    """docs/functions.md's test of a declined card, saved as a test file in a project of the
    shipped examples, passes under pytest (run_inline needs no Redis)."""
    text = (REPO / "docs" / "functions.md").read_text()
    (sample,) = [s for s in re.findall(r"```python\n(.*?)```", text, re.S) if "run_inline(" in s]
    (examples.root / "test_sample.py").write_text(sample)
    # Without the pytest plugins of this suite's own test tools (schemathesis's, anyio's):
    # a project's pytest has none of them, and importing them was half of the run's CPU.
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:schemathesis",
                          "-p", "no:anyio", "test_sample.py"],
                         cwd=examples.root, env=examples.env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "1 passed" in out.stdout, out.stdout + out.stderr
