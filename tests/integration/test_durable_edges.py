"""Durable functions at their edges, through real workers: a worker frozen past its lease
never runs a step the reclaiming run recorded, a child held by an idempotency key never
leaves its parent waiting, internal signal names are refused, every accepted value reads
back, durable calls from another thread are refused, kept signals are bounded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
import requests
from durable_helpers import ISOLATION_IDS, ISOLATIONS, marked
from test_web_support import runner_web

from runner.store.embedded import Server
from runner.testing import run_inline

from conftest import Project, wait_for, worker_project

GAP = marked('''def handle(payload, ctx):
    d = os.environ["RECORD_DIR"]
    ctx.step("a", mark, "a", ctx)
    open(os.path.join(d, "between-" + str(os.getpid())), "w").close()
    while not os.path.exists(os.path.join(d, "go")):
        time.sleep(0.01)
    try:
        ctx.step("b", mark, "b", ctx)
        ctx.step("c", mark, "c", ctx)
    finally:
        open(os.path.join(d, "after-" + str(os.getpid())), "w").close()
    return "ok"
''', imports='import os, time\n', options='TIMEOUT = 15\n', writes='str(os.getpid())')


def _pids(pid: int) -> list[int]:
    """``pid`` and its child processes."""
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [pid, *(int(p) for p in out.split())]


@pytest.mark.parametrize("isolation", ISOLATIONS, ids=ISOLATION_IDS)
def test_a_worker_frozen_past_its_lease_never_runs_a_step_recorded_since(project: Project, isolation: str) -> None:
    """A worker stopped (SIGSTOP) between two steps for longer than its lease comes back
    after another worker reclaimed the job and recorded the next steps: the frozen run
    sees its lease is gone before it calls the next step's function, so each step's side
    effect happened once."""
    # One job: one child a worker, not eight. (Its child then got the job as it came up,
    # after the claim: a child that counted the lease from then ran step b twice.)
    project.write_config(concurrency=1)
    project.add_function("gap", GAP.format(isolation=isolation))
    c = project.client
    w1 = project.spawn_worker("fast")
    job = c.enqueue("gap", {}).id
    wait_for(lambda: any(p.name.startswith("between-") for p in project.records.iterdir()), timeout=20,
             what="the first run to reach the gap")
    frozen = _pids(w1.pid)
    for p in frozen:
        os.kill(p, signal.SIGSTOP)
    try:
        (project.records / "go").touch()
        project.spawn_worker("fast")
        assert c.wait(job, 30).as_dict()["status"] == "done"
    finally:
        for p in frozen:
            os.kill(p, signal.SIGCONT)
    wait_for(lambda: len([p for p in project.records.iterdir() if p.name.startswith("after-")]) == 2,
             timeout=20, what="the frozen run to go on")
    for name in ("a", "b", "c"):
        assert len((project.records / f"{job}-{name}").read_text().splitlines()) == 1, name


KEYED = '''
QUEUE = "fast"

def handle(payload, ctx):
    try:
        return ctx.invoke("noop", {}, idempotency_key="shared-key")
    except TypeError as exc:
        return {"refused": str(exc)}
'''


def test_invoke_refuses_an_idempotency_key_rather_than_wait_for_a_child_never_written(
        edges: tuple[Project, str]) -> None:
    """A child held by another job's idempotency key would be deduplicated away and its
    parent would wait for it up to a year: ctx.invoke refuses the option at the call,
    saying why the child's own id already makes it once per call."""
    c = edges[0].client
    c.enqueue("noop", {}, idempotency_key="shared-key")
    done = c.wait(c.enqueue("keyed", {}).id, 30).as_dict()
    assert done["status"] == "done", done
    assert "idempotency_key" in done["result"]["refused"] and ".c" in done["result"]["refused"], done


WAITS = '''
QUEUE = "fast"

def handle(payload, ctx):
    return ctx.wait_for_signal(payload["name"], timeout=600)
'''


