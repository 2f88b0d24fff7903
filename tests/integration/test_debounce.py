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
    time.sleep(1.5)  # no second run comes
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
    assert 1.4 <= first <= 2.8, first  # max_wait after the first enqueue, not period after the last
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
    time.sleep(1.5)  # no second run comes
    [run] = runs(project, 7)
    assert run["payload"]["n"] == 7
    project.stop_all()
