"""ON_SUCCESS / ON_FAILURE: a destination gets the job and its result when the job's ack
lands, or the job and its error when it goes dead, each once (written in the settling
step); a destination that names no function, or whose schema cannot take the record,
refuses the function at load."""

from __future__ import annotations

import json
import textwrap

from conftest import Project, structures, wait_for

SOURCE = '''
import os
QUEUE = "fast"
MAX_ATTEMPTS = 2
BACKOFF = {"base": 0.01, "cap": 0.02, "jitter": "full"}
ON_SUCCESS = "got_result"
ON_FAILURE = "got_error"

def handle(payload, ctx):
    if payload.get("fail"):
        raise RuntimeError("boom")
    return {"doubled": payload["n"] * 2}
'''

SINK = '''
import json, os
QUEUE = "{queue}"

def handle(payload, ctx):
    with open(os.path.join(os.environ["RECORD_DIR"], "{name}-" + payload["job"]["id"]), "a") as f:
        f.write(json.dumps(payload) + "\\n")
'''


def write(project: Project, name: str, src: str, schema: str = '{"type": "object"}') -> None:
    project.add_function(name, textwrap.dedent(src), schema)


def lines(project: Project, name: str, job_id: str) -> list[dict]:
    p = project.records / f"{name}-{job_id}"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def test_destinations_get_the_result_or_the_error_once(project: Project) -> None:
    project.write_config(vt=2)
    write(project, "source", SOURCE)
    write(project, "got_result", SINK.format(queue="fast", name="got_result"))
    write(project, "got_error", SINK.format(queue="slow", name="got_error"))  # across queues: the outbox
    c = project.client
    ok = c.enqueue("source", {"n": 21}).id
    bad = c.enqueue("source", {"fail": True}).id
    project.spawn_worker("fast", "slow")
    wait_for(lambda: lines(project, "got_result", ok), timeout=20, what="the success record")
    wait_for(lambda: lines(project, "got_error", bad), timeout=20, what="the failure record")
    [got] = lines(project, "got_result", ok)
    assert got["result"] == {"doubled": 42}
    assert got["job"] == {"id": ok, "type": "source", "version": 1, "attempt": 1, "queue": "fast"}
    [err] = lines(project, "got_error", bad)
    assert err["job"]["attempt"] == 2 and err["error"]["message"] == "boom"
    assert not lines(project, "got_error", ok) and not lines(project, "got_result", bad)
    # Both ways in GET /jobs/{id}: the source names its child, the child its parent.
    assert c.get(ok).as_dict()["children"] == [f"{ok}.s"]
    assert c.get(bad).as_dict()["children"] == [f"{bad}.f"]
    assert c.wait(f"{ok}.s", 10).as_dict()["parent"] == ok
    assert c.wait(f"{bad}.f", 10).as_dict()["parent"] == bad
    assert c.get(ok).as_dict()["parent"] is None and c.get(ok).as_dict()["group"] is None
    # Counted once per landed settle: each source job wrote one; the error went through the relay.
    # (A success's follow-ups reach the figures within a second of its ack: the worker sums them.)
    stats = wait_for(lambda: (s := c.stats())["fast"]["counters"].get("followups|source") == 2 and s,
                     timeout=5, interval=0.1, what="both follow-ups in the figures")
    assert stats["fast"]["counters"].get("followups|source") == 2
    assert stats["slow"]["counters"].get("relayed|got_error") == 1


