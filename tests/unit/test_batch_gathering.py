"""A gathering batch hands a run of another key to an idle executor at most once: when
the idle executor loses the race for the inbox, the run comes back to the gatherer, which
keeps it for later instead of putting it back again (it used to, for ever: a batch that
never ran and jobs that never settled)."""

from __future__ import annotations

import collections
import queue as stdqueue
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from runner.worker import batching
from runner.worker import executors as ex
from runner.worker.execute import Claimed
from runner.worker.ledger import Ledger, Run


def _run(i: int, tenant: str) -> Run:
    return Run(Claimed(id=f"j{i}", token=f"t{i}", attempt=1, type="bulk", version_raw="1",
                       payload_raw=f'{{"tenant": "{tenant}"}}', max_attempts=3, idem_key="", resource_key="",
                       ready_ms=0, created_ms=0, checkpoint_raw="", queue="fast", claimed_ms=0))


def test_a_run_put_back_for_an_idle_executor_that_comes_back_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    fn = SimpleNamespace(name="bulk", batch=SimpleNamespace(size=10, wait_s=0.05))
    monkeypatch.setattr(ex, "resolve", lambda job, registry, grace, now: (fn, {"tenant": "other"}))
    monkeypatch.setattr(batching, "key_of", lambda f, payload: payload["tenant"])
    execs: Any = ex.Executors.__new__(ex.Executors)
    execs.rt = SimpleNamespace(registry=SimpleNamespace(functions={"bulk": fn}),
                               config=SimpleNamespace(worker=SimpleNamespace(unknown_grace_s=5.0)))
    execs.ledger = Ledger(4, 8, 2)
    execs.inbox = stdqueue.SimpleQueue()
    execs.releasing = threading.Event()
    execs._lock = threading.Lock()
    execs._gathering = {}
    # An executor counts itself idle, but the gatherer always wins the inbox's next read.
    execs._idle = 1
    execs._admit = lambda run, index: True
    execs._server_now = lambda job: 0

    first, other = _run(0, "mine"), _run(1, "other")
    known: dict[int, Any] = {id(first): ex._Placed(fn, {"tenant": "mine"}, "mine", time.monotonic())}  # type: ignore[arg-type]
    execs.inbox.put(other)
    pending: collections.deque[Run] = collections.deque()
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(execs._gather_members(first, 0, pending, known)), daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive(), "the gathering took and put back the same run for ever"
    _, members, stop = got[0]
    assert [r.job.id for r, _ in members] == ["j0"] and not stop
    assert list(pending) == [other]  # kept for this executor's next batch


def test_one_claim_asks_for_a_whole_batch() -> None:
    """A queue with a BATCH function claims up to its largest ``size`` at once when that is
    more than the queue's ``batch`` (one claim round trip fills a batch: a batch of 100
    took two claims of 64); a queue without one claims its ``batch``, as before."""
    from runner.worker.queue import claim_size_for

    def runtime(*sizes: int | None) -> Any:
        fns = [SimpleNamespace(batch=None if s is None else SimpleNamespace(size=s)) for s in sizes]
        return SimpleNamespace(registry=SimpleNamespace(for_queue=lambda name: fns))

    q = SimpleNamespace(name="fast", batch=64)
    assert claim_size_for(runtime(None, 100, 20), q) == 100  # type: ignore[arg-type]
    assert claim_size_for(runtime(None, 10), q) == 64  # type: ignore[arg-type]
    assert claim_size_for(runtime(None), q) == 64  # type: ignore[arg-type]
