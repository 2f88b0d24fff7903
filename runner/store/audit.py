"""The audit trail: one capped Redis list of who did what to which job, newest first (by
each entry's last action).

Each entry is a JSON object: ``at_ms``, ``by`` (a token's name, or ``cli:<user>``),
``action`` (requeue, delete, purge, cancel, pause, resume, run now, trigger), ``queue``
and, for one job, ``job_id``, plus what the action adds (``edited``, ``count``). An
action on many jobs at once (a bulk requeue or purge) is one entry: its ``count`` and
the first MAX_IDS of its ``ids``, so one bulk action never pushes the earlier ones out.
An action on jobs that touched none (ids that name no job, a purge of an empty list), or
a pause or resume that changed nothing, writes no entry, only its log line: such
requests cost a caller nothing, and each one pushed a real action off the trail once it
was full.

An action that repeats one of the same caller on the same target (the same action,
queue, schedule, function or job type) whose entry is less than FOLD_MS old is folded
into that entry: ``repeats`` (how many actions it stands for), ``last_at_ms``, ``count``
summed and the first MAX_IDS ``ids`` (a job's action becomes its id there); the entry
then stands for the action just made, so it goes to the head (the trail is newest first
by each entry's last action: it kept its place, and the action just made sat below the
actions between, off the first page once enough came between). 10,001
triggers of one schedule from one ``operate`` token pushed that token's own earlier
purge off a trail of 10,000; now they are one entry, and one caller adds at most one
entry an hour per target however fast it acts. With the bound of MAX_ENTRIES, flushing
the trail would take one token hundreds of targets, or months at one action an hour on
each, and every one of those entries in view meanwhile.

An entry is pushed (or folded) and the list trimmed by one script (lua/audit.lua), so
the list never holds more than MAX_ENTRIES, nor an entry whose last action is older than
MAX_AGE_MS once the next one is written, whatever the writers.

Each entry carries its place number ``n`` (audit.lua: one more than the newest numbered
entry's, or the time in ms when that is greater; kept when the entry is rewritten in
place, a new one when it is folded into and goes to the head), falling strictly from head
to tail: a reader's cursor holds the last numbered entry at or above the last one it
showed and the entries shown past it, and lua/seek_trail.lua finds where to go on by a
binary search however many entries landed, moved or left since, among entries of an
earlier release (no number) too (read_after). An entry that keeps its place is shown once;
one folded into while a reader pages goes above its cursor, so it is not shown again, nor
at all when the reader had not reached it (it is on the first page, as the newest). An
offset (read) moves with every entry that lands.

Pauses and resumes go on a list of their own (``<key>:flow``, bounded and folded alike),
read merged with the other by time: they need no job and cost nothing to repeat.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from runner.store import codec, damage, records

# About 10 MB of Redis at ~200 bytes an entry (a folded or bulk entry naming MAX_IDS
# ids is ~4 KB); older entries are dropped (the log keeps them).
MAX_ENTRIES = 50_000
MAX_AGE_MS = 90 * 86_400_000  # a quarter of a year
MAX_IDS = 100  # the ids a bulk action's entry names (its count says how many it had)
FOLD_MS = 3_600_000  # a repeat folds into its entry for an hour after that entry was written
FLOW = frozenset({"pause", "resume"})  # the actions kept on the flow trail


def bulk(ids: Sequence[str]) -> dict[str, Any]:
    """What a bulk action's entry says of its jobs: how many, and the first MAX_IDS."""
    return {"count": len(ids), "ids": list(ids[:MAX_IDS])}


def record(scripts: Any, key: str, entry: Mapping[str, Any]) -> None:
    """Put an action on the trail at the server's time (``entry`` without at_ms); an
    entry with a ``bulk`` id replaces that bulk action's entry (see Bulk); a repeat of
    the caller's action on the same target within FOLD_MS is folded into its entry."""
    bulk = entry.get("bulk")
    trail = flow_key(key) if entry.get("action") in FLOW else key
    with _bounded(scripts):
        scripts.audit(trail, codec.dumps(dict(entry)), MAX_ENTRIES, MAX_AGE_MS,
                      bulk=bulk if isinstance(bulk, str) else "", fold_ms=FOLD_MS, max_ids=MAX_IDS)


def _bounded(scripts: Any) -> Any:
    """On Redis Cluster, the trail's master waited for at most a reader's bound
    (Transport.waiting), then given up and marked stalled as a read's is (NodeStalled, an
    outage: the caller says the action was done and its entry not written), so an action
    on jobs of the masters that answer is not held for a whole stall of the trail's. On
    one server (or a link of its own), the call as it is, bounded by the socket timeout."""
    waiting = getattr(scripts, "waiting", None)
    if waiting is None or getattr(scripts, "one_server", True):
        return contextlib.nullcontext()
    from runner.store.transport import READ_WAIT_S

    return waiting(READ_WAIT_S)


