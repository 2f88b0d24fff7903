"""A hypothesis state machine drives the real scripts with random operations and a
driven clock, and checks the lifecycle invariants after every step:

- a live job is in exactly the structure its status names (ready, leases, scheduled,
  dead), a done job in none;
- a claim token that lost its lease can change nothing;
- attempts never exceed max_attempts while a job is live; a job is never lost.
"""

from __future__ import annotations

import uuid
from typing import Any

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from runner.store.scripts import Ack, Burial, NewJob, RetryAt

from conftest import structures, view

LEASE = 1000
WHERE = {"queued": "ready", "processing": "leases", "scheduled": "scheduled", "retrying": "scheduled",
         "dead": "dead", "done": "done"}


class Lifecycle(RuleBasedStateMachine):
    project: Any = None

    @initialize()
    def setup(self) -> None:
        p = self.project
        p.prefix = f"m{uuid.uuid4().hex[:8]}"
        p.write_config()
        self.rt = p.runtime
        self.k = self.rt.keys["fast"]
        self.sc = self.rt.scripts
        self.now = 1_800_000_000_000
        self.jobs: set[str] = set()
        self.claims: dict[str, str] = {}   # job id -> current token
        self.attempts: dict[str, int] = {}  # job id -> attempt of its latest claim
        self.stale: list[tuple[str, str]] = []
        self.seq = 0

    @rule(n=st.integers(1, 3), delay=st.sampled_from([0, 0, 500]), res=st.sampled_from(["", "", "r"]))
    def enqueue(self, n: int, delay: int, res: str) -> None:
        jobs = []
        for _ in range(n):
            self.seq += 1
            jid = f"j{self.seq}"
            jobs.append(NewJob(jid, "noop", 1, "{}", 3, self.now + delay if delay else 0, "", "-", res))
            self.jobs.add(jid)
        self.sc.enqueue(self.k, jobs, self.now, 60_000)

    @rule(n=st.integers(1, 4))
    def claim(self, n: int) -> None:
        self.seq += 1
        reply = self.sc.claim(self.k, now_ms=self.now, n=n, lease_ms=LEASE, token_base=f"c{self.seq}",
                              defer_base_ms=100, defer_cap_ms=400, rnd=0.3, dead_ttl_ms=10**9, done_ttl_ms=10**9)
        for i in range(0, len(reply), 12):
            jid, token, attempt = reply[i], reply[i + 1], int(reply[i + 2])
            assert 1 <= attempt <= 3
            self.claims[jid] = token
            self.attempts[jid] = attempt

    @precondition(lambda self: bool(self.claims))
    @rule(data=st.data(), action=st.sampled_from(["ack", "retry", "bury", "release"]))
    def finish(self, data: st.DataObject, action: str) -> None:
        jid = data.draw(st.sampled_from(sorted(self.claims)))
        token = self.claims.pop(jid)
        if action == "retry" and self.attempts[jid] >= 3:
            action = "bury"  # as the worker does: the last attempt's failure is final
        if action == "ack":
            codes = self.sc.ack(self.k, [Ack(jid, token, "", "", "")], self.now, 10**9)
        elif action == "retry":
            codes = self.sc.retry(self.k, [RetryAt(jid, token, self.now + 300, "{}", "", "")], self.now)
        elif action == "bury":
            codes = self.sc.bury(self.k, [Burial(jid, token, "x", "", "", False, "")], self.now, 10**9)
        else:
            codes = self.sc.release(self.k, [(jid, token)], self.now)
        status = view(self.project, jid).get("status")
        if codes == [1]:
            assert status == {"ack": "done", "retry": "retrying", "bury": "dead", "release": "queued"}[action]
        else:
            assert codes == [-1]
        self.stale.append((jid, token))

    @rule(ms=st.sampled_from([100, 400, 1100]))
    def tick(self, ms: int) -> None:
        self.now += ms
        self.sc.promote(self.k, self.now, 100)
        self.sc.reclaim(self.k, self.now, 100, 10**9)
        # Claims whose lease lapsed are now stale: their token must be refused.
        for jid, token in list(self.claims.items()):
            if view(self.project, jid).get("token") != token:
                self.stale.append((jid, self.claims.pop(jid)))

    @precondition(lambda self: bool(self.stale))
    @rule(data=st.data())
    def stale_ack_is_refused(self, data: st.DataObject) -> None:
        jid, token = data.draw(st.sampled_from(self.stale))
        if view(self.project, jid).get("token") == token:
            return  # the same claim is current again (cannot happen: tokens are unique)
        before = view(self.project, jid)
        assert self.sc.ack(self.k, [Ack(jid, token, "", "", "")], self.now, 10**9) == [-1]
        assert self.sc.renew(self.k, [(jid, token)], self.now, LEASE) == [-1]
        assert view(self.project, jid) == before

    @invariant()
    def every_job_is_where_its_status_says(self) -> None:
        if not hasattr(self, "k"):
            return
        places = structures(self.project)  # also: claims match leases, outcomes their index
        seen: dict[str, str] = {}
        for name, ids in places.items():
            for i in ids:
                assert i not in seen, f"{i} in {seen[i]} and {name}"
                seen[i] = name
        for jid in self.jobs:
            rec = view(self.project, jid)
            assert rec, f"job {jid} lost"
            status = rec["status"]
            assert seen.get(jid) == WHERE[status], (jid, status, seen.get(jid))
            assert int(rec.get("attempt", 0)) <= 3  # absent until the first claim


def test_lifecycle_state_machine(project: Any) -> None:
    Lifecycle.project = project
    run = Lifecycle.TestCase
    run.settings = settings(max_examples=40, stateful_step_count=40, deadline=None,
                            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    run().runTest()


