"""A durable job's step log as Redis holds it: a sleeping job's state hash stays in Redis's
compact encoding (listpack, not a hash table: every field at most 64 bytes), and a log
recorded in the object form entries had before still replays."""

from __future__ import annotations

import json

import pytest
from durable_helpers import ISOLATION_IDS, ISOLATIONS

from conftest import Project, wait_for

TYPICAL = '''
QUEUE = "fast"
{isolation}

def charge(order_id):
    return {{"charge_id": "ch_" + order_id}}

def handle(payload, ctx):
    charge_ = ctx.step("charge", charge, payload["order_id"])
    ctx.sleep("cool-off", 3600)
    return charge_
'''

OLD_FORM = '''
QUEUE = "fast"

def handle(payload, ctx):
    charged = ctx.step("charge", lambda: "ran again")
    ctx.sleep("nap", 3600)
    return {"charged": charged, "after": ctx.step("after", lambda: "new")}
'''


@pytest.mark.parametrize("isolation", ISOLATIONS, ids=ISOLATION_IDS)
def test_a_sleeping_job_keeps_its_state_hash_compact(project: Project, isolation: str) -> None:
    """A job that recorded one step (a small result) and went to sleep: its state hash,
    the step log with it, is a listpack. An entry over 64 bytes would make it a hash
    table, about three times the bytes for every sleeping job."""
    project.write_config(concurrency=1)  # one job: one child, not eight
    project.add_function("typical", TYPICAL.format(isolation=isolation))
    c = project.client
    project.spawn_worker("fast")
    job = c.enqueue("typical", {"order_id": "1234567890"}).id
    # (60 s: a child process starting on a busy host)
    wait_for(lambda: c.get(job).status == "sleeping", timeout=60, what="the job to sleep")
    r, k = project.runtime.redis, project.keys()
    state = r.hgetall(k.state(job))
    assert state["sleep"].split(" ")[:1] == ["2"], state  # (its log's count: lua/includes/asleep.lua)
    assert r.object("encoding", k.state(job)) == "listpack", state
    steps = c.get(job).as_dict()["steps"]
    assert [(s["name"], s["kind"], s["status"]) for s in steps] == [("charge", "step", "ok"),
                                                                     ("cool-off", "sleep", "ok")]
    assert steps[0]["result"] == '{"charge_id":"ch_1234567890"}' and steps[0]["finished_at"]
    assert steps[1]["started_at"] and steps[1]["until"]


def test_a_log_recorded_in_the_object_form_replays(project: Project) -> None:
    """Entries written as JSON objects (the form every entry had before the compact ones)
    replay as ever: the recorded step returns its recorded value without running, the
    recorded sleep, over, returns, and the run goes on past them."""
    project.add_function("old", OLD_FORM)
    c = project.client
    job = c.enqueue("old", {}).id
    r, k = project.runtime.redis, project.keys()
    now = int(r.time()[0]) * 1000
    entries = [{"name": "charge", "kind": "step", "status": "ok", "ms": 1.5, "value": "recorded",
                "finished_ms": now - 5000},
               {"name": "nap", "kind": "sleep", "status": "ok", "started_ms": now - 4000, "until_ms": now - 1000}]
    raw = [json.dumps(e, separators=(",", ":")) for e in entries]
    r.hset(k.state(job), mapping={"step:0": raw[0], "step:1": raw[1], "steps": 2,
                                  "step_bytes": sum(len(x) for x in raw)})
    project.spawn_worker("fast")
    done = c.wait(job, 30).as_dict()
    assert done["status"] == "done", done
    assert done["result"] == {"charged": "recorded", "after": "new"}
