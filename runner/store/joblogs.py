"""Reading a job's log and its stream: the lines lua/joblog.lua kept in ``log:<id>`` and
the chunks in ``stream:<id>`` (JSON objects, oldest first), written by the worker with
the lease renewal and the run's settlement (worker/joblog.py)."""

from __future__ import annotations

from typing import Any

import orjson

from runner.store import codec, damage, records
from runner.store.keys import QueueKeys

# Levels a line or a chunk may nest and still encode in every view (orjson's 254, less
# the levels a view adds around it). One nested deeper (another writer's) reads as a
# damaged line: json.loads raised RecursionError on one 3,000 levels deep, and each
# view of the log answered 500.
ENTRY_DEPTH = 250

# Which write sets a damaged log or stream key aside (damage.py): a run's next one.
MENDS_LOG = "The job's next log write (while it runs)"
MENDS_STREAM = "The job's next ctx.stream write (while it runs)"
# What probe answers for a key of another type: no length any list has.
DAMAGED_PROBE = (-1, None)


def read(redis: Any, k: QueueKeys, job_id: str, damaged: list[damage.Damaged] | None = None
         ) -> list[dict[str, Any]]:
    """The job's log lines, oldest first ([] for none). A line that is not a JSON object
    (damage) reads as its text, so a view shows it rather than failing; a log key of
    another type reads as no line, named in ``damaged``."""
    return _objects(_whole(redis, k.log(job_id), MENDS_LOG, damaged))


def read_stream(redis: Any, k: QueueKeys, job_id: str, damaged: list[damage.Damaged] | None = None
                ) -> list[dict[str, Any]]:
    """The job's streamed chunks kept (ctx.stream), oldest first: {"a": attempt, "i":
    its number in the attempt, "ts", "data"}; a stream key of another type reads as none,
    named in ``damaged``."""
    return [c for c in _objects(_whole(redis, k.stream(job_id), MENDS_STREAM, damaged)) if "i" in c]


def _whole(redis: Any, key: str, mends: str, damaged: list[damage.Damaged] | None, start: int = 0) -> Any:
    """The list's entries from ``start``; none for a key of another type (named in
    ``damaged``: damage a view shows, never a failure)."""
    try:
        return redis.lrange(key, start, -1)
    except Exception as exc:
        if not damage.wrong_type(exc):
            raise
        if damaged is not None:
            damaged.append(damage.found(redis, key, "list", mends))
        return []


def probe(redis: Any, key: str) -> tuple[int, bytes | None]:
    """(length, newest raw entry) of a log or stream list: two small reads that tell a
    follower whether anything landed since it last looked, without reading the list;
    DAMAGED_PROBE for a key of another type."""
    pipe = redis.pipeline(transaction=False)
    pipe.llen(key)
    pipe.lindex(key, -1)
    n, last = pipe.execute(raise_on_error=False)
    for got in (n, last):
        if isinstance(got, Exception):
            if not damage.wrong_type(got):
                raise got
            return DAMAGED_PROBE
    return int(n or 0), last


def read_stream_after(redis: Any, k: QueueKeys, job_id: str, after: tuple[int, ...],
                      damaged: list[damage.Damaged] | None = None) -> list[dict[str, Any]]:
    """The chunks kept after position ``after``, oldest first: (run, attempt, number),
    the run counting the job's requeues (a chunk's "r", absent: 0); (attempt, number)
    means run 0. A follower asks this every quarter second: when nothing landed it costs
    the two reads of probe and parses one chunk; when chunks landed in the same run and
    attempt only those are read (the numbers say how many), unless a trim or a gap makes
    the whole list the safe read."""
    after = widened(after)
    key = k.stream(job_id)
    n, last = probe(redis, key)
    if (n, last) == DAMAGED_PROBE:
        if damaged is not None:
            damaged.append(damage.found(redis, key, "list", MENDS_STREAM))
        return []
    if last is None:
        return []
    newest = _objects((last,))[0]
    at = position(newest)
    if at <= after:
        return []
    if at[:2] == after[:2] and after[2] >= 0 and at[2] - after[2] < n:
        fresh = [c for c in _objects(_whole(redis, key, MENDS_STREAM, damaged, -(at[2] - after[2]))) if "i" in c]
        if fresh and position(fresh[0]) == (after[0], after[1], after[2] + 1):
            return fresh
    chunks = [c for c in _objects(_whole(redis, key, MENDS_STREAM, damaged)) if "i" in c]
    return [c for c in chunks if position(c) > after]


def widened(after: tuple[int, ...]) -> tuple[int, int, int]:
    """A position as (run, attempt, number): an (attempt, number) is run 0's."""
    return (0, after[0], after[1]) if len(after) == 2 else (after[0], after[1], after[2])


def position(chunk: dict[str, Any]) -> tuple[int, int, int]:
    """A chunk's place: (run, attempt, number); a requeued job's runs after the first
    carry "r" (lua/joblog.lua), so places grow over the job's whole life."""
    r, a, i = chunk.get("r", 0), chunk.get("a"), chunk.get("i")

    def whole(v: Any) -> int:
        return v if isinstance(v, int) and not isinstance(v, bool) else -1

    return whole(r), whole(a), whole(i)


def _objects(raws: Any) -> list[dict[str, Any]]:
    """Each entry decoded: the one place a log line or a chunk is read. One that is not a
    JSON object within ENTRY_DEPTH (damage) reads as a line of its text."""
    out: list[dict[str, Any]] = []
    for raw in raws or ():
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        try:
            one = orjson.loads(text)  # in C: never a RecursionError (past 1,024 levels, a DecodeError)
            codec.check_depth(one, text, ENTRY_DEPTH)
        except orjson.JSONDecodeError:  # codec.TooDeep is one
            one = None
        if not isinstance(one, dict):
            one = {"ts": None, "level": "INFO", "src": "log", "msg": text}
        elif not _shown_as_is(one):
            one = _well_typed(one)
        out.append(one)
    return out


def _time_ok(ts: Any) -> bool:
    return ts is None or (isinstance(ts, int) and not isinstance(ts, bool) and 0 <= ts <= records.MAX_TIME_MS)


def _shown_as_is(one: dict[str, Any]) -> bool:
    return _time_ok(one.get("ts")) and isinstance(one.get("msg", ""), str)


def _well_typed(one: dict[str, Any]) -> dict[str, Any]:
    """An entry another writer put with a time a date cannot show (ts 1e300 made the
    console throw) or a message that is not text: the time None, the message its JSON."""
    out = dict(one)
    if not _time_ok(out.get("ts")):
        out["ts"] = None
    if "msg" in out and not isinstance(out["msg"], str):
        out["msg"] = codec.dumps(out["msg"])
    return out
