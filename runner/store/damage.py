"""Keys that hold another Redis type than runner keeps there (another program wrote them,
or they were damaged): how a reader tells one, and what it says of it.

A queue's own sets are set aside by the scheduler's reclaim (lua/reclaim.lua). The keys a
view reads beside them are set aside by their next writer, each renamed to
``<key>:corrupt`` (kept for inspection) before it writes: a job's log and stream
(lua/joblog.lua), a partition's recent events (lua/emit.lua), the audit trails
(lua/audit.lua) and the workers' roster (roster.py, through lua/aside.lua). Until then a
reader never fails on one: it reads what it can, and hands back a Damaged that names the
key, what it holds and what to do (every view shows it as ``damaged_keys``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Damaged:
    """A key a reader found of another type: ``holds`` the type it found, ``wanted`` the one
    runner keeps there, ``mends`` which write sets it aside on its own."""

    key: str
    holds: str
    wanted: str
    mends: str

    @property
    def detail(self) -> str:
        if self.holds in (self.wanted, "none"):  # (set aside between the read and its TYPE)
            return f"{self.key} held another Redis type when it was read and has been set aside since: read again."
        return (f"{self.key} holds a {self.holds}, not the {self.wanted} runner keeps there (another program "
                f"wrote it, or it was damaged), so what it held cannot be shown. {self.mends} renames it to "
                f"{self.key}:corrupt and goes on; to clear it now, look at it (TYPE, DUMP) and delete it "
                f"(DEL {self.key}).")

    def view(self) -> dict[str, str]:
        """As every view shows it (a list of these: ``damaged_keys``)."""
        return {"key": self.key, "type": self.holds, "detail": self.detail}


def wrong_type(exc: BaseException) -> bool:
    """Whether an error reply is Redis's WRONGTYPE (a command's, or inside a script's
    error): a key of another type, not an outage or a refusal."""
    return "WRONGTYPE" in str(exc)


def found(redis: Any, key: str, wanted: str, mends: str) -> Damaged:
    """A key that answered WRONGTYPE, named with the type it holds now (one TYPE)."""
    holds = redis.execute_command("TYPE", key)
    return Damaged(key, holds.decode() if isinstance(holds, bytes) else str(holds), wanted, mends)


def views(damaged: list[Damaged]) -> dict[str, Any]:
    """``{"damaged_keys": [...]}`` for a view's answer, {} with none (each key once)."""
    if not damaged:
        return {}
    seen: dict[str, Damaged] = {}
    for d in damaged:
        seen.setdefault(d.key, d)
    return {"damaged_keys": [d.view() for d in seen.values()]}