def test_a_destination_must_exist_and_take_the_record(project: Project) -> None:
    write(project, "source", SOURCE)
    write(project, "got_result", SINK.format(queue="fast", name="got_result"),
          '{"type": "object", "required": ["order_id"]}')
    reg = project.runtime.registry
    assert "source" not in reg.functions
    errors = " ".join(str(e) for e in reg.errors.values())
    assert "source.py:6: ON_SUCCESS" in errors and "rejects the record" in errors  # the option's line
    write(project, "got_result", SINK.format(queue="fast", name="got_result"))
    errors = " ".join(str(e) for e in project.runtime.registry.errors.values())
    assert "source.py:7: ON_FAILURE names no function: 'got_error'" in errors
    write(project, "source", SOURCE.replace('ON_FAILURE = "got_error"', 'ON_FAILURE = "got_reslt"'))
    errors = " ".join(str(e) for e in project.runtime.registry.errors.values())
    assert "source.py:7: ON_FAILURE names no function: 'got_reslt'; did you mean 'got_result'?" in errors


KILLER = '''
import os, signal
QUEUE = "fast"
MAX_ATTEMPTS = 1
ON_FAILURE = "got_error"

def handle(payload, ctx):
    os.kill(os.getpid(), signal.SIGKILL)  # takes its worker down: nobody settles it
'''


def test_a_job_buried_as_worker_lost_still_reaches_its_on_failure(project: Project) -> None:
    """A job that kills its worker on its last attempt is buried by the reclaim ("worker
    lost"), not by a settler: its ON_FAILURE job is still written, once, with the error."""
    project.write_config(vt=1)
    write(project, "killer", KILLER)
    write(project, "got_error", SINK.format(queue="fast", name="got_error"))
    c = project.client
    job = c.enqueue("killer", {}).id
    w = project.spawn_worker("fast")
    assert w.wait(timeout=20) == -9
    project.spawn_worker("fast")
    wait_for(lambda: lines(project, "got_error", job), timeout=30, what="the failure record")
    assert c.get(job).status == "dead" and c.get(job).as_dict()["reason"] == "worker lost"
    [err] = lines(project, "got_error", job)
    assert err["job"] == {"id": job, "type": "killer", "version": 1, "attempt": 1, "queue": "fast"}
    assert err["error"]["type"] == "WorkerLost"
    assert c.wait(f"{job}.f", 10).status == "done"
    rt = project.runtime
    wait_for(lambda: rt.redis.llen(project.keys("fast").lost) == 0, timeout=10, what="the lost list drained")
    # A second pass over the same id (a scheduler that died before clearing it) writes nothing new.
    from runner.worker import relay

    rt.redis.rpush(project.keys("fast").lost, job)
    assert relay.lost_destinations(rt, c, project.keys("fast")) == 1
    assert len(lines(project, "got_error", job)) == 1 and c.get(f"{job}.f").status == "done"


LARGE = '''
QUEUE = "fast"
ON_SUCCESS = "got_large"

def handle(payload, ctx):
    return "r" * payload["n"]
'''

LARGE_SINK = '''
import os
QUEUE = "fast"

def handle(payload, ctx):
    with open(os.path.join(os.environ["RECORD_DIR"], "got_large-" + payload["job"]["id"]), "w") as f:
        f.write(str(len(payload["result"])))
'''


def test_a_result_at_its_limit_still_reaches_its_on_success(project: Project) -> None:
    """A destination's record is built by the runner from a result already held to
    [worker] max_result_bytes, so it is not held to [api] max_body_bytes as a producer's
    payload is: a result of exactly 1 MiB of JSON (both limits at their default) makes a
    record over 1 MiB, and it is still written and run."""
    write(project, "large", LARGE)
    write(project, "got_large", LARGE_SINK)
    c = project.client
    job = c.enqueue("large", {"n": 1_048_574}).id  # "r" * n is 1,048,576 bytes of JSON
    project.spawn_worker("fast")
    assert c.wait(job, 30).status == "done"
    sink = project.records / f"got_large-{job}"
    # (the sink's handler creates its file, then writes it: wait for what it writes)
    wait_for(lambda: sink.exists() and sink.read_text(), timeout=20, what="the success record")
    assert sink.read_text() == "1048574"
    assert c.wait(f"{job}.s", 10).status == "done"


