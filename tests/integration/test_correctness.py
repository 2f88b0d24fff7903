"""Correctness of idempotency keys, resource locks, clocks and rolling deploys, each
through the public client or CLI and real worker processes on a real server:

- an idempotency key belongs to one function, lives as long as its job is unfinished,
  is completed only by its own job, and is released when that job dies or is purged;
- 7 and 7.0 render the same key;
- leases and due times are judged by the server's clock, not each host's;
- a child process's job shows its handler's start, not its claim's;
- a worker that does not know a job's type or version hands it to a newer worker
  (for a bounded time) instead of burying it;
- a prefetched job holds no resource lock, and jobs waiting on a resource start in the
  order they arrived;
- the dead-letter trim does bounded work per call.
"""

from __future__ import annotations

import itertools
import os
import shutil
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from runner.cli import cli
from runner.errors import IdempotencyConflict

from conftest import SCAN_COUNT, Project, wait_for

SCHEMA = """{{"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
 "properties": {{{props}}}}}"""


def add_function(project: Project, name: str, body: str, props: str = "", version: int = 1) -> None:
    (project.root / "functions" / f"{name}.py").write_text(body)
    folder = project.root / "schemas" / name
    folder.mkdir(parents=True, exist_ok=True)
    for v in range(1, version + 1):
        (folder / f"v{v}.json").write_text(SCHEMA.format(props=props))
    project._runtime = None


KEYED = '''"""Keyed by user_id; records each run."""
import os
QUEUE = "fast"
IDEMPOTENCY_KEY = "{{user_id}}"
MAX_ATTEMPTS = {attempts}


def handle(payload, ctx):
    with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id), "a") as f:
        f.write(f"{{ctx.type}} {{ctx.attempt}}\\n")
    if payload.get("fail"):
        raise RuntimeError("planned failure")
    return {{"type": ctx.type}}
'''
USER = '"user_id": {"type": "integer"}, "fail": {"type": "boolean"}, "note": {"type": "string"}'


def final(project: Project, job_id: str, timeout: float = 20) -> dict:
    c = project.client
    return wait_for(lambda: (j := c.get(job_id).as_dict())["status"] in ("done", "dead") and j,
                    timeout=timeout, what=f"job {job_id} to finish")


def test_idempotency_keys_belong_to_their_function(project: Project) -> None:
    """Two functions on one queue with the same IDEMPOTENCY_KEY template and payload: the
    second enqueue is a new job of its own function, not a duplicate of the first, and
    both run."""
    add_function(project, "welcome", KEYED.format(attempts=3), USER)
    add_function(project, "provision", KEYED.format(attempts=3), USER)
    c = project.client
    w = c.enqueue("welcome", {"user_id": 7})
    p = c.enqueue("provision", {"user_id": 7})
    assert not p.duplicate and p.id != w.id and p.type == "provision"
    again = c.enqueue("provision", {"user_id": 7})
    assert again.duplicate and again.id == p.id
    project.spawn_worker("fast")
    assert final(project, w.id)["result"] == {"type": "welcome"}
    assert final(project, p.id)["result"] == {"type": "provision"}


def test_a_key_lives_as_long_as_its_job_is_unfinished(project: Project) -> None:
    """Job A is delayed past the key retention (2 s). A second enqueue with the same key and
    another payload is still a conflict naming A (the key did not expire under a waiting
    job); A runs once; after A completes its key answers duplicates of A, and only once the
    retention has passed after A's completion does the other payload get a job of its own."""
    project.write_config()
    toml = project.root / "runner.toml"
    toml.write_text(toml.read_text().replace("idempotency = 3600", "idempotency = 2"))
    project._runtime = None
    add_function(project, "welcome", KEYED.format(attempts=3), USER)
    c = project.client
    a = c.enqueue("welcome", {"user_id": 1}, delay=3)
    time.sleep(2.5)  # past the key retention, before A is due
    with pytest.raises(IdempotencyConflict) as exc:
        c.enqueue("welcome", {"user_id": 1, "note": "other"})
    assert exc.value.job_id == a.id
    project.spawn_worker("fast")
    assert final(project, a.id)["status"] == "done"
    dup = c.enqueue("welcome", {"user_id": 1})
    assert dup.duplicate and dup.id == a.id and dup.status == "done"
    with pytest.raises(IdempotencyConflict):
        c.enqueue("welcome", {"user_id": 1, "note": "other"})
    b = wait_for(lambda: _try(c, "welcome", {"user_id": 1, "note": "other"}), timeout=10,
                 what="the completed key to age out")
    assert b.id != a.id and not b.duplicate
    assert final(project, b.id)["status"] == "done"
    assert project.runs(a.id) == ["welcome 1"]


