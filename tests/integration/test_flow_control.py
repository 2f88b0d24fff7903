"""Flow control through real worker processes on a real server: CONCURRENCY caps the
running jobs of a function cluster-wide (and per rendered key), uses every slot it has,
keeps one key's backlog from delaying another key's job, and a SIGKILLed worker's slots
free within its lease."""

from __future__ import annotations

import itertools
import os
import signal
import time

import falcon.testing
import pytest
from click.testing import CliRunner
from openapi_spec_validator import validate as validate_openapi

from runner.cli import cli
from runner.client import Request
from runner.web import create_app

from conftest import Project, wait_for

SCHEMA = """{"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
 "properties": {"tenant": {"type": "string"}, "hold": {"type": "number"}}}"""

LIMITED = '''"""Holds a slot while it sleeps; records enter (at once) and enter/exit (at the end)."""
import os
import time
QUEUE = "fast"
CONCURRENCY = {concurrency}


def handle(payload, ctx):
    start = time.time()
    folder = os.environ["RECORD_DIR"]
    with open(os.path.join(folder, ctx.job_id + ".in"), "a") as f:
        f.write(f"{{start}}\\n")
    time.sleep(payload.get("hold", 0) if ctx.attempt == 1 else 0)
    with open(os.path.join(folder, ctx.job_id), "a") as f:
        f.write(f"{{start}} {{time.time()}}\\n")
'''


def add_function(project: Project, name: str, text: str, schema: str = SCHEMA) -> None:
    """functions/<name>.py and its v1 schema; the project's runtime loads them afresh."""
    (project.root / "functions" / f"{name}.py").write_text(text)
    folder = project.root / "schemas" / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "v1.json").write_text(schema)
    project._runtime = None


def add_limited(project: Project, concurrency: str) -> None:
    add_function(project, "limited", LIMITED.format(concurrency=concurrency))


def spans(project: Project, ids: list[str]) -> list[tuple[float, float]]:
    out = []
    for i in ids:
        (line,) = project.runs(i)
        a, b = line.split()
        out.append((float(a), float(b)))
    return out


def most_at_once(sp: list[tuple[float, float]]) -> int:
    events = sorted([(a, 1) for a, _ in sp] + [(b, -1) for _, b in sp])  # an exit sorts before a tie's enter
    now = peak = 0
    for _, d in events:
        now += d
        peak = max(peak, now)
    return peak


def all_done(project: Project, ids: list[str]) -> bool:
    return all(project.runs(i) for i in ids)


def started_at(project: Project, job_id: str) -> float | None:
    p = project.records / f"{job_id}.in"
    parts = p.read_text().split() if p.exists() else []  # (empty while being written)
    return float(parts[0]) if parts else None


def test_concurrency_3_never_runs_more_than_3_and_uses_all_3(project: Project) -> None:
    """CONCURRENCY = 3 over 200 short jobs on 4 workers of 8 threads: never more than 3
    inside the handler at once, and 3 at once at some point."""
    add_limited(project, "3")
    ids = [e.id for e in project.client.enqueue_many(  # type: ignore[union-attr]
        Request("limited", {"hold": 0.03}) for _ in range(200))]
    for _ in range(4):
        project.spawn_worker("fast")
    wait_for(lambda: all_done(project, ids), timeout=120, interval=0.2, what="200 limited jobs")
    assert most_at_once(spans(project, ids)) == 3


def test_a_per_key_limit_of_2_holds_for_each_of_10_tenants(project: Project) -> None:
    """CONCURRENCY = {"key": "{tenant}", "limit": 2}, 10 tenants of 8 jobs: at most 2 of
    one tenant at once, some tenant at 2, and tenants run side by side."""
    add_limited(project, '{"key": "{tenant}", "limit": 2}')
    by_tenant = {f"t{t}": [e.id for e in project.client.enqueue_many(  # type: ignore[union-attr]
        Request("limited", {"tenant": f"t{t}", "hold": 0.1}) for _ in range(8))] for t in range(10)}
    for _ in range(4):
        project.spawn_worker("fast")
    every = [i for ids in by_tenant.values() for i in ids]
    wait_for(lambda: all_done(project, every), timeout=120, interval=0.2, what="80 keyed jobs")
    peaks = {t: most_at_once(spans(project, ids)) for t, ids in by_tenant.items()}
    assert max(peaks.values()) == 2, peaks
    assert most_at_once(spans(project, every)) > 2