NOTIFY = '''
import runner
QUEUE = "fast"
MAX_ATTEMPTS = 1
ON_FAILURE = "{dest}"

def handle(payload, ctx):
    raise runner.PermanentFailure("pager down")
'''


def test_a_destination_cycle_is_refused_at_load(project: Project) -> None:
    """A notifier whose own failure goes to itself (or A -> B -> A, through either option)
    would turn one failure into an endless stream of dead jobs with ever longer ids: each
    function on the cycle is refused at load, naming the cycle; the rest still loads."""
    write(project, "notify", NOTIFY.format(dest="notify"))
    write(project, "got_result", SINK.format(queue="fast", name="got_result"))
    reg = project.runtime.registry
    assert "notify" not in reg.functions and "got_result" in reg.functions
    assert "notify.py:5: ON_FAILURE leads back to 'notify' (notify -> notify)" in str(reg.errors[
        str(project.root / "functions" / "notify.py")])
    write(project, "notify", NOTIFY.format(dest="pager"))
    write(project, "pager", NOTIFY.format(dest="x").replace('ON_FAILURE = "x"', 'ON_SUCCESS = "notify"'))
    reg = project.runtime.registry
    assert "notify" not in reg.functions and "pager" not in reg.functions
    errors = " ".join(str(e) for e in reg.errors.values())
    assert "(notify -> pager -> notify)" in errors and "(pager -> notify -> pager)" in errors


COOPERATIVE = '''
import time
QUEUE = "fast"
ON_FAILURE = "got_error"

def handle(payload, ctx):
    for _ in range(400):
        ctx.raise_if_cancelled()
        time.sleep(0.025)
'''


def test_a_cancelled_job_does_not_reach_its_on_failure(project: Project) -> None:
    """ON_FAILURE is for a job that goes dead; an operator's cancel of a running job
    (ending cancelled, like a cancel of a queued one) sends nothing there."""
    write(project, "coop", COOPERATIVE)
    write(project, "got_error", SINK.format(queue="fast", name="got_error"))
    c = project.client
    running, queued = c.enqueue("coop", {}).id, c.enqueue("coop", {}, delay=60).id
    project.spawn_worker("fast")
    wait_for(lambda: c.get(running).status == "processing", timeout=20, what="the job running")
    c.cancel(running)
    c.cancel(queued)
    assert c.wait(running, 10).status == "cancelled" and c.get(queued).status == "cancelled"
    probe = c.enqueue("got_error", {"job": {"id": "probe"}, "error": {}}).id
    assert c.wait(probe, 10).status == "done"  # the fast queue's worker has gone past both settlements
    assert not lines(project, "got_error", running) and not lines(project, "got_error", queued)
    assert c.get(running).as_dict()["children"] in (None, [])


STRICT_ERROR = '''{"type": "object", "required": ["job", "error"], "properties": {
  "job": {"type": "object"},
  "error": {"type": "object", "required": ["type", "message"], "additionalProperties": false,
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}}}}}'''


def test_a_destination_schema_is_checked_against_the_whole_error_record(project: Project) -> None:
    """The error an ON_FAILURE destination gets carries a traceback (and, for a payload
    found invalid at claim, its errors and version): a schema that forbids those fields
    is refused at load, not found out by every failure being dropped."""
    write(project, "source", SOURCE)
    write(project, "got_result", SINK.format(queue="fast", name="got_result"))
    write(project, "got_error", SINK.format(queue="fast", name="got_error"), STRICT_ERROR)
    reg = project.runtime.registry
    assert "source" not in reg.functions
    errors = " ".join(str(e) for e in reg.errors.values())
    assert "ON_FAILURE: the v1 schema of 'got_error' rejects the record it would get" in errors
    assert "traceback" in errors