def _try(c, type_: str, payload: dict):
    try:
        return c.enqueue(type_, payload)
    except IdempotencyConflict:
        return None


def test_a_dead_or_purged_jobs_key_can_be_used_again(project: Project) -> None:
    """A key remembers a completed job; a job that died releases it, so enqueueing the same
    key (same or fixed payload) makes a new job, and so does it after a purge."""
    add_function(project, "welcome", KEYED.format(attempts=1), USER)
    c = project.client
    first = c.enqueue("welcome", {"user_id": 3, "fail": True})
    project.spawn_worker("fast")
    assert final(project, first.id)["status"] == "dead"
    retry = c.enqueue("welcome", {"user_id": 3, "fail": True})
    assert not retry.duplicate and retry.id != first.id
    assert final(project, retry.id)["status"] == "dead"
    c.purge_dead("fast")
    fixed = c.enqueue("welcome", {"user_id": 3})
    assert not fixed.duplicate and fixed.id not in (first.id, retry.id)
    assert final(project, fixed.id)["status"] == "done"
    assert c.enqueue("welcome", {"user_id": 3}).duplicate


def test_integral_floats_render_the_same_key(project: Project) -> None:
    """{"user_id": 7} and {"user_id": 7.0} both pass "type": "integer" and are the same
    request: the second is a duplicate of the first, not a conflict or a second job."""
    add_function(project, "welcome", KEYED.format(attempts=3), USER)
    c = project.client
    a = c.enqueue("welcome", {"user_id": 7})
    b = c.enqueue("welcome", {"user_id": 7.0})
    assert b.duplicate and b.id == a.id


SKEW = """# Shifts this process's wall clock, as a host whose clock is off would have it.
import os
import time

_off = float(os.environ.get("SKEW_SECONDS", "0"))
_time, _time_ns = time.time, time.time_ns
time.time = lambda: _time() + _off
time.time_ns = lambda: _time_ns() + int(_off * 1e9)
"""


def skewed(tmp_path: Path, seconds: float) -> dict[str, str]:
    """The environment of a process whose wall clock (time.time) is ``seconds`` off: a
    sitecustomize module that Python runs at start-up (its monotonic clock is left as is,
    as on a real host)."""
    folder = tmp_path / f"skew{seconds:+g}"
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(SKEW)
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "SKEW_SECONDS": str(seconds)}


def test_a_worker_whose_clock_is_behind_keeps_its_lease(project: Project, tmp_path: Path) -> None:
    """A worker host 2.5 s behind runs a 5 s job on a queue with a 3 s lease, while a worker
    with the right time runs the scheduler too: the job is never reclaimed, and runs once."""
    project.write_config(slow_vt=3)
    c = project.client
    job = c.enqueue("slow", {"seconds": 5})
    project.spawn_worker("slow", env=skewed(tmp_path, -2.5))
    wait_for(lambda: project.runs(job.id), timeout=20, what="the skewed worker to start the job")
    project.spawn_worker("slow")
    done = final(project, job.id, timeout=30)
    assert done["status"] == "done" and done["attempt"] == 1, done
    assert len(project.runs(job.id)) == 1


