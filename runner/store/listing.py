"""Job lists: one page of a queue's jobs in one status, newest first, with an opaque
cursor for the next page. Each status reads its own index (nothing is scanned):

    queued      the priority ZSET (jobs of priority 1-9, in the order they will run), then
                ready LIST (LPUSH in, so index 0 is the newest)
    scheduled   delayed ZSET: the ids of the scheduled set that are delayed, retrying,
                rate-limited or handed back, latest due first (their own index, kept with
                scheduled by every script that puts such a job there or takes it off: a
                page of them never reads past sleeping or waiting jobs)
    sleeping    sleeping ZSET: the durable functions of scheduled in a sleep (ctx.sleep),
                latest due first (their own index, kept with scheduled by the scripts that
                suspend, wake, signal, run now and cancel them: a page of them never reads
                past delayed or waiting jobs)
    waiting     waiting ZSET: the same for those waiting for a signal, an event or a child,
                latest due first (its timeout, or a parent's next look at its child)
    processing  the leases' claim times (leases:since ZSET), latest claim first (each job
                shows its lease deadline; a renewal moves the deadline, not the job)
    dead        dead ZSET, latest death first
    cancelled   cancelled ZSET, latest cancel first
    done        the done generations' logs, newest generation first
    deferred    held back without spending an attempt: each paused function's held LIST,
                then each limit's waiters (the limits with waiters are named by the
                limwait ZSET, read in name order), newest first; a rate-limited job
                waits as scheduled

The three indexes of the scheduled set (delayed, sleeping, waiting) can hold a stale id: a
worker of an earlier release that wakes, signals or cancels a job without knowing an index
leaves the id there. A page skips it, as any id whose job moved on, and takes it off its
index in the same step (lua/prune.lua checks the status again, so a job that came back
meanwhile stays): one more call for a page that met one, at most one per id it read.

A page reads at most SCAN_MAX ids of its index and one lookup per id, so its work is
bounded whatever the depth (a deferred page also reads the names of the limits that have
waiters, one per parked job at most); a type filter may return a short (even empty) page with a
cursor to go on from. Without ``queue`` the queues are listed one after another, and a
partitioned queue's partitions in tag_order, an order of their tags alone: the cursor
names its partition by tag, so processes on two counts of partitions (a rolling change
of ``partitions``) read one cursor alike, and a tag the reader has not learned of yet is
read all the same (an index into the reader's own list named another partition on
another count: an earlier release's such cursor is refused on a partitioned queue).
A cursor holds a position in its index and, in a sorted set, the last id read there
with its score: a position (score, then id) that is unique however many ids share a
score (the leases of one claim share a deadline), and the next page starts after it
wherever that id went since, found and read by one script call (lua/seek.lua: a claim
landing between the two would shift the page), so a job requeued, claimed or cancelled from
an earlier page does not make a later one skip or repeat a job that stayed. A job that moves
between two pages may be shown twice or not at all, as in any live listing; one that
stays is shown once. A done generation's log takes new jobs at its head only and loses
ids only with the whole generation, so its cursor counts from the tail (the ids left to
read, read in the same call as the log's length: lua/seek_list.lua), a place no finish
moves: the next page goes on older than the last job shown however many jobs finish
between two pages (a count from the head showed newer jobs on each next page once more
finished meanwhile than a page held, and never reached the older ones). A cursor
without the anchor (TAIL) that says so is an earlier release's, counted from the head.
The ready list takes new jobs at its head too, but a cancel takes one
from anywhere and moves every older job a place up, so a count of places would step over
one: its cursor keeps the last id shown and the first not yet shown, with that one's
place counted from the tail, and the next page starts just after the last id shown,
found by a bounded LPOS from the tail and read in the same call (lua/seek_list.lua: it
looks as far as the ids were from the tail, plus the jobs put at the tail since, which
ready:tails counts and the cursor keeps as its anchor's score: a resume puts thousands
there at once, past any fixed reach, and the next page found none of the ids); if
that one left, at the first not yet shown; if a cancel took that one out of the list
too, at the id the cancel left in its place (its neighbor toward the tail, kept in the
cancelled job's state as list_next by lua/cancel.lua), followed through the cancels of
those in turn. A bulk cancel of every id the cursor keeps is told apart from workers
claiming past them so: a chain that ends in an id that left otherwise (a worker claims
from the tail, so the jobs past it left first) goes on just after the nearest of the ids
shown before the last that is still queued (the cursor keeps up to SEEK_ANCHORS of them),
and if all of those left, the list is read.
A deferred list is read from its tail, where jobs are parked, while a limit wakes them
from its head, so no count of places holds there: its cursor keeps the last id shown and
the first not yet shown, and the next page starts just before the last id shown, found
by a bounded LPOS and read in the same call (lua/seek_list.lua; woken jobs that went
back to the head since, counted in the list's :heads, widen its reach); if that job left
(cancelled), at the first one not yet shown, or, if a batch cancel took that one out
too, at the id it left in its place (its neighbor toward the head, list_next as above);
if the chain ends in an id that was woken, the list counts as read (a limit wakes from
the head, so the jobs before it were woken first). A traversal always ends, shows every
job that stayed queued or deferred throughout, and shows none twice, as long as each page
comes within the done retention of the cancels it goes past: list_next lives in the
cancelled job's state, which goes with the job (the scheduler's trim at the done
retention; its keys expire an hour later should no scheduler run). A cursor kept longer,
whose ids were all taken by a bulk cancel (the last shown, the first not shown, the
anchors), finds none of them nor the chain and reads the list as done: the traversal still
ends and shows none twice, but the jobs not yet shown are not shown. A chain of more
cancelled ids than one call follows (lua/seek_list.lua's CHAIN) makes an empty page
whose cursor goes on from where it stopped.

On Redis Cluster a page leaves out a partition whose master does not answer, and its
cursor keeps that partition's place (its tag and position, as above) to read once the
others are read (``page``): a traversal through a stalled master still shows every job
that stays in its status once, when the master answers again.

``holders`` finds jobs by idempotency key instead: one GET per candidate function of its
``idem:<type>:<key>`` key, whose value starts with the holding job's id, and one of its
``idem:~ended:<type>:<key>``, the latest job of the key that died or was cancelled (a key
is freed then, so the holder alone would never find a dead letter);
``conflicting_holder`` says whether a key is held with another payload.
"""

