"""`runner dev` as a user runs it: a subprocess on a fresh project folder holding the shipped
examples, driven over HTTP while its files are edited, added, broken, fixed and deleted;
and the embedded Redis it starts when none answers, which keeps jobs across restarts and
never outlives it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import requests

from runner.store.embedded import Server, free_port

from conftest import REPO, Project, make_project, wait_for

SLOWPOKE = '''"""Sleeps, then says which code ran it."""
import os
import time

QUEUE = "fast"
TIMEOUT = 15


def handle(payload, ctx):
    with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id), "a") as f:
        f.write(f"{ctx.attempt}\\n")
    time.sleep(payload.get("seconds", 0))
    return {"code": "old"}
'''

HELLO = '''"""Greets."""
QUEUE = "fast"


def handle(payload, ctx):
    return {"greeting": "GREETING " + payload["name"]}
'''
HELLO_SCHEMA = {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
                "properties": {"name": {"type": "string"}}, "required": ["name"]}
BROKEN_HELLO = '"""Greets."""\nQUEUE = "fast"\ndef handle(payload, ctx)\n    return {}\n'


class Dev:
    """One `runner dev` process with its log in the project folder."""

    def __init__(self, root: Path, env: dict[str, str], args: tuple[str, ...] = ()) -> None:
        self.root = root
        self.port = free_port()
        self.log_path = root / f"dev-{self.port}.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runner.cli", "--config", str(root / "runner.toml"), "dev",
             "--port", str(self.port), *args],
            cwd=root, env=env, stdout=self.log_path.open("wb"), stderr=subprocess.STDOUT,
        )
        self.base = f"http://127.0.0.1:{self.port}"
        wait_for(self._up, timeout=30, interval=0.05, what="runner dev to serve /healthz")

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"runner dev exited with {self.proc.returncode}:\n{self.log()}")
        # The log line is the signal that the watcher is up too.
        return "runner.dev: serving http://" in self.log()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def post(self, type_: str, payload: Any, **params: Any) -> requests.Response:
        return requests.post(f"{self.base}/jobs/{type_}", json=payload, params=params, timeout=5)

    def job(self, job_id: str) -> dict[str, Any]:
        r = requests.get(f"{self.base}/jobs/{job_id}", timeout=5)
        assert r.status_code == 200, r.text
        return dict(r.json())

    def run(self, type_: str, payload: Any, timeout: float = 10.0) -> dict[str, Any]:
        r = self.post(type_, payload)
        assert r.status_code == 202, r.text
        return self.finished(r.json()["id"], timeout)

    def finished(self, job_id: str, timeout: float = 10.0) -> dict[str, Any]:
        return dict(wait_for(lambda: (j := self.job(job_id))["status"] in ("done", "dead") and j,
                             timeout=timeout, interval=0.02, what=f"job {job_id} to finish"))

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)


@pytest.fixture
def examples(tmp_path: Path, server: Server) -> Project:
    """A fresh project folder with the shipped examples (functions/ and schemas/ of the repo)."""
    p = make_project(tmp_path / "app", server, examples=True)
    p.write_config(vt=2, slow_vt=60, grace=5)
    (p.root / "functions" / "slowpoke.py").write_text(SLOWPOKE)
    (p.root / "schemas" / "slowpoke").mkdir()
    (p.root / "schemas" / "slowpoke" / "v1.json").write_text(json.dumps({"type": "object"}))
    return p


def email(user_id: int) -> dict[str, Any]:
    return {"user_id": user_id, "to": ["ada@example.com"], "name": "Ada", "template": "welcome"}


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def test_hot_reload_edits_additions_errors_fixes_and_a_long_job(examples: Project) -> None:
    """Edits take effect within seconds; a new file is a new job type over HTTP; a syntax
    error is logged with path and line while the rest keeps serving; fixing it brings it
    back; a job running across a reload finishes once, on its old code."""
    dev = Dev(examples.root, examples.env)
    fns, schemas = examples.root / "functions", examples.root / "schemas"
    try:
        assert dev.run("send_email", email(1))["result"]["via"] == "outbox"

        long_job = dev.post("slowpoke", {"seconds": 2.5}).json()["id"]
        wait_for(lambda: dev.job(long_job)["status"] == "processing", what="the long job to start")
        edit(fns / "slowpoke.py", '"old"', '"new"')
        edit(fns / "send_email.py", '"via": sent_via}', '"via": sent_via + "+edited"}')
        user = iter(range(100, 10_000))
        wait_for(lambda: dev.run("send_email", email(next(user)))["result"]["via"] == "outbox+edited",
                 timeout=5, what="the edited send_email to run")
        old = dev.finished(long_job)
        assert old["status"] == "done" and old["result"] == {"code": "old"}
        assert old["attempt"] == 1 and len(old["history"]) == 1
        assert examples.runs(long_job) == ["1"], "the long job ran more than once"
        assert dev.run("slowpoke", {})["result"] == {"code": "new"}

        (schemas / "hello").mkdir()
        (schemas / "hello" / "v1.json").write_text(json.dumps(HELLO_SCHEMA))
        (fns / "hello.py").write_text(HELLO)
        wait_for(lambda: dev.post("hello", {"name": "x"}).status_code == 202, timeout=5,
                 what="the new function to be enqueueable")
        assert dev.run("hello", {"name": "Bo"})["result"] == {"greeting": "GREETING Bo"}
        assert dev.post("hello", {"nom": "x"}).status_code == 422

        (fns / "hello.py").write_text(BROKEN_HELLO)
        wait_for(lambda: "hello.py:3: syntax error" in dev.log(), timeout=5, what="the syntax error log line")
        assert dev.run("send_email", email(2))["result"]["via"] == "outbox+edited"
        assert dev.run("hello", {"name": "Cy"})["result"] == {"greeting": "GREETING Cy"}  # last good

        (fns / "hello.py").write_text(HELLO.replace("GREETING ", "Hi "))
        wait_for(lambda: dev.run("hello", {"name": "Di"})["result"] == {"greeting": "Hi Di"}, timeout=5,
                 what="the fixed function to run")
        assert "fixed: functions/hello.py" in dev.log()
    finally:
        code = dev.stop()
    assert code == 0, dev.log()
    assert "runner dev stopped" in dev.log()


CRUNCH = '''"""Says which code ran it, in a child process."""
QUEUE = "fast"
ISOLATION = "process"


def handle(payload, ctx):
    return {"code": "good"}
'''


def test_a_broken_edit_of_a_process_function_keeps_its_last_good_version(examples: Project) -> None:
    """A process-isolated function keeps its last good version through a broken edit, as a
    thread function does: its new children run the code the worker loaded, not the broken
    file (they read it, and the function's jobs were handed back in a loop)."""
    fns = examples.root / "functions"
    (fns / "crunch.py").write_text(CRUNCH)
    (examples.root / "schemas" / "crunch").mkdir()
    (examples.root / "schemas" / "crunch" / "v1.json").write_text(json.dumps({"type": "object"}))
    dev = Dev(examples.root, examples.env)
    try:
        assert dev.run("crunch", {}, timeout=30)["result"] == {"code": "good"}
        (fns / "crunch.py").write_text(CRUNCH.replace("def handle(payload, ctx):", "def handle(payload, ctx)"))
        wait_for(lambda: "crunch.py:6: syntax error" in dev.log(), timeout=10, what="the syntax error log line")
        for _ in range(3):
            got = dev.run("crunch", {}, timeout=30)
            assert got["status"] == "done" and got["result"] == {"code": "good"}, got
        assert "is loaded" not in dev.log(), dev.log()[-3000:]
    finally:
        code = dev.stop()
    assert code == 0, dev.log()


def test_deleted_function_refuses_new_jobs_and_its_parked_jobs_return_with_it(examples: Project) -> None:
    """Deleting a file makes its type unknown (404); a job already queued waits for it (handed
    back, no attempt spent) instead of running on code that no longer exists, and runs
    promptly once the file comes back."""
    dev = Dev(examples.root, examples.env)
    path = examples.root / "functions" / "slowpoke.py"
    try:
        parked = dev.post("slowpoke", {}, delay=1.5).json()["id"]
        saved = path.read_text()
        path.unlink()
        wait_for(lambda: dev.post("slowpoke", {}).status_code == 404, timeout=5, interval=0.05,
                 what="the type to go")
        waiting = wait_for(lambda: (j := dev.job(parked))["deferrals"] >= 1 and j, timeout=30,
                           what="the queued job to be handed back")  # (10 s ran out on a loaded host)
        assert waiting["status"] == "scheduled" and waiting["attempt"] == 0
        path.write_text(saved)
        back = wait_for(lambda: (j := dev.job(parked))["status"] == "done" and j, timeout=5,
                        what="the waiting job to run once its function is back")
        assert back["result"] == {"code": "old"}
        assert examples.runs(parked) == ["1"]
        assert "function slowpoke removed" in dev.log()
    finally:
        assert dev.stop() == 0


def test_a_repeated_sigterm_lets_the_running_job_finish_and_a_second_ctrl_c_does_not_wait(
        examples: Project) -> None:
    """SIGTERM twice while a job runs (a stop that signals every process, then a process
    manager's own): dev still stops gracefully, the job finishes on its first attempt and
    dev exits 0. Ctrl-C twice is the way to stop at once: dev exits 130 without waiting
    for the running job, which keeps its lease."""
    dev = Dev(examples.root, examples.env)
    long_job = dev.post("slowpoke", {"seconds": 2.5}).json()["id"]
    wait_for(lambda: examples.runs(long_job), what="the long job to start")
    dev.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: "SIGTERM: " in dev.log(), timeout=5, interval=0.02, what="the stop")
    assert dev.stop(signal.SIGTERM) == 0, dev.log()
    assert "already stopping gracefully" in dev.log()
    r = examples.client.get(long_job).as_dict()
    assert r["status"] == "done" and r["attempt"] == 1 and examples.runs(long_job) == ["1"], r

    dev = Dev(examples.root, examples.env)
    other = dev.post("slowpoke", {"seconds": 10}).json()["id"]
    wait_for(lambda: examples.runs(other), what="the other job to start")
    dev.proc.send_signal(signal.SIGINT)
    wait_for(lambda: "SIGINT: " in dev.log(), timeout=5, interval=0.02, what="the stop")
    assert dev.stop(signal.SIGINT, timeout=5) == 130, dev.log()
    assert "SIGINT: exiting now" in dev.log()
    assert examples.client.get(other).as_dict()["status"] == "processing"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purpose: it serves nothing and holds no port.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


