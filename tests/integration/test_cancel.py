"""Cancel: a job not started ends cancelled at once and never runs, even from a worker
that prefetched it; a running one is asked to stop and sees ctx.cancelled within 2 s;
an ended one is a 409; the cancel lives in Redis, so it survives worker restarts."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from test_web_support import Web, gunicorn

from runner import JobEnded
from runner.client import Request, administering
from runner.store.embedded import Server
from runner.store.scripts import Ack

from conftest import Project, make_project, wait_for

TOKEN = "t0ken-for-tests"

COOP = '''"""Runs until cancelled, checking at each step (as a cooperative handler does)."""
import os
import time

QUEUE = "slow"
TIMEOUT = 60
{extra}

def handle(payload, ctx):
    with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id), "a") as f:
        f.write("started\\n")
    end = time.time() + payload["seconds"]
    release = payload.get("until")  # a file whose appearance ends the run early
    while time.time() < end and not (release and os.path.exists(release)):
        if payload.get("cooperate", True):
            ctx.raise_if_cancelled()
        time.sleep(0.02)
    return {{"ran": payload["seconds"]}}
'''
SCHEMA = ('{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object",'
          '"properties":{"seconds":{"type":"number"},"cooperate":{"type":"boolean"},"until":{"type":"string"}},"required":["seconds"]}')


def add_coop(project: Project, extra: str = "") -> None:
    (project.root / "functions" / "coop.py").write_text(COOP.format(extra=extra))
    (project.root / "schemas" / "coop").mkdir(exist_ok=True)
    (project.root / "schemas" / "coop" / "v1.json").write_text(SCHEMA)
    project.write_config(grace=1)


def one_slot_that_prefetches(project: Project) -> None:
    """The coop function on a slow queue with one executor that claims jobs ahead."""
    add_coop(project)
    project.write_config(grace=1, extra="")
    toml = project.root / "runner.toml"
    head = "[queues.slow]\nvisibility_timeout = 10\nconcurrency = 2"
    assert head in toml.read_text()
    toml.write_text(toml.read_text().replace(head, "[queues.slow]\nvisibility_timeout = 10\nconcurrency = 1\n"
                                             "prefetch = 4"))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, server: Server) -> Iterator[Project]:
    """One project and one worker on both queues (grace 1 s) for the module's tests that
    only enqueue and cancel jobs of functions of their own and read their outcomes and
    counters: a worker per test (its start and imports, a child's start) was most of such
    a test's time. Every function is there before the worker starts, which loads them all."""
    project = make_project(tmp_path_factory.mktemp("served"), server)
    for name, extra in (("coop", ""), ("coop_process", 'ISOLATION = "process"')):
        project.add_function(name, COOP.format(extra=extra), SCHEMA)
    project.add_function("raises_error", RAISES_ON_CANCEL)
    project.add_function("raises_rate", RAISES_ON_CANCEL)
    project.write_config(grace=1)
    project.spawn_worker()
    try:
        yield project
    finally:
        project.close()


def status(project: Project, job_id: str) -> str | None:
    return project.client.get(job_id).status


def test_a_queued_and_a_scheduled_job_end_cancelled_and_never_run(project: Project) -> None:
    """A queued job and a delayed one are cancelled at once (status cancelled, a terminal
    status a second cancel refuses); a worker started afterwards runs neither, and a
    worker restart changes nothing: the cancel is in Redis."""
    client = project.client
    queued = client.enqueue("record", {"n": 1}).id
    scheduled = client.enqueue("record", {"n": 2}, delay=0.5).id
    assert client.cancel(queued) == "cancelled"
    assert client.cancel(scheduled) == "cancelled"
    assert status(project, queued) == status(project, scheduled) == "cancelled"
    with pytest.raises(JobEnded):
        client.cancel(queued)
    w = project.spawn_worker("fast")
    after = client.enqueue("record", {"n": 3}).id
    wait_for(lambda: status(project, after) == "done", timeout=20, what="a later job to run")
    time.sleep(0.6)  # past the delay: the scheduled one would be due now
    w.kill()
    w.wait()
    project.spawn_worker("fast")
    again = client.enqueue("record", {"n": 4}).id
    wait_for(lambda: status(project, again) == "done", timeout=20, what="the restarted worker")
    assert project.runs(queued) == [] and project.runs(scheduled) == []
    assert status(project, queued) == status(project, scheduled) == "cancelled"


def test_a_cancelled_queued_job_leaves_the_ready_count_and_the_oldest_wait(project: Project) -> None:
    """With no worker to skip them, cancelled queued jobs no longer count as ready: after
    cancelling every queued job, `runner stats`' ready is 0 and no oldest wait grows
    (they were counted until a claim passed over them, for ever on a paused queue).
    Bounded: an id is taken out of ready only within 1,000 entries of either end; one
    deeper is left for the claim to skip, as before, and never runs."""
    from runner.observe.figures import read_queues

    def fast() -> tuple[int, float | None]:
        q = next(q for q in read_queues(project.runtime, int(time.time() * 1000)) if q.name == "fast")
        return q.ready, q.oldest_ready_age_s

    client = project.client
    ids = [client.enqueue("record", {"n": i}).id for i in range(3)]
    assert fast()[0] == 3
    for job_id in (ids[0], ids[2], ids[1]):  # the oldest end, the newest end, then the last one
        assert client.cancel(job_id) == "cancelled"
    assert fast() == (0, None)

    # 2,401 queued: the middle one is deeper than 1,000 from either end and stays in the list.
    many = [j.id for j in client.enqueue_many([Request("record", {"n": i}) for i in range(2401)])]
    assert client.cancel(many[1200]) == "cancelled" and client.cancel(many[0]) == "cancelled"
    assert fast()[0] == 2400  # the middle one still sits there; the oldest is gone
    project.spawn_worker("fast")
    wait_for(lambda: fast()[0] == 0 and status(project, many[-1]) == "done", timeout=60,
             what="the worker to drain the rest")
    assert project.runs(many[1200]) == [] and project.runs(many[0]) == []


def test_a_prefetched_job_is_never_started(project: Project) -> None:
    """A job claimed ahead by a worker whose executors are busy is dropped by that worker
    on the cancel's notice: it never starts, and the job ends cancelled."""
    one_slot_that_prefetches(project)
    client = project.client
    busy = client.enqueue("coop", {"seconds": 30}).id
    ahead = client.enqueue("coop", {"seconds": 30}).id
    project.spawn_worker("slow")
    wait_for(lambda: project.runs(busy), timeout=20, what="the first job to start")
    k = project.keys("slow")
    claim = wait_for(lambda: project.runtime.redis.hget(k.claims, ahead), timeout=10, what="the prefetch")
    assert claim.split()[3].find("p") >= 0, claim
    assert client.cancel(ahead) == "cancelled"
    assert client.cancel(busy) == "requested"
    wait_for(lambda: status(project, busy) == "cancelled", timeout=10, what="the running job to stop")
    time.sleep(0.5)
    assert project.runs(ahead) == []
    assert status(project, ahead) == "cancelled"


def test_a_prefetched_job_cancelled_as_its_executor_frees_never_starts(project: Project) -> None:
    """The executor frees up a moment after the cancel of the job it claimed ahead, well
    before any renewal could tell the worker: the job still never starts (the worker
    drops it on the cancel's notice, and the answer waits for that) and ends cancelled."""
    one_slot_that_prefetches(project)
    client = project.client
    flag = project.root / "release-busy"
    for attempt in range(3):  # each round: a busy job, one claimed ahead
        flag.unlink(missing_ok=True)
        busy = client.enqueue("coop", {"seconds": 30, "until": str(flag)}).id
        ahead = client.enqueue("coop", {"seconds": 0.1}).id
        if attempt == 0:
            project.spawn_worker("slow")
        wait_for(lambda b=busy: project.runs(b), timeout=20, what="the busy job to start")
        wait_for(lambda a=ahead: project.runtime.redis.hget(project.keys("slow").claims, a), timeout=10,
                 what="the prefetch")
        assert client.cancel(ahead) == "cancelled"
        flag.touch()  # the executor is free at once
        wait_for(lambda b=busy: status(project, b) == "done", timeout=10, what="the busy job to end")
        time.sleep(0.3)
        assert project.runs(ahead) == [], f"round {attempt}: a cancelled job started"
        assert status(project, ahead) == "cancelled"


def test_a_cancel_of_a_job_claimed_ahead_that_then_runs_to_its_end_answers_at_once(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cancel reaches a job claimed ahead, whose worker then starts it and acks it in
    one settlement (its start mark never written on its own): the answer is "requested"
    as soon as the claim is gone with the job done, not after waiting out CANCEL_AHEAD_S
    (stretched here, so only that wait could hold the answer)."""
    monkeypatch.setattr(administering, "CANCEL_AHEAD_S", 600.0)
    client, rt = project.client, project.runtime
    k = project.keys()
    job_id = client.enqueue("noop", {}).id
    reply = rt.scripts.claim(k, n=1, start=0, lease_ms=60_000, token_base="w.ahead", dead_ttl_ms=3_600_000,
                             done_ttl_ms=3_600_000)
    token = rt.redis.hget(k.claims, job_id).split()[0]
    assert len(reply) > 2 and "p" in rt.redis.hget(k.claims, job_id).split()[3]
    answers: list[str] = []
    asking = threading.Thread(target=lambda: answers.append(client.cancel(job_id)), daemon=True)
    asking.start()
    wait_for(lambda: "c" in rt.redis.hget(k.claims, job_id).split()[3], timeout=10, what="the cancel's mark")
    assert list(rt.scripts.ack(k, [Ack(job_id, token, "{}", "noop|1", "", started_ms=int(time.time() * 1000))],
                               3_600_000)) == [1]
    asking.join(30)
    assert not asking.is_alive(), "the cancel waited out CANCEL_AHEAD_S for a job that had ended"
    assert answers == ["requested"] and status(project, job_id) == "done"


def test_a_running_job_sees_the_cancel_within_2_s_and_ends_cancelled(served: Project) -> None:
    """A running handler that checks ctx.raise_if_cancelled() stops within 2 s of the
    cancel (the request rides on the lease renewal) and the job ends cancelled, not
    retried; a caller waiting on it hears of it (JobFailed). The cancel's history entry
    (who asked) stays before the attempt's own."""
    project = served
    client = project.client
    job_id = client.enqueue("coop", {"seconds": 30}).id
    wait_for(lambda: project.runs(job_id), timeout=20, what="the handler to start")
    t0 = time.monotonic()
    assert client.cancel(job_id, by="ops") == "requested"
    ended = client.settle(job_id, 10)
    assert ended.status == "cancelled", ended.as_dict()
    assert time.monotonic() - t0 < 2.5
    assert project.runs(job_id) == ["started"]  # not retried
    assert ended.as_dict()["attempt"] == 1
    # Who asked stays on record through the run's own end, written after it.
    history = ended.as_dict()["history"]
    assert (history[0].get("outcome"), history[0].get("by")) == ("cancel", "ops"), history
    assert len(history) == 2 and history[1]["attempt"] == 1 and history[1]["at_ms"] >= history[0]["at_ms"], history


LAST_TRY = '''"""One attempt only, running until cancelled."""
import os
import time

QUEUE = "fast"
TIMEOUT = 15
MAX_ATTEMPTS = 1

def handle(payload, ctx):
    with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id), "a") as f:
        f.write("started\\n")
    while True:
        ctx.raise_if_cancelled()
        time.sleep(0.02)
'''


def test_a_cancel_asked_of_a_last_attempt_whose_worker_dies_ends_cancelled(project: Project) -> None:
    """A job on its last attempt is asked to stop, and its worker dies before it hears of
    it: the reclaim of its lapsed lease ends it cancelled, as the cancel asked, not dead
    as "worker lost" (which counted it dead, put it in the dead letters and raised the
    dead-letter alert for a job an operator had cancelled)."""
    import signal

    from runner.observe.figures import read_queues

    project.add_function("last_try", LAST_TRY)
    client = project.client
    job_id = client.enqueue("last_try", {}).id
    w = project.spawn_worker("fast")
    wait_for(lambda: project.runs(job_id), timeout=20, what="the handler to start")
    w.send_signal(signal.SIGSTOP)  # frozen: it never hears of the cancel
    try:
        assert client.cancel(job_id, by="ops") == "requested"
    finally:
        w.send_signal(signal.SIGKILL)
        w.wait()
    project.spawn_worker("fast")  # its scheduler reclaims the lapsed lease
    ended = client.settle(job_id, 30)
    assert ended.status == "cancelled", ended.as_dict()
    assert project.runs(job_id) == ["started"]
    q = next(q for q in read_queues(project.runtime, int(time.time() * 1000)) if q.name == "fast")
    assert q.dead == 0
    counters = q.function("last_try").counters
    assert (counters["dead"], counters["cancelled"]) == (0, 1), counters


STUBBORN = '''"""One attempt only; never checks for a cancel, and runs past its TIMEOUT."""
import os
import time

QUEUE = "fast"
TIMEOUT = 1
MAX_ATTEMPTS = 1

def handle(payload, ctx):
    with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id), "a") as f:
        f.write("started\\n")
    end = time.time() + 5
    while time.time() < end:
        time.sleep(0.02)
'''


def test_a_run_asked_to_stop_that_fails_on_its_last_attempt_ends_cancelled(project: Project) -> None:
    """A thread handler that ignores its cancel, on its last attempt, then runs past its
    TIMEOUT: the job ends cancelled as the cancel asked (its history keeps the error),
    counted cancelled, not dead "max attempts reached" in the dead letters (as a failed
    run asked to stop on an earlier attempt already ended: retried, then cancelled)."""
    from runner.observe.figures import read_queues

    project.add_function("stubborn", STUBBORN)
    client = project.client
    project.spawn_worker("fast", log_name="worker.log")
    job_id = client.enqueue("stubborn", {}).id
    wait_for(lambda: project.runs(job_id), timeout=20, what="the handler to start")
    assert client.cancel(job_id) == "requested"
    ended = client.settle(job_id, 20)
    assert ended.status == "cancelled", ended.as_dict()
    q = next(q for q in read_queues(project.runtime, int(time.time() * 1000)) if q.name == "fast")
    counters = q.function("stubborn").counters
    assert (q.dead, counters["dead"], counters["cancelled"]) == (0, 0, 1), counters
    assert f"job {job_id} dead" not in (project.root / "worker.log").read_text()


def test_a_handler_that_ignores_the_cancel_is_killed_under_process_isolation(served: Project) -> None:
    """Under ISOLATION = "process" a handler that never checks is killed once its grace
    passes after the cancel, and the job ends cancelled."""
    project = served
    client = project.client
    job_id = client.enqueue("coop_process", {"seconds": 30, "cooperate": False}).id
    wait_for(lambda: project.runs(job_id), timeout=30, what="the handler to start")
    t0 = time.monotonic()
    client.cancel(job_id)
    ended = client.settle(job_id, 15)
    assert ended.status == "cancelled", ended.as_dict()
    assert time.monotonic() - t0 < 6


@pytest.fixture
def web(project: Project) -> Iterator[Web]:
    with gunicorn(project, token=TOKEN) as w:
        yield w


def test_delete_cancels_and_a_finished_job_is_409(project: Project, web: Web) -> None:
    """DELETE /jobs/{id} cancels a queued job (200); a finished job answers 409; an
    unknown id 404; `runner cancel` exits 1 for an ended job."""
    queued = web.post("/jobs/record", json={"n": 1}).json()["id"]
    r = web.call("DELETE", f"/jobs/{queued}")
    assert r.status_code == 200 and r.json() == {"id": queued, "cancel": "cancelled"}, r.text
    assert web.get(f"/jobs/{queued}").json()["status"] == "cancelled"
    project.spawn_worker("fast")
    done = web.post("/jobs/noop?wait=10", json={}).json()
    assert done["status"] == "done"
    r = web.call("DELETE", f"/jobs/{done['id']}")
    assert r.status_code == 409, r.text
    assert web.call("DELETE", "/jobs/nope").status_code == 404
    cli = subprocess.run([sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"),
                          "cancel", done["id"]], env=project.env, capture_output=True, text=True, timeout=60)
    assert cli.returncode == 1 and "ended already" in cli.stdout, (cli.stdout, cli.stderr)


def test_runner_cancel_all_of_a_type_in_a_status(project: Project) -> None:
    """`runner cancel --all --type T --status queued` cancels every queued job of that
    type and no other; --status scheduled does the same for delayed ones."""
    from click.testing import CliRunner

    from runner.cli import cli

    client = project.client
    mine = [client.enqueue("record", {"n": i}).id for i in range(30)]
    other = [client.enqueue("noop", {"i": i}).id for i in range(5)]
    later = [client.enqueue("record", {"n": i}, delay=600).id for i in range(7)]
    base = ["--config", str(project.root / "runner.toml"), "cancel", "--all", "--type", "record"]
    out = CliRunner().invoke(cli, [*base, "--status", "queued"], env=project.env, catch_exceptions=False)
    assert out.exit_code == 0, out.output
    assert "cancelled 30 job(s)" in out.stdout
    out = CliRunner().invoke(cli, [*base, "--status", "scheduled"], env=project.env, catch_exceptions=False)
    assert out.exit_code == 0 and "cancelled 7 job(s)" in out.stdout, out.output
    assert {status(project, i) for i in mine + later} == {"cancelled"}
    assert {status(project, i) for i in other} == {"queued"}
    assert client.jobs("queued").jobs and {j.id for j in client.jobs("queued").jobs} == set(other)
    bare = CliRunner().invoke(cli, base[:3], env=project.env)  # `runner cancel` and nothing to cancel
    assert bare.exit_code == 2 and "give the ids of the jobs to cancel, or --all" in bare.output, bare.output


RAISES_ON_CANCEL = '''
import time
import runner
QUEUE = "fast"
MAX_ATTEMPTS = 3

def handle(payload, ctx):
    while not ctx.cancelled:
        time.sleep(0.02)
    if payload.get("rate"):
        raise runner.RateLimited(retry_after=120)
    raise RuntimeError("ignored the cancel")
'''


@pytest.mark.parametrize("rate", [False, True], ids=["error", "rate-limited"])
def test_a_run_asked_to_stop_that_raises_on_an_early_attempt_ends_cancelled_never_retried(
        served: Project, rate: bool) -> None:
    """Attempts left, a handler asked to stop raises instead (an error, or RateLimited
    with 120 s to wait): the job ends cancelled at once, its error in the history under
    "cancelled", counted cancelled and never retried (it was counted as retried, with a
    "retry" entry, and only ended at its next claim; a RateLimited sat scheduled for its
    120 s)."""
    from runner.observe.figures import read_queues

    project, name = served, "raises_rate" if rate else "raises_error"  # (counters of its own)
    client = project.client
    job_id = client.enqueue(name, {"rate": rate}).id
    wait_for(lambda: client.get(job_id).status == "processing", timeout=20, what="the handler to start")
    assert client.cancel(job_id) == "requested"
    ended = client.settle(job_id, 20).as_dict()
    assert ended["status"] == "cancelled", ended
    outcomes = [h.get("outcome") for h in ended["history"]]
    assert "retry" not in outcomes and outcomes[-1] == "cancelled", ended["history"]
    assert ended["history"][-1]["error"]["type"] == ("RateLimited" if rate else "RuntimeError"), ended["history"]
    q = next(q for q in read_queues(project.runtime, int(time.time() * 1000)) if q.name == "fast")
    counters = q.function(name).counters
    assert (counters["retried"], counters["cancelled"], counters["dead"]) == (0, 1, 0), counters


def test_a_cancelled_job_counts_as_cancelled_not_dead(project: Project) -> None:
    """Cancelled is an outcome of its own: a queued job cancelled and a running one
    stopped by its cancel add to the function's cancelled counter
    (runner_jobs_cancelled_total), never to dead (runner_jobs_dead_total, `runner stats`,
    the dashboard's dead-lettered figure, the dead-letter alert), and the worker logs no
    "dead" warning for them."""
    from prometheus_client import CollectorRegistry, generate_latest

    from runner.observe.figures import read_queues
    from runner.web.exposition import RunnerCollector

    add_coop(project)  # (its worker starts after the queued job's cancel)
    client = project.client
    queued = client.enqueue("coop", {"seconds": 30}).id
    assert client.cancel(queued) == "cancelled"
    running = client.enqueue("coop", {"seconds": 30}).id
    project.spawn_worker("slow", log_name="worker.log")
    wait_for(lambda: project.runs(running), timeout=20, what="the handler to start")
    assert client.cancel(running) == "requested"
    assert client.settle(running, 10).status == "cancelled"

    def counters() -> dict[str, int]:
        q = next(q for q in read_queues(project.runtime, int(time.time() * 1000)) if q.name == "slow")
        return q.function("coop").counters

    wait_for(lambda: counters()["cancelled"] == 2, timeout=10, what="two cancels counted")
    assert counters()["dead"] == 0
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunnerCollector(project.runtime))
    text = generate_latest(registry).decode()
    assert 'runner_jobs_cancelled_total{function="coop",queue="slow"} 2.0' in text, text
    assert 'runner_jobs_dead_total{function="coop",queue="slow"} 0.0' in text
    log = (project.root / "worker.log").read_text()
    assert f"job {running} cancelled" in log and f"job {running} dead" not in log, log



def test_cancelling_deferred_jobs_counts_each_job_once(project: Project) -> None:
    """`runner cancel --all --status deferred` of 5 jobs a paused function holds adds 5 to
    its cancelled counter: in the stats hash, in the per-function figure (`runner stats`,
    the dashboard) and in runner_jobs_cancelled_total. A batch's cancels were counted 1, 2,
    3, ... as each job's cancel wrote the batch's running total again (15 for 5 jobs)."""
    from prometheus_client import CollectorRegistry, generate_latest

    from runner.observe.figures import read_queues
    from runner.web.exposition import RunnerCollector

    client = project.client
    client.pause(function="noop")
    ids = [client.enqueue("noop", {"i": i}).id for i in range(5)]
    project.spawn_worker("fast")
    wait_for(lambda: {client.get(i).status for i in ids} == {"deferred"}, timeout=20, what="the jobs held")
    project.stop_all()
    assert sorted(client.cancel_deferred(type="noop")["fast"]) == sorted(ids)
    assert {client.get(i).status for i in ids} == {"cancelled"}
    assert project.runtime.redis.hget(project.keys().stats, "cancelled|noop") == "5"
    q = next(q for q in read_queues(project.runtime, int(time.time() * 1000)) if q.name == "fast")
    assert q.function("noop").counters["cancelled"] == 5
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunnerCollector(project.runtime))
    text = generate_latest(registry).decode()
    assert 'runner_jobs_cancelled_total{function="noop",queue="fast"} 5.0' in text, text


