"""Job lists: one page of a queue's jobs in one status, newest first, with an opaque
cursor for the next page. Each status reads its own index (nothing is scanned):

    queued      the priority ZSET (jobs of priority 1-9, in the order they will run), then
                ready LIST (LPUSH in, so index 0 is the newest)
    scheduled   scheduled ZSET (delayed and retrying jobs), latest due first
    processing  leases ZSET, latest deadline first (each job shows its lease deadline)
    dead        dead ZSET, latest death first
    cancelled   cancelled ZSET, latest cancel first
    done        the done generations' logs, newest generation first
    deferred    held back without spending an attempt: each paused function's held LIST,
                then each limit's waiters (the limits with waiters are named by the
                limwait ZSET), oldest first; a rate-limited job waits as scheduled

A page reads at most SCAN_MAX ids of its index and one lookup per id, so its work is
bounded whatever the depth; a type filter may return a short (even empty) page with a
cursor to go on from. Without ``queue`` the queues are listed one after another.
A cursor holds a position in its index and, in a sorted set, the last id read there
with its score: the next page starts after that id wherever it has moved to (a job
requeued, claimed or cancelled from an earlier page does not make a later one skip a job
that stayed), or, should the id itself have left, after its score. A job that moves
between two pages may be shown twice or not at all, as in any live listing; one that
stays is shown once. In a list (the ready list, the done logs) new jobs come in at the
head: they can only make a job show twice.

``holders`` finds jobs by idempotency key instead: one GET per candidate function of its
``idem:<type>:<key>`` key, whose value starts with the holding job's id;
``conflicting_holder`` says whether a key is held with another payload.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from runner.store import codec, records
from runner.store.keys import QueueKeys

LISTED = ("queued", "scheduled", "processing", "deferred", "done", "dead", "cancelled")
SCAN_MAX = 1000
# The statuses each index may show: an id can outlive its status there (a cancelled job's
# id stays in ready until a claim drops it), and such an id is left out.
SHOWN = {"queued": ("queued",), "scheduled": ("scheduled", "retrying"), "processing": ("processing",),
         "done": ("done",), "dead": ("dead",), "cancelled": ("cancelled",), "deferred": ("deferred",)}
DONE_GENS = 4  # as _lib.lua keeps
MAX_POS = 2**53  # a position past any index (and within what LRANGE and ZRANGE take)


@dataclass(frozen=True, slots=True)
class Page:
    jobs: list[records.Job]
    cursor: str | None  # None: the last page


def encode_cursor(queue_index: int, pos: int, gen: int | None = None,
                  anchor: tuple[float, str] | None = None) -> str:
    raw = codec.dumps([queue_index, pos, gen] + ([anchor[0], anchor[1]] if anchor is not None else []))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


Cursor = tuple[int, int, int | None, tuple[float, str] | None]


def decode_cursor(cursor: str) -> Cursor:
    """(queue index, position, index or done generation, anchor); ValueError for anything
    this module did not make (a forged cursor is the caller's 400, never a failed read)."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        fields = codec.loads(raw)
        qi, pos, gen = fields[:3]
        anchor = fields[3:]
    except Exception as exc:
        raise ValueError("not a cursor of this list") from exc

    def whole(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_POS

    score = anchor[0] if len(anchor) == 2 else None
    if not (whole(qi) and whole(pos) and (gen is None or whole(gen)) and len(anchor) in (0, 2)
            and (not anchor or (isinstance(score, int | float) and not isinstance(score, bool)
                                and abs(score) <= MAX_POS and isinstance(anchor[1], str)
                                and 0 < len(anchor[1]) <= 200))):
        raise ValueError("not a cursor of this list")
    return qi, pos, gen, (float(anchor[0]), anchor[1]) if anchor else None


def _resume(redis: Any, key: str, pos: int, anchor: tuple[float, str] | None, newest_first: bool,
            by_score: bool = False) -> int:
    """Where to go on in a sorted set: after the anchor's rank now, or, once the anchor
    itself left (or ``by_score``: an index whose scores move, as leases renewed), after
    every member that sorts before its score."""
    if anchor is None:
        return pos
    score, member = anchor
    rank = None if by_score else (redis.zrevrank if newest_first else redis.zrank)(key, member)
    if rank is not None:
        return int(rank) + 1
    if newest_first:
        return int(redis.zcount(key, f"({score!r}", "+inf"))
    return int(redis.zcount(key, "-inf", f"({score!r}"))


def _source(redis: Any, k: QueueKeys, status: str, index: int, held_types: Sequence[str]
            ) -> tuple[str, str] | None:
    """The ``index``-th index a status with several reads, as (kind, key): "zset" read
    in score order, or "list"; None past the last."""
    if status == "queued":
        return [("zset", k.prio), ("list", k.ready)][index] if index < 2 else None
    if index < len(held_types):
        return "list", k.held(held_types[index])
    # A limit's waiters: the limwait member of this rank names it (a live set: a limit
    # whose waiters all left since the last page moves the later ones up by one).
    rank = index - len(held_types)
    named = redis.zrange(k.limwait, rank, rank)
    return ("list", k.waiters(named[0])) if named else None


def _chained(redis: Any, k: QueueKeys, status: str, pos: int, n: int, gen: int | None,
             held_types: Sequence[str], anchor: tuple[float, str] | None = None
             ) -> tuple[list[str], int, int | None, bool, tuple[float, str] | None]:
    """Up to n ids from the indexes of ``status`` read one after another (see
    _source); ``gen`` is the index being read."""
    index = gen or 0
    out: list[str] = []
    last: tuple[float, str] | None = None
    while len(out) < n:
        source = _source(redis, k, status, index, held_types)
        if source is None:
            return out, 0, index, True, None
        kind, key = source
        want = n - len(out)
        if kind == "zset":
            pos = _resume(redis, key, pos, anchor, newest_first=False)
            pairs = redis.zrange(key, pos, pos + want - 1, withscores=True)
            got = [m for m, _ in pairs]
            last = (float(pairs[-1][1]), pairs[-1][0]) if pairs else None
        else:
            got = redis.lrange(key, pos, pos + want - 1)
            last = None
        anchor = None
        out += got
        if len(got) < want:  # this index is read to its end: the next one
            index, pos, last = index + 1, 0, None
        else:
            pos += len(got)
    return out, pos, index, False, last


def _ids(redis: Any, k: QueueKeys, status: str, pos: int, n: int, gen: int | None,
         held_types: Sequence[str] = (), anchor: tuple[float, str] | None = None
         ) -> tuple[list[str], int, int | None, bool, dict[str, float], tuple[float, str] | None]:
    """Up to n ids from ``pos`` (or after ``anchor``): (ids, next pos, next gen, exhausted,
    lease deadlines in ms of processing ids, the anchor of the next page)."""
    if status in ("queued", "deferred"):
        ids, pos, gen, exhausted, last = _chained(redis, k, status, pos, n, gen, held_types, anchor)
        return ids, pos, gen, exhausted, {}, last
    if status == "done":
        current = int(redis.hget(k.done_meta, "gen") or 0)
        floor = max(current - DONE_GENS + 1, 0)
        gen = current if gen is None else min(gen, current)
        out: list[str] = []
        while len(out) < n and gen >= floor:
            got = redis.lrange(k.done(gen) + ":log", pos, pos + n - len(out) - 1)
            out += got
            if len(out) < n:  # this generation is read to its end: the next older one
                gen, pos = gen - 1, 0
            else:
                pos += len(got)
        return out, pos, gen, gen < floor, {}, None
    key = {"scheduled": k.scheduled, "dead": k.dead, "cancelled": k.cancelled, "processing": k.leases}[status]
    pos = _resume(redis, key, pos, anchor, newest_first=True, by_score=status == "processing")
    # The score comes with the id for nothing: the anchor's, and a lease's deadline.
    pairs = redis.zrevrange(key, pos, pos + n - 1, withscores=True)
    ids = [i for i, _ in pairs]
    last = (float(pairs[-1][1]), pairs[-1][0]) if pairs else None
    return ids, pos + len(ids), None, len(ids) < n, dict(pairs) if status == "processing" else {}, last


def page(redis: Any, scripts: Any, queues: list[tuple[str, QueueKeys]], status: str, type_: str | None,
         limit: int, cursor: str | None, types_of: Mapping[str, Sequence[str]] | None = None) -> Page:
    """One page; ``types_of`` names each queue's function types (whose held lists a
    paused function fills)."""
    qi, pos, gen, anchor = decode_cursor(cursor) if cursor else (0, 0, None, None)
    jobs: list[records.Job] = []
    budget = SCAN_MAX
    while qi < len(queues) and len(jobs) < limit and budget > 0:
        queue, k = queues[qi]
        # Never more ids than the page has room for, so nothing read is left unshown.
        ids, pos, gen, exhausted, leases, anchor = _ids(redis, k, status, pos, min(budget, limit - len(jobs)),
                                                        gen, (types_of or {}).get(queue, ()), anchor)
        budget -= len(ids)
        batch = scripts.batch()
        for job_id in ids:
            scripts.lookup(k, job_id, pipe=batch)
        for job_id, (rec, state, claim, outcome) in zip(ids, batch.execute(), strict=True):
            rec = rec if isinstance(rec, str) and not rec.startswith("\0") else None
            fields = records.view(job_id, rec, state or [], claim or None, outcome or None)
            if not fields or fields.get("status", "queued") not in SHOWN[status] or (
                    type_ is not None and fields.get("type") != type_):
                continue  # gone or moved on since (a live index), or of another type
            if job_id in leases:
                fields["lease_ms"] = str(int(leases[job_id]))
            jobs.append(records.Job(job_id, queue, fields))
        if exhausted:
            qi, pos, gen, anchor = qi + 1, 0, None, None
    if qi >= len(queues):
        return Page(jobs, None)
    return Page(jobs, encode_cursor(qi, pos, gen, anchor))


def _mark(value: Any) -> tuple[str, str, bool] | None:
    """An idempotency key's value, "<job id> <payload hash>[ done]": (id, hash, done)."""
    if not isinstance(value, str) or not value:
        return None
    parts = value.split(" ")
    return parts[0], parts[1] if len(parts) > 1 else "", len(parts) > 2 and parts[2] == "done"


def holders(redis: Any, candidates: list[tuple[str, QueueKeys]], key: str) -> list[tuple[str, str]]:
    """(type, job id) for each candidate function (type, its queue's keys) whose
    idempotency key ``key`` is held, in one round trip."""
    pipe = redis.pipeline(transaction=False)
    for type_, k in candidates:
        pipe.get(k.idem(type_, key))
    return [(type_, mark[0]) for (type_, _), value in zip(candidates, pipe.execute(), strict=True)
            if (mark := _mark(value)) is not None]


def conflicting_holder(redis: Any, k: QueueKeys, type_: str, key: str, payload_hash: str) -> str | None:
    """The job that holds ``type_``'s idempotency key ``key`` with another payload, as
    the enqueue script would find it (a completed key, or a job that still exists), or
    None: free, stale, or held by this very payload."""
    mark = _mark(redis.get(k.idem(type_, key)))
    if mark is None or mark[1] == payload_hash:
        return None
    return mark[0] if mark[2] or redis.exists(k.job(mark[0])) else None
