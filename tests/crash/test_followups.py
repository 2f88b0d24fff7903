"""Follow-ups (``ctx.enqueue``) are written in the ack's own step: SIGKILL a worker at
every fault point while parents enqueue two follow-ups each, and every parent whose ack
landed leaves each follow-up exactly once; a run that failed leaves none. A follow-up to
another queue goes through the source queue's outbox and its relay, exactly once even
when the worker dies between the ack and the relay."""

from __future__ import annotations

import random
import textwrap

import pytest
from crashkit import configure, wait_exit, wait_final

from runner import outbox
from runner.worker import relay
from runner.worker.faults import POINTS

from conftest import Project, wait_for

PARENT = '''
import os
QUEUE = "fast"
MAX_ATTEMPTS = 3

def handle(payload, ctx):
    kids = [ctx.enqueue(payload.get("to", "leaf"), {"parent": ctx.job_id, "i": i}) for i in range(2)]
    if ctx.attempt <= payload.get("fail_times", 0):
        raise RuntimeError("planned failure after enqueueing")
    return {"children": [k.id for k in kids]}
'''

LEAF = '''
import os
QUEUE = "{queue}"

def handle(payload, ctx):
    name = f"leaf-{{payload['parent']}}-{{payload['i']}}"
    with open(os.path.join(os.environ["RECORD_DIR"], name), "a") as f:
        f.write(ctx.job_id + "\\n")
'''

SCHEMA = '{"type": "object"}'


def add_functions(project: Project) -> None:
    for name, src in (("parent", PARENT), ("leaf", LEAF.format(queue="fast")),
                      ("leaf_slow", LEAF.format(queue="slow"))):
        (project.root / "functions" / f"{name}.py").write_text(textwrap.dedent(src))
        (project.root / "schemas" / name).mkdir(exist_ok=True)
        (project.root / "schemas" / name / "v1.json").write_text(SCHEMA)
    project._runtime = None


def leaf_ids(project: Project, parent: str, i: int) -> set[str]:
    """The distinct follow-up jobs that ran for (parent, i) (a kill may run one twice)."""
    p = project.records / f"leaf-{parent}-{i}"
    return set(p.read_text().split()) if p.exists() else set()


@pytest.mark.parametrize("point", POINTS)
def test_followups_exactly_once_per_landed_ack(project: Project, point: str) -> None:
    """Parents that fail once after enqueueing, parents that always fail, parents that
    succeed at once; the worker is killed at ``point``: in the end each done parent has
    each follow-up exactly once, a dead parent none."""
    configure(project, vt=1, concurrency=2, batch=4)
    add_functions(project)
    c = project.client
    ok = [c.enqueue("parent", {}).id for _ in range(6)]
    flaky = [c.enqueue("parent", {"fail_times": 1}).id for _ in range(4)]
    doomed = [c.enqueue("parent", {"fail_times": 9}).id for _ in range(2)]
    after = str(random.Random(point).randint(0, 4))
    w1 = project.spawn_worker("fast", env={"RUNNER_FAULT": point, "RUNNER_FAULT_AFTER": after})
    assert wait_exit(w1, 30) == -9
    project.spawn_worker("fast")
    final = wait_final(project, ok + flaky + doomed, timeout=40)
    for pid in ok + flaky:
        assert final[pid]["status"] == "done", final[pid]
        kids = final[pid]["result"]["children"]
        for i in range(2):
            wait_for(lambda pid=pid, i=i: leaf_ids(project, pid, i), timeout=20, what=f"leaf {pid} {i}")
            assert leaf_ids(project, pid, i) == {kids[i]}, (pid, i)
    for pid in doomed:
        assert final[pid]["status"] == "dead"
        assert not leaf_ids(project, pid, 0) and not leaf_ids(project, pid, 1)


def test_cross_queue_followup_survives_a_kill_before_the_relay(project: Project) -> None:
    """A follow-up to another queue waits in the source queue's outbox once the ack lands;
    the worker dies before relaying it; after a restart it arrives exactly once."""
    configure(project, vt=1, concurrency=1)
    add_functions(project)
    c = project.client
    pid = c.enqueue("parent", {"to": "leaf_slow"}).id
    w1 = project.spawn_worker("fast", env={"RUNNER_FAULT": "before_relay"})
    assert wait_exit(w1, 30) == -9
    assert c.get(pid).status == "done"
    r = project.runtime.redis
    outbox = project.keys("fast").outbox
    assert r.llen(outbox) == 2
    kids = c.get(pid).as_dict()["result"]["children"]
    project.spawn_worker("fast", "slow")
    for i in range(2):
        wait_for(lambda i=i: leaf_ids(project, pid, i), timeout=20, what=f"leaf {i}")
    wait_for(lambda: r.llen(outbox) == 0, timeout=10, what="the outbox drained")
    for i in range(2):
        assert leaf_ids(project, pid, i) == {kids[i]}
        assert c.wait(kids[i], 10).status == "done"
        assert c.get(kids[i]).as_dict()["parent"] == pid
    assert c.get(pid).as_dict()["children"] == kids


def test_relay_is_idempotent_by_child_id(project: Project) -> None:
    """A relay that placed a follow-up and died before removing it from the outbox places
    nothing the second time: the child id exists."""
    configure(project, vt=1, concurrency=1)
    add_functions(project)
    rt = project.runtime
    c = project.client
    pid = c.enqueue("parent", {"to": "leaf_slow"}).id
    w1 = project.spawn_worker("fast", env={"RUNNER_FAULT": "before_relay"})
    assert wait_exit(w1, 30) == -9
    box = project.keys("fast").outbox
    entries = rt.redis.lrange(box, 0, -1)

    outbox.place(rt, entries)  # placed, then "killed" before taking them off the outbox
    assert rt.redis.llen(project.keys("slow").ready) == 2
    assert relay.drain(rt, project.keys("fast")) == 2
    assert rt.redis.llen(project.keys("slow").ready) == 2
    assert rt.redis.llen(box) == 0
    assert c.get(pid).status == "done"


def test_followups_of_an_isolated_handler_come_with_the_ack(project: Project) -> None:
    """Under ISOLATION = "process" the child hands its follow-ups to its parent, which holds
    them on the run: a failed attempt leaves none, the successful one each once."""
    configure(project, vt=1, concurrency=2, isolation="process")
    add_functions(project)
    c = project.client
    ids = [c.enqueue("parent", {"fail_times": i % 2}).id for i in range(4)]
    project.spawn_worker("fast")
    final = wait_final(project, ids, timeout=40)
    for pid in ids:
        kids = final[pid]["result"]["children"]
        for i in range(2):
            wait_for(lambda pid=pid, i=i: leaf_ids(project, pid, i), timeout=20, what=f"leaf {pid} {i}")
            assert leaf_ids(project, pid, i) == {kids[i]}


def test_an_invalid_followup_fails_the_handler_at_once(project: Project) -> None:
    """ctx.enqueue validates at the call: an unknown function raises in the handler (the
    parent's run fails), nothing is held."""
    configure(project, vt=1, concurrency=1, max_attempts=1)
    add_functions(project)
    c = project.client
    pid = c.enqueue("parent", {"to": "no_such_function"}).id
    project.spawn_worker("fast")
    final = wait_final(project, [pid], timeout=20)[pid]
    assert final["status"] == "dead"
    assert "no_such_function" in final["last_error"]["message"]