from __future__ import annotations

import base64
import contextlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from redis.exceptions import ResponseError

from runner.store import codec, records
from runner.store.connection import UNAVAILABLE
from runner.store.keys import QueueKeys
from runner.store.outage import checked
from runner.store.scripts import SEEK_ANCHORS

LISTED = ("queued", "scheduled", "processing", "deferred", "sleeping", "waiting", "done", "dead", "cancelled")
SCAN_MAX = 1000
# The statuses each index may show: an id can outlive its status there (a cancelled job's
# id stays in ready until a claim drops it), and such an id is left out.
SHOWN = {"queued": ("queued",), "scheduled": ("scheduled", "retrying"), "processing": ("processing",),
         "done": ("done",), "dead": ("dead",), "cancelled": ("cancelled",), "deferred": ("deferred",),
         "sleeping": ("sleeping",), "waiting": ("waiting",)}
# The indexes that mirror a status of the scheduled set: a stale id met there is taken off.
MIRRORS = {"scheduled": "delayed", "sleeping": "sleeping", "waiting": "waiting"}
# A listed job's payload, result, checkpoint or error longer than this many bytes comes
# as a preview of this many (see records.Job.as_dict), cut by Redis itself: a page of 500
# jobs of 1 MiB each is then 2 MB to read and show, not 500 MB to parse on the web process.
PREVIEW_BYTES = 4096
# A page's previews share this budget: a page of more jobs than it holds at PREVIEW_BYTES
# for each of their six fields that can be cut (past 64) gets shorter previews, never
# under MIN_PREVIEW_BYTES. Eight callers reading pages of 500 jobs with three 4 KiB
# previews each (8.5 MB a page) held a one-process web's /healthz for up to 5 s: the
# pages are built off the event loop, but under the GIL.
PAGE_PREVIEW_BYTES = 1536 * 1024
MIN_PREVIEW_BYTES = 256
# What a page's lookups may read whole of state values past their preview, to cut them
# (a big error keeps its type and message): shared by the page's jobs, each getting at
# least READ_MIN and at most READ_MAX. A value past its job's share shows its size
# alone. A durable job's state holds its checkpoint and step log (4 MiB): read whole, a
# page of 50 such jobs held Redis 0.4-2.3 s (lookup.lua).
PAGE_READ_BYTES = 8 * 1024 * 1024
READ_MIN = 16 * 1024
READ_MAX = 256 * 1024
_CUT_FIELDS = 6  # payload, result, checkpoint, error, progress, history (records.SHOWN_AS)
DONE_GENS = 4  # as includes/done.lua keeps
MAX_POS = 2**53  # a position past any index (and within what LRANGE and ZRANGE take)
MAX_EARLIER = SEEK_ANCHORS - 1  # ids shown before the last a cursor keeps (a ready list's)
# A done cursor's anchor: its position counts the ids left to read from the log's tail.
TAIL = (0.0, "tail")


