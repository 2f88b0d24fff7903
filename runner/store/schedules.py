"""The schedules' side of Redis: the server's clock, the index of each queue's
registered schedules, and their states read for listings and metrics (the layout is in
keys.py; the transitions are lua/tick.lua and lua/adopt.lua).

The clock is the server's (``TIME``), never the host's: every scheduler on every host
then agrees on when a tick is due and how late it is. With ``RUNNER_TEST_SCHEDULES=1``
(tests only) the clock runs ahead by ``keys.clock_offset`` milliseconds, so a test can
move every scheduler to a daylight-saving change or past a downtime at once.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from runner.store.keys import QueueKeys, clock_offset

TEST_ENV = "RUNNER_TEST_SCHEDULES"
TOMBSTONE_S = 7 * 24 * 3600.0
# Statuses in which a job has not finished (a tick with OVERLAP = "skip" waits for them).
UNFINISHED = frozenset({"queued", "scheduled", "retrying", "processing"})


class ServerClock:
    """Epoch milliseconds by the Redis server (the ticker's time source)."""

    def __init__(self, redis: Any, prefix: str) -> None:
        self.redis = redis
        self.offset_key = clock_offset(prefix) if os.environ.get(TEST_ENV) == "1" else None

    def now_ms(self) -> int:
        if self.offset_key is None:
            sec, usec = self.redis.time()
            return int(sec) * 1000 + int(usec) // 1000
        pipe = self.redis.pipeline(transaction=False)
        pipe.time()
        pipe.get(self.offset_key)
        (sec, usec), offset = pipe.execute()
        return int(sec) * 1000 + int(usec) // 1000 + int(offset or 0)


def registered(redis: Any, keys: Iterable[QueueKeys]) -> dict[str, dict[str, str]]:
    """Per queue, the schedules registered there: id -> winning digest."""
    ks = list(keys)
    pipe = redis.pipeline(transaction=False)
    for k in ks:
        pipe.hgetall(k.schedules)
    return {k.queue: dict(h) for k, h in zip(ks, pipe.execute(), strict=True)}


def handled_ticks(redis: Any, pairs: Iterable[tuple[QueueKeys, str]]) -> list[int | None]:
    """The last handled tick of each (queue keys, schedule id), in one round trip: a cheap
    look before building tick scripts for ticks another ticker may have fired already."""
    pipe = redis.pipeline(transaction=False)
    for k, sid in pairs:
        pipe.hget(k.schedule(sid), "tick")
    return [_int(v) for v in pipe.execute(raise_on_error=False)]


def last_seen(redis: Any, k: QueueKeys, ids: Sequence[str]) -> list[int | None]:
    """When the holders of these schedules' winning definitions last said they live."""
    return [_int(v) for v in redis.hmget(k.schedules_seen, list(ids))] if ids else []


@dataclass(frozen=True, slots=True)
class State:
    """What Redis holds about one schedule; times in epoch ms, None when never."""

    digest: str | None
    tick_ms: int | None  # the last tick handled (fired or skipped)
    fired_ms: int | None  # the last tick that fired
    job_id: str | None  # the last job enqueued (a tick or a manual trigger)
    job_status: str | None  # that job's status ("expired" once its record is gone)
    late_ms: int | None  # how late the last tick fired
    fired: int = 0
    missed: int = 0
    overlapped: int = 0
    manual: int = 0
    late_sum_ms: int = 0


def _int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def read_states(redis: Any, wanted: Mapping[str, tuple[QueueKeys, Iterable[str]]],
                scripts: Any) -> dict[str, State]:
    """The states of the given schedules (queue -> its keys and schedule ids), with each
    last job's status, in two pipelined round trips (the second one lookup per last job)."""
    from runner.store import records

    pairs = [(k, sid) for k, ids in wanted.values() for sid in ids]
    pipe = redis.pipeline(transaction=False)
    for k, sid in pairs:
        pipe.hgetall(k.schedule(sid))
    raw = pipe.execute(raise_on_error=False)
    batch = scripts.batch()
    for (k, _), h in zip(pairs, raw, strict=True):
        job = h.get("job") if isinstance(h, dict) else None
        if job:
            scripts.lookup(k, job, pipe=batch)
    found = iter(batch.execute())
    out: dict[str, State] = {}
    for (_, sid), h in zip(pairs, raw, strict=True):
        h = h if isinstance(h, dict) else {}
        status = None
        if h.get("job"):
            reply = next(found)
            fields: dict[str, str] = {}
            if isinstance(reply, list) and len(reply) == 4:
                rec, state, claim, outcome = reply
                rec = rec if isinstance(rec, str) and not rec.startswith("\0") else None
                fields = records.view(h["job"], rec, state or [], claim or None, outcome or None)
            status = fields.get("status") or "expired"
        out[sid] = State(
            digest=h.get("def"), tick_ms=_int(h.get("tick")), fired_ms=_int(h.get("fired")),
            job_id=h.get("job") or None, job_status=status, late_ms=_int(h.get("late_ms")),
            fired=_int(h.get("n_fired")) or 0, missed=_int(h.get("n_missed")) or 0,
            overlapped=_int(h.get("n_overlap")) or 0, manual=_int(h.get("n_manual")) or 0,
            late_sum_ms=_int(h.get("late_sum_ms")) or 0,
        )
    return out
