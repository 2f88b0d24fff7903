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