def test_a_requeued_job_that_dies_again_reaches_its_on_failure_again(project: Project) -> None:
    """Each death of a job is its own failure: a dead job requeued (a fix that did not
    hold) that dies again sends ON_FAILURE a second record, under <id>.f2, where the first
    death's <id>.f would have deduplicated it into silence. The job's view counts its
    requeues and names the newest destination job as its child."""
    write(project, "source", SOURCE)
    write(project, "got_result", SINK.format(queue="fast", name="got_result"))
    write(project, "got_error", SINK.format(queue="fast", name="got_error"))
    c = project.client
    bad = c.enqueue("source", {"fail": True}).id
    project.spawn_worker("fast")
    wait_for(lambda: len(lines(project, "got_error", bad)) == 1, timeout=20, what="the first failure record")
    assert c.get(bad).as_dict()["requeued"] == 0
    c.requeue("fast", bad)
    wait_for(lambda: len(lines(project, "got_error", bad)) == 2, timeout=20, what="the second failure record")
    view = c.get(bad).as_dict()
    assert view["status"] == "dead" and view["requeued"] == 1 and view["children"] == [f"{bad}.f2"]
    assert c.wait(f"{bad}.f", 10).status == "done" and c.wait(f"{bad}.f2", 10).status == "done"
    assert c.get(f"{bad}.f2").as_dict()["parent"] == bad
    assert [r["job"]["attempt"] for r in lines(project, "got_error", bad)] == [2, 2]


def test_a_requeued_job_lost_again_reaches_its_on_failure_again(project: Project) -> None:
    """The lease reclaim's burial ("worker lost") of a requeued job writes its own
    ON_FAILURE job too (<id>.f2), as a settler's burial would."""
    project.write_config(vt=1)
    write(project, "killer", KILLER)
    write(project, "got_error", SINK.format(queue="fast", name="got_error"))
    c = project.client
    job = c.enqueue("killer", {}).id
    for n in (1, 2):
        if n == 2:
            c.requeue("fast", job)
        assert project.spawn_worker("fast").wait(timeout=20) == -9  # it claimed the job and died
        reaper = project.spawn_worker("fast")
        wait_for(lambda n=n: len(lines(project, "got_error", job)) == n, timeout=30, what=f"failure record {n}")
        reaper.terminate()
        assert reaper.wait(timeout=20) == 0
    assert c.get(job).as_dict()["requeued"] == 1
    assert c.get(f"{job}.f2").as_dict()["parent"] == job
    assert [r["error"]["type"] for r in lines(project, "got_error", job)] == ["WorkerLost", "WorkerLost"]


def test_a_damaged_requeue_count_reads_as_zero_and_loses_no_job(project: Project) -> None:
    """A dead job's state with a damaged `requeued` (not a number, negative, a fraction:
    a hand edit) shows 0, and requeuing it counts from there and puts it back in ready,
    its last death's children cleared (the next death names its own). It is never left
    in no structure by a script that failed half-way."""
    write(project, "source", SOURCE)
    write(project, "got_result", SINK.format(queue="fast", name="got_result"))
    write(project, "got_error", SINK.format(queue="fast", name="got_error"))
    c, r = project.client, project.runtime.redis
    jobs = [c.enqueue("source", {"fail": True}).id for _ in range(3)]
    w = project.spawn_worker("fast")
    wait_for(lambda: all(c.get(j).status == "dead" for j in jobs), timeout=20, what="the jobs dead")
    # (their ON_FAILURE jobs, in this queue too, run before the worker goes: the ready
    # list then holds only the requeued jobs)
    wait_for(lambda: all(c.get(f"{j}.f").status == "done" for j in jobs), timeout=20, what="the failure records")
    w.terminate()
    assert w.wait(timeout=20) == 0
    for job, damaged in zip(jobs, ("x", "-1", "1.5"), strict=True):
        r.hset(project.keys().job(job) + ":s", "requeued", damaged)
        assert c.get(job).as_dict()["requeued"] == 0
        c.requeue("fast", job)
        view = c.get(job).as_dict()
        assert (view["status"], view["requeued"], view["children"]) == ("queued", 1, []), view
    assert sorted(structures(project)["ready"]) == sorted(jobs)


