"""Waiting on an announced id waits: a group's then-job before its last member ended, a
follow-up's id before its parent's ack, and a group itself (`GET /groups/{id}?wait=`),
through the client and over HTTP. An id nothing announced is still refused at once."""

from __future__ import annotations

import concurrent.futures
import time

import pytest

from runner.client import Request
from runner.errors import JobNotFound, StillRunning

from conftest import Project, wait_for

FAN = '''
import time

QUEUE = "fast"
TIMEOUT = 10  # the project's default (2 s) is the handler's own sleep


def handle(payload, ctx):
    child = ctx.enqueue("record", {"n": 7})
    time.sleep(payload.get("sleep", 0))  # the child's id is announced; the ack comes later
    return {"child": child.id}
'''


def test_a_groups_then_job_and_the_group_can_be_waited_for_before_its_members_end(project: Project) -> None:
    """client.result(then_id), GET /jobs/{then}?wait= and GET /groups/{id}?wait= wait
    while the members have not run (no worker yet), and answer once a worker ran them all;
    an unknown id is a 404 / JobNotFound at once."""
    from test_web_support import gunicorn

    c = project.client
    group = c.group([Request("record", {"n": i}) for i in range(3)], Request("record", {"n": 99}))
    with gunicorn(project) as web, concurrent.futures.ThreadPoolExecutor(4) as pool:
        result = pool.submit(c.result, group.then_id, 30)
        over_http = pool.submit(web.session.get, f"{web.url}/jobs/{group.then_id}?wait=25", timeout=40)
        whole = pool.submit(web.session.get, f"{web.url}/groups/{group.id}?wait=25", timeout=40)
        with pytest.raises(concurrent.futures.TimeoutError):
            result.result(timeout=1.0)  # waiting, not refused
        assert not over_http.done() and not whole.done()
        with pytest.raises(StillRunning):
            c.result(group.then_id, 0.2)  # a short wait ends as a wait does, not as "no such job"
        t0 = time.monotonic()
        with pytest.raises(JobNotFound):
            c.result(group.id + "x.then", 5)
        assert time.monotonic() - t0 < 1
        assert web.get("/groups/nope?wait=5").status_code == 404

        project.spawn_worker("fast")
        assert result.result(timeout=40)["n"] == 99
        answer = over_http.result(timeout=40)
        assert answer.status_code == 200 and answer.json()["status"] == "done", answer.text
        view = whole.result(timeout=40)
        assert view.status_code == 200 and view.json()["then"]["status"] == "done", view.text
    project.stop_all()


def test_a_follow_ups_id_can_be_waited_for_before_its_parents_ack(project: Project) -> None:
    """A handler enqueues a follow-up and runs on: client.result of the follow-up's id
    (announced by ctx.enqueue) waits for the parent's ack and the follow-up's run."""
    (project.root / "functions" / "fan.py").write_text(FAN)
    (project.root / "schemas" / "fan").mkdir()
    (project.root / "schemas" / "fan" / "v1.json").write_text('{"type": "object"}')
    c = project.client
    parent = c.enqueue("fan", {"sleep": 2}).id
    child = f"{parent}.0"
    project.spawn_worker("fast")
    wait_for(lambda: c.get(parent).status == "processing", timeout=20, what="the parent to run")

    def announced() -> bool:
        # "processing" is written before the handler's ctx.enqueue runs: until then the
        # child's id is unknown, and a wait for it is refused at once.
        try:
            c.result(child, 0.05)
        except JobNotFound:
            return False
        except StillRunning:
            pass
        return True

    wait_for(announced, timeout=20, what="the handler to announce its follow-up")
    assert c.get(parent).status == "processing"  # the parent has not acked yet
    assert c.result(child, 30)["n"] == 7
    assert c.result(parent, 5) == {"child": child}
    project.stop_all()
