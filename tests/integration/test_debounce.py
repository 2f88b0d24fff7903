"""DEBOUNCE: a burst of enqueues with one rendered key is one job, run once with the
latest payload, a period after the last enqueue and never later than max_wait after the
first; atomic under many producers (one script call each)."""

from __future__ import annotations

import json
import textwrap
import threading
import time

import pytest

from runner.errors import ValidationFailed

from conftest import Project, wait_for

DOC = '''
import json, os
QUEUE = "fast"
DEBOUNCE = {{"key": "doc:{{doc_id}}", "period": {period}, "max_wait": {max_wait}}}

def handle(payload, ctx):
    with open(os.path.join(os.environ["RECORD_DIR"], "runs-" + str(payload["doc_id"])), "a") as f:
        f.write(json.dumps({{"id": ctx.job_id, "payload": payload, "at": __import__("time").time()}}) + "\\n")
'''
SCHEMA = '{"type": "object", "required": ["doc_id"], "properties": {"doc_id": {"type": "integer"}}}'


def runs(project: Project, doc_id: int) -> list[dict]:
    p = project.records / f"runs-{doc_id}"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def nothing_left_to_run(project: Project) -> bool:
    """No partition of the queue holds a job ready, leased, scheduled or parked: the runs
    recorded are all there will be (a fixed wait for "no further run" only sampled that)."""
    r = project.runtime.redis
    return not any(r.llen(k.ready) or r.zcard(k.leases) or r.zcard(k.scheduled) or r.zcard(k.limwait)
                   for k in project.runtime.parts["fast"])


