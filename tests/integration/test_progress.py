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


DEEP = '''"""Reports progress, then one nested past the limit, then runs until cancelled."""
import time

QUEUE = "slow"
TIMEOUT = 60
{extra}

def handle(payload, ctx):
    ctx.progress(50, "half way")
    deep = 1
    for _ in range(payload["levels"]):
        deep = [deep]
    ctx.progress(deep, payload.get("message"))
    ctx.logger.info("sent")
    while not ctx.cancelled:
        time.sleep(0.02)
    ctx.raise_if_cancelled()
'''


@pytest.mark.parametrize("isolation,levels,message", [("thread", 121, None), ("thread", 140, "deep"),
                                                      ("process", 125, None)])
def test_a_report_past_the_nesting_limit_is_dropped_keeping_the_last_one(
        project: Project, isolation: str, levels: int, message: str | None) -> None:
    """ctx.progress is held to the one limit (120 levels): a report past it is dropped
    with a warning in the job's log, and the last good report stays shown. One of 121 to
    128 levels was shown as it was; one past 128 replaced it with {"unparsable": ...}."""
    extra = 'ISOLATION = "process"' if isolation == "process" else ""
    (project.root / "functions" / "deep.py").write_text(DEEP.format(extra=extra))
    (project.root / "schemas" / "deep").mkdir(exist_ok=True)
    (project.root / "schemas" / "deep" / "v1.json").write_text('{"type":"object"}')
    project.write_config(grace=1)
    client = project.client
    job_id = client.enqueue("deep", {"levels": levels, "message": message}).id
    project.spawn_worker("slow")
    # The log line after the report rides on a renewal with the latest report.
    wait_for(lambda: any(line["msg"] == "sent" for line in client.logs(job_id)["lines"]), timeout=60,
             what="the line after the report")
    assert client.get(job_id).as_dict()["progress"] == {"percent": 50, "message": "half way"}
    warnings = [line["msg"] for line in client.logs(job_id)["lines"] if line["level"] == "WARNING"]
    assert len(warnings) == 1 and "120 levels" in warnings[0], warnings
    client.cancel(job_id)
    assert client.settle(job_id, 10).status == "cancelled"


ENDS = '''"""Reports progress, logs a line after it, then: a durable step, a retry, a sleep or a wait."""
import time

from runner import Retry

QUEUE = "slow"
TIMEOUT = 60
MAX_ATTEMPTS = 3
{extra}

def handle(payload, ctx):
    ctx.progress(10, "early")
    ctx.progress(90, "final")
    ctx.logger.info("after the final report")
    mode = payload["mode"]
    if mode == "step":
        ctx.step("s1", lambda: 1)
        time.sleep(3)  # (a renewal would send the progress by now: the line was seen before)
        return None
    if mode == "sleep":
        ctx.sleep("nap", 120)
    if mode == "signal":
        ctx.wait_for_signal("go", timeout=600)
    raise Retry(delay=120)
'''


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_line_is_seen_with_the_progress_reported_before_it_whatever_ends_the_run(
        project: Project, isolation: str) -> None:
    """The progress reported before a log line goes with the line, however the run's lines
    are written: a durable step writes them ahead of its record, and a run that ends in a
    retry, a durable sleep or a signal wait writes them with its settlement. Such a run's
    last report was never written (the job showed the one before it for as long as it
    waited), and a step's came only with the next renewal, after the line."""
    extra = 'ISOLATION = "process"' if isolation == "process" else ""
    (project.root / "functions" / "ends.py").write_text(ENDS.format(extra=extra))
    (project.root / "schemas" / "ends").mkdir(exist_ok=True)
    (project.root / "schemas" / "ends" / "v1.json").write_text('{"type":"object"}')
    project.write_config(grace=1)
    client = project.client
    modes = ("step", "retry", "sleep", "signal")
    ids = {mode: client.enqueue("ends", {"mode": mode}).id for mode in modes}
    project.spawn_worker("slow")
    seen: dict[str, object] = {}

    def look() -> bool:
        for mode, job_id in ids.items():
            if mode in seen:
                continue
            if any(line["msg"] == "after the final report" for line in client.logs(job_id)["lines"]):
                seen[mode] = client.get(job_id).as_dict().get("progress")
        return len(seen) == len(ids)

    wait_for(look, timeout=60, interval=0.01, what="every job's line")
    final = {"percent": 90, "message": "final"}
    assert seen == {mode: final for mode in modes}


STEPS = '''"""Reports progress before each of five durable steps, and writes no log line."""
import time

QUEUE = "slow"
TIMEOUT = 60
{extra}

def handle(payload, ctx):
    for i in range(1, 6):
        ctx.progress(10 * i, f"step {{i}}")
        ctx.step(f"s{{i}}", lambda: i)
        time.sleep(0.2)
    time.sleep(1.5)
'''


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_step_writes_the_progress_reported_before_it_with_its_record(project: Project, isolation: str) -> None:
    """A durable step writes the run's pending progress in the same call as its record,
    fenced by the claim token, whether or not log lines are pending: whoever sees a step
    sees the progress reported before it. Before, a step with no line pending left it to
    the next lease renewal (up to a second later), so a reader saw the step beside the
    progress of the step before it."""
    extra = 'ISOLATION = "process"' if isolation == "process" else ""
    (project.root / "functions" / "steps.py").write_text(STEPS.format(extra=extra))
    (project.root / "schemas" / "steps").mkdir(exist_ok=True)
    (project.root / "schemas" / "steps" / "v1.json").write_text('{"type":"object"}')
    project.write_config(grace=1)
    client = project.client
    job_id = client.enqueue("steps", {}).id
    project.spawn_worker("slow")
    seen: list[tuple[int, object]] = []

    def look() -> bool:
        view = client.get(job_id).as_dict()
        steps = len(view.get("steps") or [])
        if steps:
            seen.append((steps, view.get("progress")))
        return steps == 5 or view["status"] in ("done", "dead", "cancelled")

    wait_for(look, timeout=60, interval=0.005, what="every step")
    assert seen, "no step seen"
    late = [(steps, shown) for steps, shown in seen
            if not isinstance(shown, dict) or not isinstance(shown.get("percent"), (int, float))
            or shown["percent"] < 10 * steps]
    assert not late, f"steps seen before the progress reported ahead of them: {late[:5]}"
    assert client.wait(job_id, 30).status == "done"