def test_one_tenants_backlog_does_not_delay_another_tenants_job(project: Project) -> None:
    """Tenant a has 5,000 jobs queued under a per-tenant limit of 2, tenant b one behind
    them: a worker that starts on this backlog starts b's job within a second of a's first
    (a's jobs are parked on a's own list in a few claims, not scanned at n * 4 a call)."""
    add_limited(project, '{"key": "{tenant}", "limit": 2}')
    c = project.client
    for _ in range(5):
        c.enqueue_many(Request("limited", {"tenant": "a", "hold": 0.05}) for _ in range(1000))
    b = c.enqueue("limited", {"tenant": "b"})
    project.spawn_worker("fast")  # one: no other worker's start-up competes for the cores
    start = wait_for(lambda: started_at(project, b.id), timeout=30, what="tenant b's job to start")
    first = min(float(p.read_text().split()[0]) for p in project.records.glob("*.in"))
    assert start - first < 1.0, f"tenant b's job started {start - first:.2f} s after tenant a's first"


def test_a_backlog_arriving_at_running_workers_does_not_delay_another_tenant(project: Project) -> None:
    """The same with the workers running while tenant a's 5,000 jobs arrive: b's job,
    enqueued after them, starts within a second of its enqueue."""
    add_limited(project, '{"key": "{tenant}", "limit": 2}')
    for _ in range(4):
        project.spawn_worker("fast")
    c = project.client
    first = c.enqueue("limited", {"tenant": "a", "hold": 0.05})
    wait_for(lambda: started_at(project, first.id), timeout=30, what="the workers to run a job")
    for _ in range(5):
        c.enqueue_many(Request("limited", {"tenant": "a", "hold": 0.05}) for _ in range(1000))
    sent = time.time()
    b = c.enqueue("limited", {"tenant": "b"})
    start = wait_for(lambda: started_at(project, b.id), timeout=30, what="tenant b's job to start")
    assert start - sent < 1.0, f"tenant b's job started {start - sent:.2f} s after it was enqueued"


def test_a_killed_workers_slots_free_within_its_lease(project: Project) -> None:
    """A worker holding both slots of CONCURRENCY = 2 is SIGKILLed: a job parked on the
    limit starts on another worker within the lease (2 s) of the kill."""
    project.write_config(vt=2)
    add_limited(project, "2")
    c = project.client
    victim = project.spawn_worker("fast")
    holders = [c.enqueue("limited", {"hold": 60}).id for _ in range(2)]
    wait_for(lambda: all(started_at(project, i) for i in holders), timeout=30, what="both slots held")
    project.spawn_worker("fast")
    waiter = c.enqueue("limited", {}).id
    time.sleep(0.5)
    assert started_at(project, waiter) is None, "the limit let a third job in"
    os.kill(victim.pid, signal.SIGKILL)
    killed = time.time()
    start = wait_for(lambda: started_at(project, waiter), timeout=30, what="the parked job to start")
    assert start - killed < 2.0 + 1.0, f"the slots freed {start - killed:.2f} s after the kill"


def test_a_paused_queue_claims_nothing_within_a_second_and_resume_restarts_it(project: Project) -> None:
    """`pause` on a queue with a job running: the running job finishes, jobs enqueued after
    the pause do not start (a second later either), and resume starts them all."""
    add_limited(project, "None")
    for _ in range(2):
        project.spawn_worker("fast")
    c = project.client
    running = c.enqueue("limited", {"hold": 1.5}).id
    wait_for(lambda: started_at(project, running), timeout=30, what="the running job to start")
    c.pause("fast")
    assert c.paused()["fast"] == {"paused": True, "paused_functions": []}
    waiting = [c.enqueue("limited", {}).id for _ in range(5)]
    wait_for(lambda: project.runs(running), timeout=10, what="the running job to finish")
    time.sleep(1.0)
    assert not any(started_at(project, i) for i in waiting), "a paused queue started a job"
    c.resume("fast")
    wait_for(lambda: all_done(project, waiting), timeout=10, what="the jobs to run after resume")
    assert c.paused()["fast"]["paused"] is False


