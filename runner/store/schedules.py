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

from runner.store import codec, routing
from runner.store.keys import QueueKeys, clock_offset

TEST_ENV = "RUNNER_TEST_SCHEDULES"
TOMBSTONE_S = 7 * 24 * 3600.0
# Statuses in which a job has not finished (a tick with OVERLAP = "skip" waits for them).
UNFINISHED = frozenset({"queued", "scheduled", "retrying", "processing"})


class ServerClock:
    """Epoch milliseconds by the Redis server (the ticker's time source), for the schedules
    of ``queues``."""

    def __init__(self, redis: Any, prefix: str, queues: Sequence[str], scripts: Any = None) -> None:
        self.redis = redis
        # A worker's Transport: on Redis Cluster, TIME goes to a master that answers within
        # the node wait (Transport.keyless), so one master stalled stops no ticker.
        self.scripts = scripts
        # (tests only) each queue's offset, under its own tag: the first that answers counts,
        # and it is asked first from then on, as TIME's master is (Transport.keyless).
        self.offset_keys = [clock_offset(prefix, q) for q in queues] if os.environ.get(TEST_ENV) == "1" else []
        # The server's clock only moves on (a step of it is rare); the test clock's offset
        # is moved at will, so whoever sleeps by it must look again soon.
        self.steady = not self.offset_keys

    def now_ms(self) -> int:
        sec, usec = self.redis.time() if self.scripts is None else self.scripts.keyless("TIME")
        now = int(sec) * 1000 + int(usec) // 1000
        if not self.offset_keys:
            return now
        # Two calls, not a pipeline: a Cluster client refuses TIME in one (tests only).
        if self.scripts is None:
            return now + int(self.redis.get(self.offset_keys[0]) or 0)
        from runner.store.outage import OUTAGE

        err: BaseException | None = None
        for key in list(self.offset_keys):
            try:
                offset = self.scripts.on_node(key, lambda k=key: self.redis.get(k), "the test clock's offset")
            except OUTAGE as exc:
                err = exc
                continue
            if key != self.offset_keys[0]:
                self.offset_keys.remove(key)
                self.offset_keys.insert(0, key)
            return now + int(offset or 0)
        assert err is not None
        raise err


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
    return [_int(v) for v in _checked(pipe.execute(raise_on_error=False))]


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
                scripts: Any, parts: Mapping[str, Sequence[QueueKeys]] | None = None) -> dict[str, State]:
    """The states of the given schedules (queue -> its keys and schedule ids), with each
    last job's status, looked up in every partition of its queue in ``parts`` (else in the
    schedule's own): two pipelined round trips, and a third for a last job sent to another
    partition and found nowhere (queued while its entry is still in the outbox)."""
    pairs = [(k, sid) for k, ids in wanted.values() for sid in ids]
    pipe = redis.pipeline(transaction=False)
    for k, sid in pairs:
        pipe.hgetall(k.schedule(sid))
    raw = [h if isinstance(h, dict) else {} for h in _checked(pipe.execute(raise_on_error=False))]
    found = _lookup(scripts, parts or {}, [(h["job"], k, h.get("job_away") or "")
                                           for (k, _), h in zip(pairs, raw, strict=True) if h.get("job")])
    away = [(k, h["job_away"]) for (k, _), h in zip(pairs, raw, strict=True)
            if h.get("job") and h["job"] not in found and h.get("job_away")]
    sent = _in_outbox(redis, away)
    out: dict[str, State] = {}
    for (k, sid), h in zip(pairs, raw, strict=True):
        job = h.get("job")
        status = None
        if job:
            status = found[job][1].get("status") if job in found else None
            status = status or ("queued" if (k.tag, h.get("job_away")) in sent else "expired")
        out[sid] = State(
            digest=h.get("def"), tick_ms=_int(h.get("tick")), fired_ms=_int(h.get("fired")),
            job_id=job or None, job_status=status, late_ms=_int(h.get("late_ms")),
            fired=_int(h.get("n_fired")) or 0, missed=_int(h.get("n_missed")) or 0,
            overlapped=_int(h.get("n_overlap")) or 0, manual=_int(h.get("n_manual")) or 0,
            late_sum_ms=_int(h.get("late_sum_ms")) or 0,
        )
    return out


