"""The roster: which worker processes are alive, what they serve and which function
versions they know, kept in one hash per app (``<prefix>:workers``).

Each worker's scheduler writes its entry every HEARTBEAT_S, stamped with the server's
clock, and drops entries not refreshed for STALE_S (a worker that died). `runner check`
reads it to catch the rolling-deploy direction the deploy gate cannot see in the queues:
new code on disk (accepted by new web processes) that live workers do not know yet.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from runner.store import codec

HEARTBEAT_S = 10.0
STALE_S = 60.0


def key(prefix: str) -> str:
    return f"{prefix}:workers"


def server_ms(redis: Any) -> int:
    sec, usec = redis.time()
    return int(sec) * 1000 + int(usec) // 1000


@dataclass(frozen=True, slots=True)
class Member:
    id: str
    host: str
    pid: int
    queues: tuple[str, ...]
    functions: Mapping[str, int]  # type -> newest payload version it knows
    started_ms: int
    seen_ms: int

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "host": self.host, "pid": self.pid, "queues": list(self.queues),
                "functions": dict(self.functions), "started_ms": self.started_ms, "seen_ms": self.seen_ms}


def beat(redis: Any, prefix: str, member: Member) -> None:
    """Write this worker's entry (stamped now, server time) and drop stale ones."""
    now = server_ms(redis)
    entry = {**member.as_dict(), "seen_ms": now}
    redis.hset(key(prefix), member.id, codec.dumps(entry))
    stale = [m.id for m in read(redis, prefix, now, include_stale=True) if now - m.seen_ms > STALE_S * 1000]
    if stale:
        redis.hdel(key(prefix), *stale)


def leave(redis: Any, prefix: str, member_id: str) -> None:
    redis.hdel(key(prefix), member_id)


def read(redis: Any, prefix: str, now_ms: int | None = None, include_stale: bool = False) -> list[Member]:
    """The live workers (seen within STALE_S); a malformed entry is skipped."""
    now = server_ms(redis) if now_ms is None else now_ms
    out = []
    for raw in redis.hvals(key(prefix)):
        try:
            d = codec.loads(raw)
            m = Member(id=str(d["id"]), host=str(d["host"]), pid=int(d["pid"]), queues=tuple(d["queues"]),
                       functions={str(k): int(v) for k, v in d["functions"].items()},
                       started_ms=int(d["started_ms"]), seen_ms=int(d["seen_ms"]))
        except (codec.DecodeError, KeyError, TypeError, ValueError, AttributeError):
            continue
        if include_stale or now - m.seen_ms <= STALE_S * 1000:
            out.append(m)
    return out