DELAY_S = 12  # the queued job's delay in the restart test below


def test_embedded_redis_keeps_jobs_across_restarts_and_never_outlives_dev(tmp_path: Path) -> None:
    """With no Redis answering at the configured URL, dev starts the packaged server with
    its data under .runner/redis; a job queued before a restart runs after it; SIGTERM,
    Ctrl-C and SIGKILL of dev all take the server down."""
    root = tmp_path / "fresh"
    shutil.copytree(REPO / "functions", root / "functions")
    shutil.copytree(REPO / "schemas", root / "schemas")
    closed = free_port()
    (root / "runner.toml").write_text(
        f'[redis]\nurl = "redis://127.0.0.1:{closed}/0"\n\n[queues.fast]\nvisibility_timeout = 5\n\n'
        '[queues.slow]\nvisibility_timeout = 60\n\n[worker]\ngrace_period = 5\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_") and k != "REDIS_URL"}
    env.update({"OUTBOX_DIR": str(root / "outbox"), "PYTHONUNBUFFERED": "1"})

    def session() -> dict[str, Any]:
        return dict(json.loads((root / ".runner" / "dev.json").read_text()))

    devs: list[Dev] = []
    servers: list[int] = []
    try:
        first = Dev(root, env)
        devs.append(first)
        assert "starting the embedded one" in first.log()
        server_pid = session()["server_pid"]
        servers.append(server_pid)
        # Far enough out that a CLI start on a loaded machine (seconds) never sees it run.
        job_id = first.post("send_email", email(7), delay=DELAY_S).json()["id"]
        # The other commands of the project find the embedded server by themselves.
        stats = subprocess.run([sys.executable, "-m", "runner.cli", "stats", "--json"], cwd=root, env=env,
                               capture_output=True, timeout=30)
        assert stats.returncode == 0, stats.stderr
        assert json.loads(stats.stdout)["queues"][0]["scheduled"] == 1
        assert first.stop(signal.SIGINT) == 0  # Ctrl-C
        wait_for(lambda: not _alive(server_pid), timeout=5, what="the embedded server to stop")
        assert not (root / ".runner" / "dev.json").exists()

        second = Dev(root, env)
        devs.append(second)
        servers.append(session()["server_pid"])
        try:
            done = second.finished(job_id, timeout=DELAY_S + 30)
            assert done["status"] == "done" and done["attempt"] == 1
        finally:
            assert second.stop() == 0
        assert (root / ".runner" / "redis").is_dir()

        third = Dev(root, env)
        devs.append(third)
        pid = session()["server_pid"]
        servers.append(pid)
        third.proc.kill()
        third.proc.wait(timeout=10)
        wait_for(lambda: not _alive(pid), timeout=5, what="the server to die with its parent")
    finally:
        # A failed step must not leave dev or its server running past the test.
        for dev in devs:
            if dev.proc.poll() is None:
                dev.proc.kill()
                dev.proc.wait(timeout=10)
        for pid in servers:
            if _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def test_runner_toml_reload_adds_a_queue_and_a_broken_one_keeps_the_last_good(examples: Project) -> None:
    """A broken runner.toml is logged and the last good one keeps serving; a new queue
    restarts the workers gracefully and a function on it runs."""
    dev = Dev(examples.root, examples.env)
    toml = examples.root / "runner.toml"
    try:
        good = toml.read_text()
        toml.write_text(good + "\n[queues.bulk]\nvisiblity_timeout = 5\n")
        wait_for(lambda: "runner.toml not reloaded" in dev.log(), timeout=5, what="the config error")
        assert "queues.bulk.visiblity_timeout" in dev.log()
        assert dev.run("send_email", email(3))["status"] == "done"

        (examples.root / "schemas" / "bulky").mkdir()
        (examples.root / "schemas" / "bulky" / "v1.json").write_text(json.dumps({"type": "object"}))
        (examples.root / "functions" / "bulky.py").write_text(
            'QUEUE = "bulk"\n\n\ndef handle(payload, ctx):\n    return {"queue": ctx.queue}\n')
        toml.write_text(good + "\n[queues.bulk]\nvisibility_timeout = 5\nconcurrency = 1\n")
        wait_for(lambda: dev.post("bulky", {}).status_code == 202, timeout=5, interval=0.05,
                 what="the function on the new queue")
        assert dev.run("bulky", {})["result"] == {"queue": "bulk"}
        assert "restarting the workers" in dev.log()
        assert dev.run("send_email", email(4))["status"] == "done"
    finally:
        assert dev.stop() == 0
