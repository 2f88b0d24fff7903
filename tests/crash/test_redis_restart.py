"""Redis restarted under a running worker (appendonly on): the worker waits it out with
backoff (no busy loop, no log flood), reconnects by itself, settles the jobs it was
running, keeps consuming, and loses nothing. Producers get a clear RedisUnavailable."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from crashkit import (
    assert_quiet,
    configure,
    cpu_seconds,
    log_records,
    new_project,
    outcomes,
    own_server,
    wait_final,
    wait_log,
    worker_log,
)

from runner.errors import RedisUnavailable

from conftest import assert_no_job_in_two_structures, wait_for

DOWN_S = 3.0


def test_worker_survives_a_redis_restart_and_loses_nothing(tmp_path: Path) -> None:
    """Jobs done before, jobs running across the outage, delayed jobs due during it and
    jobs enqueued after it: each runs exactly once and ends done. While Redis is down the
    worker burns almost no CPU and writes a handful of log lines."""
    with own_server(tmp_path / "redis") as srv:
        p = new_project(tmp_path / "p", srv)
        try:
            configure(p, vt=5, concurrency=4)
            c = p.client
            w = p.spawn_worker("fast")
            before = [c.enqueue("record", {"n": i}).id for i in range(20)]
            wait_final(p, before, timeout=20)
            running = [c.enqueue("record", {"n": i, "sleep": 0.8}).id for i in range(4)]
            delayed = [c.enqueue("record", {"n": i}, delay=1.5).id for i in range(5)]
            wait_for(lambda: all(p.runs(i) for i in running), timeout=10, what="handlers to start")

            srv.stop()  # SIGTERM: Redis writes its append-only file and exits
            log = worker_log(p, w)
            lines0 = len(log.read_bytes().splitlines())
            cpu0 = cpu_seconds(w.pid)
            with pytest.raises(RedisUnavailable):
                c.enqueue("record", {"n": 99})
            # Watch the worker for a while with Redis gone.
            t_end = time.monotonic() + DOWN_S
            while time.monotonic() < t_end:
                assert w.poll() is None, "the worker died while Redis was down"
                time.sleep(0.1)
            cpu_down = cpu_seconds(w.pid) - cpu0
            lines_down = len(log.read_bytes().splitlines()) - lines0
            assert cpu_down < 0.3 * DOWN_S, f"busy loop: {cpu_down:.2f} s CPU in {DOWN_S} s down"
            assert lines_down <= 12, f"log flood: {lines_down} lines in {DOWN_S} s down"

            srv.start()
            after = [c.enqueue("record", {"n": i}).id for i in range(20)]
            final = wait_final(p, before + running + delayed + after, timeout=30)
            for job_id, r in final.items():
                assert r["status"] == "done", (job_id, r)
                assert outcomes(r) == ["done"], (job_id, r["history"])
                assert len(p.runs(job_id)) == 1
            wait_log(log, "Redis reachable again", timeout=5)
            warnings = [r for r in log_records(log) if "unavailable" in str(r.get("msg"))]
            assert 1 <= len(warnings) <= 6
            assert w.poll() is None
            assert_quiet(p)
            assert_no_job_in_two_structures(p)
        finally:
            p.stop_all()


CHECKPOINTER = '''
import os, time
QUEUE = "fast"
ISOLATION = "process"
TIMEOUT = 30
MAX_ATTEMPTS = 3
BACKOFF = {"base": 0.1, "cap": 0.2, "jitter": "full"}

def handle(payload, ctx):
    folder = os.environ["RECORD_DIR"]
    with open(os.path.join(folder, ctx.job_id), "a") as f:
        f.write(f"{ctx.attempt}\\n")
    if payload.get("wait") and ctx.attempt == 1:
        while not os.path.exists(os.path.join(folder, "go")):
            time.sleep(0.02)
    ctx.save_checkpoint({"attempt": ctx.attempt})
    return {"attempt": ctx.attempt, "n": payload.get("n")}
'''


def test_a_child_whose_checkpoint_meets_redis_away_gets_the_error_and_its_slot_stays_in_step(
        tmp_path: Path) -> None:
    """A process-isolated handler saves a checkpoint while Redis is down: the handler gets
    RedisUnavailable (a transient failure, retried), as a thread's would, and its child
    sends that attempt's outcome. Its slot stays in step: the retry and the next job each
    get their own outcome, not one left over from the call that failed."""
    with own_server(tmp_path / "redis") as srv:
        p = new_project(tmp_path / "p", srv)
        try:
            p.add_function("ckpt", CHECKPOINTER)
            configure(p, vt=5, concurrency=1)
            c = p.client
            first = c.enqueue("ckpt", {"wait": True, "n": 1}).id
            p.spawn_worker("fast")
            wait_for(lambda: p.runs(first), timeout=30, what="the handler to start")
            srv.stop()
            (p.records / "go").write_text("")
            time.sleep(1.0)  # the handler meets Redis away; the worker waits it out
            srv.start()

            def enqueue_second() -> str | None:
                try:
                    return c.enqueue("ckpt", {"n": 2}).id
                except RedisUnavailable:  # the client's pooled connection was to the server before
                    return None

            second = wait_for(enqueue_second, timeout=10, what="the restarted server to take the second job")
            final = wait_final(p, [first, second], timeout=30)
            assert final[first]["status"] == "done" and final[first]["result"] == {"attempt": 2, "n": 1}, final[first]
            assert "RedisUnavailable" in str(final[first]["history"]), final[first]["history"]
            assert final[second]["status"] == "done" and final[second]["result"] == {"attempt": 1, "n": 2}
            assert p.runs(first) == ["1", "2"] and p.runs(second) == ["1"]
        finally:
            p.stop_all()


TALKER = '''
import os, time
QUEUE = "fast"
TIMEOUT = 9

def handle(payload, ctx):
    go = os.path.join(os.environ["RECORD_DIR"], "go")
    n = 0
    while not os.path.exists(go):
        ctx.logger.info("line %d", n)
        n += 1
        time.sleep(0.02)
    ctx.logger.info("line %d", n)
    return n + 1
'''


def test_a_running_jobs_log_lines_outlive_a_redis_restart(tmp_path: Path) -> None:
    """A handler logs all the while Redis is down: the lines a lease renewal failed to
    write are kept and go with the next write, so the log ends whole, every line once and
    in order."""
    with own_server(tmp_path / "redis") as srv:
        p = new_project(tmp_path / "p", srv)
        try:
            p.add_function("talker", TALKER)
            configure(p, vt=1, concurrency=1)
            c = p.client
            job = c.enqueue("talker", {}).id
            w = p.spawn_worker("fast")
            log = worker_log(p, w)
            wait_for(lambda: len(c.logs(job)["lines"]) > 3, timeout=30, what="lines while it runs")
            srv.stop()
            wait_log(log, "fast renewer: Redis unavailable", timeout=15)
            srv.start()
            wait_log(log, "fast renewer: Redis reachable again", timeout=15)
            (p.records / "go").write_text("")

            def ended() -> bool:
                try:
                    return c.get(job).status == "done"
                except RedisUnavailable:  # a pooled connection to the server before
                    return False

            wait_for(ended, timeout=30, what="the job to end")
            final = wait_final(p, [job], timeout=30)[job]
            assert final["status"] == "done", final
            msgs = [str(x["msg"]) for x in c.logs(job)["lines"]]
            assert msgs == [f"line {i}" for i in range(final["result"])], msgs
        finally:
            p.stop_all()


def test_lookups_and_lists_answer_on_the_first_try_after_a_redis_restart(tmp_path: Path) -> None:
    """Once a restarted Redis answers, a job lookup and a job list (the store's pipelined
    script calls, on connections kept from before the restart) answer on their first
    try: a connection the restart closed is opened again and the call sent once more, as
    a plain read's is, instead of failing once per broken connection."""
    with own_server(tmp_path / "redis") as srv:
        p = new_project(tmp_path / "p", srv)
        try:
            configure(p)
            c = p.client
            job = c.enqueue("record", {"n": 1}).id
            assert c.get(job).status == "queued"
            assert [j.id for j in c.jobs("queued").jobs] == [job]
            srv.stop()
            srv.start()
            assert c.get(job).status == "queued"
            assert [j.id for j in c.jobs("queued").jobs] == [job]
            assert c.logs(job)["lines"] == []
        finally:
            p.stop_all()