DEEP = '''
QUEUE = "fast"
MAX_ATTEMPTS = 2
ON_SUCCESS = "got_result"

def handle(payload, ctx):
    v = 1
    for _ in range(payload["levels"]):
        v = {"a": v}
    return v
'''

MERGED = '''
import json, os
QUEUE = "fast"

def handle(payload, ctx):
    with open(os.path.join(os.environ["RECORD_DIR"], "merged-" + payload["group"]["id"]), "a") as f:
        f.write(json.dumps(payload) + "\\n")
'''


def test_a_result_leaves_room_for_the_records_built_around_it(project: Project) -> None:
    """A result is held to the one nesting limit (120), as a payload is, and the records
    runner builds around it (the then-job's payload, 4 levels more; an ON_SUCCESS body, 1
    more) always read back (128). A deeper result fails at settle with the limit named,
    where one of 125-128 levels once killed the then-job and one of 128 never got its
    ON_SUCCESS job."""
    from runner.client import Request

    write(project, "deep", DEEP)
    write(project, "got_result", SINK.format(queue="fast", name="got_result"))
    write(project, "merged", MERGED)
    c = project.client
    at = c.enqueue("deep", {"levels": 120}).id
    over = [c.enqueue("deep", {"levels": n}).id for n in (121, 128)]
    g = c.group([Request("deep", {"levels": 120})], then=Request("merged", {}))
    project.spawn_worker("fast")
    wait_for(lambda: lines(project, "got_result", at), timeout=20, what="the success record")
    wait_for(lambda: lines(project, "merged", g.id), timeout=20, what="the then-job")
    [merged] = lines(project, "merged", g.id)
    assert merged["group"]["outcomes"][0]["status"] == "done"
    for jid in over:
        rec = c.wait(jid, timeout_s=20).as_dict()
        assert (rec["status"], rec["reason"]) == ("dead", "permanent failure"), rec
        assert "120 levels" in rec["last_error"]["message"], rec["last_error"]
        assert not lines(project, "got_result", jid)


def test_a_result_past_64_bits_is_one_clear_failure_not_a_rerun(project: Project) -> None:
    """A result holding an integer past 64 bits cannot be ON_SUCCESS's payload: the attempt
    fails at once, saying so, and the handler ran once. Before, building the destination's
    job raised inside the settle, the ack never landed, and the job ran again ("worker
    lost") until it went dead. Without ON_SUCCESS such a result is stored, every digit."""
    project.write_config(vt=1)
    write(project, "source", '''
        import os
        QUEUE = "fast"
        MAX_ATTEMPTS = 3
        BACKOFF = {"base": 0.01, "cap": 0.02, "jitter": "full"}
        ON_SUCCESS = "got_result"

        def handle(payload, ctx):
            with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id), "a") as f:
                f.write("ran\\n")
            return {"big": 2 ** 70}
    ''')
    write(project, "plain", '''
        QUEUE = "fast"

        def handle(payload, ctx):
            return {"big": 2 ** 70}
    ''')
    write(project, "got_result", SINK.format(queue="fast", name="got_result"))
    c = project.client
    job_id = c.enqueue("source", {}).id
    kept = c.enqueue("plain", {}).id
    project.spawn_worker("fast")
    dead = c.wait(job_id, 20).as_dict()
    assert dead["status"] == "dead", dead
    assert "64 bits" in dead["last_error"]["message"] and "ON_SUCCESS" in dead["last_error"]["message"]
    assert project.runs(job_id) == ["ran"]
    assert dead["attempt"] == 1 and dead["reason"] != "worker lost"
    assert not lines(project, "got_result", job_id)
    assert c.wait(kept, 20).as_dict()["result"] == {"big": 2 ** 70}
