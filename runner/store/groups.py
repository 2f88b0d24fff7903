"""Reading groups (fan-out/fan-in) back: a group's progress and its members' outcomes.

A group lives under its members' queue tag (keys.py): its hash (total, left, done, dead,
cancelled, sealed, the then-job, created_ms, completed_ms) and its outcomes hash (member
index -> outcome JSON). The scripts write both (group.lua, and the settling scripts
through group_settle in includes/groups.lua); this module only reads.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from runner.store import codec
from runner.store.keys import QueueKeys

PAGE = 1000  # outcomes read per round trip


@dataclass(frozen=True, slots=True)
class GroupState:
    id: str
    queue: str
    fields: Mapping[str, str]

    def _int(self, name: str) -> int:
        try:
            return int(self.fields.get(name) or 0)
        except ValueError:
            return 0

    @property
    def total(self) -> int:
        return self._int("total")

    @property
    def complete(self) -> bool:
        return bool(self.fields.get("completed_ms"))

    @property
    def then(self) -> tuple[str, str, str]:
        """The then-job's (queue, id, type); its queue is the group's when written ''."""
        raw = codec.loads(self.fields.get("then") or "[]")
        if not isinstance(raw, list) or len(raw) < 3:
            return self.queue, "", ""
        return str(raw[0] or self.queue), str(raw[1]), str(raw[2])

    def view(self) -> dict[str, Any]:
        """Progress as GET /groups/{id} shows it (the then-job's status is the caller's)."""
        finished = self._int("done") + self._int("dead") + self._int("cancelled")
        created, completed = self._int("created_ms"), self._int("completed_ms")
        return {
            "id": self.id, "queue": self.queue, "total": self.total, "done": self._int("done"),
            "dead": self._int("dead"), "cancelled": self._int("cancelled"),
            "pending": max(0, self.total - finished), "sealed": self.fields.get("sealed") == "1",
            "complete": self.complete, "created_at": created / 1000 if created else None,
            "completed_at": completed / 1000 if completed else None,
        }


def read(redis: Any, keys: Mapping[str, QueueKeys], group_id: str) -> GroupState | None:
    """The group from whichever queue holds it (one round trip), or None."""
    pipe = redis.pipeline(transaction=False)
    for k in keys.values():
        pipe.hgetall(k.group(group_id))
    for queue, fields in zip(keys, _checked(pipe.execute(raise_on_error=False)), strict=True):
        if isinstance(fields, dict) and fields.get("then"):
            return GroupState(group_id, queue, fields)
    return None


def outcomes(redis: Any, k: QueueKeys, group_id: str, total: int) -> Iterator[Any]:
    """The members' outcomes in member order, a page per round trip; None for a member not
    finished yet."""
    key = k.group_outcomes(group_id)
    for start in range(1, total + 1, PAGE):
        for raw in redis.hmget(key, [str(i) for i in range(start, min(start + PAGE, total + 1))]):
            yield codec.loads(raw) if raw is not None else None


def _checked(replies: Any) -> list[Any]:
    """outage.checked, imported when called: the reading commands load no redis-py."""
    from runner.store.outage import checked

    return checked(replies)