PARKED = '''
import os
import time

QUEUE = "fast"
CONCURRENCY = {"key": "t:{t}", "limit": 2}


def handle(payload, ctx):
    with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id), "a") as f:
        f.write("ran\\n")
    time.sleep(0.02)
'''


def test_cancel_all_deferred_cancels_while_limits_wake_and_no_cancelled_job_runs(project: Project) -> None:
    """`runner cancel --all --status deferred` while a worker keeps waking and running
    jobs parked on a CONCURRENCY limit: every job it reports cancelled is cancelled and
    never ran (each batch is found and cancelled in one step, so none is woken in
    between), and no job is deferred afterwards."""
    import json

    project.add_function("parked", PARKED, '{"type": "object", "properties": {"t": {"type": "integer"}}}')
    c = project.client
    from runner.client import Request

    ids = [j.id for j in c.enqueue_many([Request("parked", {"t": i % 4}) for i in range(2000)])]  # type: ignore[union-attr]
    project.spawn_worker("fast")
    wait_for(lambda: len(list(project.records.iterdir())) >= 20, timeout=30, what="the first runs")
    out = subprocess.run([sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"),
                          "cancel", "--all", "--status", "deferred", "--json"],
                         cwd=project.root, env=project.env, capture_output=True, text=True, timeout=120)
    answers = json.loads(out.stdout)
    assert len(answers) >= 100, out.stdout[-500:] + out.stderr[-2000:]
    wait_for(lambda: {c.get(i).status for i in ids} <= {"done", "cancelled"}, timeout=60, what="every job to end")
    ran = [a for a in answers if project.runs(a["id"])]
    assert not ran, f"{len(ran)} of {len(answers)} jobs the cancel reported ran: {ran[:3]}"
    assert {a.get("cancel") for a in answers} == {"cancelled"}
    assert {c.get(a["id"]).status for a in answers} == {"cancelled"}
    project.stop_all()


