"""Watching a run: a job's log (what its handler logged, and in a child process what it
wrote to stdout and stderr), read once or followed until the job ends, and its stream
(ctx.stream's chunks) as an iterator. Reads only; the Redis commands are store/joblogs.py's."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from runner.client.inspecting import find
from runner.errors import RedisUnavailable
from runner.store import damage, joblogs, records
from runner.store.connection import reachable
from runner.store.keys import QueueKeys

if TYPE_CHECKING:
    from runner.client import Client

# How often a follower reads the log again: lines land with a run's settlement.
FOLLOW_POLL_S = 0.25
# A follower with nothing new reads the job's status every this many polls (about a second).
STATUS_EVERY = 4
# A follower that loses Redis once it has found the job polls again this often, longest.
AWAY_POLL_S = 2.0


def logs(client: Client, job_id: str, after: int | None = None) -> dict[str, Any]:
    """{"id", "status", "lines": [{"n", "ts", "level", "src", "msg"}, ...]}, oldest line
    first; ``after``: only the lines after the one numbered so (lines_after); and
    "damaged_keys" when the log's key holds another Redis type (no line read: see
    store/damage.py). Raises JobNotFound when the job is unknown (or its retention has
    passed)."""
    k, fields = find(client, job_id)
    damaged: list[damage.Damaged] = []
    with reachable():
        lines = joblogs.read(client.runtime.redis, k, job_id, damaged)
    return {"id": job_id, "status": fields.get("status"), "lines": lines_after(lines, after), **damage.views(damaged)}


def lines_after(lines: list[dict[str, Any]], after: int | None) -> list[dict[str, Any]]:
    """The lines a reader who saw the line numbered ``after`` has not seen (all for None):
    those numbered past it, whatever was trimmed off the front since (new_lines)."""
    return lines if after is None else new_lines([{"n": after}], lines)


class Mark(NamedTuple):
    """What a follower knows from its last poll: the job's home (found once), the log's
    probe, the job's fields, and the polls since its status was last read."""

    home: QueueKeys
    probe: tuple[int, bytes | None]
    fields: dict[str, str]
    polls: int


def logs_if_changed(client: Client, job_id: str, mark: Mark | None) -> tuple[dict[str, Any], Mark]:
    """logs(), for a follower that read them before: ``mark`` is what the last call
    returned with them (None at first). While nothing landed the log is not read again
    (two small reads say so) and "lines" is None; else the lines, and the new mark.

    The job is looked for in every queue partition once; then only at its home, and only
    when lines landed or every STATUS_EVERY polls, so an idle follower costs the two small
    reads a poll (the status is at most that many polls late: the lines never are)."""
    k, fields, polls = _where(client, job_id, mark)
    redis = client.runtime.redis
    damaged: list[damage.Damaged] = []
    with reachable():
        now = joblogs.probe(redis, k.log(job_id))
        if mark is not None and (now != mark.probe or polls >= STATUS_EVERY):
            k, fields = _at_home(client, k, job_id)
            polls = 0
            if fields.get("status") in records.ENDED:  # its last lines may have landed since the probe
                now = joblogs.probe(redis, k.log(job_id))
        lines = None if mark is not None and now == mark.probe else joblogs.read(redis, k, job_id, damaged)
    return ({"id": job_id, "status": fields.get("status"), "lines": lines, **damage.views(damaged)},
            Mark(k, now, fields, polls))


def _where(client: Client, job_id: str, mark: Mark | None) -> tuple[QueueKeys, dict[str, str], int]:
    """A follower's job: looked for in every queue partition at its first poll, then taken
    from the last poll's mark (its home, its fields, the polls since its status was read)."""
    if mark is None:
        k, fields = find(client, job_id)
        return k, fields, 0
    return mark.home, mark.fields, mark.polls + 1


def _at_home(client: Client, k: QueueKeys, job_id: str) -> tuple[QueueKeys, dict[str, str]]:
    """The job as readers see it, read at its home; looked for everywhere should it have
    moved (a change of the queue's partitions)."""
    found = records.lookup_many(client.runtime.scripts, [k], [job_id]).get(job_id)
    return found if found is not None else find(client, job_id)


