"""Reading groups (fan-out/fan-in) back: a group's progress and its members' outcomes.

A group lives under its members' queue tag (keys.py): its hash (total, left, done, dead,
cancelled, sealed, the then-job, created_ms, completed_ms), its outcomes hash (member
index -> outcome JSON), its member list (the ids in member order) and its marks (a byte
a member: the outcome counted for it). The scripts write them (group.lua, and the
settling scripts through group_settle in includes/groups.lua); this module only reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from runner.store import codec, records
from runner.store.keys import QueueKeys

PAGE = 1000  # outcomes read per round trip, at most
MEMBERS_PAGE_MAX = 500  # members listed per page (member_page.lua), at most
# A member's mark (includes/groups.lua MARKS) and the outcome it stands for; "" not finished.
MARKS = {"d": "done", "x": "dead", "c": "cancelled", "": "pending"}
OUTCOMES = {v: k or "p" for k, v in MARKS.items()}  # an outcome -> what member_page.lua asks for
PAGE_BYTES = 8 * 1024 * 1024  # bytes of outcomes read per round trip, at most (one outcome past it: alone)


# A group has 1 to this many members (runner/groups.py refuses more): a count past it,
# or a time past records.MAX_TIME_MS, is damage (a hash another producer wrote), shown as
# absent and named in the view's "damaged", never taken as it is (a 400-digit created_ms
# failed every view; total=3000000 read three million outcomes).
MAX_MEMBERS = 100_000
_COUNTS = ("total", "done", "dead", "cancelled")
_TIMES = ("created_ms", "completed_ms")


@dataclass(frozen=True, slots=True)
class GroupState:
    id: str
    queue: str
    fields: Mapping[str, str]

    def _int(self, name: str) -> int:
        """The field within its range (counts to MAX_MEMBERS, times to a date's last):
        0 when absent or damaged."""
        return records.count_of(self.fields.get(name) or 0,
                                records.MAX_TIME_MS if name in _TIMES else MAX_MEMBERS) or 0

    @property
    def damaged(self) -> list[str]:
        """The fields read back out of their range, or unreadable (the then-job's)."""
        out = [name for name in (*_COUNTS, *_TIMES) if self.fields.get(name)
               and records.count_of(self.fields[name], records.MAX_TIME_MS if name in _TIMES else MAX_MEMBERS)
               is None]
        if self._then() is None:
            out.append("then")
        return out

    @property
    def total(self) -> int:
        return self._int("total")

    @property
    def complete(self) -> bool:
        return bool(self.fields.get("completed_ms"))

    def _then(self) -> tuple[str, str, str] | None:
        try:
            raw = codec.loads(self.fields.get("then") or "[]")
        except codec.DecodeError:
            return None
        if not isinstance(raw, list) or len(raw) < 3 or not all(isinstance(x, str) for x in raw[:3]):
            return None
        return raw[0] or self.queue, raw[1], raw[2]

    @property
    def then(self) -> tuple[str, str, str]:
        """The then-job's (queue, id, type); its queue is the group's when written ''.
        ("", "") for the id and type when the field is damaged."""
        return self._then() or (self.queue, "", "")

    def view(self) -> dict[str, Any]:
        """Progress as GET /groups/{id} shows it (the then-job's status is the caller's)."""
        finished = self._int("done") + self._int("dead") + self._int("cancelled")
        created, completed = self._int("created_ms"), self._int("completed_ms")
        view: dict[str, Any] = {
            "id": self.id, "queue": self.queue, "total": self.total, "done": self._int("done"),
            "dead": self._int("dead"), "cancelled": self._int("cancelled"),
            "pending": max(0, self.total - finished), "sealed": self.fields.get("sealed") == "1",
            "complete": self.complete, "created_at": created / 1000 if created else None,
            "completed_at": completed / 1000 if completed else None,
        }
        damaged = self.damaged
        if damaged:
            view["damaged"] = damaged  # (as a job view's: the fields shown as absent)
        return view


def read(redis: Any, keys: Mapping[str, QueueKeys], group_id: str) -> GroupState | None:
    """The group from whichever queue holds it (one round trip), or None."""
    pipe = redis.pipeline(transaction=False)
    for k in keys.values():
        pipe.hgetall(k.group(group_id))
    for queue, fields in zip(keys, _checked(pipe.execute(raise_on_error=False)), strict=True):
        if isinstance(fields, dict) and fields.get("then"):
            return GroupState(group_id, queue, fields)
    return None


@dataclass(frozen=True, slots=True)
class MemberPage:
    members: list[dict[str, Any]]  # {"member": its 1-based index, "id", "status"}, in member order
    next: int  # the member the next page starts at; 0: none is left
    listed: int  # the members the group's list holds (0: a group written before members were listed)


def member_page(scripts: Any, k: QueueKeys, group_id: str, start: int, limit: int,
                outcomes: frozenset[str] = frozenset()) -> MemberPage:
    """The members from member ``start`` on (1-based), at most ``limit`` (MEMBERS_PAGE_MAX),
    each with the outcome the group counted for it (MARKS: pending until then); with
    ``outcomes``, those of these outcomes only (their marks searched in Redis, one call)."""
    wanted = "".join(sorted(OUTCOMES[o] for o in outcomes))
    reply = scripts.member_page(k, group_id, start, min(limit, MEMBERS_PAGE_MAX), wanted)
    rows = [_text(x) for x in reply[2:]]
    members = [{"member": int(rows[i]), "id": rows[i + 1], "status": MARKS.get(rows[i + 2], "pending")}
               for i in range(0, len(rows), 3)]
    return MemberPage(members, int(reply[0]), int(reply[1]))


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def outcome_page(redis: Any, k: QueueKeys, group_id: str, total: int, start: int, max_bytes: int
                 ) -> tuple[list[Any], int]:
    """The outcomes of members ``start``.. (1-based) that fit in ``max_bytes`` (at least
    one), in two round trips (each one's size first, HSTRLEN, O(1)), None for a member
    not finished yet: (them, the next member to read, past ``total`` when none is left).
    A page of 1,000 outcomes of 1 MiB was 1 GB in one reply."""
    key = k.group_outcomes(group_id)
    names = [str(i) for i in range(start, min(start + PAGE, total + 1))]
    pipe = redis.pipeline(transaction=False)
    for name in names:
        pipe.hstrlen(key, name)
    taken, size = 0, 0
    for n in pipe.execute():
        if taken and size + int(n) > max_bytes:
            break
        taken, size = taken + 1, size + int(n)
    raws = redis.hmget(key, names[:taken]) if taken else []
    return [codec.loads(raw) if raw is not None else None for raw in raws], start + taken


def _checked(replies: Any) -> list[Any]:
    """outage.checked, imported when called: the reading commands load no redis-py."""
    from runner.store.outage import checked

    return checked(replies)
