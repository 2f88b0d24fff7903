"""Job lists read bounded state: a listed job's lookup reads the fields a list row shows,
never its whole state hash, so a page of durable jobs carrying 4 MiB step logs and big
checkpoints costs Redis about what a page of small jobs does, and moves kilobytes. A list
row still says what each step is (its name, status, times and size) without its value,
and never "unreadable" for a good record whatever its size; GET /jobs/{id} reads it all.

Costs are read from what Redis itself saw (SLOWLOG, reply sizes), never wall time."""

from __future__ import annotations

import statistics
from typing import Any

from test_big_records import every_command_logged, script_calls

from runner.store import codec, listing, records
from runner.store.steps import MAX_LOG_BYTES, MAX_STEPS
from runner.worker.fetcher import CLAIM_FIELDS

from conftest import Project

STEP_VALUE = 290_000  # 14 steps of it: a step log near its 4 MiB bound
STEPS = 14


def _durable_dead(project: Project, n: int, value_bytes: int, steps: int = STEPS,
                  checkpoint_bytes: int = 0) -> list[str]:
    """n dead jobs, each with ``steps`` steps recorded as a run records them (step.lua),
    each step's value a string of ``value_bytes``, and a checkpoint of that many bytes."""
    rt, k = project.runtime, project.keys()
    made = project.client.enqueue_many([_req(i) for i in range(n)])
    reply = list(rt.scripts.claim(k, n=len(made), start=len(made), lease_ms=60_000, token_base="w.steps",
                                  dead_ttl_ms=10**9, done_ttl_ms=10**9))
    got = [(reply[i], reply[i + 1]) for i in range(2, len(reply), CLAIM_FIELDS)]
    for job_id, token in got:
        for s in range(steps):
            body = records.step_ok_entry(f"step-{s}", codec.dumps("v" * value_bytes), 12.5)
            code, _ = rt.scripts.step(k, job_id, token, s, body, MAX_STEPS, MAX_LOG_BYTES)
            assert int(code) == 1
        if checkpoint_bytes:
            rt.redis.hset(k.state(job_id), "checkpoint", codec.dumps({"c": "c" * checkpoint_bytes}))
    from runner.store.scripts import Burial

    rt.scripts.bury(k, [Burial(i, t, "permanent failure", '{"type":"E","message":"m"}', "", False, "")
                        for i, t in got], 10**9)
    return [i for i, _ in got]


def _req(i: int) -> Any:
    from runner.client import Request

    return Request("perm", {"i": i})


def test_a_page_of_durable_jobs_with_big_step_logs_reads_only_what_a_row_shows(project: Project) -> None:
    """10 dead jobs each with a 4 MiB step log (14 steps of 290 KB) and a 900 KB
    checkpoint, beside 10 with small steps: each big job's lookup costs Redis at most a few
    times a small one's (it read the whole hash, HGETALL: 4.9 MB into Lua a job), and the
    whole page moves under 300 KB; each row names every step with its status and size."""
    c, r, k = project.client, project.runtime.redis, project.keys()
    big = _durable_dead(project, 10, STEP_VALUE, checkpoint_bytes=900_000)
    small = _durable_dead(project, 10, 10)
    with every_command_logged(r):
        for _ in range(3):
            total, page = c.dead("fast", limit=50)
            assert total == 20 and len(page) == 20
        usec: dict[bool, list[int]] = {True: [], False: []}
        for i in big + small:
            usec[i in big] += [call["usec"] for call in script_calls(project, records.lookup_keys(k, i))]
    assert len(usec[True]) == len(usec[False]) == 30
    ratio = statistics.median(usec[True]) / max(1, statistics.median(usec[False]))
    print(f"lookup median: big {statistics.median(usec[True])} us, small {statistics.median(usec[False])} us")
    assert ratio < 4, (ratio, sorted(usec[True])[:5], sorted(usec[False])[:5])
    replies = [project.runtime.scripts.lookup(k, i, cut=listing.preview_bytes(50)) for i in big]
    shipped = sum(len(codec.dumps(x)) for x in replies)
    assert shipped < 300_000, shipped
    for job in page:
        view = job.as_dict()
        assert [s["name"] for s in view["steps"]] == [f"step-{s}" for s in range(STEPS)], view["steps"]
        assert all(s["status"] == "ok" and s["kind"] == "step" and s["finished_at"] for s in view["steps"])
        sizes = [r.hstrlen(k.state(view["id"]), f"step:{i}") for i in range(STEPS)]
        assert [s["size"] for s in view["steps"]] == sizes, view["steps"][0]
        assert sizes[0] > (STEP_VALUE if view["id"] in big else 10)
        if view["id"] in big:
            assert view["checkpoint"] is None and view["truncated"]["checkpoint"] > 900_000
            assert all("result" not in s for s in view["steps"])
        else:
            assert view["steps"][0]["result"] == '"' + "v" * 10 + '"'
    whole = c.get(big[0]).as_dict()
    assert whole["checkpoint"] == {"c": "c" * 900_000}
    assert whole["steps"][0]["result"].startswith('"vvv')
    assert whole["steps"][0]["size"] == r.hstrlen(k.state(big[0]), "step:0")