def test_a_child_s_signal_name_is_reserved_everywhere(edges: tuple[Project, str]) -> None:
    """child.<n> is the signal a child's end sends its parent: POST /jobs/{id}/signals/child.0
    is a 400 naming the reservation, client.signal and `runner signal` refuse it, and a
    handler's wait_for_signal("child.0") raises; the waiting job gets nothing forged."""
    project, url = edges
    c = project.client
    job = c.enqueue("waits", {"name": "approval"}).id
    wait_for(lambda: c.get(job).status == "waiting", timeout=20, what="the job to wait")
    r = requests.post(f"{url}/jobs/{job}/signals/child.0", json={"status": "done", "result": 1},
                      headers={"Authorization": "Bearer t"}, timeout=10)
    assert r.status_code == 400 and "reserved" in r.json()["detail"], r.text
    with pytest.raises(ValueError, match="reserved"):
        c.signal(job, "child.0", {"status": "done"})
    cli = [sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"), "signal"]
    out = subprocess.run([*cli, job, "child.12", "1"], env=project.env, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "reserved" in out.stderr, out
    assert c.get(job).status == "waiting"
    ran = run_inline("waits", {"name": "child.0"}, project=project.root)
    assert ran.error is not None and "reserved" in ran.error["message"], ran


DEEP = '''
QUEUE = "fast"

def nest(n):
    v = []
    for _ in range(n - 1):
        v = [v]
    return v

def handle(payload, ctx):
    value = ctx.step("deep", nest, payload["d"])
    ctx.sleep("nap", 0.2)
    got = ctx.wait_for_signal("go", timeout=600) if payload.get("wait") else None
    ctx.step("after", lambda: 1)
    return {"ok": value == nest(payload["d"]), "got": got is not None}
'''


def _nest(n: int) -> list[object]:
    v: list[object] = []
    for _ in range(n - 1):
        v = [v]
    return v


def test_every_step_value_and_signal_body_accepted_reads_back(edges: tuple[Project, str]) -> None:
    """One nesting limit, 120 levels, holds at every entry to the step log: a step value of
    120 levels is recorded and replayed past a sleep, one of 121 fails the step for good
    naming the limit; a signal body of 121 levels is a 400 over HTTP and an error from the
    client, one of 120 resumes the job. An entry that cannot be read fails the job saying
    so, not as a non-deterministic replay."""
    project, url = edges
    c = project.client
    ok = c.wait(c.enqueue("deep", {"d": 120}).id, 30).as_dict()
    assert ok["status"] == "done" and ok["result"]["ok"], ok
    over = c.wait(c.enqueue("deep", {"d": 121}).id, 30).as_dict()
    assert over["status"] == "dead" and over["last_error"]["type"] == "StepTooLarge", over
    assert "120" in over["last_error"]["message"], over
    job = c.enqueue("deep", {"d": 1, "wait": True}).id
    wait_for(lambda: c.get(job).status == "waiting", timeout=20, what="the job to wait")
    r = requests.post(f"{url}/jobs/{job}/signals/go", json=_nest(121),
                      headers={"Authorization": "Bearer t"}, timeout=10)
    assert r.status_code == 400 and "120" in r.json()["detail"], r.text
    r = requests.post(f"{url}/jobs/{job}/signals/go", json=_nest(200),
                      headers={"Authorization": "Bearer t"}, timeout=10)
    assert r.status_code == 400 and "120" in r.json()["detail"] and r.json()["max_depth"] == 120, r.text
    with pytest.raises(ValueError, match="120"):
        c.signal(job, "go", _nest(121))
    assert c.signal(job, "go", _nest(120)) == "resumed"
    assert c.wait(job, 30).as_dict()["result"] == {"ok": True, "got": True}
    damaged = c.enqueue("deep", {"d": 1, "wait": True}).id
    wait_for(lambda: c.get(damaged).status == "waiting", timeout=20, what="the job to wait")
    project.runtime.redis.hset(project.keys().job(damaged) + ":s", "step:0", "{not json")
    c.signal(damaged, "go", 1)
    dead = c.wait(damaged, 30).as_dict()
    assert dead["status"] == "dead", dead
    assert "non-deterministic" not in dead["last_error"]["message"], dead
    assert "cannot be read" in dead["last_error"]["message"], dead


THREADED = marked('''def handle(payload, ctx):
    ctx.step("first", mark, "first", ctx)
    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda i: ctx.step(f"s{{i}}", mark, f"s{{i}}", ctx), range(4)))
''', imports='import os\nfrom concurrent.futures import ThreadPoolExecutor\n')


@pytest.mark.parametrize("isolation", ISOLATIONS, ids=ISOLATION_IDS)
def test_a_durable_call_from_another_thread_is_refused(edges: tuple[Project, str], isolation: str) -> None:
    """Steps called from threads the handler started would be recorded in whatever order
    the threads ran, and a replay in another: each such call raises, the job fails for
    good saying why, and none of their functions ran."""
    project = edges[0]
    c = project.client
    job = c.enqueue(f"threaded_{ISOLATION_IDS[ISOLATIONS.index(isolation)]}", {}).id
    dead = c.wait(job, 30).as_dict()
    assert dead["status"] == "dead" and dead["attempt"] == 1, dead
    assert "thread" in dead["last_error"]["message"], dead
    assert not [p for p in project.records.iterdir() if p.name.startswith(f"{job}-s")]
    assert len((project.records / f"{job}-first").read_text().splitlines()) == 1


def test_the_signals_a_job_keeps_unread_are_bounded(edges: tuple[Project, str]) -> None:
    """A job keeps at most 32 signals unread and 1 MiB of their bodies: past either the
    client raises SignalsFull and HTTP answers 409 (count) or 413 (bytes), nothing kept."""
    from runner.errors import SignalsFull

    project, url = edges
    c = project.client
    job = c.enqueue("waits", {"name": "s0"}, delay=600).id
    for i in range(1, 33):
        assert c.signal(job, f"s{i}", i) == "kept"
    with pytest.raises(SignalsFull):
        c.signal(job, "s33", 33)
    big = c.enqueue("waits", {"name": "b0"}, delay=600).id
    for i in range(4):
        c.signal(big, f"b{i}", "x" * 250_000)
    auth = {"Authorization": "Bearer t"}
    r = requests.post(f"{url}/jobs/{big}/signals/b9", json="x" * 250_000, headers=auth, timeout=10)
    assert r.status_code == 413 and "read" in r.json()["detail"], r.text
    r = requests.post(f"{url}/jobs/{job}/signals/s40", json=1, headers=auth, timeout=10)
    assert r.status_code == 409 and r.json()["type"].endswith("too-many-signals"), r.text


ORDERED = '''
QUEUE = "fast"

def handle(payload, ctx):
    ctx.step("{first}", lambda: 1)
    ctx.step("{second}", lambda: 2)
    ctx.sleep("nap", 600)
    ctx.step("last", lambda: 3)
'''


def test_runner_check_names_sleeping_jobs_whose_steps_the_new_code_reaches_in_another_order(
        project: Project) -> None:
    """A job sleeps after steps "a" then "b"; the code on disk swaps them (same names): `runner
    check` fails naming the job and both steps; with the order kept, it passes."""
    project.add_function("ordered", ORDERED.format(first="a", second="b"))
    c = project.client
    worker = project.spawn_worker("fast")
    job = c.enqueue("ordered", {}).id
    wait_for(lambda: c.get(job).status == "sleeping", timeout=20, what="the job to sleep")
    worker.kill()
    worker.wait(timeout=10)
    cmd = [sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"), "check"]
    same = subprocess.run(cmd, env=project.env, capture_output=True, text=True, timeout=60, cwd=project.root)
    assert same.returncode == 0, same
    (project.root / "functions" / "ordered.py").write_text(ORDERED.format(first="b", second="a"))
    swapped = subprocess.run(cmd, env=project.env, capture_output=True, text=True, timeout=60, cwd=project.root)
    text = swapped.stdout + swapped.stderr
    assert swapped.returncode != 0 and job in text and "other order" in text, text


@pytest.fixture(scope="module")
def edges(tmp_path_factory: pytest.TempPathFactory, server: Server) -> Iterator[tuple[Project, str]]:
    """One project, its worker (fast queue) and its `runner web` (token "t", one process)
    for the tests that read only their own jobs: their functions all there before the
    worker starts (threaded as threaded_thread and threaded_process). A worker and a web
    server per test was most of such a test's time."""
    functions = {"keyed": KEYED, "waits": WAITS, "deep": DEEP,
                 **{f"threaded_{name}": THREADED.format(isolation=isolation)
                    for isolation, name in zip(ISOLATIONS, ISOLATION_IDS, strict=True)}}
    with worker_project(tmp_path_factory.mktemp("edges") / "project", server, functions, concurrency=2) as project, \
            runner_web(project, "web", workers=1) as web:
        yield project, web.url