def flow_key(key: str) -> str:
    """The pauses' and resumes' trail beside the trail ``key`` (keys.audit_flow)."""
    return key + ":flow"


class Bulk:
    """A bulk action's one entry, on the trail from the first batch that acted on a job
    ("state": "running", the ``expected`` count asked for) and rewritten in place after
    each later batch (``count`` so far and the first ids) and at its end ("done", or
    "interrupted" by an error): a bulk action killed half-way still shows who started it
    and how far it got. One that acted on no job never reaches the trail. ``put(fields,
    trail)`` writes the entry (the caller's trail and log): ``trail`` False at the end of
    an action that acted on none, for the log alone."""

    def __init__(self, put: Any, expected: int) -> None:
        self.put = put
        self.id = os.urandom(8).hex()
        self.expected = expected
        self.written = False

    def progress(self, done: Sequence[str]) -> None:
        if done:
            self._put("running", done, True)

    def end(self, done: Sequence[str], ok: bool) -> None:
        self._put("done" if ok else "interrupted", done, bool(done) or self.written)

    def _put(self, state: str, done: Sequence[str], trail: bool) -> None:
        self.put({"bulk": self.id, "state": state, "expected": self.expected, **bulk(done)}, trail)
        self.written = self.written or trail


# Where a reader stopped on one trail: the place number of the last numbered entry at or
# above the last one shown (audit.lua numbers each) and how many entries past it were
# shown; (0, how many entries were left past it) on a trail with no numbered entry.
Place = tuple[int, int]
# (ASCII digits, no leading zero, at most 16 of them, as lua/includes/places.lua reads
# them: Lua's %d reads no other digits; any other spelling is another writer's, none)
_PLACE = re.compile(r'[{,]"n":([1-9][0-9]{0,15})[,}]')
MAX_PLACE = 2**53
# The largest place number audit.lua writes or seek_trail.lua reads; another writer's past
# it is no number (near 2**53 Lua's doubles make n + 1 == n).
PLACE_BOUND = 2**50


@dataclass(frozen=True, slots=True)
class Page:
    total: int  # entries held on both trails when the page was read
    entries: list[dict[str, Any]]
    cursor: str | None  # None: the last page
    damaged: list[damage.Damaged] = field(default_factory=list)  # trails of another Redis type, read as empty


def _mends(trail: str, key: str) -> str:
    """Which write sets a damaged trail aside (damage.py): audit.lua, with the next entry."""
    return "The next pause or resume" if trail != key else "The next operator action on the trail"


def read(redis: Any, key: str, offset: int, limit: int, damaged: list[damage.Damaged] | None = None
         ) -> tuple[int, list[dict[str, Any]]]:
    """(entries held on both trails, one page newest first, the two merged by time) from
    ``offset``: not stable while actions land (each moves every later entry a place on);
    read_after's cursor is. An entry that is not JSON is shown as such (as the oldest); a
    trail of another Redis type reads as empty, named in ``damaged``."""
    want = offset + max(limit, 1)
    pipe = redis.pipeline(transaction=False)
    trails = (key, flow_key(key))
    for trail in trails:
        pipe.llen(trail)
        pipe.lrange(trail, 0, want - 1)
    got = pipe.execute(raise_on_error=False)
    total, raws = 0, []
    for t, trail in enumerate(trails):
        length, raw = got[2 * t], got[2 * t + 1]
        if isinstance(length, Exception) or isinstance(raw, Exception):
            _damaged(redis, trail, key, length if isinstance(length, Exception) else raw, damaged)
            length, raw = 0, []
        total += int(length)
        raws.append([str(e) for e in raw])
    merged = _merged(raws, want)
    return total, [e for _, e in merged[offset:]]


def read_after(scripts: Any, key: str, limit: int, cursor: str | None) -> Page:
    """One page newest first, both trails merged by time, after the cursor's places (one
    per trail, found by lua/seek_trail.lua wherever the entries went since): actions that
    land, fold into an entry or trim the oldest move no place, so an entry that stays on
    the trail is shown once. A trail of another Redis type reads as empty, named in the
    page's ``damaged``. ValueError for a cursor this function did not make."""
    places = decode_cursor(cursor) if cursor else (None, None)
    n = min(max(limit, 1), 999)  # (seek_trail.lua reads at most 1000 a call: n + 1)
    damaged: list[damage.Damaged] = []
    read = [_seek(scripts, trail, key, place, n + 1, damaged)
            for trail, place in zip((key, flow_key(key)), places, strict=True)]
    merged = _merged([raw for _, _, _, raw in read], n + 1)
    shown = merged[:n]
    total = sum(length for length, _, _, _ in read)
    if len(merged) <= n:
        return Page(total, [e for _, e in shown], None, damaged)
    after = [_after(place, start, length, head, raw, sum(1 for trail, _ in shown if trail == t))
             for t, ((length, start, head, raw), place) in enumerate(zip(read, places, strict=True))]
    return Page(total, [e for _, e in shown], encode_cursor(after[0], after[1]), damaged)


