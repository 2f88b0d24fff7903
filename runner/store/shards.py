"""Which masters of a Redis Cluster answer now, for the commands an operator runs while
one shard is down (docs/partitions.md, "A shard down"): they show what the live masters
hold and name the one that is down, rather than take all of Redis for unreachable."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from runner.store.keys import QueueKeys


@dataclass(frozen=True, slots=True)
class Down:
    """A master that did not answer, and the partitions whose slots it holds."""

    node: str  # host:port
    parts: tuple[QueueKeys, ...]
    error: str

    def line(self) -> str:
        """``127.0.0.1:7000 (queue fast: {fast}, {fast:3}; queue slow: {slow})``."""
        by_queue: dict[str, list[str]] = {}
        for k in self.parts:
            by_queue.setdefault(k.queue, []).append("{" + k.tag + "}")
        held = "; ".join(f"queue {q}: {', '.join(tags)}" for q, tags in by_queue.items())
        return f"{self.node} ({held})"


def down(redis: Any, every: Sequence[QueueKeys]) -> list[Down]:
    """The masters holding partitions of ``every`` that do not answer a PING, when others
    do (each asked on its own connection); [] on a single server or Sentinel, or when no
    master answers (an outage of all of Redis, which the caller reports as such). A live
    master becomes the client's default node, so the commands sent to no key in
    particular (TIME, INFO) reach one."""
    nodes = getattr(redis, "get_node_from_key", None)
    if nodes is None:
        return []
    from runner.store.connection import UNAVAILABLE

    by_node: dict[str, tuple[Any, list[QueueKeys]]] = {}
    try:
        for k in every:
            node = redis.get_node_from_key(k.ready)
            by_node.setdefault(node.name, (node, []))[1].append(k)
    except UNAVAILABLE:  # no layout at all: all of Redis is away
        return []
    out: list[Down] = []
    live = None
    stalled: set[str] = getattr(redis, "runner_stalled", set())  # (connection.py's probe, as the client was built)
    for name, (node, parts) in by_node.items():
        if name in stalled:
            out.append(Down(name, tuple(parts), f"Redis node {name} took the connection and did not answer "
                                                "(stopped or hung)"))
            continue
        try:
            node.redis_connection.ping()
        except UNAVAILABLE as exc:
            out.append(Down(name, tuple(parts), str(exc)))
            continue
        live = live or node
    if live is None:
        return []
    if out:
        redis.set_default_node(live)
    return out


def without(parts: dict[str, list[QueueKeys]], gone: Sequence[Down]) -> None:
    """Leave the partitions of the masters ``gone`` out of ``parts`` (a runtime's, in
    place): a reading command then reads the live ones only."""
    dead = {(k.queue, k.tag) for d in gone for k in d.parts}
    for ks in parts.values():
        ks[:] = [k for k in ks if (k.queue, k.tag) not in dead]