def preview_bytes(limit: int) -> int:
    """How many bytes each cut field of a page of ``limit`` jobs keeps."""
    return max(MIN_PREVIEW_BYTES, min(PREVIEW_BYTES, PAGE_PREVIEW_BYTES // (_CUT_FIELDS * max(limit, 1))))


def read_bytes(limit: int) -> int:
    """How many bytes of state values past the preview each job of a page of ``limit``
    may read whole (lookup.lua's ARGV[3])."""
    return max(READ_MIN, min(READ_MAX, PAGE_READ_BYTES // max(limit, 1)))


@dataclass(frozen=True, slots=True)
class LeftOut:
    """A partition a page could not read (Redis Cluster: its master stalled or down): the
    cursor comes back to it once the others are read."""

    queue: str
    tag: str
    error: BaseException


@dataclass(frozen=True, slots=True)
class Page:
    jobs: list[records.Job]
    cursor: str | None  # None: the last page
    left_out: tuple[LeftOut, ...] = ()


def tag_order(tag: str) -> tuple[int, int, str]:
    """Where a partition comes in its queue's list: the home tag (the queue's own name)
    first, then ``<queue>:<s>`` by ``s``. A function of the tag alone, so every process,
    whatever its count of partitions and whichever of them it knows, reads one order."""
    _, sep, rest = tag.partition(":")
    if not sep:
        return 0, 0, ""
    return (1, int(rest), "") if rest.isascii() and rest.isdigit() and len(rest) <= 9 else (2, 0, rest)


def _place(tag: str, pos: int, gen: int | None, anchor: tuple[float, str] | None,
           marks: tuple[str, ...] | None) -> list[Any]:
    tail: list[Any] = [anchor[0], anchor[1]] if anchor is not None else []
    if marks is not None:  # a list's ids: the first not yet shown, the last shown (and before it)
        tail = [*(tail or [0, ""]), *marks]
    return [tag, pos, gen, *tail]


def encode_cursor(tag: str, pos: int, gen: int | None = None,
                  anchor: tuple[float, str] | None = None, marks: tuple[str, ...] | None = None,
                  later: Sequence[Place] = (), alone: bool = False) -> str:
    """``tag``: the partition being read (its queue's name, or ``<queue>:<s>``), by name:
    an index into the reader's own list of partitions names another partition on a
    process of another count. ``later``: the places of partitions a page left out (their
    master did not answer), read after the others; ``alone``: the partition being read is
    one of those, and no partition after it in the order is left to read."""
    fields = _place(tag, pos, gen, anchor, marks)
    if later or alone:  # (an object, which no place holds: a cursor without one reads as before)
        fields.append({"later": [_place(*p) for p in later], "alone": alone})
    raw = codec.dumps(fields)
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _is_tag(v: Any) -> bool:
    """A partition's tag: a queue's name (letters, digits, - or _, as config.py takes
    them), alone or with ``:<s>`` (keys.partition_tags)."""
    if not isinstance(v, str) or not 1 <= len(v) <= 1000:
        return False
    queue, sep, s = v.partition(":")
    return (queue.replace("_", "").replace("-", "").isalnum()
            and (not sep or (s.isascii() and s.isdigit() and len(s) <= 9)))


# An earlier release's cursor held an index into the list of partitions of the process that
# made it: on a partitioned queue, another count numbers them otherwise.
EARLIER = ("this cursor was made by an earlier release, whose place in a partitioned queue's list "
           "another process may read elsewhere: start the list again (without a cursor)")

Cursor = tuple[str | int, int, int | None, tuple[float, str] | None, tuple[str, ...] | None]
# A partition's place in its index: (tag, position, index or done generation, anchor, marks).
Place = tuple[str, int, int | None, tuple[float, str] | None, tuple[str, ...] | None]
MAX_LATER = 1000  # places a cursor keeps of partitions left out (more than any deployment has)


def decode_cursor(cursor: str) -> Cursor:
    """(partition tag, position, index or done generation, anchor, a deferred list's
    marks); an earlier release's cursor has the index of its partition instead of the tag.
    ValueError for anything this module did not make (a forged cursor is the caller's 400,
    never a failed read)."""
    return _read_cursor(cursor)[0]


def _read_cursor(cursor: str) -> tuple[Cursor, list[Place], bool]:
    """decode_cursor's place, and the places of the partitions left out and ``alone``
    (encode_cursor)."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        fields = codec.loads(raw)
        extra = fields.pop() if isinstance(fields, list) and fields and isinstance(fields[-1], dict) else None
        later, alone = ([], False) if extra is None else (extra["later"], extra["alone"])
        if not (isinstance(later, list) and len(later) <= MAX_LATER and isinstance(alone, bool)
                and all(isinstance(p, list) for p in later)):
            raise ValueError("not a cursor of this list")
    except Exception as exc:
        raise ValueError("not a cursor of this list") from exc
    places = [_decode_place(p) for p in later]
    if any(not isinstance(p[0], str) for p in places):
        raise ValueError("not a cursor of this list")
    return _decode_place(fields), places, alone  # type: ignore[return-value]


def _decode_place(fields: Any) -> Cursor:
    try:
        where, pos, gen = fields[:3]
        anchor = fields[3:5]
        marks = fields[5:]
    except Exception as exc:
        raise ValueError("not a cursor of this list") from exc

    def whole(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_POS

    def name(v: Any, least: int) -> bool:
        return isinstance(v, str) and least <= len(v) <= 1000

    score = anchor[0] if len(anchor) == 2 else None
    if not ((whole(where) or _is_tag(where))
            and whole(pos) and (gen is None or whole(gen)) and len(anchor) in (0, 2)
            and (not marks or (2 <= len(marks) <= 2 + MAX_EARLIER and anchor and all(name(m, 1) for m in marks)))
            and (not anchor or (isinstance(score, int | float) and not isinstance(score, bool)
                                and abs(score) <= MAX_POS and name(anchor[1], 0 if marks else 1)))):
        raise ValueError("not a cursor of this list")
    return (where, pos, gen, (float(anchor[0]), anchor[1]) if anchor else None,
            tuple(marks) if marks else None)


def _in_order(queues: Sequence[tuple[str, QueueKeys]], where: str | int | None
              ) -> tuple[list[tuple[str, QueueKeys]], int]:
    """The partitions to list, each queue's in tag_order, and the index of the cursor's
    (``where``) among them. A partition this process does not know (a tag recorded since
    it last looked) is read all the same: its keys follow from its tag, and skipping it
    would leave its jobs unshown."""
    names = list(dict.fromkeys(q for q, _ in queues))
    order = sorted(queues, key=lambda qk: (names.index(qk[0]), tag_order(qk[1].tag)))
    if where is None:
        return order, 0
    if isinstance(where, int):
        # One partition per queue: the index names a queue, as it did (the queues come in
        # the order they did). More: refused, never read from a partition it did not mean.
        if len(order) != len(names):
            raise ValueError(EARLIER)
        return order, where
    queue = where.partition(":")[0]
    if queue not in names:
        raise ValueError(f"not a cursor of this list (it reads queue {queue!r}): start the list again")
    for i, (q, k) in enumerate(order):
        if q == queue and k.tag == where:
            return order, i
    at = next((i for i, (q, k) in enumerate(order) if q == queue
               and tag_order(k.tag) > tag_order(where)),
              max(i for i, (q, _) in enumerate(order) if q == queue) + 1)
    sibling = next(k for q, k in order if q == queue)
    order.insert(at, (queue, replace(sibling, tag=where, partition=sibling.partitions)))
    return order, at


def _span(scripts: Any, key: str, pos: int, n: int, anchor: tuple[float, str] | None,
          newest_first: bool) -> tuple[list[tuple[str, float]], int]:
    """Up to n (id, score) of a sorted set from ``pos`` or after the anchor's position
    (score, then member: unique however many members share a score, wherever the anchor
    itself went since), found and read in one script call (a claim landing in between
    would shift the page); and the rank after the last one read."""
    start, pairs = scripts.seek(key, pos, n, anchor, newest_first)
    return pairs, start + len(pairs)


def _deferred(scripts: Any, redis: Any, k: QueueKeys, pos: int, n: int, index: int, held_types: Sequence[str],
              anchor: tuple[float, str] | None, marks: tuple[str, ...] | None
              ) -> tuple[list[str], int, int, bool, tuple[float, str] | None, tuple[str, ...] | None]:
    """Up to n deferred ids: each paused function's held list (``index`` names it), then
    each limit's waiters, the limits in the order of their names (the anchor's id names
    the one being read: limwait's scores move with every sweep, its names do not). Each
    list is read newest first, from its tail, and the next page resumes from the ids the
    last one ended on (``marks``; ``pos`` is where they were), not from a count of places:
    jobs are parked at the tail and woken from the head, so a count from either end moves
    while a client pages (lua/seek_list.lua)."""
    out: list[str] = []
    limit = anchor[1] if anchor is not None and anchor[1] and index >= len(held_types) else None
    place = (pos, marks[0], marks[1]) if marks is not None else None  # (a deferred list keeps no more)
    # The anchor's score: how many woken jobs had gone back to the list's head (where the
    # place counts from) when the place was read (seek_list.lua).
    pushed = int(anchor[0]) if marks is not None and anchor is not None else None
    names: list[str] | None = None
    while len(out) < n:
        if index < len(held_types):
            key = k.held(held_types[index])
        else:
            if names is None:
                names = sorted(scripts.on_node(k.limwait, lambda: redis.zrange(k.limwait, 0, -1),
                                               what="a read of the limits' waiters"))
            if limit is None or limit not in names:  # the first, or the one after a limit left
                later = [m for m in names if limit is None or m > limit]
                if not later:
                    return out, 0, index, True, None, None
                limit, place = later[0], None
            key = k.waiters(limit)
        place, got, pushed = scripts.seek_list(k, key, n - len(out), place, pushed=pushed)
        out += got
        if place is None:  # this list is read to its end: the next one
            if index < len(held_types):
                index += 1
            else:
                names = [m for m in names or () if m > (limit or "")]
                if not names:
                    return out, 0, index, True, None, None
                limit = names[0]
    if place is None:
        return out, 0, index, False, (0.0, limit) if limit is not None else None, None
    return out, place[0], index, False, (float(pushed or 0), limit or ""), (place[1], place[2])


def _source(k: QueueKeys, index: int) -> tuple[str, str] | None:
    """The ``index``-th index of the queued list, as (kind, key): "zset" read in score
    order, or "list"; None past the last."""
    return [("zset", k.prio), ("list", k.ready)][index] if index < 2 else None


def _chained(redis: Any, scripts: Any, k: QueueKeys, pos: int, n: int, gen: int | None,
             anchor: tuple[float, str] | None = None, marks: tuple[str, ...] | None = None
             ) -> tuple[list[str], int, int | None, bool, tuple[float, str] | None, tuple[str, ...] | None]:
    """Up to n queued ids from the priority set, then ready (see _source); ``gen`` is
    the index being read. Ready is resumed from the ids the last page ended on
    (``marks``; ``pos`` is where the first not yet shown was, counted from the tail), not
    from a count of places from the head: a cancel takes an id from anywhere, and every
    older job moves one place toward the head (lua/seek_list.lua)."""
    index = gen or 0
    out: list[str] = []
    last: tuple[float, str] | None = None
    place = (pos, *marks) if marks is not None else None
    # A ready cursor's anchor score: how many jobs had been put at the consumer end (where
    # its place counts from) when the place was read (seek_list.lua).
    pushed = int(anchor[0]) if marks is not None and anchor is not None else None
    while len(out) < n:
        source = _source(k, index)
        if source is None:
            return out, 0, index, True, None, None
        kind, key = source
        want = n - len(out)
        if kind == "zset":
            pairs, end = _span(scripts, key, pos, want, anchor, newest_first=False)
            got = [m for m, _ in pairs]
            last = (pairs[-1][1], pairs[-1][0]) if pairs else None
            anchor = None
            out += got
            if len(got) < want:  # this index is read to its end: the next one
                index, pos, last = index + 1, 0, None
            else:
                pos = end
            continue
        place, got, pushed = scripts.seek_list(k, key, want, place, ready=True, pushed=pushed)
        out += got
        if place is None:  # read to its end
            return out, 0, index + 1, True, None, None
        return out, place[0], index, False, (float(pushed), ""), tuple(place[1:])
    return out, pos, index, False, last, None


def _ids(redis: Any, scripts: Any, k: QueueKeys, status: str, pos: int, n: int, gen: int | None,
         held_types: Sequence[str] = (), anchor: tuple[float, str] | None = None,
         marks: tuple[str, ...] | None = None
         ) -> tuple[list[str], int, int | None, bool, dict[str, float], tuple[float, str] | None,
                    tuple[str, ...] | None]:
    """Up to n ids from ``pos`` (or after ``anchor``, or a deferred list's ``marks``): (ids,
    next pos, next gen, exhausted, lease deadlines in ms of processing ids, the anchor and
    the marks of the next page)."""
    if status == "deferred":
        ids, pos, index, exhausted, last, marks = _deferred(scripts, redis, k, pos, n, gen or 0, held_types,
                                                            anchor, marks)
        return ids, pos, index, exhausted, {}, last, marks
    if status == "queued":
        ids, pos, gen, exhausted, last, marks = _chained(redis, scripts, k, pos, n, gen, anchor, marks)
        return ids, pos, gen, exhausted, {}, last, marks
    if status == "done":
        current = int(scripts.on_node(k.done_meta, lambda: redis.hget(k.done_meta, "gen"),
                                      what="a read of the done generation") or 0)
        floor = max(current - DONE_GENS + 1, 0)
        gen = current if gen is None else min(gen, current)
        # pos: how many ids of the generation's log are left to read, counted from its
        # tail (the anchor says so; a cursor without one counted from the head).
        left: int | None = pos if anchor is not None else None
        skip = 0 if anchor is not None else pos
        out: list[str] = []
        while len(out) < n and gen >= floor:
            left, got = scripts.seek_done(k, k.done(gen) + ":log", n - len(out), left, skip)
            out += got
            if not left:  # this generation is read to its end: the next older one
                gen, left, skip = gen - 1, None, 0
        if left is None or gen < floor:  # (a cursor's generation rolled out: older ones went first)
            return out, 0, gen, gen < floor, {}, None, None
        return out, left, gen, False, {}, TAIL, None
    key = {"scheduled": k.delayed, "dead": k.dead, "cancelled": k.cancelled, "processing": k.running,
           "sleeping": k.sleeping, "waiting": k.waiting}[status]
    # The score comes with the id for nothing: the next page's anchor.
    pairs, end = _span(scripts, key, pos, n, anchor, newest_first=True)
    ids = [i for i, _ in pairs]
    last = (pairs[-1][1], pairs[-1][0]) if pairs else None
    leases: dict[str, float] = {}
    if status == "processing" and ids:
        deadlines = scripts.on_node(k.leases, lambda: redis.zmscore(k.leases, ids), what="a read of the leases")
        leases = {i: d for i, d in zip(ids, deadlines, strict=True) if d is not None}
    return ids, end, None, len(ids) < n, leases, last, None


def page(redis: Any, scripts: Any, queues: list[tuple[str, QueueKeys]], status: str, type_: str | None,
         limit: int, cursor: str | None, types_of: Mapping[str, Sequence[str]] | None = None) -> Page:
    """One page; ``types_of`` names each queue's function types (whose held lists a
    paused function fills).

    On Redis Cluster, a partition whose master does not answer (an outage: stalled or
    down; a stalled one is given up past the reader's bound, Transport.waiting) is left
    out: the page goes on with the next, lists it in ``left_out``, and its cursor keeps
    that partition's place, read once the others are (again and again while its master
    stays away), so a traversal still shows every job that stays in its status once. A
    page that could read none of its partitions raises the outage."""
    if cursor:
        (where, pos, gen, anchor, marks), later, alone = _read_cursor(cursor)
        if alone and not isinstance(where, str):
            raise ValueError("not a cursor of this list")
    else:
        (where, pos, gen, anchor, marks), later, alone = (None, 0, None, None, None), [], False
    order, qi = _in_order(queues, where)
    tags = [p[0] for p in later]
    if len(set(tags)) != len(tags) or where in tags or len(tags) > len(order):
        raise ValueError("not a cursor of this list")  # (each partition left out is read once a page)
    # What this page reads, in turn, each from its place: the cursor's partition, every
    # one after it in the order (unless it was left out before: ``alone``), then those
    # left out before. (queue, keys, place, in the order)
    todo: list[tuple[str, QueueKeys, tuple[int, int | None, Any, Any], bool]] = []
    if qi < len(order):
        todo.append((*order[qi], (pos, gen, anchor, marks), not alone))
    if not alone:
        todo += [(q, k, (0, None, None, None), True) for q, k in order[qi + 1:]]
    for tag, was_pos, was_gen, was_anchor, was_marks in later:
        found, at = _in_order(queues, tag)
        todo.append((*found[at], (was_pos, was_gen, was_anchor, was_marks), False))
    jobs: list[records.Job] = []
    left: list[tuple[str, QueueKeys, tuple[int, int | None, Any, Any]]] = []
    errors: list[LeftOut] = []
    read_any = False
    budget = SCAN_MAX
    cut, read = preview_bytes(limit), read_bytes(limit)
    i = 0
    while i < len(todo) and len(jobs) < limit and budget > 0:
        queue, k, (pos, gen, anchor, marks), ordered = todo[i]
        try:
            # Never more ids than the page has room for, so nothing read is left unshown.
            ids, pos, gen, exhausted, leases, anchor, marks = _ids(
                redis, scripts, k, status, pos, min(budget, limit - len(jobs)), gen,
                (types_of or {}).get(queue, ()), anchor, marks)
            batch = scripts.batch()
            for job_id in ids:
                scripts.lookup(k, job_id, pipe=batch, cut=cut, read=read)
            looked = batch.execute()
        except UNAVAILABLE as exc:
            if scripts.one_server:
                raise
            # Its master is away: the next partitions now, this one from the same place later.
            left.append((queue, k, todo[i][2]))
            errors.append(LeftOut(queue, k.tag, exc))
            i += 1
            continue
        read_any = True
        budget -= len(ids)
        stale: list[str] = []
        for job_id, (rec, state, claim, outcome, sizes) in zip(ids, looked, strict=True):
            rec = rec if isinstance(rec, str) and not rec.startswith("\0") else None
            fields = records.view(job_id, rec, state or [], claim or None, outcome or None, sizes or ())
            if not fields or fields.get("status", "queued") not in SHOWN[status]:
                stale.append(job_id)
                continue  # gone or moved on since (a live index)
            if type_ is not None and fields.get("type") != type_:
                continue
            if job_id in leases:
                fields["lease_ms"] = str(int(leases[job_id]))
            jobs.append(records.Job(job_id, queue, fields))
        if stale and status in MIRRORS:
            # Tidying only: a list is a read, and never fails for it (a server refusing
            # writes, a script not loaded on a read replica, a master that stopped
            # answering since); a later page tries again.
            with contextlib.suppress(ResponseError, *UNAVAILABLE):
                scripts.prune(getattr(k, MIRRORS[status]), k, stale, SHOWN[status])
        if exhausted:
            i += 1
        else:
            todo[i] = (queue, k, (pos, gen, anchor, marks), ordered)
    if errors and not read_any:
        raise errors[0].error
    rest = todo[i:]
    places = [(k.tag, *place) for _, k, place, ordered in rest if not ordered] + \
             [(k.tag, *place) for _, k, place in left]
    if rest and rest[0][3]:  # the next is in the order: those after it follow
        _, k, (pos, gen, anchor, marks), _ = rest[0]
        return Page(jobs, encode_cursor(k.tag, pos, gen, anchor, marks, later=places), tuple(errors))
    if not places:
        return Page(jobs, None, tuple(errors))
    (tag, pos, gen, anchor, marks), *others = places
    return Page(jobs, encode_cursor(tag, pos, gen, anchor, marks, later=others, alone=True), tuple(errors))


@dataclass(frozen=True, slots=True)
class DeadPage:
    total: int  # dead jobs in every partition when the page was read
    jobs: list[records.Job]
    cursor: str | None  # None: the last page


def dead_cursor(queue: str, score: float, job_id: str) -> str:
    """A dead-letter page's cursor: the queue and the position (time of death, job id) of
    the last job shown. A position in an order of the jobs alone, not of any partition:
    processes on any count of partitions read it alike."""
    raw = codec.dumps(["dead", queue, _score_mark(score), job_id[:MAX_DEAD_ID]])
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


# A cursor's id holds at most this many characters. Another writer's longer member is
# held by its first MAX_DEAD_ID: the next page goes on after that prefix, skipping only
# members of the same time of death that share it and sort below the one shown.
MAX_DEAD_ID = 1000


def _score_mark(score: float) -> int | float | str:
    """A time of death as the cursor holds it: a whole number of ms as an int, any other
    finite score as a float (another writer's: ns, 1e300), an infinite one as a word."""
    if math.isinf(score):
        return "+inf" if score > 0 else "-inf"
    return int(score) if abs(score) <= MAX_POS and score == int(score) else float(score)


def decode_dead_cursor(cursor: str, queue: str) -> tuple[float, str]:
    """(time of death, job id) of the last job shown; ValueError for anything
    dead_cursor did not make for ``queue`` (the caller's 400)."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        kind, of, score, job_id = codec.loads(raw)
    except Exception as exc:
        raise ValueError("not a cursor of this list") from exc
    if score in ("+inf", "-inf"):
        score = float(score)
    elif isinstance(score, int) and not isinstance(score, bool) and abs(score) <= MAX_POS:
        pass
    elif not (isinstance(score, float) and math.isfinite(score)):
        raise ValueError("not a cursor of this list")
    if not (kind == "dead" and isinstance(of, str) and isinstance(job_id, str) and 1 <= len(job_id) <= MAX_DEAD_ID):
        raise ValueError("not a cursor of this list")
    if of != queue:
        raise ValueError(f"not a cursor of this list (it reads queue {of!r}): start the list again")
    return float(score), job_id


def dead_after(redis: Any, scripts: Any, queue: str, parts: Sequence[QueueKeys], limit: int,
               cursor: str | None) -> DeadPage:
    """A queue's dead letters, newest first over all its partitions, after the cursor's
    position (time of death, then id, as ZREVRANGE orders each partition): each partition's
    next limit + 1 past that position (lua/seek.lua: found and read in one call, wherever
    the last job shown went since), merged. Deaths since land before the position and
    requeues or deletes behind it move nothing, so a job that stays dead is shown once."""
    anchor = decode_dead_cursor(cursor, queue) if cursor else None
    n = min(max(limit, 1), 999)  # (seek.lua reads at most 1000 a call: n + 1)
    pipe = redis.pipeline(transaction=False)
    for part in parts:
        pipe.zcard(part.dead)
    total = sum(int(c) for c in checked(pipe.execute(raise_on_error=False)))
    rows = [(score, job_id, part) for part in parts
            for job_id, score in scripts.seek(part.dead, 0, n + 1, anchor, True)[1]]
    # (ids compare as Redis orders one score's members: by their bytes, which for UTF-8
    # is the order of their code points, as Python compares them)
    rows.sort(key=lambda x: (x[0], x[1]), reverse=True)
    chosen = rows[:n]
    more = len(rows) > n
    jobs = _dead_jobs(scripts, queue, [(job_id, part) for _, job_id, part in chosen], n)
    return DeadPage(total, jobs, dead_cursor(queue, chosen[-1][0], chosen[-1][1]) if more else None)


def _dead_jobs(scripts: Any, queue: str, chosen: Sequence[tuple[str, QueueKeys]], limit: int) -> list[records.Job]:
    batch = scripts.batch()
    cut, read = preview_bytes(limit), read_bytes(limit)
    for job_id, k in chosen:
        scripts.lookup(k, job_id, pipe=batch, cut=cut, read=read)
    jobs = []
    for (job_id, _), (rec, state, _claim, _outcome, sizes) in zip(chosen, batch.execute(), strict=True):
        rec = rec if isinstance(rec, str) and not rec.startswith("\0") else None
        jobs.append(records.Job(job_id, queue, records.view(job_id, rec, state or [], None, None, sizes or ())))
    return jobs


def dead_page(redis: Any, scripts: Any, queue: str, parts: Sequence[QueueKeys], offset: int,
              limit: int) -> DeadPage:
    """A queue's dead letters, newest first over all its partitions, from ``offset``: the
    page, each job's big values cut by Redis to the page's preview_bytes (see page), and a
    cursor that goes on after its last job (dead_after). An offset is not stable while
    jobs die, leave or come back (each death before it moves every later job a place
    on): the earlier releases' way to page, kept for their clients."""
    end = offset + max(limit, 1) - 1
    pipe = redis.pipeline(transaction=False)
    for part in parts:
        pipe.zcard(part.dead)
        pipe.zrevrange(part.dead, 0 if len(parts) > 1 else offset, end, withscores=True)
    got = checked(pipe.execute(raise_on_error=False))
    total = sum(int(n) for n in got[::2])
    # Each partition's newest, merged by time of death, then id, as ZREVRANGE orders each
    # (deaths of one millisecond are common: a settle buries a batch): an order of the
    # jobs alone, so processes that know the partitions in another order (another count)
    # page alike. One partition is already a page.
    merged = sorted(((score, job_id, part) for part, rows in zip(parts, got[1::2], strict=True)
                     for job_id, score in rows), key=lambda x: (x[0], x[1]), reverse=True)
    chosen = merged if len(parts) == 1 else merged[offset:end + 1]
    jobs = _dead_jobs(scripts, queue, [(job_id, k) for _, job_id, k in chosen], limit)
    more = chosen and offset + len(chosen) < total
    return DeadPage(total, jobs, dead_cursor(queue, chosen[-1][0], chosen[-1][1]) if more else None)


def _mark(value: Any) -> tuple[str, str, bool] | None:
    """An idempotency key's value, "<job id> <payload hash>[ done]": (id, hash, done)."""
    if not isinstance(value, str) or not value:
        return None
    parts = value.split(" ")
    return parts[0], parts[1] if len(parts) > 1 else "", len(parts) > 2 and parts[2] == "done"


def holders(redis: Any, candidates: list[tuple[str, QueueKeys]], key: str) -> list[tuple[str, str]]:
    """(type, job id) for each candidate function (type, a partition's keys) whose
    idempotency key ``key`` is held there, then the jobs of it that ended dead or
    cancelled (each id once), in one round trip."""
    pipe = redis.pipeline(transaction=False)
    for type_, k in candidates:
        pipe.get(k.idem(type_, key))
        pipe.get(k.idem_ended(type_, key))
    values = pipe.execute()
    held = [(type_, mark[0]) for (type_, _), value in zip(candidates, values[::2], strict=True)
            if (mark := _mark(value)) is not None]
    ended = [(type_, value) for (type_, _), value in zip(candidates, values[1::2], strict=True)
             if isinstance(value, str) and value]
    out: dict[str, tuple[str, str]] = {}
    for t, i in held + ended:
        out.setdefault(i, (t, i))
    return list(out.values())


def conflicting_holder(redis: Any, k: QueueKeys, type_: str, key: str, payload_hash: str) -> str | None:
    """The job that holds ``type_``'s idempotency key ``key`` with another payload, as
    the enqueue script would find it (a completed key, or a job that still exists), or
    None: free, stale, or held by this very payload."""
    mark = _mark(redis.get(k.idem(type_, key)))
    if mark is None or mark[1] == payload_hash:
        return None
    return mark[0] if mark[2] or redis.exists(k.job(mark[0])) else None
