"""A worker stopped by SIGTERM exits once its stop is done, whatever threads a
thread-isolated handler left running: a thread of its own that is not a daemon, or a
long task on a module-level ThreadPoolExecutor. Python's exit waits for such threads,
so the worker logged "stopped" and stayed up until the platform's SIGKILL (30 s on a
PaaS, 90 s under systemd), with every later SIGTERM ignored."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from conftest import Project, wait_for

LEAVES = '''
import threading, time
from concurrent.futures import ThreadPoolExecutor
QUEUE = "fast"
POOL = ThreadPoolExecutor(2)

def handle(payload, ctx):
    if payload["how"] == "thread":
        threading.Thread(target=time.sleep, args=(120,), daemon=False).start()
    elif payload["how"] == "atexit":  # an exit hook of the handler's own that waits for its task
        import atexit
        POOL.submit(time.sleep, 120)
        atexit.register(POOL.shutdown)
    else:
        POOL.submit(time.sleep, 120)
    return {}
'''


@pytest.mark.parametrize("how", ["thread", "pool", "atexit"])
def test_a_sigterm_ends_the_worker_though_a_handler_left_a_thread_running(project: Project, how: str) -> None:
    project.add_function("leaves", LEAVES)
    job = project.client.enqueue("leaves", {"how": how}).id
    w = project.spawn_worker("fast")
    wait_for(lambda: project.client.get(job).status == "done", timeout=30, what="the job done")
    t0 = time.monotonic()
    w.send_signal(signal.SIGTERM)
    try:
        code = w.wait(timeout=15)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the worker was still up {time.monotonic() - t0:.0f} s after SIGTERM") from None
    assert code == 0, code
    log = (project.root / "worker-0.log").read_text()
    warned = [line for line in log.splitlines() if "exiting without them" in line]
    assert len(warned) == 1 and ("Thread-" in warned[0] or "ThreadPoolExecutor-" in warned[0]), log[-2000:]
    assert "runner-" not in warned[0] and "scheduler-" not in warned[0], warned  # (never runner's own)


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_plain_stop_names_no_thread(project: Project, isolation: str) -> None:
    """A worker whose handlers left nothing running stops without the warning (runner's
    own idle pools are not a handler's threads)."""
    project.write_config(concurrency=1)  # one job: one child under process isolation, not eight
    project.add_function("plain", f'QUEUE = "fast"\nISOLATION = "{isolation}"\n\n'
                                  "def handle(payload, ctx):\n    return {}\n")
    job = project.client.enqueue("plain", {}).id
    w = project.spawn_worker("fast")
    wait_for(lambda: project.client.get(job).status == "done", timeout=30, what="the job done")
    w.send_signal(signal.SIGTERM)
    assert w.wait(timeout=15) == 0
    log = (project.root / "worker-0.log").read_text()
    assert "exiting without them" not in log, log[-2000:]


def test_runner_dev_too_exits_past_a_handler_s_thread(project: Project) -> None:
    """`runner dev` stopped by SIGTERM exits as the worker does."""
    import os
    import sys

    from runner.store.embedded import free_port

    project.add_function("leaves", LEAVES)
    proc = subprocess.Popen([sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"),
                             "dev", "--port", str(free_port())], cwd=project.root, env=project.env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        job = project.client.enqueue("leaves", {"how": "thread"}).id
        wait_for(lambda: project.client.get(job).status == "done", timeout=60, what="the job done under dev")
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            raise AssertionError("runner dev was still up 20 s after SIGTERM") from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


SITE = '''
import atexit, json, os
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

class ToFile(SpanExporter):
    def export(self, spans):
        with open(os.environ["SPANS_OUT"], "a") as f:
            for s in spans:
                f.write(json.dumps({"name": s.name}) + "\\n")
        return SpanExportResult.SUCCESS

# As an application or `opentelemetry-instrument` sets it up: spans sent in batches, the
# last ones at exit (the provider registers its own shutdown as an exit hook).
provider = TracerProvider()
provider.add_span_processor(BatchSpanProcessor(ToFile(), schedule_delay_millis=60_000))
trace.set_tracer_provider(provider)
'''


def test_a_handler_s_blocking_exit_hook_does_not_lose_the_spans_of_finished_jobs(project: Project) -> None:
    """The exit hooks run last-registered first, on one thread, for EXIT_HOOKS_S: a
    handler's hook that blocks (its pool's shutdown) kept every hook registered before
    it from running, the tracing provider's shutdown among them, and the spans of the
    jobs the worker had finished, still queued for export, were lost (0 of 105 exported
    after 20 jobs). The worker sends them before it runs the hooks."""
    site = project.root / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITE)
    spans = project.root / "spans.jsonl"
    project.add_function("leaves", LEAVES)
    job = project.client.enqueue("leaves", {"how": "atexit"}).id
    w = project.spawn_worker("fast", env={"SPANS_OUT": str(spans),
                                          "PYTHONPATH": f"{site}:{project.env.get('PYTHONPATH', '')}"})
    wait_for(lambda: project.client.get(job).status == "done", timeout=30, what="the job done")
    w.send_signal(signal.SIGTERM)
    assert w.wait(timeout=15) == 0
    names = spans.read_text().splitlines() if spans.exists() else []
    assert '{"name": "run leaves"}' in names, (names, (project.root / "worker-0.log").read_text()[-2000:])
