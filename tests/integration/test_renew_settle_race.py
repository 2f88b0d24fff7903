"""The renewer and the settler of one queue race on the same runs: a renewal that reaches
Redis just after those runs' acks is refused ("not yours"), and that refusal is not a
lost lease. Real components on a real server; the interleaving is forced by running the
renewal at the one moment it can lose the race: after the acks landed, before the
settler takes the runs out of the ledger."""

from __future__ import annotations

import logging
import queue as stdqueue
from collections.abc import Iterable

import pytest

from runner.worker.execute import Done
from runner.worker.fetcher import Fetcher
from runner.worker.ledger import Ledger, Run, Settlement
from runner.worker.renewer import Renewer
from runner.worker.settler import Settler

from conftest import Project, structures

JOBS = 40


class RenewBetweenAckAndForget(Ledger):
    """A ledger whose runs, once acked, are renewed before the settler forgets them: the
    renewal then lands after the acks, as it does when a renewer's snapshot was taken just
    before a settle."""

    renewer: Renewer
    snapshot: list[Run]

    def forget(self, runs: Iterable[Run]) -> None:
        runs = list(runs)
        if getattr(self, "snapshot", None):
            snap, self.snapshot = self.snapshot, []
            self.renewer.renew(snap)
        super().forget(runs)


def test_renewal_refused_after_a_concurrent_ack_is_no_lost_lease(
    project: Project, caplog: pytest.LogCaptureFixture
) -> None:
    """Jobs acked while their renewal was in flight log no "lease lost" warning, end done,
    and a run that really lost its lease still does."""
    rt = project.runtime
    q = rt.config.queues["fast"]
    for i in range(JOBS):
        project.client.enqueue("noop", {"n": i})
    ledger = RenewBetweenAckAndForget(q.concurrency, JOBS, 1)
    inbox: stdqueue.SimpleQueue[Run | None] = stdqueue.SimpleQueue()
    outcomes: stdqueue.SimpleQueue[Settlement | None] = stdqueue.SimpleQueue()
    fetcher = Fetcher(rt, q, ledger, inbox, outcomes, "w-race")
    renewer = Renewer(rt, q, ledger)
    settler = Settler(rt, q, ledger, outcomes)
    ledger.renewer = renewer
    got, _ = fetcher.claim(JOBS, JOBS)
    assert got == JOBS
    runs = ledger.renewable()
    ledger.snapshot = list(runs)  # the renewer's snapshot, taken before the settle
    with caplog.at_level(logging.WARNING, logger="runner.worker"):
        settler.send([Settlement(r, Done("null")) for r in runs])
    lost = [rec.getMessage() for rec in caplog.records if "lease lost" in rec.getMessage()]
    assert lost == []
    assert sorted(structures(project)["done"]) == sorted(r.job.id for r in runs)
    assert not any(r.lost for r in runs)

    # A run whose lease really went elsewhere (its token no longer holds) is still reported.
    project.client.enqueue("noop", {"n": -1})
    got, _ = fetcher.claim(1, 1)
    assert got == 1
    (held,) = ledger.renewable()
    rt.redis.hset(project.keys().claims, held.job.id, "other.1-0 1 0 -")  # another worker's claim
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="runner.worker"):
        renewer.renew([held])
    assert held.lost
    assert any("lease lost" in rec.getMessage() for rec in caplog.records)