def test_a_paused_function_holds_its_jobs_in_order_and_spends_no_attempt(project: Project) -> None:
    """Pausing one function holds its jobs (status deferred, attempt 0) while another
    function of the queue runs; resume runs the held jobs in the order they came."""
    add_limited(project, "None")
    project.write_config(concurrency=1, prefetch=0)
    project.spawn_worker("fast")
    c = project.client
    c.pause(function="limited")
    held = []
    for _ in range(4):
        held.append(c.enqueue("limited", {}).id)
        time.sleep(0.01)
    other = c.enqueue("record", {"n": 1}).id
    wait_for(lambda: project.runs(other), timeout=30, what="the other function's job to run")
    wait_for(lambda: all(c.get(i).status == "deferred" for i in held), timeout=5, what="held jobs")
    assert all(c.get(i).as_dict()["attempt"] == 0 for i in held)
    assert not any(started_at(project, i) for i in held)
    assert c.paused()["fast"]["paused_functions"] == ["limited"]
    assert c.resume(function="limited") == 4
    wait_for(lambda: all_done(project, held), timeout=20, what="the held jobs to run after resume")
    starts = [started_at(project, i) for i in held]
    assert starts == sorted(starts), "held jobs ran out of order"  # type: ignore[type-var]


BUSY = '''"""Holds the only executor until a file appears."""
import os
import time
QUEUE = "fast"


def handle(payload, ctx):
    with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id + ".in"), "a") as f:
        f.write(f"{time.time()}\\n")
    end = time.time() + 30
    while not os.path.exists(os.path.join(os.environ["RECORD_DIR"], "release")) and time.time() < end:
        time.sleep(0.01)
'''


def claimed_ahead(project: Project, n: int) -> tuple[str, list[str]]:
    """One executor (prefetch 8) held by a busy job until $RECORD_DIR/release appears, and
    ``n`` jobs of `limited` that the worker claimed ahead of it: (busy id, their ids)."""
    # (a lease of 10 s: the busy job's renewals on a loaded host never let it lapse, which
    # would send it back to ready, where the pause keeps it)
    project.write_config(vt=10, concurrency=1, prefetch=8)
    add_function(project, "busy", BUSY)
    add_limited(project, "None")
    c = project.client
    busy = c.enqueue("busy", {}).id
    project.spawn_worker("fast")
    wait_for(lambda: started_at(project, busy), timeout=30, what="the busy job")
    ids = [c.enqueue("limited", {}).id for _ in range(n)]
    r, claims = project.runtime.redis, project.keys().claims
    wait_for(lambda: all(r.hexists(claims, i) for i in ids), timeout=10, what="the jobs claimed ahead")
    return busy, ids


@pytest.mark.parametrize("what", ["function", "queue"])
def test_jobs_claimed_ahead_do_not_start_after_a_pause(project: Project, what: str) -> None:
    """One executor busy, prefetch 8: four jobs sit claimed ahead in the worker when the
    function (or the queue) is paused. They never start while the pause lasts: the worker
    hands them back, spending nothing, and a resume runs each once."""
    busy, held = claimed_ahead(project, 4)
    c = project.client
    r, claims = project.runtime.redis, project.keys().claims
    if what == "function":
        c.pause(function="limited")
    else:
        c.pause("fast")
    wait_for(lambda: not any(r.hexists(claims, i) for i in held), timeout=15, what="the claims handed back")
    (project.records / "release").touch()
    assert c.wait(busy, 10).status == "done"
    time.sleep(1.0)  # a start would have come by now
    assert not any(started_at(project, i) for i in held)
    assert all(c.get(i).as_dict()["attempt"] == 0 for i in held)
    if what == "function":
        c.resume(function="limited")
    else:
        c.resume("fast")
    wait_for(lambda: all_done(project, held), timeout=20, what="the jobs to run after the resume")
    assert all(len(project.runs(i)) == 1 for i in held)