def test_a_cancel_of_a_job_whose_state_key_is_damaged_answers_as_for_its_real_status(project: Project) -> None:
    """A dead job whose state key held another Redis type (another writer's damage) was a
    404 to a cancel, where a sound dead job is a 409; a queued one was a 404 too. Each is
    answered by what the queue's sets say of it: the dead one has ended (409, the damage
    named), the queued one ends cancelled, its damaged state set aside as <key>:corrupt."""
    from runner.store import records

    r, k = project.runtime.redis, project.keys()
    r.set(k.job("dmg1"), records.encode({"type": "noop", "version": 1, "payload": "{}", "max_attempts": 3}))
    r.set(k.state("dmg1"), "clobbered")
    r.zadd(k.dead, {"dmg1": 1})
    with pytest.raises(JobEnded) as ended:
        project.client.cancel("dmg1")
    assert ended.value.status == "dead" and "state" in str(ended.value), str(ended.value)
    assert r.get(k.state("dmg1")) == "clobbered"  # (a refusal writes nothing)
    job = project.client.enqueue("noop", {})
    r.set(k.state(job.id), "clobbered")
    assert project.client.cancel(job.id) == "cancelled"
    assert r.get(k.state(job.id) + ":corrupt") == "clobbered"
    assert project.client.get(job.id).as_dict()["status"] == "cancelled"
    assert r.lrange(k.ready, 0, -1) == []


