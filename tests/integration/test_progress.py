"""Progress: ctx.progress(percent, message) is batched onto the lease renewal and shown by
GET /jobs/{id} (via the client) and `runner job` within 2 s, in threads and under process
isolation."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from conftest import Project, wait_for

PROG = '''"""Reports progress, then runs until cancelled."""
import time

QUEUE = "slow"
TIMEOUT = 60
{extra}

def handle(payload, ctx):
    for i in range(1000):  # many reports: only the latest is sent
        ctx.progress(i / 20, "warming up")
    ctx.progress(50, "half way")
    while not ctx.cancelled:
        time.sleep(0.02)
    ctx.raise_if_cancelled()
'''


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_progress_is_visible_within_2_s(project: Project, isolation: str) -> None:
    """The handler's last report shows as {"percent", "message"} within 2 s of being made."""
    extra = 'ISOLATION = "process"' if isolation == "process" else ""
    (project.root / "functions" / "prog.py").write_text(PROG.format(extra=extra))
    (project.root / "schemas" / "prog").mkdir(exist_ok=True)
    (project.root / "schemas" / "prog" / "v1.json").write_text(
        '{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object"}')
    project.write_config(grace=1)
    client = project.client
    job_id = client.enqueue("prog", {}).id
    project.spawn_worker("slow")
    # Started: its handler has it (under process isolation a claimed job shows processing
    # while its child starts, which takes seconds on a loaded machine).
    wait_for(lambda: client.get(job_id).as_dict().get("started_at") is not None, timeout=30,
             what="the job to start")
    t0 = time.monotonic()
    want = {"percent": 50, "message": "half way"}
    wait_for(lambda: client.get(job_id).as_dict().get("progress") == want, timeout=5, what="the progress")
    assert time.monotonic() - t0 < 2.5
    shown = subprocess.run([sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"),
                            "job", job_id, "--json"], env=project.env, capture_output=True, text=True, timeout=60)
    assert json.loads(shown.stdout)["progress"] == want, shown.stderr
    client.cancel(job_id)
    assert client.settle(job_id, 10).status == "cancelled"
