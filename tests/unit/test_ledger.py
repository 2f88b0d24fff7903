"""The ledger wakes the fetcher when what it waits for holds, and only then."""

from __future__ import annotations

import threading
from typing import Any

from runner.worker.execute import Claimed
from runner.worker.ledger import Ledger, Run

from conftest import wait_for


class CountingCondition(threading.Condition):
    """A Condition that counts its notifies (each one wakes the waiting fetcher)."""

    def __init__(self) -> None:
        super().__init__()
        self.notified = 0

    def notify(self, n: int = 1) -> None:
        self.notified += 1
        super().notify(n)


def _runs(n: int) -> list[Run]:
    return [Run(Claimed(id=f"j{i}", token=f"t{i}", attempt=1, type="noop", version_raw="1", payload_raw="{}",
                        max_attempts=3, idem_key="", resource_key="", ready_ms=0, created_ms=0, checkpoint_raw="",
                        queue="fast", claimed_ms=0)) for i in range(n)]


def _ledger(concurrency: int, capacity: int, low_water: int) -> tuple[Ledger, CountingCondition]:
    led = Ledger(concurrency, capacity, low_water)
    cond = CountingCondition()
    led.cond = cond
    return led, cond


def _waiting(cond: threading.Condition) -> bool:
    """A thread waits in the condition (CPython keeps its waiters in ``_waiters``)."""
    return len(cond._waiters) > 0  # type: ignore[attr-defined]


def _in_thread(fn: Any) -> tuple[threading.Thread, list[Any]]:
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(fn()), daemon=True)
    t.start()
    return t, got


def test_a_finished_job_that_leaves_too_little_room_does_not_wake_the_fetcher() -> None:
    """Waiting for room worth a claim (4 free, or any free with nothing waiting for an
    executor), the fetcher is not woken by a finished job that frees an executor but not
    that much room (each such wake-up was two thread switches for nothing), and is woken
    by the one that frees enough."""
    led, cond = _ledger(concurrency=2, capacity=4, low_water=4)
    led.claimed(_runs(4))
    led.picked()
    led.picked()  # two running, two claimed ahead and waiting for an executor
    stop = threading.Event()
    t, got = _in_thread(lambda: led.room(stop))
    wait_for(lambda: _waiting(cond), timeout=5, what="the fetcher to wait for room")
    for _ in range(3):
        led.returned()  # busy 1: an executor is free, but 3 of 4 is not room worth a claim
    assert cond.notified == 0 and not got
    led.picked()
    led.picked()  # nothing waits for an executor any more: any room is worth a claim now
    t.join(timeout=5)
    assert got == [(3, 1)] and cond.notified == 1


def test_the_fetcher_waiting_for_a_free_executor_is_woken_when_one_frees() -> None:
    """Held at a limited job (it may only be claimed to start at once), the fetcher waits
    for a free executor: the finished job that frees one wakes it, and not before."""
    led, cond = _ledger(concurrency=2, capacity=4, low_water=1)
    led.claimed(_runs(3))
    for _ in range(3):
        led.picked()
    stop = threading.Event()
    t, _ = _in_thread(lambda: led.executor_free(stop, timeout_s=30))
    wait_for(lambda: _waiting(cond), timeout=5, what="the fetcher to wait for an executor")
    led.returned()  # busy 2: every executor still busy
    assert cond.notified == 0 and t.is_alive()
    led.returned()  # busy 1: one is free
    t.join(timeout=5)
    assert not t.is_alive() and cond.notified == 1