def test_a_job_whose_state_key_is_damaged_shows_the_status_of_the_set_that_holds_it(project: Project,
                                                                                   web: Web) -> None:
    """A cancelled job whose state key another writer overwrote showed "queued" beside its
    damage while a second DELETE answered 409 (cancelled), and that 409's detail dropped
    the damage the client named. Its status comes from whichever of the queue's sets holds
    it (cancelled, sleeping and waiting as dead and scheduled did), and the 409 names the
    damaged key."""
    from runner.store import records

    r, k = project.runtime.redis, project.keys()
    job = project.client.enqueue("record", {"n": 1})
    assert project.client.cancel(job.id) == "cancelled"
    r.delete(k.state(job.id))
    r.set(k.state(job.id), "clobbered")
    shown = web.get(f"/jobs/{job.id}").json()
    assert shown["status"] == "cancelled" and "state" in shown["damaged"], shown
    again = web.call("DELETE", f"/jobs/{job.id}")
    assert again.status_code == 409 and "damaged" in again.json()["detail"], again.text
    for status in ("sleeping", "waiting"):
        jid = f"dmg-{status}"
        r.set(k.job(jid), records.encode({"type": "noop", "version": 1, "payload": "{}", "max_attempts": 3}))
        r.set(k.state(jid), "clobbered")
        r.zadd(k.scheduled, {jid: 1})
        r.zadd(getattr(k, status), {jid: 1})
        shown = web.get(f"/jobs/{jid}").json()
        assert shown["status"] == status and "state" in shown["damaged"], shown