def test_a_thousand_enqueues_from_eight_producers_run_once_with_the_last_payload(project: Project) -> None:
    project.add_function("doc", textwrap.dedent(DOC.format(period=1.0, max_wait=120)), SCHEMA)
    answers: list[dict] = []
    lock = threading.Lock()

    def producer(p: int) -> None:
        client = project.client  # one client (and connection) per producer
        mine = [client.enqueue("doc", {"doc_id": 1, "p": p, "i": i}).as_dict() for i in range(125)]
        with lock:
            answers.extend(mine)

    threads = [threading.Thread(target=producer, args=(p,)) for p in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    last = project.client.enqueue("doc", {"doc_id": 1, "last": True}).as_dict()
    assert len(answers) == 1000
    assert {a["id"] for a in answers} == {last["id"]}, "every enqueue of the burst names its one job"
    assert all(a["debounced"] for a in answers) and last["debounced"]
    view = project.client.get(last["id"]).as_dict()
    assert view["absorbed"] == 1000 and view["status"] == "scheduled"
    project.spawn_worker("fast")
    wait_for(lambda: runs(project, 1), timeout=30, what="the burst's run")
    wait_for(lambda: nothing_left_to_run(project), timeout=15, what="no job left to run")  # no second run comes
    [run] = runs(project, 1)
    assert run["id"] == last["id"] and run["payload"] == {"doc_id": 1, "last": True}


def test_max_wait_bounds_the_delay_under_a_continuous_stream(project: Project) -> None:
    """Enqueues every 0.1 s with a 0.5 s period never let the start come by itself:
    max_wait (1.5 s) starts it anyway, and the next enqueue starts a new burst."""
    project.add_function("doc", textwrap.dedent(DOC.format(period=0.5, max_wait=1.5)), SCHEMA)
    project.spawn_worker("fast")
    client = project.client
    t0 = time.time()
    while time.time() - t0 < 4.0:
        client.enqueue("doc", {"doc_id": 2, "at": time.time()})
        time.sleep(0.1)
    wait_for(lambda: len(runs(project, 2)) >= 2, timeout=10, what="two runs")
    got = runs(project, 2)
    first = got[0]["at"] - t0
    # max_wait after the first enqueue, not period after the last (4.5 s or later): a
    # loaded worker claims the due job late, and the enqueues meanwhile still join it.
    assert 1.4 <= first <= 3.9, first
    assert len({r["id"] for r in got}) == len(got)


def test_debounce_refuses_what_would_break_the_burst(project: Project) -> None:
    project.add_function("doc", textwrap.dedent(DOC.format(period=1.0, max_wait=5)), SCHEMA)
    with pytest.raises(ValidationFailed, match="no idempotency key"):
        project.client.enqueue("doc", {"doc_id": 3}, idempotency_key="k")
    project.add_function("both", 'QUEUE = "fast"\nIDEMPOTENCY_KEY = "{doc_id}"\n'
                                 'DEBOUNCE = {"key": "{doc_id}", "period": 1}\ndef handle(p, ctx):\n    pass\n', SCHEMA)
    [err] = [e for p, e in project.runtime.registry.errors.items() if p.endswith("both.py")]
    assert "exclude each other" in str(err)


def test_a_burst_on_a_partitioned_queue_is_one_job(project: Project) -> None:
    """The burst lives under its debounce key, so every enqueue of one key is routed to
    the partition that key names: 8 enqueues on 4 partitions are one job, run once with
    the last payload (round-robin spreading made 4 jobs, each run)."""
    project.write_config(fast="partitions = 4")
    project.add_function("doc", textwrap.dedent(DOC.format(period=0.5, max_wait=120)), SCHEMA)
    c = project.client
    ids = {c.enqueue("doc", {"doc_id": 7, "n": i}).id for i in range(8)}
    assert len(ids) == 1, ids
    assert c.get(ids.pop()).as_dict()["absorbed"] == 7
    project.spawn_worker("fast")
    wait_for(lambda: runs(project, 7), timeout=30, what="the burst's run")
    wait_for(lambda: nothing_left_to_run(project), timeout=15, what="no job left to run")  # no second run comes
    [run] = runs(project, 7)
    assert run["payload"]["n"] == 7
    project.stop_all()


def test_the_job_that_ran_keeps_the_count_it_absorbed(project: Project) -> None:
    """absorbed shows while the burst's job waits, and stays in its view once it ran and
    is done (the count lived in its state, which a success deletes)."""
    project.add_function("doc", textwrap.dedent(DOC.format(period=0.3, max_wait=120)), SCHEMA)
    c = project.client
    ids = {c.enqueue("doc", {"doc_id": 8, "n": i}).id for i in range(5)}
    [job] = ids
    assert c.get(job).as_dict()["absorbed"] == 4
    project.spawn_worker("fast")
    done = c.wait(job, 30).as_dict()
    assert done["status"] == "done", done
    assert done["absorbed"] == 4, done
    assert done["debounce"]["key"] == "doc:8", done


# --- only a job still waiting for its debounce absorbs (a started one does not) ------

BILL = '''
import json, os
QUEUE = "fast"
DEBOUNCE = {"key": "acct:{acct}", "period": 0.2, "max_wait": 60}

def rec(x):
    with open(os.path.join(os.environ["RECORD_DIR"], "bill"), "a") as f:
        f.write(json.dumps(x) + "\\n")

def handle(payload, ctx):
    charged = ctx.step("charge", lambda: rec({"step": "charge", "amount": payload["amount"]}) or payload["amount"])
    ctx.sleep("cool-off", 1.5)
    rec({"step": "receipt", "charged": charged, "amount": payload["amount"], "id": ctx.job_id})
'''
BILL_SCHEMA = ('{"type": "object", "required": ["acct", "amount"], "properties": '
               '{"acct": {"type": "string"}, "amount": {"type": "integer"}}}')


def bill_lines(project: Project) -> list[dict]:
    p = project.records / "bill"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def test_a_durable_job_sleeping_after_a_step_starts_no_burst_of_its_own(project: Project) -> None:
    """A durable job that ran a step and sleeps is back in the scheduled set, but it has
    started: the next enqueue of its key is a new burst (its own job and run), and the
    sleeping job keeps its payload and its sleep."""
    project.add_function("bill", textwrap.dedent(BILL), BILL_SCHEMA)
    c = project.client
    a = c.enqueue("bill", {"acct": "A1", "amount": 100}).as_dict()
    project.spawn_worker("fast")
    wait_for(lambda: bill_lines(project), timeout=30, what="the charge step")
    wait_for(lambda: c.get(a["id"]).as_dict()["status"] == "sleeping", timeout=10, what="the sleep")
    b = c.enqueue("bill", {"acct": "A1", "amount": 5}).as_dict()
    assert b["id"] != a["id"] and b["debounced"]
    assert c.get(a["id"]).as_dict()["payload"]["amount"] == 100
    wait_for(lambda: len([x for x in bill_lines(project) if x["step"] == "receipt"]) == 2, timeout=30,
             what="both receipts")
    receipts = {x["id"]: x for x in bill_lines(project) if x["step"] == "receipt"}
    assert receipts[a["id"]]["charged"] == receipts[a["id"]]["amount"] == 100
    assert receipts[b["id"]]["charged"] == receipts[b["id"]]["amount"] == 5


FLAKY = '''
import json, os
QUEUE = "fast"
DEBOUNCE = {"key": "doc:{doc_id}", "period": 0.2, "max_wait": 30}

def handle(payload, ctx):
    with open(os.path.join(os.environ["RECORD_DIR"], "runs-" + str(payload["doc_id"])), "a") as f:
        f.write(json.dumps({"id": ctx.job_id, "attempt": ctx.attempt, "payload": payload}) + "\\n")
    if payload.get("fail"):
        raise RuntimeError("fails")
'''


def test_a_job_waiting_out_a_retry_backoff_starts_no_burst_of_its_own(project: Project) -> None:
    """A failed run waits for its retry in the scheduled set: a new enqueue is a new burst,
    and the retry keeps its payload and backoff."""
    project.write_config(max_attempts=2)
    toml = project.root / "runner.toml"
    toml.write_text(toml.read_text().replace('backoff = { base = 0.01, cap = 0.05, jitter = "full" }',
                                             'backoff = { base = 2.0, cap = 2.0, jitter = "none" }'))
    project.add_function("doc", textwrap.dedent(FLAKY), SCHEMA)
    c = project.client
    first = c.enqueue("doc", {"doc_id": 4, "fail": True}).as_dict()
    project.spawn_worker("fast")
    wait_for(lambda: runs(project, 4), timeout=30, what="the first attempt")
    wait_for(lambda: c.get(first["id"]).as_dict()["status"] == "retrying", timeout=10, what="the backoff")
    second = c.enqueue("doc", {"doc_id": 4, "edit": 2}).as_dict()
    assert second["id"] != first["id"]
    view = c.get(first["id"]).as_dict()
    assert view["payload"] == {"doc_id": 4, "fail": True} and view["absorbed"] == 0
    wait_for(lambda: len(runs(project, 4)) == 3, timeout=30, what="the retry and the new burst's run")
    got = runs(project, 4)
    assert [(r["id"], r["attempt"]) for r in got if r["id"] == first["id"]] == [(first["id"], 1), (first["id"], 2)]
    assert [r["payload"] for r in got if r["id"] == second["id"]] == [{"doc_id": 4, "edit": 2}]


# --- emits of a debounced subscriber join its burst ----------------------------------

def test_an_emit_joins_the_burst_of_its_debounce_key_on_a_partitioned_queue(project: Project) -> None:
    """Emits and outbox placement route a debounced job by its debounce key, as enqueue
    does: an enqueue and an emit of one key are one job, and the emit (its answer and its
    record) names it and says debounced."""
    from runner.store.routing import partition_of

    project.write_config(fast="partitions = 4")
    src = DOC.format(period=1.0, max_wait=30).replace('QUEUE = "fast"', 'QUEUE = "fast"\nTRIGGERS = ["doc.edited"]')
    project.add_function("doc", textwrap.dedent(src), SCHEMA)
    c = project.client
    home = project.runtime.keys["fast"].partition
    away = next(d for d in range(100, 200) if partition_of(f"d:doc:doc:{d}", 4) != home)
    here = next(d for d in range(100, 200) if partition_of(f"d:doc:doc:{d}", 4) == home)
    for doc in (away, here):
        a = c.enqueue("doc", {"doc_id": doc, "via": "enqueue"}).as_dict()
        e = c.emit("doc.edited", {"doc_id": doc, "via": "emit"}).as_dict()
        [job] = e["jobs"]
        assert job["id"] == a["id"] and job.get("debounced") is True, (doc, a, e)
        [event] = [x for x in c.events(name="doc.edited") if x["id"] == e["id"]]
        assert [j["id"] for j in event["jobs"]] == [a["id"]], (doc, event)  # its record too
        assert c.get(a["id"]).as_dict()["absorbed"] == 1
    project.spawn_worker("fast")
    wait_for(lambda: runs(project, away) and runs(project, here), timeout=30, what="both bursts' runs")
    wait_for(lambda: nothing_left_to_run(project), timeout=15, what="no job left to run")  # no second run comes
    for doc in (away, here):
        [run] = runs(project, doc)
        assert run["payload"]["via"] == "emit"



def test_an_emit_absorbed_into_a_burst_is_absorbed_once_however_often_it_is_placed(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """An emit's job joins a burst through the outbox, and its entry is placed a second
    time (its emitter died before taking it off, or a relay read it first): the second
    placement merges nothing, so a newer enqueue's payload still wins and the burst counts
    two absorbed enqueues, not three (the emitted payload was merged again); it still
    names the burst's job, for an emitter whose own placement came second."""
    from runner import outbox
    from runner.store.routing import partition_of

    project.write_config(fast="partitions = 4")
    src = DOC.format(period=30, max_wait=60).replace('QUEUE = "fast"', 'QUEUE = "fast"\nTRIGGERS = ["doc.edited"]')
    project.add_function("doc", textwrap.dedent(src), SCHEMA)
    c = project.client
    home = project.runtime.keys["fast"].partition
    doc = next(d for d in range(100, 200) if partition_of(f"d:doc:doc:{d}", 4) != home)
    kept: list[str] = []
    monkeypatch.setattr(outbox, "remove", lambda rt, k, entries: kept.extend(entries))  # the emitter dies here
    first = c.enqueue("doc", {"doc_id": doc, "v": "FIRST"}).id
    [job] = c.emit("doc.edited", {"doc_id": doc, "v": "OLD"}).as_dict()["jobs"]
    assert job["id"] == first and kept, (job, kept)
    monkeypatch.undo()
    assert c.enqueue("doc", {"doc_id": doc, "v": "NEWER"}).id == first
    named: dict[str, tuple[str, str]] = {}
    outbox.place(project.runtime, kept, named)  # placed again, as a relay does with what is left
    view = c.get(first).as_dict()
    assert (view["payload"]["v"], view["absorbed"]) == ("NEWER", 2), view
    [entry] = kept
    assert named == {json.loads(entry)[1]: (first, "scheduled")}  # the burst's job still named

# --- one burst per key and version ----------------------------------------------------

def test_alternating_versions_make_one_burst_each(project: Project) -> None:
    """A rolling deploy: producers on v1 and v2 enqueue one key in turn. Each version has
    its burst (2 jobs for 40 enqueues), and each runs once with its version's last payload."""
    src = DOC.format(period=1.0, max_wait=30) + "\ndef upgrade(payload, version):\n    return payload\n"
    project.add_function("doc", textwrap.dedent(src), SCHEMA)
    (project.root / "schemas" / "doc" / "v2.json").write_text(SCHEMA)
    project._runtime = None
    c = project.client
    ids = [c.enqueue("doc", {"doc_id": 5, "i": i}, version=1 + i % 2).id for i in range(40)]
    assert len(set(ids)) == 2, len(set(ids))
    project.spawn_worker("fast")
    wait_for(lambda: len(runs(project, 5)) == 2, timeout=30, what="the two bursts' runs")
    wait_for(lambda: nothing_left_to_run(project), timeout=15, what="no job left to run")  # no third run comes
    assert sorted(r["payload"]["i"] for r in runs(project, 5)) == [38, 39]


# --- the marker lives as long as its job waits -----------------------------------------

def test_the_burst_marker_lives_as_long_as_its_job_waits(project: Project) -> None:
    """No TTL: with no worker for longer than any bound, the burst still absorbs; once its
    job is claimed the marker is gone and the next enqueue starts a new burst."""
    project.add_function("doc", textwrap.dedent(DOC.format(period=0.3, max_wait=0.6)), SCHEMA)
    c, r, k = project.client, project.runtime.redis, project.keys()
    marker = f"{k.idem_prefix}~debounce:doc:doc:6"
    a = c.enqueue("doc", {"doc_id": 6, "edit": 1})
    assert r.pttl(marker) == -1, "the marker expires while its job waits"
    time.sleep(1.0)  # past max_wait, with no worker: the job still waits
    b = c.enqueue("doc", {"doc_id": 6, "edit": 2})
    assert b.id == a.id
    project.spawn_worker("fast")
    wait_for(lambda: runs(project, 6), timeout=30, what="the burst's run")
    assert not r.exists(marker)
    d = c.enqueue("doc", {"doc_id": 6, "edit": 3})
    assert d.id != a.id
    wait_for(lambda: len(runs(project, 6)) == 2, timeout=30, what="the new burst's run")
    assert [x["payload"]["edit"] for x in runs(project, 6)] == [2, 3]


# --- an absorbed enqueue's keys follow its payload --------------------------------------

def test_an_absorbed_enqueue_renders_its_keys_from_the_latest_payload(project: Project) -> None:
    src = DOC.format(period=0.5, max_wait=10).replace('QUEUE = "fast"',
                                                      'QUEUE = "fast"\nRESOURCE_KEY = "owner:{owner}"')
    project.add_function("doc", textwrap.dedent(src), '{"type": "object", "required": ["doc_id", "owner"], '
                         '"properties": {"doc_id": {"type": "integer"}, "owner": {"type": "string"}}}')
    c = project.client
    a = c.enqueue("doc", {"doc_id": 8, "owner": "alice"})
    b = c.enqueue("doc", {"doc_id": 8, "owner": "bob"})
    assert a.id == b.id
    view = c.get(a.id).as_dict()
    assert view["payload"]["owner"] == "bob" and view["resource_key"] == "owner:bob"
