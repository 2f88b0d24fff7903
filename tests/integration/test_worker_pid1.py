"""A worker started as PID 1 of a pid namespace (as a container starts its exec-form
command without an init) warns at start that it reaps no orphans, and says what to do."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from conftest import Project, wait_for

THREADED = '''
QUEUE = "fast"

def handle(payload, ctx):
    return {}
'''


def test_a_worker_that_is_pid_1_warns_that_it_needs_an_init(project: Project) -> None:
    """``runner worker`` as PID 1 serving thread-mode functions logs the warning once at
    start, naming `docker run --init` and compose's `init: true`, and goes on serving."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed (install util-linux: apt-get install util-linux)")
    if subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True).returncode:
        pytest.skip("this host does not allow a pid namespace (unshare --pid needs CAP_SYS_ADMIN)")
    project.add_function("threaded", THREADED)
    project.write_config()
    log = project.root / "pid1.log"
    args = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", sys.executable, "-m", "runner.cli",
            "--config", str(project.root / "runner.toml"), "worker", "--queue", "fast"]
    proc = subprocess.Popen(args, cwd=project.root, env=project.env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    project.procs.append(proc)
    job = project.client.enqueue("threaded", {}).id
    wait_for(lambda: project.client.get(job).status == "done", timeout=30, what="the job to run")
    out = log.read_text(errors="replace")
    assert out.count("this worker is PID 1 with no init") == 1, out
    assert "docker run --init" in out and "init: true" in out, out
