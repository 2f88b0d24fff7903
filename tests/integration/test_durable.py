"""Durable functions through a real worker, under both isolations: a recorded step never
runs again on a later attempt, a sleep ends the run (status sleeping, no attempt spent,
no lease, no slot) and the job resumes past it, a replay that takes another path fails
for good naming both steps, and a step past its bound raises StepTooLarge."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
import requests
from durable_helpers import ISOLATION_IDS, ISOLATIONS, marked, runs
from test_web_support import runner_web

from runner.errors import JobEnded, JobNotFound, SignalPending
from runner.store.embedded import Server

from conftest import Project, assert_no_job_in_two_structures, structures, wait_for, worker_project

STEPS = marked('''def handle(payload, ctx):
    a = ctx.step("a", mark, "a", ctx)
    b = ctx.step("b", mark, "b", ctx)
    again = ctx.step("a", mark, "a2", ctx)
    if ctx.attempt == 1 and payload.get("fail"):
        raise RuntimeError("transient, after three recorded steps")
    if payload.get("sleep") is not None:
        ctx.sleep("nap", payload["sleep"])
    c = ctx.step("c", mark, "c", ctx)
    return {{"a": a, "b": b, "again": again, "c": c, "attempt": ctx.attempt}}
''', writes='ctx.step_key', returns='name.upper()')

SWITCH = '''
import os
QUEUE = "fast"
{isolation}

def handle(payload, ctx):
    flag = os.path.join(os.environ["RECORD_DIR"], ctx.job_id + "-seen")
    first = not os.path.exists(flag)
    open(flag, "a").close()
    ctx.step("one" if first else "other", lambda: 1)
    raise RuntimeError("again")
'''

BIG = '''
QUEUE = "fast"
{isolation}

def handle(payload, ctx):
    ctx.step("big", lambda: "x" * 300_000)
'''


@pytest.mark.parametrize("isolation", ISOLATIONS, ids=ISOLATION_IDS)
def test_recorded_steps_never_run_again_on_a_retry(durable: Project, isolation: str) -> None:
    """Three steps (one name twice: recorded as a and a#2) land, the attempt fails
    transiently, and the retry replays them from the log: each fn ran once, and
    step_key is "<job id>:<name as recorded>"."""
    project = durable
    c = project.client
    job = c.enqueue(f"steps_{iso_id(isolation)}", {"fail": True}).id
    done = c.wait(job, 30).as_dict()
    assert done["status"] == "done", done
    assert done["result"] == {"a": "A", "b": "B", "again": "A2", "c": "C", "attempt": 2}
    assert runs(project, job, "a") == [f"{job}:a"]
    assert runs(project, job, "a2") == [f"{job}:a#2"]
    assert runs(project, job, "b") == [f"{job}:b"]
    assert runs(project, job, "c") == [f"{job}:c"]
    assert_no_job_in_two_structures(project)


@pytest.mark.parametrize("isolation", ISOLATIONS, ids=ISOLATION_IDS)
def test_a_sleep_frees_the_worker_and_resumes_past_it(durable: Project, isolation: str) -> None:
    """ctx.sleep ends the run: the job is in scheduled alone with status sleeping, holds no
    lease, spent no attempt; it comes back after the sleep and replays past it."""
    project = durable
    c = project.client
    fn = f"naps_{iso_id(isolation)}"  # this test's alone: its counters are its job's
    job = c.enqueue(fn, {"sleep": 1.5}).id
    wait_for(lambda: c.get(job).status == "sleeping", timeout=20, what="the job to sleep")
    where = structures(project)
    assert job in where["scheduled"] and job not in where["leases"], where
    assert_no_job_in_two_structures(project)
    done = c.wait(job, 30).as_dict()
    assert done["status"] == "done", done
    assert done["result"]["attempt"] == 1  # the sleep spent no attempt
    for name in ("a", "b", "a2", "c"):
        assert len(runs(project, job, name)) == 1, name
    counters = c.stats()["fast"]["counters"]
    assert counters.get(f"steps|{fn}") == 4 and counters.get(f"sleeps|{fn}") == 1, counters
    assert counters.get(f"replays|{fn}") == 1, counters  # the resume replayed a, b and a#2


AGED = marked('''def handle(payload, ctx):
    ctx.step("a", mark, "a", ctx)
    if payload.get("nap"):
        ctx.sleep("nap", payload["nap"])
    ctx.step("b", mark, "b", ctx)
    return "ok"
''', options="MAX_AGE = 1\n")


@pytest.mark.parametrize("rate", [False, True], ids=["plain", "rate-limited"])
@pytest.mark.parametrize("isolation", ISOLATIONS, ids=ISOLATION_IDS)
def test_max_age_bounds_the_first_start_only_a_resume_past_it_runs(durable: Project, isolation: str,
                                                                   rate: bool) -> None:
    """MAX_AGE 1 s and a 2 s sleep: the job resumes after the sleep, past its MAX_AGE, and
    ends done with each step run once, under both isolations (a child's job was buried
    as expired at its resume, its second step never run), with a RATE_LIMIT too (its
    token's wait was still held to the first start's MAX_AGE: buried at the resume)."""
    project = durable
    c = project.client
    warm = c.enqueue(f"warm_{iso_id(isolation)}", {}).id  # a child ready first: the job's first start is in time
    assert c.wait(warm, 60).as_dict()["status"] == "done"
    job = c.enqueue(f"aged{'_rated' if rate else ''}_{iso_id(isolation)}", {"nap": 2}).id
    done = c.wait(job, 30).as_dict()
    assert done["status"] == "done", done
    assert len(runs(project, job, "a")) == 1 and len(runs(project, job, "b")) == 1


def test_run_now_cuts_a_sleep_short(project: Project) -> None:
    """An operator's run now of a job in an hour's sleep: the replay returns from ctx.sleep
    and runs on past it (docs/durable.md, docs/http.md), with no attempt spent."""
    project.add_function("steps", STEPS.format(isolation=""))
    c = project.client
    project.spawn_worker("fast")
    job = c.enqueue("steps", {"sleep": 3600}).id
    wait_for(lambda: c.get(job).status == "sleeping", timeout=20, what="the job to sleep")
    c.run_now(job)
    done = c.wait(job, 30).as_dict()
    assert done["status"] == "done", done
    assert done["result"]["attempt"] == 1 and done["result"]["c"] == "C", done
    assert len(runs(project, job, "c")) == 1


@pytest.mark.parametrize("isolation", ISOLATIONS, ids=ISOLATION_IDS)
def test_a_replay_on_another_path_fails_for_good_naming_both_steps(durable: Project, isolation: str) -> None:
    """The first run records step "one"; its retry reaches "other" at that position:
    dead at once, reason permanent failure, the message naming both."""
    c = durable.client
    job = c.enqueue(f"switch_{iso_id(isolation)}", {}).id
    dead = c.wait(job, 30).as_dict()
    assert dead["status"] == "dead", dead
    assert dead["reason"] == "permanent failure"
    msg = dead["last_error"]["message"]
    assert "non-deterministic replay" in msg and "'one'" in msg and "'other'" in msg, msg
    assert dead["attempt"] == 2


@pytest.mark.parametrize("isolation", ISOLATIONS, ids=ISOLATION_IDS)
def test_a_step_past_max_step_bytes_raises_step_too_large(durable: Project, isolation: str) -> None:
    c = durable.client
    dead = c.wait(c.enqueue(f"big_{iso_id(isolation)}", {}).id, 30).as_dict()
    assert dead["status"] == "dead" and dead["attempt"] == 1, dead
    assert dead["last_error"]["type"] == "StepTooLarge"
    assert "max_step_bytes" in dead["last_error"]["message"]


WAITER = marked('''def handle(payload, ctx):
    ctx.step("before", mark, "before", ctx)
    if payload.get("nap"):
        ctx.sleep("nap", payload["nap"])
    try:
        answer = ctx.wait_for_signal("approval", timeout=payload.get("timeout"))
    except runner.SignalTimeout:
        answer = "timed out"
    ctx.step("after", mark, "after", ctx)
    return {{"answer": answer}}
''', imports='import os\nimport runner\n')


@pytest.mark.parametrize("isolation", ISOLATIONS, ids=ISOLATION_IDS)
def test_a_wait_frees_the_worker_and_a_signal_resumes_it(project: Project, isolation: str) -> None:
    """The job waits (status waiting, in scheduled alone, showing what it waits for); a
    signal wakes it in the same step and the wait returns its body; a second signal of a
    finished job is refused as ended."""
    project.write_config(concurrency=1)  # one job: one child, not eight
    project.add_function("waiter", WAITER.format(isolation=isolation))
    c = project.client
    project.spawn_worker("fast")
    job = c.enqueue("waiter", {}).id
    wait_for(lambda: c.get(job).status == "waiting", timeout=20, what="the job to wait")
    view = c.get(job).as_dict()
    assert view["waiting_for"]["signal"] == "approval", view
    assert [(s["name"], s["status"]) for s in view["steps"]] == [("before", "ok"), ("approval", "waiting")]
    assert_no_job_in_two_structures(project)
    assert job in structures(project)["scheduled"]
    assert [j.id for j in c.jobs("waiting").jobs] == [job]
    shown = subprocess.run([sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"), "job",
                            job], env=project.env, capture_output=True, text=True, timeout=60)
    assert "1. before (step) ok" in shown.stdout and "2. approval (signal) waiting" in shown.stdout, shown
    assert c.signal(job, "approval", {"ok": True}) == "resumed"
    done = c.wait(job, 30).as_dict()
    assert done["status"] == "done" and done["result"] == {"answer": {"ok": True}}, done
    assert len(runs(project, job, "before")) == 1 and len(runs(project, job, "after")) == 1
    counters = c.stats()["fast"]["counters"]
    assert counters.get("signals|waiter") == 1 and counters.get("waits|waiter") == 1, counters
    with pytest.raises(JobEnded):
        c.signal(job, "approval", 1)
    with pytest.raises(JobNotFound):
        c.signal("0" * 32, "approval", 1)


@pytest.mark.parametrize("isolation", ISOLATIONS, ids=ISOLATION_IDS)
def test_an_early_signal_is_kept_and_a_wait_can_time_out(durable: Project, isolation: str) -> None:
    """A signal sent while the job sleeps before its wait is kept (a second of that name
    is refused while unread) and the wait returns it at once; a wait with a timeout and
    no signal raises SignalTimeout, which the handler catches."""
    c = durable.client
    waiter = f"waiter_{iso_id(isolation)}"
    early = c.enqueue(waiter, {"nap": 2}).id
    wait_for(lambda: c.get(early).status == "sleeping", timeout=20, what="the job to sleep")
    assert c.signal(early, "approval", "yes") == "kept"
    with pytest.raises(SignalPending):
        c.signal(early, "approval", "again")
    assert c.wait(early, 30).as_dict()["result"] == {"answer": "yes"}
    late = c.enqueue(waiter, {"timeout": 0.5}).id
    assert c.wait(late, 30).as_dict()["result"] == {"answer": "timed out"}
    steps = c.get(late).as_dict().get("steps")
    assert steps is None or steps[1]["status"] == "timeout"  # (a done job keeps no step log)


def test_signals_over_http_and_the_cli(project: Project) -> None:
    """POST /jobs/{id}/signals/{name}: 202 with the delivery, a 409 once the job ended or
    while one of that name is unread, a 404 for no such job; GET /jobs?status=waiting
    lists the waiting job; `runner signal ID NAME JSON` delivers too (exit 0, 1 refused)."""
    project.add_function("waiter", WAITER.format(isolation=""))
    c = project.client
    project.spawn_worker("fast")
    auth = {"Authorization": "Bearer t"}
    with runner_web(project, "web", workers=1) as web:
        one = c.enqueue("waiter", {}).id
        wait_for(lambda: c.get(one).status == "waiting", timeout=20, what="the job to wait")
        listed = requests.get(f"{web.url}/jobs?status=waiting", headers=auth, timeout=10).json()
        assert [j["id"] for j in listed["jobs"]] == [one], listed
        r = requests.post(f"{web.url}/jobs/{one}/signals/approval", json={"ok": 1}, headers=auth, timeout=10)
        assert r.status_code == 202 and r.json() == {"id": one, "signal": "approval", "delivery": "resumed"}, r.text
        assert c.wait(one, 30).as_dict()["result"] == {"answer": {"ok": 1}}
        r = requests.post(f"{web.url}/jobs/{one}/signals/approval", json=1, headers=auth, timeout=10)
        assert r.status_code == 409 and r.json()["type"].endswith("job-ended"), r.text
        r = requests.post(f"{web.url}/jobs/{'0' * 32}/signals/approval", json=1, headers=auth, timeout=10)
        assert r.status_code == 404, r.text
        r = requests.post(f"{web.url}/jobs/{one}/signals/bad%20name", json=1, headers=auth, timeout=10)
        assert r.status_code == 400, r.text
        two = c.enqueue("waiter", {"nap": 30}).id
        wait_for(lambda: c.get(two).status == "sleeping", timeout=20, what="the job to sleep")
        assert requests.post(f"{web.url}/jobs/{two}/signals/approval", json=2, headers=auth,
                             timeout=10).json()["delivery"] == "kept"
        r = requests.post(f"{web.url}/jobs/{two}/signals/approval", json=3, headers=auth, timeout=10)
        assert r.status_code == 409 and r.json()["type"].endswith("signal-pending"), r.text
    three = c.enqueue("waiter", {}).id
    wait_for(lambda: c.get(three).status == "waiting", timeout=20, what="the job to wait")
    cli = [sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"), "signal"]
    out = subprocess.run([*cli, three, "approval", '{"via": "cli"}'], env=project.env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and "resumed" in out.stdout, out
    assert c.wait(three, 30).as_dict()["result"] == {"answer": {"via": "cli"}}
    again = subprocess.run([*cli, three, "approval"], env=project.env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 1 and "ended" in again.stderr, again


def test_cancel_ends_a_sleeping_and_a_waiting_job_at_once(project: Project) -> None:
    """A sleeping or waiting job holds no claim: a cancel ends it cancelled in one step,
    out of scheduled, and it never runs again."""
    project.add_function("waiter", WAITER.format(isolation=""))
    c = project.client
    project.spawn_worker("fast")
    sleeping = c.enqueue("waiter", {"nap": 30}).id
    waiting = c.enqueue("waiter", {}).id
    wait_for(lambda: c.get(sleeping).status == "sleeping" and c.get(waiting).status == "waiting", timeout=20,
             what="both to suspend")
    assert c.cancel(sleeping) == "cancelled" and c.cancel(waiting) == "cancelled"
    assert c.get(sleeping).status == "cancelled" and c.get(waiting).status == "cancelled"
    assert structures(project)["scheduled"] == []
    assert_no_job_in_two_structures(project)


PARENT = marked('''def handle(payload, ctx):
    ctx.step("before", mark, "before", ctx)
    got = ctx.invoke("record", {{"n": payload["n"]}})
    try:
        ctx.invoke("perm", {{}})
        failed = None
    except runner.JobFailed as exc:
        failed = exc.error["type"]
    ctx.step("after", mark, "after", ctx)
    return {{"child": got, "failed": failed}}
''', imports='import os\nimport runner\n')


@pytest.mark.parametrize("isolation", ISOLATIONS, ids=ISOLATION_IDS)
def test_invoke_runs_a_child_and_resumes_with_its_result_or_its_failure(durable: Project, isolation: str) -> None:
    """ctx.invoke writes the child with the parent's suspension (status waiting, no slot);
    the child's end resumes the parent with its result, and a dead child raises JobFailed
    there; the lineage shows both ways (the parent's step names the child, the child's
    view its parent)."""
    project = durable
    c = project.client
    job = c.enqueue(f"parent_{iso_id(isolation)}", {"n": 7}).id
    done = c.wait(job, 60).as_dict()
    assert done["status"] == "done", done
    child = f"{job}.c1"
    assert done["result"]["child"] == c.get(child).as_dict()["result"], done
    assert done["result"]["failed"] is not None
    assert c.get(child).as_dict()["invoked_by"] == {"id": job, "signal": "child.1"}
    assert len(runs(project, job, "before")) == 1 and len(runs(project, job, "after")) == 1
    assert_no_job_in_two_structures(project)


def test_durable_calls_on_a_partitioned_queue(project: Project) -> None:
    """partitions = 3: each job's step log lives beside it in its own partition; sleeps,
    signals (found in whichever partition holds the job) and child calls all resume."""
    project.write_config(fast="partitions = 3")
    project.add_function("waiter", WAITER.format(isolation=""))
    project.add_function("parent", PARENT.format(isolation=""))
    c = project.client
    project.spawn_worker("fast")
    waiting = [c.enqueue("waiter", {"nap": 0.2}).id for _ in range(9)]
    parents = [c.enqueue("parent", {"n": i}).id for i in range(3)]
    rt = c.runtime
    assert len({rt.parts["fast"].index(next(k for k in rt.parts["fast"] if rt.redis.exists(k.job(j))))
                for j in waiting}) > 1  # spread over the partitions
    for j in waiting:
        wait_for(lambda j=j: c.get(j).status == "waiting", timeout=20, what="each job to wait")
        assert c.signal(j, "approval", j) == "resumed"
    for j in waiting:
        assert c.wait(j, 30).as_dict()["result"] == {"answer": j}
    for j in parents:
        done = c.wait(j, 60).as_dict()
        assert done["status"] == "done" and done["result"]["child"] is not None, done


DRIFT = '''
QUEUE = "fast"

def handle(payload, ctx):
    ctx.step("{first}", lambda: 1)
    ctx.sleep("nap", 600)
    ctx.step("last", lambda: 2)
'''


def test_runner_check_names_sleeping_jobs_whose_steps_the_new_code_no_longer_reaches(project: Project) -> None:
    """A job sleeps after step "a"; the code on disk renames it "b": `runner check` fails
    naming the job and the step its replay would no longer reach; with the name kept, it
    passes."""
    project.add_function("drift", DRIFT.format(first="a"))
    c = project.client
    worker = project.spawn_worker("fast")
    job = c.enqueue("drift", {}).id
    wait_for(lambda: c.get(job).status == "sleeping", timeout=20, what="the job to sleep")
    worker.kill()
    worker.wait(timeout=10)
    cmd = [sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"), "check"]
    same = subprocess.run(cmd, env=project.env, capture_output=True, text=True, timeout=60, cwd=project.root)
    assert same.returncode == 0, same
    (project.root / "functions" / "drift.py").write_text(DRIFT.format(first="b"))
    moved = subprocess.run(cmd, env=project.env, capture_output=True, text=True, timeout=60, cwd=project.root)
    text = moved.stdout + moved.stderr
    assert moved.returncode != 0 and job in text and "'a'" in text and "non-deterministic" in text, text


INVOKER = '''
QUEUE = "fast"

def handle(payload, ctx):
    ctx.step("pre", lambda: 1)
    return ctx.invoke("invoked_kid", {}, timeout=600, delay=300)
'''
INVOKED_KID = '''
QUEUE = "fast"

def handle(payload, ctx):
    return "kid"
'''


def test_a_parent_waiting_on_invoke_shows_the_timeout_it_asked_for(project: Project) -> None:
    """A parent waiting on ctx.invoke(..., timeout=600) shows that timeout and its child in
    waiting_for, not the 30 s check it makes of the child meanwhile."""
    import time

    project.add_function("invoker", INVOKER)
    project.add_function("invoked_kid", INVOKED_KID)
    c = project.client
    project.spawn_worker("fast")
    t0 = time.time()
    job = c.enqueue("invoker", {}).id
    wait_for(lambda: c.get(job).status == "waiting", timeout=20, what="the parent to wait")
    view = c.get(job).as_dict()
    assert 590 < view["waiting_for"]["timeout_at"] - t0 < 620, view["waiting_for"]
    assert view["waiting_for"]["job"] == view["steps"][-1]["child"]
    assert c.get(view["waiting_for"]["job"]).as_dict()["type"] == "invoked_kid"


INSERTED = '''
QUEUE = "fast"

def handle(payload, ctx):
    {new}
    ctx.step("a", lambda: 1)
    ctx.sleep("nap", 600)
    ctx.step("last", lambda: 2)
'''


def test_runner_check_fails_a_step_inserted_before_the_recorded_ones(project: Project) -> None:
    """A deploy that adds a step every run reaches before a sleeping job's recorded steps
    fails `runner check` naming the job (its replay would meet the new step first); one
    added under an if, which a replay may not reach, does not; and a sleeper behind more
    than 1,000 delayed jobs of its queue is found all the same."""
    project.add_function("drift", DRIFT.format(first="a"))
    c = project.client
    for i in range(1_100):
        c.enqueue("drift", {"i": i}, delay=3_600)  # sorted before the sleeper (due sooner)
    worker = project.spawn_worker("fast")
    job = c.enqueue("drift", {}).id
    wait_for(lambda: c.get(job).status == "sleeping", timeout=30, what="the job to sleep")
    worker.kill()
    worker.wait(timeout=10)
    cmd = [sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"), "check"]
    path = project.root / "functions" / "drift.py"
    path.write_text(INSERTED.format(new='ctx.step("audit", lambda: 0)'))
    inserted = subprocess.run(cmd, env=project.env, capture_output=True, text=True, timeout=60, cwd=project.root)
    text = inserted.stdout + inserted.stderr
    assert inserted.returncode != 0 and job in text and "'audit'" in text, text
    path.write_text(INSERTED.format(new='if payload.get("audit"):\n        ctx.step("audit", lambda: 0)'))
    branch = subprocess.run(cmd, env=project.env, capture_output=True, text=True, timeout=60, cwd=project.root)
    assert branch.returncode == 0, branch.stdout + branch.stderr


EVENT_WAITER = '''
QUEUE = "fast"

def handle(payload, ctx):
    ctx.step("pre", lambda: 1)
    return ctx.wait_for_event("order.paid", match={"order_id": 1}, timeout=600)
'''


def test_runner_check_passes_a_job_waiting_for_an_event_on_unchanged_code(project: Project) -> None:
    """A job waiting in ctx.wait_for_event recorded the event's name as its step: the
    deploy gate knows that call, so unchanged code passes, and a renamed step before it
    fails naming the job."""
    project.add_function("evwait", EVENT_WAITER)
    c = project.client
    worker = project.spawn_worker("fast")
    job = c.enqueue("evwait", {}).id
    wait_for(lambda: c.get(job).status == "waiting", timeout=30, what="the job to wait")
    worker.kill()
    worker.wait(timeout=10)
    cmd = [sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"), "check"]
    same = subprocess.run(cmd, env=project.env, capture_output=True, text=True, timeout=60, cwd=project.root)
    assert same.returncode == 0, same.stdout + same.stderr
    (project.root / "functions" / "evwait.py").write_text(EVENT_WAITER.replace('"pre"', '"renamed"'))
    moved = subprocess.run(cmd, env=project.env, capture_output=True, text=True, timeout=60, cwd=project.root)
    assert moved.returncode != 0 and job in moved.stdout + moved.stderr


def iso_id(isolation: str) -> str:
    """The id of an isolation line ("thread" or "process"), which the shared functions' names end in."""
    return ISOLATION_IDS[ISOLATIONS.index(isolation)]


@pytest.fixture(scope="module")
def durable(tmp_path_factory: pytest.TempPathFactory, server: Server) -> Iterator[Project]:
    """One project and one worker on the fast queue for the tests that read only their own
    jobs (and the counters of a function of their own): each function of theirs in both
    isolations, named <name>_thread and <name>_process, all there before the worker starts
    (it loads them all). A worker per test (its start, imports and first claim) was most
    of such a test's time."""
    rated = AGED.replace("MAX_AGE = 1\n", "MAX_AGE = 1\nRATE_LIMIT = {{\"limit\": 5, \"period\": 1}}\n")
    warm = 'QUEUE = "fast"\n{isolation}\n\ndef handle(payload, ctx):\n    return 1\n'
    sources = {"steps": STEPS, "naps": STEPS, "switch": SWITCH, "big": BIG, "waiter": WAITER, "parent": PARENT,
               "aged": AGED, "aged_rated": rated, "warm": warm}
    functions = {f"{name}_{iso_id(isolation)}": source.format(isolation=isolation)
                 for name, source in sources.items() for isolation in ISOLATIONS}
    with worker_project(tmp_path_factory.mktemp("durable") / "project", server, functions, concurrency=2) as project:
        yield project