def test_an_operators_actions_are_on_record_at_the_servers_time(project: Project, tmp_path: Path) -> None:
    """`runner cancel` and `runner dead requeue` from a host an hour behind: the entries
    they put in the jobs' history and on the audit trail carry the Redis server's time,
    as every other time of a job does, not the operator's host's."""
    import subprocess
    import sys

    c = project.client
    later = c.enqueue("record", {"n": 1}, delay=600).id
    dead = c.enqueue("perm", {}).id
    project.spawn_worker("fast")
    wait_for(lambda: c.get(dead).status == "dead", timeout=20, what="the job to die")
    env = {**project.env, **skewed(tmp_path, -3600)}
    for args in (["cancel", later], ["dead", "requeue", dead]):
        out = subprocess.run([sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"),
                              *args], env=env, cwd=project.root, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
    sec, usec = project.runtime.redis.time()
    server_ms = int(sec) * 1000 + int(usec) // 1000
    cancelled = next(e for e in c.get(later).as_dict()["history"] if e["outcome"] == "cancel")
    requeued = next(e for e in c.get(dead).as_dict()["history"] if e["outcome"] == "requeued")
    for entry in (cancelled, requeued):
        assert abs(entry["at_ms"] - server_ms) < 60_000, (entry, server_ms)
    _, trail = c.audit()
    assert [e["action"] for e in trail] == ["requeue", "cancel"]
    assert all(abs(e["at_ms"] - server_ms) < 60_000 for e in trail), (trail, server_ms)


def test_a_delay_is_measured_on_the_servers_clock(project: Project, tmp_path: Path) -> None:
    """A producer host 30 s ahead enqueues with delay=1: the job runs about 1 s later (a due
    time written in the producer's clock would be 31 s away)."""
    import json
    import subprocess
    import sys

    project.spawn_worker("fast")
    out = subprocess.run([sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"),
                          "enqueue", "record", '{"n": 1}', "--delay", "1", "--json"],
                         env={**project.env, **skewed(tmp_path, 30)}, cwd=project.root, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    done = final(project, json.loads(out.stdout)["id"])
    # Measured from the enqueue as the server recorded it (a loaded host's CLI start-up
    # is no part of the delay).
    waited = done["started_at"] - done["created_at"]
    assert 0.9 <= waited < 5, f"ran {waited:.2f} s after the enqueue"



SLOW_IMPORT = '''
import os, time
QUEUE = "fast"
ISOLATION = "process"
if os.environ.get("RUNNER_CHILD_OF"):  # in the child only: its import takes 1.2 s
    time.sleep(1.2)


def handle(payload, ctx):
    return time.time()
'''


def test_a_fresh_childs_quick_job_shows_its_handlers_start(project: Project) -> None:
    """A quick job on a fresh child whose import takes 1.2 s: its started_at is its handler's
    start, not its claim 1.2 s before (the run's start mark went no further than the settle
    that also held its end, and the outcome kept the claim's time)."""
    project.write_config(concurrency=1)  # one job, one child (each one started is ~0.3 s of CPU)
    project.add_function("slow_import", SLOW_IMPORT)
    project.spawn_worker("fast")
    c = project.client
    job = c.enqueue("slow_import", {}).id
    done = c.wait(job, 60).as_dict()
    assert done["status"] == "done" and done["attempt"] == 1, done
    early = done["result"] - done["started_at"]
    assert -0.5 < early < 0.5, f"started_at is {early:.2f} s before the handler began"

SLOW_IMPORT_ENDS = '''
import os, time
from runner import Retry
QUEUE = "fast"
ISOLATION = "process"
MAX_ATTEMPTS = {attempts}
if os.environ.get("RUNNER_CHILD_OF"):  # in the child only: its import takes 1.2 s
    time.sleep(1.2)


def handle(payload, ctx):
{body}
'''
ENDS = {
    # A failed attempt with attempts left (its retry far off, so its record stays to read).
    "retried": (3, "    raise Retry(600, f'began {time.time():.3f}')"),
    # The last attempt failed: the dead-letter record. (A Retry: it ends at once, with no
    # traceback to format, so its end and its start mark reach the same settle.)
    "buried": (1, "    raise Retry(600, f'began {time.time():.3f}')"),
    # A durable function's first run ends at a sleep; its next run ends it.
    "slept": (3, "    began = ctx.step('began', time.time)\n    ctx.sleep('nap', 0.2)\n    return began"),
}


def test_a_fresh_childs_failed_or_suspended_run_shows_its_handlers_start(project: Project) -> None:
    """A fresh child whose imports take 1.2 s per function (past the 0.5 s bound): a run that fails (a retry, a
    death) or ends at a sleep records its handler's start, as a success does: the view's
    started_at (GET /jobs/{id}, `runner job`, the dead-letter list) and its history entry.
    Its start mark went no further than the settle that also held its end, and retry.lua,
    bury.lua and suspend.lua wrote the claim's time, seconds before the handler began."""
    project.write_config(concurrency=len(ENDS))  # a fresh child for each job, and no more
    for name, (attempts, body) in ENDS.items():
        project.add_function(name, SLOW_IMPORT_ENDS.format(attempts=attempts, body=body))
    c = project.client
    jobs = {name: c.enqueue(name, {}).id for name in ENDS}
    project.spawn_worker("fast")
    for name, status in (("retried", "retrying"), ("buried", "dead"), ("slept", "done")):
        wait_for(lambda i=jobs[name], s=status: c.get(i).status == s, timeout=60, what=f"{name} to be {status}")
    for name in ("retried", "buried"):
        view = c.get(jobs[name]).as_dict()
        began = float(view["last_error"]["message"].split()[-1])
        (entry,) = view["history"]
        assert view["attempt"] == entry["attempt"] == 1, view
        for where, at in (("started_at", view["started_at"]), ("history", entry["started_ms"] / 1000)):
            assert -0.5 < began - at < 0.5, f"{name}: {where} is {began - at:.2f} s before the handler began"
    (dead,) = [j for j in c.dead("fast")[1] if j.id == jobs["buried"]]
    assert -0.5 < float(dead.as_dict()["last_error"]["message"].split()[-1]) - dead.as_dict()["started_at"] < 0.5
    slept = c.get(jobs["slept"]).as_dict()
    assert -0.5 < slept["result"] - slept["started_at"] < 0.5, \
        f"a resumed run's started_at is {slept['result'] - slept['started_at']:.2f} s before its first run began"


ONLY_V1 = '''"""Knows payload v1 only."""
QUEUE = "fast"


def handle(payload, ctx):
    return {"v": ctx.version}
'''


def test_a_worker_that_does_not_know_a_type_hands_it_to_a_newer_worker(project: Project, tmp_path: Path) -> None:
    """Rolling deploy: the producer knows function `fresh`, the running worker does not. The
    job is not buried as "unknown type": it waits, and a worker with the new code runs it."""
    old = tmp_path / "old"
    shutil.copytree(project.root, old)
    add_function(project, "fresh", ONLY_V1)
    c = project.client
    job = c.enqueue("fresh", {})
    import subprocess
    import sys

    with open(tmp_path / "old.log", "wb") as log:
        old_worker = subprocess.Popen([sys.executable, "-m", "runner.cli", "--config", str(old / "runner.toml"),
                                       "worker", "--queue", "fast"], cwd=old, env=project.env,
                                      stdout=log, stderr=subprocess.STDOUT)
    project.procs.append(old_worker)
    wait_for(lambda: c.get(job.id).as_dict()["deferrals"] >= 1 or c.get(job.id).status != "queued",
             timeout=20, what="the old worker to see the job")
    assert c.get(job.id).status not in ("dead", "done")
    # The deploy gate sees it from the other side: a live worker behind the code on disk.
    out = CliRunner().invoke(cli, ["--config", str(project.root / "runner.toml"), "check", "--json"],
                             env=project.env)
    import json

    behind = [p for p in json.loads(out.stdout)["problems"] if "does not know function fresh" in p["message"]]
    assert behind and behind[0]["severity"] == "warning", out.stdout
    project.spawn_worker("fast")
    assert final(project, job.id)["status"] == "done"


def test_an_unknown_version_waits_for_a_newer_worker_for_a_bounded_time(project: Project, tmp_path: Path) -> None:
    """A v2 job reaches a worker that knows only v1: it is put back, not buried; with nobody
    newer coming, it goes dead as "unknown version" once [worker] unknown_grace (4 s here)
    has passed since it was enqueued."""
    project.write_config(worker="unknown_grace = 4")
    add_function(project, "versioned", ONLY_V1, version=2)
    c = project.client
    job = c.enqueue("versioned", {}, version=2)
    (project.root / "schemas" / "versioned" / "v2.json").unlink()
    project.spawn_worker("fast")
    seen = wait_for(lambda: (j := c.get(job.id).as_dict())["status"] == "dead" and j, timeout=20,
                    what="the job to give up")
    assert seen["reason"] == "unknown version"
    assert seen["finished_at"] - seen["created_at"] >= 4.0
    assert seen["deferrals"] >= 1


HOLDER = '''"""Holds a resource while it sleeps; records enter and exit."""
import os
import time
QUEUE = "fast"
RESOURCE_KEY = "res:{r}"


def handle(payload, ctx):
    start = time.time()
    time.sleep(payload.get("hold", 0))
    with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id), "a") as f:
        f.write(f"{start} {time.time()}\\n")
'''


def test_resource_keys_of_integral_floats_exclude_each_other(project: Project) -> None:
    """RESOURCE_KEY "res:{r}" with r = 1 and r = 1.0 is one resource: never inside at once."""
    add_function(project, "holder", HOLDER, '"r": {"type": "integer"}, "hold": {"type": "number"}')
    c = project.client
    ids = [c.enqueue("holder", {"r": v, "hold": 0.3}).id for v in (1, 1.0, 1, 1.0)]
    project.spawn_worker("fast")
    for i in ids:
        final(project, i)
    spans = sorted(tuple(map(float, line.split()[:2])) for i in ids for line in project.runs(i))
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end, "two jobs were inside one resource at once"


def test_a_prefetched_job_holds_no_resource_lock(project: Project) -> None:
    """Worker A (one thread, prefetch 4) is busy with a 3 s job when two jobs on resource r
    arrive; worker B is idle. B runs both r jobs while A is still busy: A's prefetch never
    took r's lock for a job it could not start."""
    project.write_config(concurrency=1, prefetch=4)
    c = project.client
    long_job = c.enqueue("record", {"n": 1, "sleep": 3})
    project.spawn_worker("fast")
    wait_for(lambda: project.runs(long_job.id), timeout=15, what="the long job to start")
    r_jobs = [c.enqueue("resource", {"r": "x", "hold": 0.05}).id for _ in range(2)]
    time.sleep(0.3)  # worker A's fetcher claims what it can meanwhile
    project.spawn_worker("fast")
    wait_for(lambda: len(c.workers()) == 2, timeout=30, what="worker B to start")
    b_up = time.time()
    for i in r_jobs:
        assert final(project, i)["status"] == "done"
    # B runs them within 3 s of being up, or of A's long job ending, whichever is later (a
    # loaded host may start B late); a lock held by A's prefetch would hold them until A
    # itself got to them, after its long job.
    long_end = float(project.runs(long_job.id)[0].split()[2])
    ends = [float(project.runs(i)[0].split()[1]) for i in r_jobs]
    assert max(ends) < max(long_end, b_up) + 3, "a resource job waited behind a prefetch that held its lock"


def test_jobs_waiting_on_a_resource_start_in_arrival_order(project: Project) -> None:
    """Twelve jobs on one resource, three workers of four threads: they run one at a time and
    start in the order they were enqueued (the woken waiter gets the lock, no arrival jumps
    the line), and a job waiting a long time leaves one waiter entry, not one per retry."""
    project.write_config(concurrency=4, prefetch=0)
    add_function(project, "holder", HOLDER, '"r": {"type": "string"}, "hold": {"type": "number"}')
    c = project.client
    first = c.enqueue("holder", {"r": "q", "hold": 2.0})
    for _ in range(3):
        project.spawn_worker("fast")
    wait_for(lambda: project.runs(first.id) or c.get(first.id).status == "processing", timeout=15,
             what="the first holder to start")
    waiters = []
    for _ in range(11):
        waiters.append(c.enqueue("holder", {"r": "q", "hold": 0.05}).id)
        time.sleep(0.02)
    time.sleep(1.0)
    r = project.runtime.redis
    pattern = project.keys().base.replace("{", "\\{").replace("}", "\\}") + "*waiters*"
    keys = r.scan_iter(count=SCAN_COUNT, match=pattern)
    entries = sum(r.llen(k) if r.type(k) == "list" else r.zcard(k) for k in keys)
    assert entries <= len(waiters), f"{entries} waiter entries for {len(waiters)} waiting jobs"
    for i in waiters:
        assert final(project, i, timeout=30)["status"] == "done"
    starts = [float(project.runs(i)[0].split()[0]) for i in waiters]
    assert starts == sorted(starts), "waiters did not start in arrival order"


def test_the_dead_letter_trim_is_bounded_per_call(project: Project) -> None:
    """20,000 dead-letter entries past their retention: one trim call removes at most its
    bound, and the scheduler clears them all over a few passes."""
    r = project.runtime.redis
    k = project.keys()
    pipe = r.pipeline(transaction=False)
    for i in range(0, 20000, 1000):
        pipe.zadd(k.dead, {f"gone{j}": 1 for j in range(i, i + 1000)})
    pipe.execute()
    removed, _ = project.runtime.scripts.trim(k, 1000, 1000, 100)
    assert 0 < int(removed) <= 1000
    project.spawn_worker("fast")
    wait_for(lambda: r.zcard(k.dead) == 0, timeout=20, what="the scheduler to trim every entry")


def test_check_and_dev_name_a_multi_host_url_with_a_password_without_crashing(project: Project) -> None:
    """`runner check` on a Sentinel or Cluster URL with several hosts and a password that
    nothing answers: exit 3 with the password hidden, not a crash."""
    for url in ("redis+sentinel://u:s3cret@127.0.0.1:1,127.0.0.1:2/mymaster",
                "redis+cluster://u:s3cret@127.0.0.1:1,127.0.0.1:2"):
        out = CliRunner().invoke(cli, ["--config", str(project.root / "runner.toml"), "check"],
                                 env={**project.env, "REDIS_URL": url})
        assert out.exit_code == 3, (url, out.output, out.exception)
        assert "s3cret" not in out.output and "***" in out.output


FROZEN_PARENT = '''
import os, time
import redis
QUEUE = "fast"

def handle(payload, ctx):
    r = redis.Redis.from_url(os.environ["REDIS_URL"])
    sec, usec = r.time()
    r.set("ran_ms:" + ctx.job_id, int(sec) * 1000 + int(usec) // 1000)
    return ctx.enqueue("fresh", {}).id
'''


def test_a_worker_frozen_with_its_claim_pending_dates_its_ack_by_the_servers_clock(project: Project) -> None:
    """An idle worker frozen (SIGSTOP: a container freeze, a paused VM) while its blocking
    wait and claim are in flight: the server claims a job during the freeze and the worker
    reads the reply when it thaws. Its ack is dated when it lands, by the server's clock,
    never by the claim's time plus the worker's own clock since (which cannot see the
    freeze): the job's finish is not before its handler ran, and a follow-up with a
    MAX_AGE shorter than the freeze is created fresh and runs."""
    import signal

    project.add_function("parent", FROZEN_PARENT)
    project.add_function("fresh", 'QUEUE = "fast"\nMAX_AGE = 2\n\ndef handle(payload, ctx):\n    return "ran"\n')
    project.add_function("warm", 'QUEUE = "fast"\n\ndef handle(payload, ctx):\n    return 1\n')
    project.write_config(vt=30, prefetch=0)
    client, r, k = project.client, project.runtime.redis, project.keys()
    worker = project.spawn_worker("fast")
    warm = client.enqueue("warm", {}).id  # (not "fresh": its MAX_AGE may pass while the worker starts)
    wait_for(lambda: client.get(warm).status == "done", timeout=60, what="the warm-up job")
    for _ in range(5):  # (the claim must land while the worker is frozen: almost always)
        time.sleep(1.0)  # idle: the fetcher sits in its blocking wait
        os.kill(worker.pid, signal.SIGSTOP)
        try:
            job = client.enqueue("parent", {}).id
            time.sleep(0.3)
            claimed_frozen = r.hexists(k.claims, job)
            time.sleep(3.0)
        finally:
            os.kill(worker.pid, signal.SIGCONT)
        wait_for(lambda: client.get(job).status == "done", timeout=60, what="the parent")  # noqa: B023
        if claimed_frozen:
            break
    assert claimed_frozen, "the job was never claimed while the worker was frozen"
    ran = int(r.get(f"ran_ms:{job}"))
    assert int(client.get(job).fields["finished_ms"]) >= ran
    child = client.result(job, timeout=10)
    wait_for(lambda: client.get(child).status in ("done", "dead"), timeout=60, what="the follow-up")
    assert client.get(child).status == "done", client.get(child).fields
