"""A child process runs the code its worker loaded, not what is on disk now. A function
file changed under a running `runner worker` (a deploy that swaps files before the
restart) reached every child started after it: a replacement after a crash ran v2 where
the worker had loaded v1, and a broken file sent the function's jobs round the hand-back
loop ("no function ... is loaded"). Only a reload brings a new version in."""

from __future__ import annotations

import json

import pytest
from crashkit import wait_final
from test_child_batches import Fed

from runner.catalog import registry as registry_mod
from runner.worker.execute import Done
from runner.worker.isolation import Generations
from runner.worker.ledger import Release
from runner.worker.slot import Slot

from conftest import Project

SKEW = '''
import os
QUEUE = "fast"
ISOLATION = "process"
MAX_ATTEMPTS = 1
V = {v}

def handle(payload, ctx):
    if payload.get("crash"):
        os._exit(1)
    return {{"v": V}}
'''


def test_a_replacement_child_runs_the_code_its_worker_loaded(project: Project) -> None:
    project.add_function("skew", SKEW.format(v=1))
    project.write_config(vt=5, concurrency=1, prefetch=0, max_attempts=1, worker="unknown_grace = 30")
    c = project.client
    project.spawn_worker("fast")
    first = c.enqueue("skew", {}).id
    assert wait_final(project, [first], timeout=60)[first]["result"] == {"v": 1}
    path = project.root / "functions" / "skew.py"
    for text in (SKEW.format(v=2), "def handle(:\n"):  # a new version, then a broken file
        path.write_text(text)
        crash = c.enqueue("skew", {"crash": True}).id  # the child dies: the next job gets a new one
        assert wait_final(project, [crash], timeout=60)[crash]["status"] == "dead"
        job = c.enqueue("skew", {}).id
        final = wait_final(project, [job], timeout=60)[job]
        assert final["status"] == "done" and final["result"] == {"v": 1}, (text, final)
        assert not final.get("deferrals"), final


FORKER = '''
import os
QUEUE = "fast"
ISOLATION = "process"
MAX_ATTEMPTS = 1
TIMEOUT = 15

def handle(payload, ctx):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            ctx.save_checkpoint({"forked": 1})
            said = "saved"
        except Exception as exc:
            said = f"{type(exc).__name__}: {exc}"
        finally:
            os.write(write, said.encode() if "said" in locals() else b"?")
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    said = os.read(read, 4096).decode()
    ctx.save_checkpoint({"parent": 1})  # the handler's own call is answered as ever
    ctx.extend_lease()
    return {"fork": said}
'''


def test_a_ctx_call_from_a_process_the_handler_forked_fails_at_once(project: Project) -> None:
    """Under process isolation a process the handler forks shares its child's channel to
    the worker, but not the thread that reads the answers: a ctx call that waits for one
    (save_checkpoint) from it hung the job to its TIMEOUT. It fails at once, saying why,
    and the handler's own calls are answered as ever."""
    project.add_function("forker", FORKER)
    project.write_config(vt=5, concurrency=1, prefetch=0, max_attempts=1)
    job = project.client.enqueue("forker", {}).id
    project.spawn_worker("fast")
    final = wait_final(project, [job], timeout=60)[job]
    assert final["status"] == "done", final.get("last_error")
    said = final["result"]["fork"]
    assert said.startswith("RunnerError") and "forked" in said, said
    took = (final["finished_at"] - final["started_at"])
    assert took < 10, f"the job took {took:.1f} s"


def test_a_child_started_just_after_a_reload_runs_its_generations_code(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reload (`runner dev`) that lands between an executor's look at the functions and
    its child's start: the child is for the generation the executor validated the job
    against, and runs that generation's code. Its code was never kept (only the newest
    generation's was made, on demand), so the child read the files on disk, the newer
    version, and ran v2 for a job the worker had taken as v1's."""
    project.add_function("skew", SKEW.format(v=1))
    project.write_config(grace=1)
    for k, v in project.env.items():  # the child inherits this process's environment
        monkeypatch.setenv(k, v)
    cfg = project.config()
    generations = Generations()
    first = registry_mod.load(cfg)
    g1 = generations.of(first)  # an executor takes a job of v1 ...
    (project.root / "functions" / "skew.py").write_text(SKEW.format(v=2))
    assert generations.of(registry_mod.load(cfg, first)) == g1 + 1  # ... and a reload lands
    slot = Slot(cfg.queues["fast"], cfg, 1.0, generations.code)
    try:
        fed = Fed(project, first.functions["skew"], "j0", {}, True)
        slot.run([fed], g1, {}, lambda: False)
        assert isinstance(fed.outcome, Done), fed.outcome
        assert json.loads(fed.outcome.result) == {"v": 1}, fed.outcome
    finally:
        slot.close()


def test_a_child_two_reloads_late_is_not_started_and_its_job_goes_back(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two reloads between an executor's look and its child's start: that generation's
    code is no longer kept, so no child starts for it (it would run code the job was not
    taken for); the job goes back unspent, to run under the code loaded now."""
    project.add_function("skew", SKEW.format(v=1))
    project.write_config(grace=1)
    for k, v in project.env.items():
        monkeypatch.setenv(k, v)
    cfg = project.config()
    generations = Generations()
    first = registry_mod.load(cfg)
    g1 = generations.of(first)
    latest = first
    for v in (2, 3):
        (project.root / "functions" / "skew.py").write_text(SKEW.format(v=v))
        latest = registry_mod.load(cfg, latest)
        generations.of(latest)
    slot = Slot(cfg.queues["fast"], cfg, 1.0, generations.code)
    try:
        fed = Fed(project, first.functions["skew"], "j0", {}, True)
        slot.run([fed], g1, {}, lambda: False)
        assert isinstance(fed.outcome, Release), fed.outcome
        assert slot.child is None and slot.failures == 0
    finally:
        slot.close()
