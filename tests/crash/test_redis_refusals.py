"""Redis refusing commands for a while (memory full, permissions revoked): the worker
waits it out and carries on by itself; no settlement is dropped and no thread of the
worker dies, so it never silently stops consuming."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from crashkit import configure, new_project, outcomes, own_server, wait_final, wait_log, worker_log

from runner.errors import RedisUnavailable
from runner.store.embedded import Server

from conftest import (
    PROTECTED_CONFIGS,
    Project,
    assert_no_job_in_two_structures,
    refuse_writes,
    take_writes_again,
    wait_for,
)


def _admin(srv: Server) -> redis.Redis:
    return redis.Redis(port=srv.port, decode_responses=True)


def _refused(p: Project, w_log: Path, needle: str) -> None:
    wait_for(lambda: needle in w_log.read_text(errors="replace"), timeout=10,
             what=f"the worker to meet {needle!r}")


def _fill_memory(admin: redis.Redis, scratch: Path) -> None:
    admin.config_set("maxmemory", 1)  # every write is refused from now on


def _free_memory(admin: redis.Redis, scratch: Path) -> None:
    admin.config_set("maxmemory", 0)


@pytest.mark.parametrize("refuse,restore,needle,extra", [
    pytest.param(_fill_memory, _free_memory, "maxmemory", [], id="memory full (OOM)"),
    pytest.param(refuse_writes, take_writes_again, "Redis unavailable", PROTECTED_CONFIGS,
                 id="cannot persist (MISCONF)"),
])
def test_worker_waits_out_redis_refusing_writes(
    tmp_path: Path, refuse: Callable[[redis.Redis, Path], None],
    restore: Callable[[redis.Redis, Path], None], needle: str, extra: list[str],
) -> None:
    """Redis refusing every write while a handler runs: maxmemory reached under
    noeviction (OOM), or a failed snapshot (MISCONF). The worker treats it as an outage,
    with no tracebacks, backs off and settles the running job once writes are taken
    again; producers get RedisUnavailable meanwhile."""
    with own_server(tmp_path / "redis", extra=extra) as srv:
        p = new_project(tmp_path / "p", srv)
        try:
            configure(p, vt=3, concurrency=2)
            c = p.client
            w = p.spawn_worker("fast")
            a = c.enqueue("record", {"n": 1, "sleep": 0.8}).id
            wait_for(lambda: p.runs(a), timeout=15, what="the handler to start")
            admin = _admin(srv)
            refuse(admin, tmp_path)
            with pytest.raises(RedisUnavailable):
                c.enqueue("record", {"n": 2})
            _refused(p, worker_log(p, w), needle)
            restore(admin, tmp_path)
            b = c.enqueue("record", {"n": 3}).id
            final = wait_final(p, [a, b], timeout=20)
            assert all(r["status"] == "done" for r in final.values())
            assert outcomes(final[b]) == ["done"]
            assert len(p.runs(a)) <= 2 and len(p.runs(b)) == 1
            assert w.poll() is None
            assert "Traceback" not in worker_log(p, w).read_text(errors="replace")
            assert_no_job_in_two_structures(p)
        finally:
            p.stop_all()


def test_worker_survives_a_refused_settlement(tmp_path: Path) -> None:
    """The worker's ACL user loses EVALSHA while a handler runs (an operator's mistake),
    then gets it back: the refused ack is retried and lands, and new jobs run and settle
    without restarting the worker."""
    with own_server(tmp_path / "redis") as srv:
        admin = _admin(srv)
        admin.acl_setuser("w", enabled=True, passwords=["+pw"], keys=["~*"], channels=["&*"], commands=["+@all"])
        p = new_project(tmp_path / "p", srv)
        try:
            configure(p, vt=2, concurrency=2)
            c = p.client
            w = p.spawn_worker("fast", env={"REDIS_URL": f"redis://w:pw@127.0.0.1:{srv.port}/0"})
            wait_log(worker_log(p, w), "serving", timeout=15)
            a = c.enqueue("record", {"n": 1, "sleep": 0.8}).id
            wait_for(lambda: p.runs(a), timeout=15, what="the handler to start")
            admin.acl_setuser("w", enabled=True, commands=["-evalsha", "-eval"])
            _refused(p, worker_log(p, w), "settle")
            admin.acl_setuser("w", enabled=True, commands=["+@all"])
            b = c.enqueue("record", {"n": 2}).id
            final = wait_final(p, [a, b], timeout=12)
            assert all(r["status"] == "done" for r in final.values())
            assert outcomes(final[b]) == ["done"]
            assert w.poll() is None
        finally:
            p.stop_all()