def test_pause_and_resume_over_http_and_the_cli_show_in_queues_and_stats(project: Project) -> None:
    """POST /queues/{q}/pause|resume and /functions/{type}/pause|resume change what GET
    /queues and `runner stats` show; `runner pause` / `runner resume` do the same; the
    routes are in /openapi.json; an unknown queue or function is a 404 / a refusal."""
    add_limited(project, "None")
    app = falcon.testing.TestClient(create_app(project.runtime))

    def queue_state() -> tuple[bool, list[str]]:
        (q,) = [q for q in app.simulate_get("/queues").json["queues"] if q["name"] == "fast"]
        return q["paused"], q["paused_functions"]

    assert app.simulate_post("/queues/fast/pause").json == {"queue": "fast", "paused": True, "paused_functions": []}
    assert queue_state() == (True, [])
    assert app.simulate_post("/functions/limited/pause").json["paused"] is True
    assert queue_state() == (True, ["limited"])
    assert app.simulate_post("/queues/fast/resume").status_code == 200
    resumed = app.simulate_post("/functions/limited/resume").json
    assert resumed == {"function": "limited", "queue": "fast", "paused": False, "resumed_jobs": 0}
    assert queue_state() == (False, [])
    assert app.simulate_post("/queues/nope/pause").status_code == 404
    assert app.simulate_post("/functions/nope/pause").status_code == 404
    doc = app.simulate_get("/openapi.json").json
    validate_openapi(doc)
    assert "post" in doc["paths"]["/functions/{type}/pause"] and "post" in doc["paths"]["/queues/{queue}/resume"]

    def run(*args: str) -> str:
        out = CliRunner().invoke(cli, ["--config", str(project.root / "runner.toml"), *args],
                                 env=project.env, catch_exceptions=False)
        assert out.exit_code == 0, out.output
        return out.output

    assert run("pause", "--function", "limited") == "paused function limited\n"
    assert run("pause", "fast") == "paused queue fast\n"
    (row,) = [line for line in run("stats").splitlines() if line.startswith("fast")]
    assert row.split()[-1] == "queue"
    run("resume", "fast")
    (row,) = [line for line in run("stats").splitlines() if line.startswith("fast")]
    assert row.split()[-1] == "limited"
    assert "0 held job(s) back" in run("resume", "--function", "limited")
    assert queue_state() == (False, [])


def test_get_function_and_metrics_show_limits_use_and_holds_by_reason(project: Project) -> None:
    """GET /functions/{type} shows CONCURRENCY with the slots in use and the jobs parked on
    it, and the pause; /metrics counts held-back claims per function and reason (deferred:
    a full limit, paused: a pause) and shows a paused queue."""
    add_limited(project, "1")
    app = falcon.testing.TestClient(create_app(project.runtime))
    c = project.client
    project.spawn_worker("fast")
    first = c.enqueue("limited", {"hold": 30}).id
    wait_for(lambda: started_at(project, first), timeout=30, what="the slot to be taken")
    c.enqueue("limited", {})
    flow = wait_for(lambda: (f := app.simulate_get("/functions/limited").json["flow"])["concurrency"]["waiting"]
                    and f, timeout=10, what="a job parked on the limit")
    assert flow == {"paused": False, "held_by_pause": 0,
                    "concurrency": {"limit": 1, "key": None, "running": 1, "waiting": 1}}
    c.pause(function="limited")
    c.enqueue("limited", {})
    wait_for(lambda: app.simulate_get("/functions/limited").json["flow"]["held_by_pause"] == 1, timeout=10,
             what="a job held by the pause")
    c.pause("fast")
    text = app.simulate_get("/metrics").text
    lines = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
             if line and not line.startswith("#")}
    assert lines['runner_jobs_deferred_total{function="limited",queue="fast"}'] >= 1
    assert lines['runner_jobs_paused_total{function="limited",queue="fast"}'] == 1
    assert lines['runner_queue_paused{queue="fast"}'] == 1


RATED = '''"""Records its start; rate limited."""
import os
import time
QUEUE = "fast"
RATE_LIMIT = {"limit": 20, "period": 1}


def handle(payload, ctx):
    with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id + ".in"), "a") as f:
        f.write(f"{time.time()} {ctx.attempt}\\n")
'''


def test_a_rate_limit_of_20_a_second_gives_200_starts_in_10_s_spread_evenly(project: Project) -> None:
    """RATE_LIMIT 20 per second over 260 jobs on 4 workers: after the first second's
    burst of 20, the next 10 s hold 200 +- 5 starts, about 20 in each second, all on
    their first attempt (held-back jobs spend none), each job held back at most once."""
    add_function(project, "rated", RATED)
    ids = [e.id for e in project.client.enqueue_many(  # type: ignore[union-attr]
        Request("rated", {}) for _ in range(260))]
    for _ in range(4):
        project.spawn_worker("fast")
    wait_for(lambda: sum(started_at(project, i) is not None for i in ids) >= 240, timeout=60, interval=0.2,
             what="240 rated starts")
    lines = [parts for i in ids if (p := project.records / f"{i}.in").exists() and (parts := p.read_text().split())]
    assert all(attempt == "1" for _, attempt in lines)
    starts = sorted(float(t) for t, _ in lines)
    t0 = starts[0]
    window = [t for t in starts if t0 + 1 <= t < t0 + 11]
    assert 195 <= len(window) <= 205, len(window)
    per_second = [sum(1 for t in window if t0 + 1 + s <= t < t0 + 2 + s) for s in range(10)]
    assert all(16 <= n <= 24 for n in per_second), per_second
    # Each held-back job was scheduled once, for its own token: no retrying storm.
    assert project.client.stats()["fast"]["counters"]["ratelimited|rated"] <= len(ids)


