"""Every time a user sees comes from the Redis server's clock, not a host's: a producer
and a worker whose clocks run 2 h ahead (libfaketime on real processes) make a job whose
created, started and finished times, and its history's, are the server's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import Project, wait_for

FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
# Monotonic stays true: with it faked, every timed wait on a condition (Event.wait) waits
# the 2 h offset as well. But libfaketime 0.9.10 then fails each absolute clock_nanosleep
# on the monotonic clock with EINVAL, which is how time.sleep sleeps, so the faked
# processes sleep through select() instead (sitecustomize below).
SHIM = """import select, time
def _sleep(seconds: float) -> None:
    select.select([], [], [], max(0.0, seconds))
time.sleep = _sleep
"""


@pytest.fixture
def ahead(tmp_path: Path) -> dict[str, str]:
    shim = tmp_path / "faketime-shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(SHIM)
    path = os.pathsep.join(p for p in (str(shim), os.environ.get("PYTHONPATH", "")) if p)
    return {"LD_PRELOAD": str(FAKETIME), "FAKETIME": "+2h", "DONT_FAKE_MONOTONIC": "1", "PYTHONPATH": path}

pytestmark = pytest.mark.skipif(not FAKETIME.exists(), reason="needs libfaketime (apt-get install faketime)")


def _enqueue_ahead(project: Project, payload: dict[str, object], ahead: dict[str, str]) -> str:
    out = subprocess.run([sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"),
                          "enqueue", "perm" if payload.get("fail") else "record", json.dumps(payload), "--json"],
                         cwd=project.root, env={**project.env, **ahead}, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    job_id: str = json.loads(out.stdout)["id"]
    # The producer's clock is ahead: its id begins with that clock (what the bug showed).
    assert int(job_id[:12], 16) / 1000 > _server_s(project) + 3600
    return job_id


def _server_s(project: Project) -> float:
    sec, usec = project.runtime.redis.time()
    return int(sec) + int(usec) / 1e6


def test_times_of_a_job_from_a_producer_and_a_worker_2h_ahead_are_the_servers(
    project: Project, ahead: dict[str, str]
) -> None:
    """A done job and a dead one (with its history) made by a producer 2 h ahead and run
    by a worker 2 h ahead: created <= started <= finished, each within a minute of the
    server's clock, and every history entry's times too."""
    c = project.client
    before = _server_s(project)
    done = _enqueue_ahead(project, {"n": 1}, ahead)
    dead = _enqueue_ahead(project, {"fail": True}, ahead)
    project.spawn_worker("fast", env=ahead)
    wait_for(lambda: c.get(done).status == "done" and c.get(dead).status == "dead", timeout=30,
             what="both jobs to end")
    after = _server_s(project)
    for job_id in (done, dead):
        view = c.get(job_id).as_dict()
        times = [view["created_at"], view["enqueued_at"], view["started_at"], view["finished_at"]]
        assert all(t is not None and before - 1 <= t <= after + 1 for t in times), (job_id, times, before, after)
        assert times == sorted(times), (job_id, times)
        assert view["history"], job_id
        for entry in view["history"]:
            for key in ("at_ms", "started_ms"):
                assert before - 1 <= entry[key] / 1000 <= after + 1, (job_id, entry, before, after)
    project.stop_all()
    assert os.environ.get("FAKETIME") is None  # the test's own process runs on the true clock


def test_queue_figures_of_a_web_process_2h_ahead_are_by_the_servers_clock(
    project: Project, ahead: dict[str, str]
) -> None:
    """A web process whose clock runs 2 h ahead: GET /queues gives the waiting job's
    oldest_ready_age_s in seconds, not 2 h, and GET /throughput's window ends at the
    server's minute, so the job done just now is in it."""
    from test_web_support import gunicorn

    c = project.client
    done = c.enqueue("record", {"n": 1}).id
    worker = project.spawn_worker("fast")
    wait_for(lambda: c.get(done).status == "done", timeout=30, what="the job to finish")
    worker.send_signal(signal.SIGTERM)  # a stop adds the figures it holds (a SIGKILL may lose a second's)
    assert worker.wait(timeout=30) == 0
    c.enqueue("record", {"n": 2})
    with gunicorn(project, env=ahead) as web:
        (fast,) = [q for q in web.get("/queues").json()["queues"] if q["name"] == "fast"]
        assert fast["oldest_ready_age_s"] is not None and fast["oldest_ready_age_s"] < 600, fast
        series = web.get("/throughput?minutes=5").json()
        assert sum(series["queues"]["fast"]["done"]) == 1, series
        assert abs(series["times"][-1] - _server_s(project)) < 120, series["times"]
        metrics = web.get("/metrics").text
        (age,) = [line for line in metrics.splitlines()
                  if line.startswith('runner_queue_oldest_ready_age_seconds{queue="fast"}')]
        assert float(age.split()[-1]) < 600, age


LOGGER = '''
import os
QUEUE = "fast"
ISOLATION = "{isolation}"

def handle(payload, ctx):
    ctx.logger.info("a line")
    print("said on stdout")
    ctx.stream("a chunk")
'''


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_workers_log_lines_and_stream_chunks_carry_the_servers_time(project: Project, ahead: dict[str, str],
                                                                      isolation: str) -> None:
    """A worker 2 h ahead: its job's log lines (ctx.logger, and a child's stdout) and its
    stream's chunks are stamped with the server's time, as every time shown (they showed
    the host's, 2 h off)."""
    project.write_config(concurrency=1)  # one job: one child, not eight
    project.add_function("logger", LOGGER.format(isolation=isolation))
    c = project.client
    before = _server_s(project)
    job = c.enqueue("logger", {}).id
    project.spawn_worker("fast", env=ahead)
    wait_for(lambda: c.get(job).status == "done", timeout=30, what="the job to end")
    after = _server_s(project)
    lines = c.logs(job)["lines"]
    from runner.client import watching

    chunks = watching.stream_chunks(c, job)["chunks"]
    assert chunks, "no chunk kept"
    assert lines and all(before - 1 <= x["ts"] / 1000 <= after + 1 for x in lines), (lines, before, after)
    assert all(before - 1 <= x["ts"] / 1000 <= after + 1 for x in chunks), (chunks, before, after)