def new_lines(seen: list[dict[str, Any]], now: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The lines of ``now`` after the last of ``seen``. A line's ``n`` is its place among
    every line written to the log, whatever was trimmed since (lua/joblog.lua), so the
    lines after it are exactly those numbered past it: the same text twice in the same
    millisecond is two lines. Lines written before lines were numbered: the last line
    seen is looked for, from the end."""
    if not seen:
        return now
    last = seen[-1]
    at = _number(last)
    if at is not None:
        fresh = [x for x in now if _after(x, at)]
        newest = _number(now[-1]) if now else None
        # A log written afresh (it expired, and the job ran again): all of it is new.
        return now if newest is not None and newest < at else fresh
    for i in range(len(now) - 1, -1, -1):
        if now[i] == last:
            return now[i + 1:]
    return now  # everything seen was trimmed away meanwhile


def _after(line: dict[str, Any], at: int) -> bool:
    n = _number(line)
    return n is not None and n > at


def _number(line: dict[str, Any]) -> int | None:
    n = line.get("n")
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def follow_logs(client: Client, job_id: str, timeout_s: float | None = None,
                poll_s: float = FOLLOW_POLL_S, damaged: list[dict[str, Any]] | None = None
                ) -> Iterator[dict[str, Any]]:
    """Each line of the job's log as it lands, from the first kept, until the job has
    ended (or ``timeout_s`` passed); ends at once for an ended job, after its lines. A log
    key of another type is followed on (the run's next write sets it aside), and named in
    ``damaged`` (as a view's "damaged_keys", each key once)."""
    until = None if timeout_s is None else time.monotonic() + timeout_s
    seen: list[dict[str, Any]] = []
    mark: Mark | None = None
    away = 0
    while True:
        try:
            got, mark = logs_if_changed(client, job_id, mark)
        except RedisUnavailable:
            if mark is None or _past(until):  # (not found yet: the caller hears of it)
                raise
            away += 1
            time.sleep(_away_poll(poll_s, away))
            continue
        away = 0
        if damaged is not None:
            damaged.extend(d for d in got.get("damaged_keys", ()) if d["key"] not in {x["key"] for x in damaged})
        fresh = new_lines(seen, got["lines"]) if got["lines"] is not None else []
        yield from fresh
        if fresh:
            seen = got["lines"]
        if got["status"] in records.ENDED or _past(until):
            return
        time.sleep(poll_s)


def _past(until: float | None) -> bool:
    return until is not None and time.monotonic() >= until


def _away_poll(poll_s: float, away: int) -> float:
    """A follower of a found job carries on through an outage (a Redis restart, a
    failover), as the job does: it polls again, less often the longer Redis is away,
    and raises only past its own timeout."""
    return min(AWAY_POLL_S, poll_s * float(2 ** min(away, 4)))


def stream_chunks(client: Client, job_id: str, after: tuple[int, ...] = (-1, -1)) -> dict[str, Any]:
    """{"id", "status", "chunks"}: the chunks kept after position ``after`` ((run,)
    attempt, number: see joblogs.position), oldest first, and "damaged_keys" when the
    stream's key holds another Redis type. Raises JobNotFound for an unknown job."""
    return stream_if_changed(client, job_id, after, None)[0]


def stream_if_changed(client: Client, job_id: str, after: tuple[int, ...], mark: Mark | None
                      ) -> tuple[dict[str, Any], Mark]:
    """stream_chunks(), for a follower that read them before (``mark``, as for
    logs_if_changed): the job's status is read at its home only when chunks landed or
    every STATUS_EVERY polls."""
    k, fields, polls = _where(client, job_id, mark)
    redis = client.runtime.redis
    damaged: list[damage.Damaged] = []
    with reachable():
        fresh = joblogs.read_stream_after(redis, k, job_id, after, damaged)
        if mark is not None and (fresh or polls >= STATUS_EVERY):
            k, fields = _at_home(client, k, job_id)
            polls = 0
            if fields.get("status") in records.ENDED:  # its last chunks may have landed since the read
                fresh = joblogs.read_stream_after(redis, k, job_id, after, damaged)
    return ({"id": job_id, "status": fields.get("status"), "chunks": fresh, **damage.views(damaged)},
            Mark(k, (0, None), fields, polls))


def _int(v: Any) -> int:
    return v if isinstance(v, int) else -1


def position(chunk: dict[str, Any]) -> tuple[int, int, int]:
    return joblogs.position(chunk)


def stream(client: Client, job_id: str, timeout_s: float | None = None,
           poll_s: float = FOLLOW_POLL_S) -> Iterator[Any]:
    """Each piece of the job's ctx.stream output in order, from the first kept, as it
    lands (about once a second while the job runs), until the job has ended (or
    ``timeout_s`` passed). Raises JobNotFound for an unknown job."""
    until = None if timeout_s is None else time.monotonic() + timeout_s
    after: tuple[int, ...] = (-1, -1)
    mark: Mark | None = None
    away = 0
    while True:
        try:
            got, mark = stream_if_changed(client, job_id, after, mark)
        except RedisUnavailable:
            if mark is None or _past(until):
                raise
            away += 1
            time.sleep(_away_poll(poll_s, away))
            continue
        away = 0
        for chunk in got["chunks"]:
            yield chunk.get("data")
        if got["chunks"]:
            after = position(got["chunks"][-1])
        if got["status"] in records.ENDED or _past(until):
            return
        time.sleep(poll_s)