THROTTLED = '''"""Told "too many requests" on its first two runs."""
import os
import time
import runner
QUEUE = "fast"
MAX_ATTEMPTS = 1


def handle(payload, ctx):
    p = os.path.join(os.environ["RECORD_DIR"], ctx.job_id + ".in")
    with open(p, "a") as f:
        f.write(f"{time.time()} {ctx.attempt}\\n")
    with open(p) as f:
        if len(f.readlines()) <= 2:
            raise runner.RateLimited(retry_after=1)
    return "ok"
'''


def test_rate_limited_from_a_handler_puts_the_job_back_without_spending_an_attempt(project: Project) -> None:
    """A handler with MAX_ATTEMPTS = 1 raises RateLimited(retry_after=1) twice: the job
    runs a third time and is done on attempt 1, each run at least a second after the one
    before, with two "rate limited" entries in its history."""
    add_function(project, "throttled", THROTTLED)
    c = project.client
    job = c.enqueue("throttled", {}).id
    project.spawn_worker("fast")
    done = wait_for(lambda: (j := c.get(job).as_dict())["status"] in ("done", "dead") and j, timeout=30,
                    what="the throttled job to finish")
    assert done["status"] == "done" and done["attempt"] == 1, done
    runs = [line.split() for line in (project.records / f"{job}.in").read_text().splitlines()]
    assert [a for _, a in runs] == ["1", "1", "1"]
    times = [float(t) for t, _ in runs]
    assert all(b - a >= 0.95 for a, b in itertools.pairwise(times)), times
    assert [h["outcome"] for h in done["history"]] == ["rate limited", "rate limited", "done"]


ALWAYS_THROTTLED = '''"""Told "too many requests" on every run, and succeeds past its 101st."""
import os
import runner
QUEUE = "fast"
MAX_ATTEMPTS = {attempts}


def handle(payload, ctx):
    p = os.path.join(os.environ["RECORD_DIR"], ctx.job_id + ".in")
    with open(p, "a") as f:
        f.write(f"{{ctx.attempt}}\\n")
    with open(p) as f:
        if len(f.readlines()) <= 101:
            raise runner.RateLimited(retry_after=0)
    return "ran past its budget"
'''


@pytest.mark.parametrize("attempts", [1, 2])
def test_rate_limited_past_its_free_uses_spends_attempts_and_never_runs_past_the_budget(
        project: Project, attempts: int) -> None:
    """RateLimited is free 100 times a job; past that each counts as an attempt. With
    MAX_ATTEMPTS = 1 the 101st run is the last: the job is dead ("max attempts reached",
    attempt 1) and never runs a 102nd time; with 2, the 102nd run is the second attempt."""
    add_function(project, "throttled", ALWAYS_THROTTLED.format(attempts=attempts))
    # Each run is back after the scheduler's next pass: a pass every 10 ms, not 50 ms,
    # makes the 101 runs a second or two.
    toml = project.root / "runner.toml"
    toml.write_text(toml.read_text().replace("scheduler_interval = 0.05", "scheduler_interval = 0.01"))
    c = project.client
    job = c.enqueue("throttled", {}).id
    project.spawn_worker("fast")
    final = wait_for(lambda: (j := c.get(job).as_dict())["status"] in ("done", "dead") and j, timeout=60,
                     what="the throttled job to finish")
    runs = (project.records / f"{job}.in").read_text().split()
    if attempts == 1:
        assert final["status"] == "dead" and final["reason"] == "max attempts reached", final
        assert final["attempt"] == 1 and len(runs) == 101, (final["attempt"], len(runs))
    else:
        assert final["status"] == "done" and final["attempt"] == 2 and len(runs) == 102, final
        assert runs[-1] == "2" and set(runs[:-1]) == {"1"}


