"""The workflow transitions in Lua: MAX_AGE decided in the claim, and a group's countdown
(group.lua writes members and seals; ack, bury, reclaim and cancel count a member down
once, and the settle that finishes the last member writes the then-job)."""

from __future__ import annotations

from typing import Any

import pytest

from runner.store.scripts import Burial

from conftest import Project, structures

NOW = 1_800_000_000_000
LEASE = 1_000
FIELDS = 14


@pytest.fixture
def p(any_project: Project) -> Project:
    return any_project


def enqueue(p: Project, *jobs: Any, now: int = NOW) -> None:
    p.runtime.scripts.enqueue(p.keys(), list(jobs), now_ms=now)


def new(job_id: str, type_: str = "noop", limits: str = "", meta: str = "") -> Any:
    from runner.store.scripts import NewJob

    return NewJob(id=job_id, type=type_, version=1, payload='{"a":1}', max_attempts=3, run_at_ms=0, delay_ms=0,
                  idem_key="", payload_hash="-", resource_key="", limits=limits, meta=meta)


def claim(p: Project, now: int, max_ages: str = "", n: int = 10) -> list[list[Any]]:
    reply = list(p.runtime.scripts.claim(p.keys(), n=n, start=n, lease_ms=LEASE, token_base="w.1",
                                         dead_ttl_ms=10_000_000, done_ttl_ms=10_000_000, now_ms=now,
                                         max_ages=max_ages))
    return [reply[i:i + FIELDS] for i in range(2, len(reply), FIELDS)]


# --- MAX_AGE ---------------------------------------------------------------------------


def test_claim_marks_a_job_past_its_max_age_expired_and_takes_no_limit(p: Project) -> None:
    """A job older than its type's MAX_AGE (by created_ms, on the script's clock) is claimed
    with started = 2 and no limit slot; a younger one, or one of a type without MAX_AGE, is
    claimed as usual."""
    enqueue(p, new("old", limits="1 r:x"), new("other", type_="record"))
    enqueue(p, new("young"), now=NOW + 900)
    got = {g[0]: g for g in claim(p, NOW + 1000, "noop=500 slow=1")}
    assert got["old"][12] == 2 and got["young"][12] == 1 and got["other"][12] == 1
    assert got["old"][2] == 1  # the attempt it would be
    r, k = p.runtime.redis, p.keys()
    assert r.zcard(k.limit("r:x")) == 0  # no slot taken for a job that will not run
    claim_entry = r.hget(k.claims, "old")
    assert claim_entry is not None and claim_entry.split()[3] == "-"  # no limit, idempotency or state flag


def test_an_expired_claim_buries_without_spending_its_attempt(p: Project) -> None:
    enqueue(p, new("old"))
    [job] = claim(p, NOW + 1000, "noop=500")
    sc, k = p.runtime.scripts, p.keys()
    assert sc.bury(k, [Burial("old", job[1], "expired", '{"type":"Expired"}',
                              '{"attempt":1,"outcome":"expired"}', True, "dead|noop expired|noop")],
                   10_000_000, now_ms=NOW + 1001) == [1]
    st = p.runtime.redis.hgetall(k.state("old"))
    assert st["status"] == "dead" and st["reason"] == "expired" and st["attempt"] == "0"
    assert structures(p)["dead"] == ["old"]
