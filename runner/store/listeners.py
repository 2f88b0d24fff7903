"""The waiters of events (ctx.wait_for_event; layout in keys.py): one registry per event
name, under a tag of the name's own, holding each waiter in the bucket of its match (the
digest of its field names and values), scored by when it began to wait, so an event
reads only the buckets its data can match, and in each only the waiters that began
before it was emitted.

A match compares top-level fields of the event's data for equal JSON values: canonical
JSON (keys sorted, an integral float as its integer, at any size), so ``1`` and ``1.0``
are equal, as are ``2**60`` and ``2.0**60``, and ``true`` and ``1`` are not.

The waiters of one event are told a bounded batch at a time (client/waking.py); the
events still to tell wait on their home partition's ``wakes`` list, written by the emit
in its own step (lua/emit.lua).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from runner.store import codec
from runner.store.keys import EventKeys, QueueKeys

# The distinct lists of match fields one event name's waiters may use at once: an event
# reads one bucket per list, so this bounds an emit's reads.
MAX_SHAPES = 64
# Waiters read (and told) per call.
BATCH = 100
# How long an event's count of resumed waiters is kept (GET /events).
WOKE_KEEP_MS = 7 * 86_400_000


def _norm(value: Any) -> Any:
    # Every whole float, however large, as the integer it equals (a float past 2**53 is
    # still exactly one integer): ``2.0**60`` and ``2**60`` are one value, while
    # ``2**53 + 1``, which no float holds, equals no float. Not finite: is_integer() is False.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {str(k): _norm(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_norm(v) for v in value]
    return value


def canonical(value: Any) -> str:
    """The JSON text two equal values share."""
    return json.dumps(_norm(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def stored(match: Any) -> Any:
    """``match`` as a wait keeps it: its canonical JSON read back, with each whole number
    outside 64 bits as the float it equals, since the codec encodes no wider integer (a
    float of 2.0**64 or more would otherwise come back as an integer no record can hold).
    ValueError when ``match`` is not JSON, or holds such an integer that no float equals
    (no event's data can hold it either)."""
    return _narrow(codec.loads(canonical(match)))


def _narrow(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**64:
        try:
            as_float = float(value)
        except OverflowError:
            as_float = None
        if as_float is None or as_float != value:
            raise ValueError(f"the integer {value} is outside 64 bits and no float equals it")
        return as_float
    if isinstance(value, dict):
        return {k: _narrow(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_narrow(v) for v in value]
    return value


def shape_of(match: Mapping[str, Any]) -> str:
    """A match's field names, as the registry keeps them (a JSON list, sorted)."""
    return json.dumps(sorted(match), separators=(",", ":"), ensure_ascii=False)


def digest(shape: str, values: Sequence[Any]) -> str:
    """The bucket of a match: its field names and their values."""
    return hashlib.blake2b(f"{shape}\n{canonical(list(values))}".encode(), digest_size=16).hexdigest()


def digest_of(match: Mapping[str, Any]) -> str:
    shape = shape_of(match)
    return digest(shape, [match[f] for f in json.loads(shape)])


def digest_for(shape: str, data: Any) -> str | None:
    """The bucket an event's data falls in for one field list (None: it lacks a field, or
    the list read back from Redis is damaged: not a JSON list of names, or nested deep
    enough that json.loads raised RecursionError, which failed the emit)."""
    try:
        fields = json.loads(shape)
    except (ValueError, RecursionError):
        return None
    if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
        return None
    if not fields:
        return digest(shape, [])
    if not isinstance(data, dict) or any(f not in data for f in fields):
        return None
    return digest(shape, [data[f] for f in fields])


def member(queue: str, tag: str, job_id: str, position: int) -> str:
    """A waiter: its job's queue and partition tag, its id, and the wait's position."""
    return codec.dumps([queue, tag, job_id, position])


def parse_member(raw: str) -> tuple[str, str, str, int] | None:
    try:
        q, tag, job_id, pos = codec.loads(raw)
    except (codec.DecodeError, ValueError, TypeError):
        return None
    if isinstance(q, str) and isinstance(tag, str) and isinstance(job_id, str) and isinstance(pos, int):
        return q, tag, job_id, pos
    return None


def shapes(redis: Any, ek: EventKeys) -> list[str]:
    """The field lists the name's waiters use (at most MAX_SHAPES)."""
    return [str(s) for s in redis.hkeys(ek.shapes)]


def waiting(redis: Any, ek: EventKeys) -> int:
    """How many waiters the name has."""
    return sum(int(v) for v in (redis.hvals(ek.shapes) or ()))


def waiters(redis: Any, ek: EventKeys, bucket: str, before_ms: int, n: int = BATCH, offset: int = 0) -> list[str]:
    """``n`` waiters of a bucket that began to wait at or before ``before_ms``, the first
    ``offset`` passed over."""
    return [str(m) for m in redis.zrangebyscore(ek.bucket(bucket), "-inf", before_ms, start=offset, num=n)]


def wakes_head(redis: Any, k: QueueKeys, n: int) -> list[str]:
    """The first ``n`` events of ``k`` whose waiters are still to be told, oldest first."""
    return [str(e) for e in redis.lrange(k.wakes, 0, n - 1)]


def drop_wakes(redis: Any, k: QueueKeys, entries: Iterable[str]) -> None:
    """Take events whose waiters were all told off ``k``'s list (one each), in one round trip."""
    entries = list(entries)
    if not entries:
        return
    pipe = redis.pipeline(transaction=False)
    for e in entries:
        pipe.lrem(k.wakes, 1, e)
    pipe.execute()


def woke(redis: Any, prefix: str, events: Sequence[tuple[str, str]]) -> list[int]:
    """How many waiters each (name, event id) resumed, in one round trip."""
    if not events:
        return []
    pipe = redis.pipeline(transaction=False)
    for name, event_id in events:
        pipe.get(EventKeys(prefix, name).woke(event_id))
    return [int(v or 0) for v in pipe.execute()]
