"""Idempotency keys under random interleavings (hypothesis), on a real server: enqueues
through the public client (same or other payload, same or other function, same or other
key) mixed with claims, acks, failures, deaths, requeues, purges and the expiry of
completed keys. After every step:

- every accepted job is unfinished (ready, scheduled or claimed), done or dead, or was
  purged on purpose: none is lost;
- a duplicate answer names a job of the same function whose payload is the one sent;
- nothing is settled as a duplicate of a job that did not complete;
- a key never admits a second unfinished job of its function.
"""

from __future__ import annotations

import itertools
import uuid
from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from runner.client import Client
from runner.errors import IdempotencyConflict
from runner.runtime import Runtime
from runner.store import codec, records
from runner.store.scripts import Ack, Burial, RetryAt

from conftest import Project, size

LEASE = 60_000
FUNCTIONS = ("idem", "noop")  # both on the fast queue
KEYS = ("k1", "k2")
PAYLOADS = ({"k": "a"}, {"k": "a", "v": 2}, {"k": "a", "v": 2.0})  # the last two are one request


def machine_for(project: Project) -> type[RuleBasedStateMachine]:
    base = project.config()

    class Idempotency(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            cfg = replace(base, redis=replace(base.redis, prefix=f"m{uuid.uuid4().hex[:10]}"))
            self.rt = Runtime.create(cfg)
            self.c = Client(self.rt)
            self.k = self.rt.keys["fast"]
            self.r = self.rt.redis
            self.now = 1_900_000_000_000
            self.seq = itertools.count()
            self.jobs: dict[str, dict[str, Any]] = {}  # id -> {fn, key, payload}
            self.claimed: dict[str, str] = {}  # id -> token
            self.purged: set[str] = set()

        def teardown(self) -> None:
            self.rt.close()

        def _tick(self) -> int:
            self.now += 10
            return self.now

        def _view(self, job_id: str) -> dict[str, str]:
            rec, st, claim, outcome = self.rt.scripts.lookup(self.k, job_id)
            rec = rec if isinstance(rec, str) and not rec.startswith("\0") else None
            return records.view(job_id, rec, st or [], claim or None, outcome or None)

        def _views(self, ids: list[str]) -> dict[str, dict[str, str]]:
            """Many jobs' views in one round trip (an invariant reads every job)."""
            batch = self.rt.scripts.batch()
            for job_id in ids:
                self.rt.scripts.lookup(self.k, job_id, pipe=batch)
            out = {}
            for job_id, (rec, state, claim, outcome) in zip(ids, batch.execute(), strict=True):
                rec = rec if isinstance(rec, str) and not rec.startswith("\0") else None
                out[job_id] = records.view(job_id, rec, state or [], claim or None, outcome or None)
            return out

        def _status(self, job_id: str) -> str | None:
            return self._view(job_id).get("status")

        @rule(fn=st.sampled_from(FUNCTIONS), key=st.sampled_from(KEYS), payload=st.sampled_from(PAYLOADS))
        def enqueue(self, fn: str, key: str, payload: dict[str, Any]) -> None:
            try:
                out = self.c.enqueue(fn, payload, idempotency_key=key)
            except IdempotencyConflict as exc:
                held = self.jobs[exc.job_id]
                assert held["fn"] == fn and held["key"] == key
                assert codec.canonical(held["payload"]) != codec.canonical(payload)
                return
            if out.duplicate:
                held = self.jobs[out.id]
                assert held["fn"] == fn, "a duplicate of another function's job"
                assert codec.canonical(held["payload"]) == codec.canonical(payload), "a duplicate of another payload"
                return
            for other_id, other in self.jobs.items():
                if other["fn"] == fn and other["key"] == key and other_id not in self.purged:
                    assert self._status(other_id) in ("done", "dead", None), \
                        f"key {key} admitted a second unfinished job beside {other_id}"
            self.jobs[out.id] = {"fn": fn, "key": key, "payload": payload}

        @rule(n=st.integers(1, 3))
        def claim(self, n: int) -> None:
            self.rt.scripts.promote(self.k, 100, now_ms=self._tick())
            reply = self.rt.scripts.claim(self.k, n=n, start=n, lease_ms=LEASE, token_base=f"w.{next(self.seq)}",
                                          dead_ttl_ms=10**9, done_ttl_ms=10**9, now_ms=self._tick())
            for i in range(2, len(reply), 15):
                self.claimed[reply[i]] = reply[i + 1]

        def _one(self, data: st.DataObject) -> tuple[str, str] | None:
            if not self.claimed:
                return None
            job_id = data.draw(st.sampled_from(sorted(self.claimed)))
            return job_id, self.claimed.pop(job_id)

        @rule(data=st.data())
        def ack(self, data: st.DataObject) -> None:
            got = self._one(data)
            if got:
                self.rt.scripts.ack(self.k, [Ack(got[0], got[1], "", "{}", "")], 10**9, now_ms=self._tick())

        @rule(data=st.data())
        def fail(self, data: st.DataObject) -> None:
            got = self._one(data)
            if got:
                self.rt.scripts.retry(self.k, [RetryAt(got[0], got[1], 0, "{}", "{}", "")], now_ms=self._tick())

        @rule(data=st.data())
        def die(self, data: st.DataObject) -> None:
            got = self._one(data)
            if got:
                self.rt.scripts.bury(self.k, [Burial(got[0], got[1], "max attempts reached", "", "", False, "")],
                                     10**9, now_ms=self._tick())

        @rule(data=st.data())
        def requeue(self, data: st.DataObject) -> None:
            dead = self.r.zrange(self.k.dead, 0, -1)
            if dead:
                job_id = data.draw(st.sampled_from(dead))
                self.c.requeue("fast", job_id)

        @rule(data=st.data())
        def purge(self, data: st.DataObject) -> None:
            dead = self.r.zrange(self.k.dead, 0, -1)
            if dead:
                job_id = data.draw(st.sampled_from(dead))
                self.c.delete_dead("fast", job_id)
                self.purged.add(job_id)

        @rule()
        def expire_completed_keys(self) -> None:
            """The retention of completed keys passes (only they carry an expiry)."""
            # The model knows every key it can have written; a SCAN would walk every
            # earlier example's keys on the shared server and slow down with each one.
            names = [self.k.idem(fn, key) for fn in FUNCTIONS for key in KEYS]
            pipe = self.r.pipeline(transaction=False)
            for name in names:
                pipe.pttl(name)
            for name, ttl in zip(names, pipe.execute(), strict=True):
                if ttl > 0:
                    self.r.delete(name)

        @invariant()
        def nothing_is_lost(self) -> None:
            views = self._views([i for i in self.jobs if i not in self.purged])
            for job_id, v in views.items():
                status = v.get("status")
                assert status in ("queued", "scheduled", "retrying", "processing", "done", "dead"), (job_id, status)

        @invariant()
        def duplicates_only_of_completed_jobs(self) -> None:
            views = self._views(list(self.jobs))
            for job_id in self.jobs:
                of = views[job_id].get("duplicate_of") if job_id not in self.purged else None
                if of:
                    assert views[of].get("status") == "done", f"{job_id} settled as a duplicate of unfinished {of}"
                    assert self.jobs[of]["fn"] == self.jobs[job_id]["fn"]

    return Idempotency


def test_idempotency_holds_under_random_interleavings(project: Project) -> None:
    run_state_machine_as_test(
        machine_for(project),
        settings=settings(max_examples=int(size("MODEL_EXAMPLES", 25, 300)), stateful_step_count=30, deadline=None,
                          suppress_health_check=list(HealthCheck)),
    )
