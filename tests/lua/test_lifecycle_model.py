"""A hypothesis state machine drives the real scripts with random operations and a
driven clock (the scripts' test clock), and checks the lifecycle invariants after every
step:

- a live job is in exactly the structure its status names (ready, leases, scheduled,
  dead, or its limit's waiter list when parked), a done job in none (save an id a late
  success left in ready, which the next claim drops);
- a parked job has one waiter entry, and a limit with parked jobs is known to the sweep;
- a limit of 1 has at most one live holder, and every claimed job under it holds it;
- a claim token that lost its lease can change nothing, unless its run finished while
  nobody else held the job (a late success: the job is done, 2);
- attempts never exceed max_attempts while a job is live; a job is never lost.
"""

from __future__ import annotations

import uuid
from typing import Any

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from runner.store.scripts import Ack, Burial, Hand, NewJob, RetryAt
from runner.worker.fetcher import CLAIM_FIELDS

from conftest import size, structures, view

LEASE = 1000
LIMIT = "r:r"  # the limit key of resource "r"
WHERE = {"queued": "ready", "processing": "leases", "scheduled": "scheduled", "retrying": "scheduled",
         "dead": "dead", "done": "done", "deferred": "parked"}


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
        self.limited: set[str] = set()  # jobs under LIMIT
        self.claims: dict[str, str] = {}   # job id -> current token
        self.attempts: dict[str, int] = {}  # job id -> attempt of its latest claim
        self.unstarted: set[str] = set()  # claimed ahead, no start mark yet
        self.stale: list[tuple[str, str]] = []
        self.late: set[str] = set()  # done by a late success: an id may linger in ready
        self.seq = 0

    @rule(n=st.integers(1, 3), delay=st.sampled_from([0, 0, 500]), res=st.sampled_from(["", "", "r"]))
    def enqueue(self, n: int, delay: int, res: str) -> None:
        jobs = []
        for _ in range(n):
            self.seq += 1
            jid = f"j{self.seq}"
            jobs.append(NewJob(jid, "noop", 1, "{}", 3, 0, delay, "", "-", res, f"1 r:{res}" if res else ""))
            self.jobs.add(jid)
            if res:
                self.limited.add(jid)
        self.sc.enqueue(self.k, jobs, now_ms=self.now)

    @rule(n=st.integers(1, 4), start=st.integers(0, 4))
    def claim(self, n: int, start: int) -> None:
        self.seq += 1
        reply = self.sc.claim(self.k, n=n, start=start, lease_ms=LEASE, token_base=f"c{self.seq}",
                              dead_ttl_ms=10**9, done_ttl_ms=10**9, now_ms=self.now)
        assert reply[0] == self.now and reply[1] in (0, 1)  # time, held back
        for i in range(2, len(reply), CLAIM_FIELDS):
            jid, token, attempt, started = reply[i], reply[i + 1], int(reply[i + 2]), int(reply[i + 12])
            assert 1 <= attempt <= 3
            # claimed to start (1), or ahead (0; 3, held, for one lost unstarted before)
            assert started == 1 if (i - 2) // CLAIM_FIELDS < start else started in (0, 3), started
            assert not (jid in self.limited and started != 1), f"{jid} is under a limit and was prefetched"
            self.claims[jid] = token
            self.attempts[jid] = attempt
            if started != 1:
                self.unstarted.add(jid)

    @precondition(lambda self: bool(self.unstarted))
    @rule(data=st.data())
    def start(self, data: st.DataObject) -> None:
        jid = data.draw(st.sampled_from(sorted(self.unstarted)))
        self.unstarted.discard(jid)
        assert self.sc.start(self.k, [(jid, self.claims[jid])], now_ms=self.now) == [1]

    @precondition(lambda self: bool(self.claims))
    @rule(data=st.data(), action=st.sampled_from(["ack", "retry", "bury", "release", "later"]))
    def finish(self, data: st.DataObject, action: str) -> None:
        jid = data.draw(st.sampled_from(sorted(self.claims)))
        token = self.claims[jid]
        self.unstarted.discard(jid)
        if action == "retry" and self.attempts[jid] >= 3:
            action = "bury"  # as the worker does: the last attempt's failure is final
        if action == "ack":
            codes = self.sc.ack(self.k, [Ack(jid, token, "", "", "")], 10**9, now_ms=self.now)
        elif action == "retry":
            codes = self.sc.retry(self.k, [RetryAt(jid, token, 300, "{}", "", "")], now_ms=self.now)
        elif action == "bury":
            codes = self.sc.bury(self.k, [Burial(jid, token, "x", "", "", False, "")], 10**9, now_ms=self.now)
        elif action == "release":
            codes = self.sc.release(self.k, [(jid, token)], now_ms=self.now)
        else:
            # Given up with the handler still running: the claim keeps its token and lease
            # until reclaim takes it back (or the handler's ack lands first).
            codes = self.sc.release(self.k, [Hand(jid, token, "later")], now_ms=self.now)
        assert codes == [1]
        status = view(self.project, jid).get("status")
        assert status == {"ack": "done", "retry": "retrying", "bury": "dead", "release": "queued",
                          "later": "processing"}[action]
        if action != "later":
            del self.claims[jid]
            self.stale.append((jid, token))

    @rule(ms=st.sampled_from([100, 400, 1100]))
    def tick(self, ms: int) -> None:
        self.now += ms
        self.sc.promote(self.k, 100, now_ms=self.now)
        self.sc.reclaim(self.k, 100, 10**9, now_ms=self.now)
        # Claims whose lease lapsed are now stale: their token must be refused.
        for jid, token in list(self.claims.items()):
            if view(self.project, jid).get("token") != token:
                self.stale.append((jid, self.claims.pop(jid)))
                self.unstarted.discard(jid)

    @precondition(lambda self: bool(self.stale))
    @rule(data=st.data())
    def stale_token(self, data: st.DataObject) -> None:
        jid, token = data.draw(st.sampled_from(self.stale))
        before = view(self.project, jid)
        assert before.get("token") != token  # tokens are unique: a stale one never comes back
        assert self.sc.renew(self.k, [(jid, token)], LEASE, now_ms=self.now) == [-1]
        assert self.sc.start(self.k, [(jid, token)], now_ms=self.now) == [-1]
        assert view(self.project, jid) == before
        lost = self.rt.redis.hget(self.k.state(jid), "lost_token")
        code = self.sc.ack(self.k, [Ack(jid, token, "", "", "")], 10**9, now_ms=self.now)
        if code == [2]:
            # A late success: the lapsed run's token, the job waiting in ready or buried
            # as worker lost (nobody holds it).
            assert lost is not None and lost.split()[0] == token
            assert before["status"] == "queued" or (before["status"], before.get("reason")) == ("dead", "worker lost")
            assert view(self.project, jid)["status"] == "done"
            self.late.add(jid)
        else:
            assert code == [-1]
            assert view(self.project, jid) == before

    @invariant()
    def every_job_is_where_its_status_says(self) -> None:
        if not hasattr(self, "k"):
            return
        r = self.rt.redis
        places = structures(self.project)  # also: claims match leases, outcomes their index
        waiters = r.lrange(self.k.limit(LIMIT) + ":w", 0, -1)
        assert len(waiters) == len(set(waiters)), f"a job parked twice: {waiters}"
        places["parked"] = waiters
        seen: dict[str, set[str]] = {}
        for name, ids in places.items():
            for i in ids:
                seen.setdefault(i, set()).add(name)
        for jid in self.jobs:
            rec = view(self.project, jid)
            assert rec, f"job {jid} lost"
            status = rec["status"]
            where = seen.get(jid, set())
            if jid in self.late and status == "done":
                assert where in ({"done"}, {"done", "ready"}), (jid, where)
            else:
                assert where == {WHERE[status]}, (jid, status, where)
            assert int(rec.get("attempt", 0)) <= 3  # absent until the first claim
        if waiters:  # the sweep knows of them, so none is stranded if a release is lost
            assert r.zscore(self.k.limwait, LIMIT) is not None

    @invariant()
    def a_limit_of_one_admits_one_holder(self) -> None:
        if not hasattr(self, "k"):
            return
        live = self.rt.redis.zrangebyscore(self.k.limit(LIMIT), f"({self.now}", "+inf")
        assert len(live) <= 1, live
        for jid, token in self.claims.items():
            if jid in self.limited:
                assert live == [token], (jid, token, live)


def test_lifecycle_state_machine(project: Any) -> None:
    Lifecycle.project = project
    run = Lifecycle.TestCase
    run.settings = settings(max_examples=int(size("MODEL_EXAMPLES", 20, 200)), stateful_step_count=40, deadline=None,
                            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    run().runTest()