def test_a_step_over_the_preview_size_is_never_unreadable_in_a_list(project: Project) -> None:
    """A step whose value is 5-20 KB (past the list's 4 KiB preview), recorded by a run or
    planted as an earlier release wrote it (no summary beside it), shows in the list with
    its name, status and size, where it showed as "unreadable" (a cut entry parsed)."""
    c, r, k = project.client, project.runtime.redis, project.keys()
    [recorded] = _durable_dead(project, 1, 5_000, steps=3)
    [planted] = _durable_dead(project, 1, 10, steps=0)
    entry = records.step_ok_entry("old-step", codec.dumps("w" * 20_000), 3.0)[:-1] + ",1700000000000]"
    r.hset(k.state(planted), mapping={"steps": 1, "step_bytes": len(entry), "step:0": entry})
    _, page = c.dead("fast", limit=50)
    rows = {j.id: j.as_dict() for j in page}
    assert [(s["name"], s["status"], s["size"]) for s in rows[recorded]["steps"]] == [
        (f"step-{i}", "ok", r.hstrlen(k.state(recorded), f"step:{i}")) for i in range(3)]
    [old] = rows[planted]["steps"]
    assert (old["name"], old["status"], old["size"]) == ("old-step", "ok", len(entry)), old
    assert old["finished_at"] is not None


def test_the_deploy_gates_scan_reads_no_state_hash_whole(project: Project) -> None:
    """`runner check --scan` (census.waiting_versions) counts big durable jobs by type and
    version reading only the state fields it needs (HMGET), never a whole step log: it
    sent one HGETALL per job, 4 MiB each here."""
    from runner.store import census

    r, k = project.runtime.redis, project.keys()
    _durable_dead(project, 3, STEP_VALUE)
    r.config_resetstat()
    read, groups = census.waiting_versions(r, [k])
    assert read == 3 and groups[("fast", "dead", "perm", "1")] == 3, groups
    stats = r.info("commandstats")
    assert "cmdstat_hgetall" not in stats and int(stats["cmdstat_hmget"]["calls"]) >= 3, stats.keys()


def _event_waits(project: Project, n: int, match_bytes: int) -> str:
    """A dead job whose step log holds ``n`` taken ctx.wait_for_event waits, each keeping
    its ``match`` of about ``match_bytes``, recorded as a run records them (wait.lua)."""
    import json

    from runner.client.administering import deliver_signal

    c, rt, k = project.client, project.runtime, project.keys()
    c.enqueue_many([_req(0)])
    reply = list(rt.scripts.claim(k, n=1, start=1, lease_ms=60_000, token_base="w.waits",
                                  dead_ttl_ms=10**9, done_ttl_ms=10**9))
    job_id, token = reply[2], reply[3]
    match = {"order": "m" * match_bytes}
    for pos in range(n):
        sig = f"event.{pos}"
        deliver_signal(c, job_id, sig, json.dumps({"id": "e", "name": "x", "data": {}, "ts": 1}), bounded=True)
        head = codec.dumps({"name": f"paid#{pos}", "kind": "event", "event": "paid", "match": match,
                            "signal": sig})[:-1]
        code, _ = rt.scripts.take_signal(k, job_id, token, pos, sig, head, None, MAX_STEPS, MAX_LOG_BYTES)
        assert int(code) == 1
    from runner.store.scripts import Burial

    rt.scripts.bury(k, [Burial(job_id, token, "permanent failure", '{"type":"E","message":"m"}', "", False, "")],
                    10**9)
    return job_id


