"""The replay rule (worker/journal.py) without Redis: a recorded step returns its value
without calling its function, a repeated name is recorded as name#2, a replay that
reaches another step fails for good naming both, a recorded permanent error is raised
again, a step past its bounds raises StepTooLarge, and a sleep suspends the run once and
is skipped on the replay after its end."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from runner.errors import NonDeterministicReplay, PermanentFailure, StaleLease, StepTooLarge, Suspend
from runner.store import records
from runner.worker import journal
from runner.worker.journal import Journal, StepFailed


class Log:
    """A step log as step.lua keeps it: fenced by position, bounded in entries."""

    def __init__(self, max_steps: int = journal.MAX_STEPS) -> None:
        self.entries: list[dict[str, Any]] = []
        self.max_steps = max_steps
        self.lost = False

    def record(self, pos: int, body: str) -> tuple[int, int]:
        if self.lost:
            return journal.LOST, 0
        if pos != len(self.entries):
            return journal.MOVED, len(self.entries)
        if pos >= self.max_steps:
            return journal.FULL, pos
        self.entries.append(records.entry_of(json.loads(body)) or {})  # as store/steps.py reads it back
        return journal.RECORDED, len(self.entries)

    def run(self, **kw: Any) -> Journal:
        return Journal("j1", lambda: [dict(e) for e in self.entries], self.record, **kw)


def test_a_recorded_step_replays_its_value_without_calling_fn() -> None:
    log, calls = Log(), []

    def fn(x: int) -> int:
        calls.append(x)
        return x * 2

    j = log.run()
    assert j.step("a", fn, (1,), {}) == 2 and j.step("a", fn, (5,), {}) == 10
    assert [e["name"] for e in log.entries] == ["a", "a#2"]
    j2 = log.run()
    assert j2.step("a", fn, (1,), {}) == 2 and j2.step("a", fn, (5,), {}) == 10
    assert calls == [1, 5] and j2.replayed == 2 and j2.ran == 0


def test_step_key_is_stable_inside_fn_and_none_outside() -> None:
    log = Log()
    j = log.run()
    seen: list[str | None] = []
    j.step("charge", lambda: seen.append(j.step_key), (), {})
    j.step("charge", lambda: seen.append(j.step_key), (), {})
    assert seen == ["j1:charge", "j1:charge#2"] and j.step_key is None


def test_a_replay_on_another_path_names_both_steps() -> None:
    log = Log()
    log.run().step("one", lambda: 1, (), {})
    with pytest.raises(NonDeterministicReplay, match=r"non-deterministic replay.*'one'.*'other'") as exc:
        log.run().step("other", lambda: 1, (), {})
    assert isinstance(exc.value, PermanentFailure)


def test_a_recorded_permanent_error_is_raised_again_without_running() -> None:
    log, calls = Log(), []

    def bad() -> None:
        calls.append(1)
        raise PermanentFailure("card declined")

    with pytest.raises(PermanentFailure):
        log.run().step("charge", bad, (), {})
    with pytest.raises(StepFailed, match="card declined"):
        log.run().step("charge", bad, (), {})
    assert calls == [1]


def test_a_transient_error_is_not_recorded() -> None:
    log = Log()
    with pytest.raises(ZeroDivisionError):
        log.run().step("a", lambda: 1 / 0, (), {})
    assert log.entries == []


def test_bounds_raise_step_too_large() -> None:
    with pytest.raises(StepTooLarge, match="max_step_bytes"):
        Log().run(max_step_bytes=10).step("big", lambda: "x" * 20, (), {})
    with pytest.raises(StepTooLarge, match="cannot be recorded as JSON"):
        Log().run().step("odd", lambda: {1, 2}, (), {})
    log = Log(max_steps=1)
    j = log.run()
    j.step("a", lambda: 1, (), {})
    with pytest.raises(StepTooLarge, match="1 entries"):
        j.step("b", lambda: 1, (), {})


def test_a_lost_lease_refuses_the_step() -> None:
    log = Log()
    log.lost = True
    with pytest.raises(StaleLease):
        log.run().step("a", lambda: 1, (), {})


def test_a_sleep_suspends_once_and_is_skipped_after_its_end() -> None:
    log = Log()
    now = [1_000_000]
    j = log.run(clock0=(now[0], time.monotonic()))
    j.step("a", lambda: 1, (), {})
    with pytest.raises(Suspend) as sus:
        j.sleep("nap", 5000, 0)
    assert sus.value.index == 1 and sus.value.delay_ms == 5000 and not sus.value.recorded
    # The suspend script records the entry with its end.
    log.entries.append({"name": "nap", "kind": "sleep", "status": "ok", "until_ms": now[0] + 5000})
    early = log.run(clock0=(now[0] + 10, time.monotonic()))
    early.step("a", lambda: 1, (), {})
    with pytest.raises(Suspend) as again:
        early.sleep("nap", 5000, 0)
    assert again.value.recorded and again.value.at_ms == now[0] + 5000
    late = log.run(clock0=(now[0] + 5000, time.monotonic()))
    late.step("a", lambda: 1, (), {})
    late.sleep("nap", 5000, 0)  # returns: over
    assert late.step("b", lambda: 2, (), {}) == 2


def test_inline_sleeps_are_recorded_and_end_at_once() -> None:
    log = Log()
    j = log.run(inline=True)
    j.sleep("nap", 3_600_000, 0)
    assert log.entries[0]["kind"] == "sleep" and log.entries[0]["until_ms"] - log.entries[0]["started_ms"] == 3_600_000


def test_a_durable_call_inside_a_step_is_refused() -> None:
    log = Log()
    j = log.run()
    with pytest.raises(PermanentFailure, match="inside step 'j1:outer'"):
        j.step("outer", lambda: j.step("inner", lambda: 1, (), {}), (), {})
    assert [(e["name"], e["status"]) for e in log.entries] == [("outer", "error")]  # failed for good


def test_a_wait_for_an_event_puts_its_waiter_on_record_before_it_suspends_and_replays_its_event() -> None:
    """ctx.wait_for_event: the waiter goes on record (at the wait's position), then the run
    suspends waiting for the signal its delivery sends; a resumed run takes the event,
    records it and takes the waiter off; a replay returns the recorded event (or None
    after a timeout) without asking again; a step recorded where the wait was is
    non-deterministic."""
    log = Log()
    listened: list[tuple[str, dict[str, Any], int, bool]] = []
    answers: list[tuple[int, str]] = [(0, "")]

    def listen(name: str, match: dict[str, Any], pos: int, on: bool) -> int:
        listened.append((name, match, pos, on))
        return 1

    def take(pos: int, signal: str, head: str, until: int | None) -> tuple[int, str]:
        assert signal == f"event.{pos}"
        return answers.pop(0)

    j = log.run(take=take, listen=listen)
    with pytest.raises(Suspend) as sus:
        j.wait_event("order.paid", {"order_id": 7}, 5000)
    assert (sus.value.kind, sus.value.signal, sus.value.event, sus.value.match) == (
        "event", "event.0", "order.paid", {"order_id": 7})
    assert listened == [("order.paid", {"order_id": 7}, 0, True)]
    # suspend.lua recorded the wait; the resumed run finds the delivered event.
    log.entries.append({"name": "order.paid", "kind": "event", "status": "waiting", "until_ms": 10**13})
    event = {"id": "e1", "name": "order.paid", "data": {"order_id": 7}, "ts": 1}
    answers.append((1, json.dumps(event)))
    j2 = log.run(take=take, listen=listen)
    assert j2.wait_event("order.paid", {"order_id": 7}, 5000) == event
    assert listened[-1] == ("order.paid", {"order_id": 7}, 0, False)
    log.entries[0] = {"name": "order.paid", "kind": "event", "status": "ok", "value": event}
    j3 = log.run(take=take, listen=listen)
    assert j3.wait_event("order.paid", {"order_id": 7}, 5000) == event and j3.replayed == 1
    log.entries[0] = {"name": "order.paid", "kind": "event", "status": "timeout"}
    assert log.run(take=take, listen=listen).wait_event("order.paid", {"order_id": 7}, 5000) is None
    with pytest.raises(NonDeterministicReplay, match=r"event 'order\.paid'"):
        log.run(take=take, listen=listen).step("order.paid", lambda: 1, (), {})


def test_run_inline_waits_match_top_level_fields_as_equal_json() -> None:
    """Inline, a wait gets the event given for its name when the data holds its match."""
    log = Log()
    j = log.run(inline=True, events={"order.paid": {"order_id": 7.0, "x": [1]}})
    got = j.wait_event("order.paid", {"order_id": 7}, None)
    assert got is not None and got["data"] == {"order_id": 7.0, "x": [1]}
    assert j.wait_event("order.paid", {"order_id": True}, None) is None
    assert j.wait_event("order.shipped", {}, None) is None
    assert [(e["name"], e["status"]) for e in log.entries] == [
        ("order.paid", "ok"), ("order.paid#2", "timeout"), ("order.shipped", "timeout")]


@pytest.mark.parametrize("durable", ["sleep", "wait", "wait_event"])
def test_a_suspension_after_a_step_that_failed_unrecorded_ends_the_attempt(durable: str) -> None:
    """A transient error in a step, swallowed by the handler, leaves that step without a
    record: a sleep, a signal wait or an event wait reached after it must not take its
    position (the retry runs the step there again), so it ends the attempt instead."""
    log = Log()
    j = log.run()

    def flaky() -> None:
        raise ConnectionError("card service away")

    with pytest.raises(ConnectionError):
        j.step("charge", flaky, (), {})
    with pytest.raises(journal.AfterUnrecordedStep, match="'charge'"):
        if durable == "sleep":
            j.sleep("nap", 1000, int(time.time() * 1000) + 1000)
        elif durable == "wait":
            j.wait("approval", None)
        else:
            j.wait_event("order.paid", {"order_id": 1}, None)
    assert log.entries == []


def test_a_step_retried_in_a_loop_keeps_its_name_and_key_at_its_position() -> None:
    """``for _ in range(3): try: step("pay")`` after an unrecorded failure: the retry is
    the same step at the same position (key "j1:pay" each time, recorded as "pay"), the
    unrecorded runs between are numbered among themselves, and the replay meets "pay"
    where the next attempt would have called it."""
    log, keys = Log(), []
    j = log.run()
    tries = iter([ConnectionError("away"), ConnectionError("away"), "paid"])

    def pay() -> str:
        keys.append(j.step_key)
        got = next(tries)
        if isinstance(got, Exception):
            raise got
        return got

    def note() -> None:
        keys.append(j.step_key)

    paid = None
    for _ in range(3):
        try:
            paid = j.step("pay", pay, (), {})
            break
        except ConnectionError:
            j.step("note", note, (), {})
            j.step("note", note, (), {})
    assert paid == "paid"
    assert keys == ["j1:pay", "j1:note", "j1:note#2", "j1:pay", "j1:note", "j1:note#2", "j1:pay"]
    j.step("pay", lambda: "again", (), {})  # a second use of the name, recorded after it
    j.step("note", lambda: "n", (), {})
    assert [e["name"] for e in log.entries] == ["pay", "pay#2", "note"]
    j2 = log.run()
    assert j2.step("pay", pay, (), {}) == "paid" and j2.step("pay", pay, (), {}) == "again"
    assert j2.step("note", note, (), {}) == "n" and j2.ran == 0


def test_a_sleep_of_the_failed_step_s_name_does_not_take_its_place() -> None:
    """Only a step of that name is the failed step called again: a sleep named alike
    still ends the attempt."""
    log = Log()
    j = log.run()
    with pytest.raises(ConnectionError):
        j.step("pay", lambda: (_ for _ in ()).throw(ConnectionError("away")), (), {})
    with pytest.raises(journal.AfterUnrecordedStep):
        j.sleep("pay", 1000, int(time.time() * 1000) + 1000)
    assert log.entries == []
