"""The repository's Procfile run the way a PaaS runs it: the release line as the deploy gate,
then web, worker and slow under honcho with PORT, WEB_CONCURRENCY, REDIS_URL and the API
token set; jobs enqueued over HTTP complete, and a SIGTERM to everything shuts down
cleanly (a job running at that moment finishes) well inside the 30 s kill deadline."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import requests
from honcho.environ import parse_procfile

from runner.store.embedded import Server, free_port

from conftest import REPO, make_project, wait_for

TOKEN = "s3cret-token"


def live_members(pgid: int) -> list[int]:
    """Processes of a group that still run (an exited one waiting to be reaped does not)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def test_procfile_processes_serve_run_jobs_and_stop_cleanly(tmp_path: Path, server: Server) -> None:
    p = make_project(tmp_path / "app", server, examples=True)
    p.write_config(vt=5, slow_vt=60, grace=10)
    shutil.copy(REPO / "Procfile", p.root / "Procfile")
    procfile = parse_procfile((p.root / "Procfile").read_text())
    assert set(procfile.processes) >= {"release", "web", "worker", "slow"}

    port = free_port()
    env = {**p.env, "PORT": str(port), "WEB_CONCURRENCY": "2", "RUNNER_API_TOKEN": TOKEN}
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")

    release = subprocess.run(procfile.processes["release"], shell=True, cwd=p.root, env=env,
                             capture_output=True, timeout=60)
    assert release.returncode == 0, release.stdout + release.stderr

    log_path = p.root / "honcho.log"
    honcho = subprocess.Popen([sys.executable, "-m", "honcho", "start", "web", "worker", "slow"],
                              cwd=p.root, env=env, stdout=log_path.open("wb"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {TOKEN}"}

    def up() -> bool:
        assert honcho.poll() is None, log_path.read_text()
        try:
            return requests.get(base + "/healthz", timeout=1).status_code == 200
        except (requests.ConnectionError, requests.Timeout):  # accepted, not yet serving
            return False

    def job(job_id: str) -> dict[str, Any]:
        return dict(requests.get(f"{base}/jobs/{job_id}", headers=auth, timeout=5).json())

    try:
        wait_for(up, timeout=30, interval=0.05, what="the web process on $PORT")
        assert requests.post(base + "/jobs/send_email", json={}, timeout=5).status_code == 401
        email = requests.post(base + "/jobs/send_email", headers=auth, timeout=5, json={
            "user_id": 1, "to": ["ada@example.com"], "name": "Ada", "template": "welcome"})
        assert email.status_code == 202, email.text
        done = wait_for(lambda: (j := job(email.json()["id"]))["status"] == "done" and j, timeout=20,
                        what="the fast worker to run the email")
        assert done["result"]["via"] == "outbox"
        report = requests.post(base + "/jobs/refresh_report", headers=auth, timeout=5,
                               json={"report_id": "r1", "chunks": 15, "chunk_seconds": 0.1}).json()["id"]
        wait_for(lambda: job(report)["status"] == "processing", timeout=20, what="the slow worker to start")
    finally:
        honcho.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        code = honcho.wait(timeout=40)
        took = time.monotonic() - t0
    out = log_path.read_text(errors="replace")
    # honcho starts each line under /bin/sh -c; where that shell does not exec its command
    # (dash), the shell itself dies of the SIGTERM (143) while the process under it stops
    # gracefully. What counts: no SIGKILL, every process group empty, every process's log.
    assert code in (0, 143), out
    assert took < 30, f"shutdown took {took:.1f} s"
    assert "SIGKILL" not in out, out
    groups = [int(m) for m in re.findall(r"sending SIGTERM to \S+ \(pid (\d+)\)", out)]
    assert len(groups) == 3, out
    assert [live_members(g) for g in groups] == [[], [], []]
    assert "Shutting down: Master" in out  # gunicorn, gracefully
    assert out.count(" stopped") >= 2, out  # both workers, gracefully
    finished = p.client.get(report).as_dict()
    assert finished["status"] == "done" and finished["attempt"] == 1, json.dumps(finished)[:500]


STOPPED_MID_RUN = '''"""Runs for payload["seconds"] in a child process; one attempt only."""
import os
import time

QUEUE = "slow"
ISOLATION = "process"
MAX_ATTEMPTS = 1
TIMEOUT = 60


def handle(payload, ctx):
    with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id), "a") as f:
        f.write(f"start {ctx.attempt}\\n")
    time.sleep(payload["seconds"])
    with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id), "a") as f:
        f.write("end\\n")
    return "finished"
'''


def descendants(pid: int) -> list[int]:
    """``pid`` and every process under it (read from /proc)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += parents.get(p, [])
    return out


def test_a_stop_that_signals_every_process_under_honcho_lets_the_running_job_finish(
        tmp_path: Path, server: Server) -> None:
    """A Procfile's worker under honcho, stopped the way Heroku stops a dyno running
    `honcho start` (and systemd's KillMode=control-group a unit): SIGTERM to every process
    at once, and then honcho forwards its own SIGTERM to the worker. The process-isolated
    job, 1 s into a 4 s run with one attempt allowed, finishes within the 20 s grace period:
    done on its first attempt, run once; the job queued behind it stays queued with no
    attempt spent. (The worker read the second SIGTERM as "exit now": the job was left
    processing with its only attempt spent, and went dead as "worker lost".)"""
    p = make_project(tmp_path / "app", server)
    (p.root / "functions" / "stopped_mid_run.py").write_text(STOPPED_MID_RUN)
    shutil.copytree(p.root / "schemas" / "slow", p.root / "schemas" / "stopped_mid_run")
    p.write_config(slow_vt=60, grace=20)
    toml = p.root / "runner.toml"  # one job at a time on slow: the second waits behind the first
    toml.write_text(toml.read_text().replace("concurrency = 2\n", "concurrency = 1\n"))
    (p.root / "Procfile").write_text("slow: runner worker --queue slow\n")
    env = {**p.env, "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}
    log_path = p.root / "honcho.log"
    honcho = subprocess.Popen([sys.executable, "-m", "honcho", "start", "slow"], cwd=p.root, env=env,
                              stdout=log_path.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        running = p.client.enqueue("stopped_mid_run", {"seconds": 4}).id
        wait_for(lambda: p.runs(running), timeout=60, interval=0.05, what="the handler to start")
        behind = p.client.enqueue("stopped_mid_run", {"seconds": 0}).id
        time.sleep(1.0)  # a second into its run
        for pid in descendants(honcho.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        honcho.wait(timeout=40)
    finally:  # (a failed step leaves nothing running: honcho starts each line in a session of its own)
        for pid in descendants(honcho.pid) if honcho.poll() is None else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        honcho.wait(timeout=10)
    out = log_path.read_text(errors="replace")
    assert "sending SIGTERM to slow" in out, out  # honcho forwarded its own
    r = p.client.get(running).as_dict()
    assert r["status"] == "done" and r["attempt"] == 1 and r["result"] == "finished", out
    assert p.runs(running) == ["start 1", "end"]
    b = p.client.get(behind).as_dict()
    assert b["status"] == "queued" and b["attempt"] == 0 and not p.runs(behind), json.dumps(b)[:500]