def _seek(scripts: Any, trail: str, key: str, place: Place | None, n: int,
          damaged: list[damage.Damaged]) -> tuple[int, int, tuple[int, int], list[str]]:
    """seek_trail's page of one trail; an empty trail for one of another Redis type."""
    try:
        return scripts.seek_trail(trail, place, n)  # type: ignore[no-any-return]
    except Exception as exc:
        _damaged(scripts.client, trail, key, exc, damaged)
        return 0, 0, (0, -1), []


def _damaged(redis: Any, trail: str, key: str, exc: Exception, damaged: list[damage.Damaged] | None) -> None:
    """A trail's read that failed: named in ``damaged`` when it is of another type, else raised."""
    if not damage.wrong_type(exc):
        raise exc
    if damaged is not None:
        damaged.append(damage.found(redis, trail, "list", _mends(trail, key)))


def _after(place: Place | None, start: int, length: int, head: Place, raw: Sequence[str], took: int) -> Place:
    """Where a trail's next page starts, ``took`` of its entries ``raw`` (read from index
    ``start``) shown on this one: anchored at the last numbered entry shown, else at the
    place's own anchor, else at the trail's newest numbered entry ``head`` (number,
    index) if it lies above; a count from the tail only on a trail with none."""
    if not took:
        if place is not None:  # none of this trail on the page: where it was
            return place
        if head[0] and raw:  # from the first page: just before its newest entry
            return head[0] + 1, 0
        return 0, length - start
    last = start + took - 1
    numbered = [j for j in range(took) if _place(raw[j])]
    if place is not None and place[0] > 0:
        mine = (place[0], place[1] + took)
        # The numbers fall as the pages go on; one that does not (another writer's) is no
        # anchor: the old one holds, so the place only moves on and the walk ends.
        if not numbered or _place(raw[numbered[-1]]) >= place[0]:
            return mine
    if numbered:
        return _place(raw[numbered[-1]]), took - 1 - numbered[-1]
    if head[0] and 0 <= head[1] <= last:
        return head[0], last - head[1]
    return 0, length - (start + took)


def _merged(trails: Sequence[Sequence[str]], most: int) -> list[tuple[int, dict[str, Any]]]:
    """Up to ``most`` (trail, entry) of the trails, each in its own order (newest first),
    merged by the time of each entry's last action (the newer first; the main trail's
    first at a tie)."""
    entries = [[_entry(raw) for raw in trail] for trail in trails]
    at = [0] * len(entries)
    out: list[tuple[int, dict[str, Any]]] = []
    while len(out) < most:
        heads = [t for t in range(len(entries)) if at[t] < len(entries[t])]
        if not heads:
            break
        t = max(heads, key=lambda t: (_at(entries[t][at[t]]), -t))
        out.append((t, entries[t][at[t]]))
        at[t] += 1
    return out


def _place(raw: str) -> int:
    """An entry's place number as seek_trail.lua reads it: 0 for none or one out of range."""
    m = _PLACE.search(raw)
    n = int(m.group(1)) if m else 0
    return n if 1 <= n <= PLACE_BOUND else 0


def encode_cursor(main: Place, flow: Place) -> str:
    raw = codec.dumps(["audit", list(main), list(flow)])
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[Place, Place]:
    """The places on the main trail and on the flow trail; ValueError for anything
    encode_cursor did not make (the caller's 400)."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        kind, main, flow = codec.loads(raw)
    except Exception as exc:
        raise ValueError("not a cursor of this list") from exc

    def whole(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_PLACE

    places = (main, flow)
    if kind != "audit" or not all(isinstance(p, list) and len(p) == 2 and all(map(whole, p)) for p in places):
        raise ValueError("not a cursor of this list")
    return (main[0], main[1]), (flow[0], flow[1])


def _entry(item: Any) -> dict[str, Any]:
    try:
        entry = codec.loads(item)
    except codec.DecodeError:
        entry = None
    if not isinstance(entry, dict):
        return {"unparsable": str(item)[:200]}
    entry.pop("n", None)  # its place on the trail: the cursor's, not the reader's
    # Another writer's time past the last date (or not a number): shown as absent. A
    # folded entry's last_at_ms is held to the same range.
    bad = [f for f in ("at_ms", "last_at_ms") if f in entry and not _in_range(entry[f])]
    if bad:
        entry = {**entry, **dict.fromkeys(bad), "damaged": bad}
    return entry


def _in_range(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 < v <= records.MAX_TIME_MS


def _at(entry: dict[str, Any]) -> int:
    """When an entry's last action was (a folded entry's last_at_ms, else its at_ms): the
    order of each trail, by which the two are merged."""
    for field_ in ("last_at_ms", "at_ms"):
        at = entry.get(field_)
        if isinstance(at, int) and not isinstance(at, bool):
            return at
    return 0
