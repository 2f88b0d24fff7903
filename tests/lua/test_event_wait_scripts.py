"""listen.lua, unlisten.lua, emit.lua's pending entry and signal.lua's position check, for
ctx.wait_for_event: state before, call, state after, return code. A waiter keeps the time
its wait began when put on again; the field lists a name's waiters use are counted and
bounded; a waiter leaves once; an emit keeps its event for the waiters in its own step;
a delivery to a wait that is over is refused, and one to a wait not yet suspended is
kept for it. Matching (unit): equal JSON values, 1 and 1.0 alike, true and 1 not."""

from __future__ import annotations

from typing import Any

import pytest
from test_scripts import NOW, claim, enqueue, new, state

from runner.client import waking
from runner.store import listeners, records
from runner.store.keys import EventKeys
from runner.store.scripts import Suspension

from conftest import Project, wait_for


def _ek(p: Project, name: str = "order.paid") -> EventKeys:
    return EventKeys(p.runtime.config.redis.prefix, name)


def _listen(p: Project, match: dict[str, Any], member: str, now: int = NOW) -> list[int]:
    return list(p.runtime.scripts.listen(_ek(p), listeners.shape_of(match), listeners.digest_of(match), member,
                                         listeners.MAX_SHAPES, now_ms=now))


def test_a_waiter_keeps_its_start_and_leaves_once(project: Project) -> None:
    p = project
    m = listeners.member("fast", "fast", "a", 1)
    assert _listen(p, {"order_id": 7}, m) == [1, NOW]
    assert _listen(p, {"order_id": 7}, m, now=NOW + 50) == [0, NOW]  # a replay's wait: the first start stays
    assert _listen(p, {"order_id": 8}, listeners.member("fast", "fast", "b", 1)) == [1, NOW]
    assert _listen(p, {}, listeners.member("fast", "fast", "c", 1)) == [1, NOW]
    r = p.runtime.redis
    assert r.hgetall(_ek(p).shapes) == {'["order_id"]': "2", "[]": "1"}
    assert listeners.waiting(r, _ek(p)) == 3
    digest = listeners.digest_of({"order_id": 7})
    assert listeners.waiters(r, _ek(p), digest, NOW - 1) == []  # began after that event
    assert listeners.waiters(r, _ek(p), digest, NOW) == [m]
    items = [(digest, '["order_id"]', m)]
    assert p.runtime.scripts.unlisten(_ek(p), items, "ev1", 1, 1000) == 1
    assert p.runtime.scripts.unlisten(_ek(p), items, "ev1", 0, 1000) == 0  # gone: counts nothing again
    assert r.hgetall(_ek(p).shapes) == {'["order_id"]': "1", "[]": "1"}
    assert listeners.woke(r, p.runtime.config.redis.prefix, [("order.paid", "ev1"), ("order.paid", "ev2")]) == [1, 0]


def test_the_field_lists_of_one_name_are_bounded(project: Project) -> None:
    p = project
    for i in range(listeners.MAX_SHAPES):
        assert _listen(p, {f"f{i}": 1}, listeners.member("fast", "fast", f"j{i}", 0))[0] == 1
    assert _listen(p, {"another": 1}, listeners.member("fast", "fast", "x", 0)) == [-1, 0]
    assert _listen(p, {"f0": 2}, listeners.member("fast", "fast", "y", 0))[0] == 1  # a list in use: fine


def test_an_emit_keeps_its_event_for_the_waiters_in_its_own_step(project: Project) -> None:
    """With waiters on record the event is kept for them in the emit's step; with none
    (read in the same step, on one server) nothing is kept and nobody is to be told."""
    p = project
    rt = p.runtime
    k = p.keys()
    none = rt.scripts.emit(k, [], event_id="e0", name="order.paid", data='"data":{}', idem_key="", data_hash="",
                           idem_ms=1000, keep=10, away="[]", entries=[], whole="{}", now_ms=NOW)
    assert none[-1] == "" and rt.redis.llen(k.wakes) == 0
    _listen(p, {"order_id": 7}, listeners.member("fast", "fast", "a", 0))
    reply = rt.scripts.emit(k, [], event_id="e1", name="order.paid", data='"data":null',
                            whole='{"order_id":7,"n":1.50}', idem_key="", data_hash="", idem_ms=1000, keep=10,
                            away="[]", entries=[], now_ms=NOW)
    pending = rt.redis.lrange(k.wakes, 0, -1)
    assert pending == [reply[-1]] == [f'{{"id":"e1","name":"order.paid","ts":{NOW},"data":{{"order_id":7,"n":1.50}}}}']