def test_a_high_priority_job_behind_10000_plain_ones_starts_next(project: Project) -> None:
    """One worker of one thread busy with a job; 10,000 plain jobs queue up, then one of
    priority 9: it is the next job to start."""
    project.write_config(concurrency=1, prefetch=0)
    add_limited(project, "None")
    c = project.client
    project.spawn_worker("fast")
    busy = c.enqueue("limited", {"hold": 5.0}).id  # outlasts the enqueue of 10,000 on a slow machine
    wait_for(lambda: started_at(project, busy), timeout=30, what="the worker to be busy")
    for _ in range(10):
        c.enqueue_many(Request("limited", {}) for _ in range(1000))
    high = c.enqueue("limited", {}, priority=9).id
    assert c.stats()["fast"]["ready"] >= 10_000
    start = wait_for(lambda: started_at(project, high), timeout=30, what="the high-priority job to start")
    others = [float(p.read_text().split()[0]) for p in project.records.glob("*.in")
              if p.stem not in (busy, high) and p.read_text().split()]
    assert all(t > start for t in others), "a plain job started before the high-priority one"


URGENT = '''"""Records its start, like limited."""
import os
import time
QUEUE = "fast"
PRIORITY = 9


def handle(payload, ctx):
    with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id + ".in"), "a") as f:
        f.write(f"{time.time()}\\n")
'''

FAN_OUT = '''"""Writes 20 plain follow-ups, then one of a PRIORITY = 9 function, then one of priority 7."""
QUEUE = "fast"


def handle(payload, ctx):
    plain = [ctx.enqueue("limited", {}).id for _ in range(20)]
    urgent = ctx.enqueue("urgent", {}).id
    seven = ctx.enqueue("limited", {}, priority=7).id
    return {"plain": plain, "urgent": urgent, "seven": seven}
'''


def test_jobs_a_handler_writes_keep_their_priority(project: Project) -> None:
    """A handler's follow-ups go in with its ack: one of a function with PRIORITY = 9 and
    one given ``priority=7`` start before the 20 plain ones written with them, highest
    first, though they were written last; an out-of-range priority is refused in the
    handler."""
    project.write_config(concurrency=1, prefetch=0)
    add_limited(project, "None")
    for name, text in (("urgent", URGENT), ("fan_out", FAN_OUT)):
        add_function(project, name, text, '{"type": "object"}')
    c = project.client
    parent = c.enqueue("fan_out", {}).id
    project.spawn_worker("fast")
    made = c.wait(parent, timeout_s=30).as_dict()["result"]
    ids = [*made["plain"], made["urgent"], made["seven"]]
    wait_for(lambda: all(started_at(project, i) for i in ids), timeout=30, what="the follow-ups to start")
    order = sorted(ids, key=lambda i: started_at(project, i) or 0)
    assert order[:2] == [made["urgent"], made["seven"]], [ids.index(i) for i in order]

    from runner.testing import run_inline

    (project.root / "functions" / "fan_out.py").write_text(FAN_OUT.replace("priority=7", "priority=10"))
    outcome = run_inline("fan_out", {}, project=project.root)
    assert outcome.status != "done" and outcome.error is not None, outcome
    assert "priority must be 0 to 9, got 10" in outcome.error["message"], outcome.error


def test_priority_over_http_and_the_cli_and_a_bad_one_is_refused(project: Project) -> None:
    """?priority= and --priority put the job in the priority set; 10 is refused."""
    add_limited(project, "None")
    app = falcon.testing.TestClient(create_app(project.runtime))
    assert app.simulate_post("/jobs/limited?priority=5", json={}).status_code == 202
    assert app.simulate_post("/jobs/limited?priority=10", json={}).status_code == 400
    out = CliRunner().invoke(cli, ["--config", str(project.root / "runner.toml"), "enqueue", "limited", "{}",
                                   "--priority", "7"], env=project.env, catch_exceptions=False)
    assert out.exit_code == 0, out.output
    r = project.runtime.redis
    assert sorted(-int(s // 1e13) for _, s in r.zrange(project.keys().prio, 0, -1, withscores=True)) == [5, 7]


def test_a_job_claimed_ahead_shows_no_attempt_spent_and_no_start(project: Project) -> None:
    """A job a worker claimed ahead waits there for an executor: GET /jobs/{id} shows it
    held (processing, its worker, claimed_ahead) with no attempt spent and no start time,
    until its handler starts."""
    _, (ahead,) = claimed_ahead(project, 1)
    c = project.client
    d = c.get(ahead).as_dict()
    assert (d["status"], d["attempt"], d["started_at"], d["claimed_ahead"]) == ("processing", 0, None, True), d
    assert d["worker"]
    (project.records / "release").touch()
    done = c.wait(ahead, 15).as_dict()
    assert done["status"] == "done" and done["attempt"] == 1 and done["started_at"] is not None