def test_a_list_row_is_bounded_whatever_steps_the_job_holds(project: Project) -> None:
    """A job with 120 event waits, each keeping a 4 KB match (a 500 KB log, within every
    bound), and one whose summaries an earlier release wrote with the match in them: each
    list row lists its last LIST_STEPS steps (name, status, size; steps_more says how many
    earlier ones it leaves out) and moves a few kilobytes a row, where it moved every
    summary whole (4 KB a step: 4 MB a row for 990 waits). GET /jobs/{id} has them all."""
    c, r, k = project.client, project.runtime.redis, project.keys()
    new = _event_waits(project, 120, 4000)
    old = _event_waits(project, 120, 4000)
    sk = k.state(old)
    for pos in range(120):  # summaries as the release before wrote them: the match kept
        head = codec.loads(r.hget(sk, f"step:{pos}"))
        head.pop("value")
        head["size"] = r.hstrlen(sk, f"step:{pos}")
        r.hset(sk, f"stephead:{pos}", codec.dumps(head))
    assert max(r.hstrlen(k.state(new), f"stephead:{i}") for i in range(120)) <= records.STEP_HEAD_MAX
    _, page = c.dead("fast", limit=50)
    rows = {j.id: j.as_dict() for j in page}
    for job_id in (new, old):
        reply = project.runtime.scripts.lookup(k, job_id, cut=listing.preview_bytes(50), read=listing.read_bytes(50))
        shipped = len(codec.dumps(reply))
        assert shipped < 40_000, shipped
        row = rows[job_id]
        assert len(row["steps"]) == records.LIST_STEPS and row["steps_more"] == 120 - records.LIST_STEPS
        first = 120 - records.LIST_STEPS
        want = [(f"paid#{i}", "ok", r.hstrlen(k.state(job_id), f"step:{i}")) for i in range(first, 120)]
        got = [(s["name"], s["status"], s["size"]) for s in row["steps"]]
        if job_id == new:
            assert got == want, row["steps"][0]
        else:  # 4 KB summaries: those past the page's read share say their size alone
            assert all(g in (w, (None, "not listed", w[2])) for g, w in zip(got, want, strict=True)), got
            assert sum(g == w for g, w in zip(got, want, strict=True)) >= 30, got
        whole = c.get(job_id).as_dict()
        assert len(whole["steps"]) == 120 and "steps_more" not in whole
        assert whole["steps"][0]["match"] == {"order": "m" * 4000}


def test_a_page_of_small_dead_jobs_costs_the_commands_it_did(project: Project) -> None:
    """A page of 50 small dead jobs (GET /dead/{queue}, GET /jobs?status=dead) costs
    Redis at most the 11 commands a job it did when a lookup read its state with one
    HGETALL, and the HLEN (O(1)) that keeps a hash of very many fields from being read
    at all (602 a page): the careful read (names, sizes, then values) is for big states
    alone; it cost 18 a job (902 a page)."""
    from runner.client import Request
    from runner.store.scripts import Burial

    c, rt, r, k = project.client, project.runtime, project.runtime.redis, project.keys()
    c.enqueue_many([Request("perm", {"i": i, "s": "abc"}) for i in range(50)])
    reply = list(rt.scripts.claim(k, n=50, start=50, lease_ms=60_000, token_base="w.s",
                                  dead_ttl_ms=10**9, done_ttl_ms=10**9))
    got = [(reply[i], reply[i + 1]) for i in range(2, len(reply), CLAIM_FIELDS)]
    error = '{"type":"ValueError","message":"boom","traceback":"Traceback ...\\n  File x\\nValueError: boom"}'
    rt.scripts.bury(k, [Burial(i, t, "permanent failure", error, "", False, "") for i, t in got], 10**9)

    def commands(view: Any) -> int:
        view()  # (scripts loaded)
        r.config_resetstat()
        jobs = view()
        assert len(jobs) == 50 and all(j.as_dict()["last_error"]["message"] == "boom" for j in jobs)
        stats = r.info("commandstats")
        return sum(int(v["calls"]) for v in stats.values()) - 1  # (this INFO)

    dead = commands(lambda: c.dead("fast", limit=50)[1])
    listed = commands(lambda: c.jobs("dead", limit=50).jobs)
    print("commands a page: dead", dead, "jobs?status=dead", listed)
    # (the dead-letter page pays one command a page more since it answers a cursor: per
    # page, never per job)
    assert dead <= 603 and listed <= 602, (dead, listed)