def _wait(p: Project, token: str, pos: int = 0) -> list[int]:
    entry = '{"name":"order.paid","kind":"event","event":"order.paid","match":{},"signal":"event.0",' \
            '"status":"waiting"}'
    s = Suspension("a", token, pos, entry, 5_000, 0, 1000, 4 << 20, "waits|noop", "event", "event.0")
    return list(p.runtime.scripts.suspend(p.keys(), s, now_ms=NOW + 10))


def test_a_delivery_wakes_a_waiting_job_and_is_refused_once_its_wait_is_over(project: Project) -> None:
    p = project
    sc = p.runtime.scripts
    enqueue(p, new("a"))
    (job,) = claim(p)
    # Put on record while the run still holds the job: kept for the wait, which reads it.
    assert list(sc.signal(p.keys(), "a", "event.0", '{"id":"e0"}', position=0, now_ms=NOW + 5)) == [1, "processing"]
    assert _wait(p, job[1]) == [1]
    assert state(p, "a")["status"] == "queued"  # the event kept before it suspended: ready at once
    (job,) = claim(p, now=NOW + 20, base="w.2")
    code, body = sc.take_signal(p.keys(), "a", job[1], 0, "event.0", '{"name":"order.paid","kind":"event"', NOW,
                                1000, 4 << 20, now_ms=NOW + 21)
    assert (int(code), body) == (1, '{"id":"e0"}')
    # The wait is over (its entry says ok): a second event's delivery is refused.
    assert list(sc.signal(p.keys(), "a", "event.0", '{"id":"e1"}', position=0, now_ms=NOW + 30)) == [-6, "processing"]
    assert "sig:event.0" not in state(p, "a")


def test_a_delivery_to_a_suspended_wait_wakes_it(project: Project) -> None:
    p = project
    sc = p.runtime.scripts
    enqueue(p, new("a"))
    (job,) = claim(p)
    assert _wait(p, job[1]) == [1]
    assert state(p, "a")["status"] == "waiting"
    assert list(sc.signal(p.keys(), "a", "event.0", '{"id":"e0"}', position=0, now_ms=NOW + 30)) == [2, "queued"]
    code, _ = sc.signal(p.keys(), "a", "event.0", '{"id":"e1"}', position=0, now_ms=NOW + 31)
    assert code == -3  # the first event wins


def test_the_emitter_tells_a_bounded_batch_and_leaves_the_rest(project: Project) -> None:
    """More waiters than an emitter tells itself: it tells INLINE of them (a batch per
    call), and the event stays pending for the relay, which tells the rest."""
    p = project
    for i in range(waking.INLINE + 50):
        _listen(p, {"order_id": 1}, listeners.member("fast", "fast", f"gone{i}", 0), now=1)
    out = p.client.emit("order.paid", {"order_id": 1})
    r = p.runtime.redis
    assert listeners.waiting(r, _ek(p)) == 50
    assert r.llen(p.keys().wakes) == 1
    p.spawn_worker("fast")
    wait_for(lambda: r.llen(p.keys().wakes) == 0, timeout=60, what="the relay to tell the rest")
    assert listeners.waiting(r, _ek(p)) == 0
    assert out.id and r.exists(_ek(p).woke(out.id)) == 0  # (jobs that do not exist: nobody resumed)


@pytest.mark.parametrize(("match", "data", "hit"), [
    ({"order_id": 7}, {"order_id": 7.0, "x": 1}, True),
    ({"order_id": 7}, {"order_id": "7"}, False),
    ({"order_id": 1}, {"order_id": True}, False),
    ({"a": {"x": 1, "y": [1, 2]}}, {"a": {"y": [1, 2.0], "x": 1}}, True),
    ({"a": None}, {"a": None}, True),
    ({"a": None}, {}, False),
    ({}, ["any", "data"], True),
    ({"a": 1}, ["not", "an", "object"], False),
])
def test_a_match_is_equal_json_of_top_level_fields(match: dict[str, Any], data: Any, hit: bool) -> None:
    shape = listeners.shape_of(match)
    assert (listeners.digest_for(shape, data) == listeners.digest_of(match)) is hit


def test_the_record_says_what_a_job_waits_for() -> None:
    f = {"status": "waiting", "waiting_for": "event.1", "ready_ms": str(NOW), "steps": "2",
         "step:1": '{"name":"order.paid","kind":"event","event":"order.paid","match":{"order_id":7},'
                   '"signal":"event.1","status":"waiting"}'}
    assert records.waiting_view(f)["event"] == "order.paid"
    assert records.waiting_view(f)["match"] == {"order_id": 7}
