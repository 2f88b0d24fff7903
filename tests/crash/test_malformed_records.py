"""Malformed records in Redis (written by a buggy or hostile producer, or damaged): each
ends in the dead-letter set with a reason, never reaches a handler, and the worker keeps
serving the good jobs around it. Nothing is lost."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from crashkit import configure, lock_keys, wait_final

from runner.store.keys import QueueKeys
from runner.store.records import RECORD_FIELDS

from conftest import Project, assert_no_job_in_two_structures, raw_status, wait_for

Raw = redis.Redis


def _configure(project: Project, *, concurrency: int, batch: int) -> None:
    """crashkit.configure's knobs (a 1 s lease, no prefetch), and unknown types and
    versions go dead at once (unknown_grace = 0) rather than being handed back for a newer
    worker: no worker will ever know these."""
    project.write_config(vt=1, concurrency=concurrency, batch=batch, prefetch=0, worker="unknown_grace = 0")


def _raw(project: Project) -> Raw:
    return redis.Redis.from_url(project.server.url)  # bytes in, bytes out


def _state(raw: Raw, k: QueueKeys, job_id: bytes) -> dict[bytes, bytes]:
    """What a buried record keeps of its fate: its state hash."""
    return raw.hgetall(k.job_prefix.encode() + job_id + b":s")  # type: ignore[no-any-return]


def _good_fields(**over: Any) -> dict[str, Any]:
    now = int(time.time() * 1000)
    fields: dict[str, Any] = {
        "type": "record", "version": 1, "payload": '{"n": 1}', "status": "queued",
        "attempt": 0, "max_attempts": 3, "created_ms": now, "enqueued_ms": now,
        "ready_ms": now, "idem_key": "", "resource_key": "", "deferrals": 0,
    }
    fields.update(over)
    return {k: v for k, v in fields.items() if v is not None}


def _b(v: Any) -> bytes:
    return v if isinstance(v, bytes) else str(v).encode()


def _record(**over: Any) -> Callable[[Raw, bytes], None]:
    """A producer's job as the scripts store it: the record string (records.encode's
    layout, bytes allowed) and its state hash."""
    def write(r: Raw, key: bytes) -> None:
        f = _good_fields(**over)
        r.set(key, b"\x1f".join([b"1", *(_b(f.get(name, "")) for name in RECORD_FIELDS), _b(f.get("payload", ""))]))
        state = {n: f[n] for n in ("status", "attempt", "ready_ms", "deferrals", "enqueued_ms") if n in f}
        if state.get("status") == "queued":  # (absent: queued)
            del state["status"]
        r.hset(key + b":s", mapping=state)

    return write


# id -> (how the record is written, expected reason prefix)
CASES: dict[bytes, tuple[Callable[[Raw, bytes], None], str]] = {
    b"m-none": (lambda r, k: None, "malformed record: no job record"),
    b"m-string": (lambda r, k: r.set(k, "garbage"), "malformed record: not a record of this runner"),
    b"m-list": (lambda r, k: r.rpush(k, "a", "b"), "malformed record: a Redis list"),
    b"m-zset": (lambda r, k: r.zadd(k, {"a": 1}), "malformed record: a Redis zset"),
    b"m-missing": (_record(version=None, payload=None), "malformed record: missing field(s) version"),
    b"m-hash": (lambda r, k: r.hset(k, "x", "1"), "malformed record: a Redis hash"),
    b"m-notjson": (_record(payload="{not json"), "malformed record"),
    b"m-bad-version": (_record(version="abc"), "malformed record"),
    b"m-unknown-type": (_record(type="nope"), "unknown type"),
    b"m-unknown-version": (_record(version=99), "unknown version"),
    b"m-invalid": (_record(payload='{"n": "not an int"}'), "invalid payload"),
    b"m-array": (_record(payload="[1, 2, 3]"), "invalid payload"),
    b"m-deep": (_record(payload="[" * 2000 + "]" * 2000), "malformed record"),
    b"m-bytes-payload": (_record(payload=b"\xff\xfe{\x00"), "malformed record"),
    b"m-bytes-type": (_record(type=b"rec\xfford"), "unknown type"),
    b"\xff\xfe\x00\x01 random bytes id": (lambda r, k: None, "malformed record: no job record"),
    b"\xc3\x28bytes-id-with-record": (_record(), ""),  # a valid record under a non-UTF-8 id runs
}


def _plant(project: Project, raw: Raw, k: QueueKeys, job_id: bytes, write: Callable[[Raw, bytes], None]) -> None:
    key = k.job_prefix.encode() + job_id
    write(raw, key)
    raw.lpush(k.ready.encode(), job_id)


def test_malformed_records_go_dead_with_a_reason_and_the_worker_keeps_going(project: Project) -> None:
    """Every malformation above, planted between good jobs, one worker (unknown_grace = 0:
    an unknown type or version is not waited for): each bad one ends dead with its reason
    (and never reaches the handler), every good one is done, the worker is still up, and
    no id is left in flight or in two structures."""
    _configure(project, concurrency=2, batch=4)
    c = project.client
    k = project.keys("fast")
    raw = _raw(project)
    good = [c.enqueue("record", {"n": 0}).id]
    for job_id, (write, _) in CASES.items():
        _plant(project, raw, k, job_id, write)
        good.append(c.enqueue("record", {"n": len(good)}).id)
    w = project.spawn_worker("fast")
    assert all(r["status"] == "done" for r in wait_final(project, good, timeout=30).values())

    def all_settled() -> bool:
        for job_id in CASES:
            st = raw_status(raw, k, job_id)
            if st not in (b"dead", b"done"):
                return False
        return True

    wait_for(all_settled, timeout=20, what="every malformed record to settle")
    dead = set(raw.zrange(k.dead.encode(), 0, -1))
    for job_id, (_, reason) in CASES.items():
        f = _state(raw, k, job_id)
        if not reason:
            assert raw_status(raw, k, job_id) == b"done", job_id
            continue
        assert f[b"status"] == b"dead", job_id
        assert job_id in dead, job_id
        assert f[b"reason"].decode(errors="replace").startswith(reason), (job_id, f[b"reason"])
        # Never handed to a handler, and it spent no attempt.
        assert int(f.get(b"attempt", b"0")) == 0, (job_id, f)
    assert not (set(project.records.iterdir()) - {project.records / g for g in good}
                - {p for p in project.records.iterdir() if p.name.startswith("\udcc3")}), "a bad record ran"
    assert raw.type(k.job_prefix.encode() + b"m-list:corrupt") == b"list", "the damaged value is kept"
    assert raw.get(k.job_prefix.encode() + b"m-string") == b"garbage", "the damaged value is kept"
    assert w.poll() is None, "the worker must keep running"
    assert raw.llen(k.ready) == 0 and raw.zcard(k.leases) == 0 and raw.zcard(k.scheduled) == 0
    assert lock_keys(project) == []
    # The dead-letter list is readable through the client even with undecodable ids.
    total, _page = c.dead("fast", limit=100)
    assert total == len([1 for _, reason in CASES.values() if reason])


# Records whose bookkeeping fields have the wrong type or an unknown status.
BUGS = {
    "attempt-not-integer": pytest.param(_record(attempt="abc")),
    # A signed-digit attempt out of range: -1000 ran a handler that succeeds again every
    # lease; 2**53 + 1 buried it as worker lost.
    "attempt-negative": pytest.param(_record(attempt="-1000")),
    "attempt-huge": pytest.param(_record(attempt="9007199254740993")),
    "deferrals-not-integer": pytest.param(
        _record(deferrals="many", resource_key="busy", limits="1 r:busy")
    ),
    "max-attempts-not-integer": pytest.param(
        _record(max_attempts="x")
    ),
    "ready-ms-not-integer": pytest.param(_record(ready_ms="soon")),
    "unknown-status": pytest.param(_record(status="weird")),
}


@pytest.mark.parametrize("write", list(BUGS.values()), ids=list(BUGS))
def test_record_with_a_wrong_typed_field_goes_dead_not_lost(
    project: Project, write: Callable[[Raw, bytes], None]
) -> None:
    """A record whose bookkeeping fields have the wrong type: it must end dead with a
    reason, and the good jobs claimed in the same batch must run exactly once, without a
    lost lease."""
    configure(project, vt=1, concurrency=4, batch=8)
    c = project.client
    k = project.keys("fast")
    raw = _raw(project)
    good = [c.enqueue("record", {"n": i}).id for i in range(3)]
    _plant(project, raw, k, b"bad", write)
    # A held slot of the resource's limit: the record would be parked (deferral path).
    raw.zadd(k.limit("r:busy"), {"someone-else": int(time.time() * 1000) + 60_000})
    good += [c.enqueue("record", {"n": i}).id for i in range(3, 6)]
    w = project.spawn_worker("fast")
    final = wait_final(project, good, timeout=20)
    for job_id, r in final.items():
        assert r["status"] == "done"
        assert [h["outcome"] for h in r["history"]] == ["done"], (job_id, r["history"])
    # FIFO: the bad record was claimed before the later good jobs, so it is settled by now.
    wait_for(lambda: raw_status(raw, k, b"bad") in (b"dead", b"done"),
             timeout=3, what="the bad record to be buried")
    f = _state(raw, k, b"bad")
    assert f[b"status"] == b"dead" and f[b"reason"].startswith(b"malformed record"), f
    assert raw.zscore(k.dead, "bad") is not None
    assert w.poll() is None
    assert_no_job_in_two_structures(project)


def test_a_record_with_a_huge_number_of_errors_is_buried_soon(project: Project) -> None:
    """A record another producer wrote, whose 1 MB payload has 520,000 bad values (listing
    them all once held the claiming worker 25 s, its leases unrenewed): buried as an
    invalid payload within seconds, its error the first one and a note that more may
    exist, and the worker runs the good job behind it."""
    _configure(project, concurrency=2, batch=4)
    project.add_function("items", 'QUEUE = "fast"\n\n\ndef handle(payload, ctx):\n    return None\n',
                         '{"type": "object", "properties": {"a": {"type": "array", "items": {"type": "string"}}}}')
    c = project.client
    k = project.keys("fast")
    raw = _raw(project)
    _plant(project, raw, k, b"huge", _record(type="items", payload='{"a": [' + "0," * 519_999 + "0]}"))
    w = project.spawn_worker("fast")
    wait_for(lambda: raw_status(raw, k, b"huge") == b"dead", timeout=15, what="the record to be buried")
    good = c.enqueue("record", {"n": 1}).id
    assert wait_final(project, [good], timeout=15)[good]["status"] == "done"
    job = c.get("huge").as_dict()
    assert job["reason"] == "invalid payload", job["reason"]
    errors = job["last_error"]["errors"]
    assert errors[0] == {"path": "$.a[0]", "message": '0 is not of type "string"'}, errors[:3]
    assert len(errors) == 2 and "only the first error" in errors[1]["message"], errors[1:]
    assert w.poll() is None
