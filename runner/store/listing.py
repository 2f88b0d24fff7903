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
Offsets are positions in a live index: a job that moves between two pages may be shown
twice or not at all, as in any live listing.

``holders`` finds jobs by idempotency key instead: one GET per candidate function of its
``idem:<type>:<key>`` key, whose value starts with the holding job's id.
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


@dataclass(frozen=True, slots=True)
class Page:
    jobs: list[records.Job]
    cursor: str | None  # None: the last page


def encode_cursor(queue_index: int, pos: int, gen: int | None = None) -> str:
    raw = codec.dumps([queue_index, pos, gen])
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[int, int, int | None]:
    """(queue index, position, done generation); ValueError for anything else."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        qi, pos, gen = codec.loads(raw)
    except Exception as exc:
        raise ValueError("not a cursor of this list") from exc
    if not (isinstance(qi, int) and isinstance(pos, int) and qi >= 0 and pos >= 0
            and (gen is None or isinstance(gen, int))):
        raise ValueError("not a cursor of this list")
    return qi, pos, gen


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
             held_types: Sequence[str]) -> tuple[list[str], int, int | None, bool]:
    """Up to n ids from the indexes of ``status`` read one after another (see
    _source); ``gen`` is the index being read."""
    index = gen or 0
    out: list[str] = []
    while len(out) < n:
        source = _source(redis, k, status, index, held_types)
        if source is None:
            return out, 0, index, True
        kind, key = source
        want = n - len(out)
        read = redis.lrange if kind == "list" else redis.zrange
        got = read(key, pos, pos + want - 1)
        out += got
        if len(got) < want:  # this index is read to its end: the next one
            index, pos = index + 1, 0
        else:
            pos += len(got)
    return out, pos, index, False


def _ids(redis: Any, k: QueueKeys, status: str, pos: int, n: int, gen: int | None,
         held_types: Sequence[str] = ()) -> tuple[list[str], int, int | None, bool, dict[str, float]]:
    """Up to n ids from ``pos``: (ids, next pos, next gen, exhausted, lease deadlines in
    ms of processing ids)."""
    if status in ("queued", "deferred"):
        ids, pos, gen, exhausted = _chained(redis, k, status, pos, n, gen, held_types)
        return ids, pos, gen, exhausted, {}
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
        return out, pos, gen, gen < floor, {}
    if status == "processing":
        # The lease deadline is the score: read with the id, it costs nothing more.
        pairs = redis.zrevrange(k.leases, pos, pos + n - 1, withscores=True)
        ids = [i for i, _ in pairs]
        return ids, pos + len(ids), None, len(ids) < n, dict(pairs)
    key = {"scheduled": k.scheduled, "dead": k.dead, "cancelled": k.cancelled}[status]
    ids = redis.zrevrange(key, pos, pos + n - 1)
    return ids, pos + len(ids), None, len(ids) < n, {}


def page(redis: Any, scripts: Any, queues: list[tuple[str, QueueKeys]], status: str, type_: str | None,
         limit: int, cursor: str | None, types_of: Mapping[str, Sequence[str]] | None = None) -> Page:
    """One page; ``types_of`` names each queue's function types (whose held lists a
    paused function fills)."""
    qi, pos, gen = decode_cursor(cursor) if cursor else (0, 0, None)
    jobs: list[records.Job] = []
    budget = SCAN_MAX
    while qi < len(queues) and len(jobs) < limit and budget > 0:
        queue, k = queues[qi]
        # Never more ids than the page has room for, so nothing read is left unshown.
        ids, pos, gen, exhausted, leases = _ids(redis, k, status, pos, min(budget, limit - len(jobs)), gen,
                                                (types_of or {}).get(queue, ()))
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
            qi, pos, gen = qi + 1, 0, None
    if qi >= len(queues):
        return Page(jobs, None)
    return Page(jobs, encode_cursor(qi, pos, gen))


def holders(redis: Any, candidates: list[tuple[str, QueueKeys]], key: str) -> list[tuple[str, str]]:
    """(type, job id) for each candidate function (type, its queue's keys) whose
    idempotency key ``key`` is held, in one round trip."""
    pipe = redis.pipeline(transaction=False)
    for type_, k in candidates:
        pipe.get(k.idem(type_, key))
    out = []
    for (type_, _), value in zip(candidates, pipe.execute(), strict=True):
        if isinstance(value, str) and value:
            out.append((type_, value.split(" ", 1)[0]))  # "<job id> <payload hash> [done]"
    return out