def last_jobs(redis: Any, scripts: Any, wanted: Sequence[tuple[QueueKeys, str]],
              parts: Mapping[str, Sequence[QueueKeys]]) -> list[str]:
    """What tick.lua's ``seen`` argument says of each schedule's last jobs (its state's
    job and tick_job), read wherever they live among their queue's ``parts``: one
    "<id> <where>" line each, where is 'relaying' (sent to another partition, its entry
    still in the outbox), 'here' (in the schedule's own partition, or in none: done) or
    its status in another partition; '-' for none.

    Three round trips, each after the one before: the states; whether the entries of the
    last jobs sent away are still in the outbox; the look-ups of the others. An entry
    leaves the outbox only after its job was placed (outbox.py), so a job whose entry is
    gone is found by the look-up that follows (or has ended)."""
    pipe = redis.pipeline(transaction=False)
    for k, sid in wanted:
        pipe.hgetall(k.schedule(sid))
    states = [h if isinstance(h, dict) else {} for h in _checked(pipe.execute(raise_on_error=False))]
    lasts = [[(i, h.get(f"{role}_away") or "") for role in ("job", "tick_job") if (i := h.get(role))]
             for h in states]
    sent = _in_outbox(redis, [(k, entry) for (k, _), ls in zip(wanted, lasts, strict=True) for _, entry in ls
                              if entry])
    found = _lookup(scripts, parts, [(i, k, entry) for (k, _), ls in zip(wanted, lasts, strict=True)
                                     for i, entry in ls if (k.tag, entry) not in sent])
    out = []
    for (k, _), ls in zip(wanted, lasts, strict=True):
        lines = {}
        for i, entry in ls:
            if (k.tag, entry) in sent:
                lines[i] = "relaying"
            elif i not in found or found[i][0] == k.tag:
                lines.setdefault(i, "here")
            else:
                lines.setdefault(i, found[i][1].get("status") or "queued")
        out.append("\n".join(f"{i} {w}" for i, w in lines.items()) or "-")
    return out


def _in_outbox(redis: Any, entries: Sequence[tuple[QueueKeys, str]]) -> set[tuple[str, str]]:
    """Which of these (partition, entry) pairs are in that partition's outbox, by (tag,
    entry): one LPOS each, in one round trip (only for jobs sent to another partition)."""
    if not entries:
        return set()
    pipe = redis.pipeline(transaction=False)
    for k, entry in entries:
        pipe.lpos(k.outbox, entry)
    return {(k.tag, entry) for (k, entry), at in zip(entries, _checked(pipe.execute(raise_on_error=False)),
                                                      strict=True) if at is not None}


def _lookup(scripts: Any, parts: Mapping[str, Sequence[QueueKeys]],
            wanted: Sequence[tuple[str, QueueKeys, str]]) -> dict[str, tuple[str, dict[str, str]]]:
    """The jobs of these (id, its schedule's partition, the outbox entry it was sent away
    with or ''), wherever they live among their queue's ``parts``: id -> (its partition's
    tag, its fields as readers see them). First where each most likely is (the schedule's
    partition, and the one its entry's keys route to by the current count), in one round
    trip; the queue's other partitions only for those not found there (ended long ago,
    or placed by another count), in a second."""
    from runner.store import records

    def ask(asks: list[tuple[str, QueueKeys]], out: dict[str, tuple[str, dict[str, str]]]) -> None:
        if not asks:
            return
        batch = scripts.batch()
        for i, k in asks:
            batch.add("lookup", records.lookup_keys(k, i), (i,))
        for (i, k), (rec, state, claim, outcome) in zip(asks, batch.execute(), strict=True):
            rec = rec if isinstance(rec, str) and not rec.startswith("\0") else None
            fields = records.view(i, rec, state or [], claim or None, outcome or None)
            if fields and i not in out:
                out[i] = (k.tag, fields)

    first: dict[str, list[QueueKeys]] = {}
    for i, k, entry in wanted:
        likely = _routed(entry, parts.get(k.queue) or ())
        first.setdefault(i, [k] if likely is None or likely.tag == k.tag else [k, likely])
    out: dict[str, tuple[str, dict[str, str]]] = {}
    ask([(i, k) for i, ks in first.items() for k in ks], out)
    rest = {i: k.queue for i, k, _ in wanted if i not in out}
    ask([(i, k) for i, q in rest.items() for k in parts.get(q) or () if k not in first[i]], out)
    return out


def _routed(entry: str, parts: Sequence[QueueKeys]) -> QueueKeys | None:
    """The partition an outbox entry's keys route its job to by the current count (where
    the relay places it, unless another count placed the key), None when unknown."""
    if not entry or not parts:
        return None
    try:
        _, _, type_, _, _, _, _, _, idem, _, _, limits, *_ = codec.loads(entry)
    except (codec.DecodeError, ValueError, TypeError):
        return None
    key = routing.route_of(str(type_), str(idem), str(limits))
    return parts[routing.partition_of(key, parts[0].partitions)] if key else None


def _checked(replies: Any) -> list[Any]:
    """outage.checked, imported when called: the reading commands load no redis-py."""
    from runner.store.outage import checked

    return checked(replies)
