"""Which masters of a Redis Cluster answer now, for the commands an operator runs while
one shard is down (docs/partitions.md, "A shard down"): they show what the live masters
hold and name the one that is down, rather than take all of Redis for unreachable."""

from __future__ import annotations

import time
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


def on_cluster(redis: Any) -> bool:
    """Whether ``redis`` is a Redis Cluster client: its partitions on several masters,
    each read on its own within a reader's bound (Transport.each_master). Not a reading
    command's own link, one server or Sentinel."""
    return getattr(redis, "get_node_from_key", None) is not None


def node_of(redis: Any, key: str) -> str:
    """The master (host:port) of ``key``'s slot on Redis Cluster ('' elsewhere, or when the
    client has no layout now: the read itself then says why)."""
    try:
        return str(redis.get_node_from_key(key).name)
    except Exception:
        return ""


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
    answers = _pings([node for name, (node, _) in by_node.items() if name not in stalled])
    for name, (node, parts) in by_node.items():
        if name in stalled:
            out.append(Down(name, tuple(parts), f"Redis node {name} took the connection and did not answer "
                                                "(stopped or hung)"))
            continue
        said = answers.get(name)
        if said is not None:
            out.append(Down(name, tuple(parts), said))
            continue
        live = live or node
    if live is None:
        return []
    if out:
        redis.set_default_node(live)
    return out


def by_master(redis: Any, parts: Sequence[QueueKeys], error: str) -> list[Down]:
    """``parts``, left out of a read as their masters did not answer it (``error`` says
    how), as the masters that hold them, for a command to name as ``down`` names them."""
    held: dict[str, list[QueueKeys]] = {}
    for k in parts:
        held.setdefault(node_of(redis, k.ready) or "?", []).append(k)
    return [Down(node, tuple(ks), error) for node, ks in held.items()]


def _pings(nodes: Sequence[Any]) -> dict[str, str | None]:
    """Each node's PING, all at once, each waited for at most the probe's PROBE_S (a master
    that stalled since the client was built takes the PING and says nothing: it would
    hold the command for the 15 s socket timeout): by name, None for an answer, else
    why not."""
    import threading

    from runner.store.connection import PROBE_S, UNAVAILABLE

    said: dict[str, str | None] = {}
    raised: list[BaseException] = []

    def ping(node: Any) -> None:
        try:
            node.redis_connection.ping()
            said[node.name] = None
        except UNAVAILABLE as exc:
            said[node.name] = str(exc)
        except Exception as exc:  # not an outage (a refused password): the caller's, as before
            raised.append(exc)

    threads = [threading.Thread(target=ping, args=(n,), name="runner-ping", daemon=True) for n in nodes]
    for t in threads:
        t.start()
    deadline = time.monotonic() + PROBE_S
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    if raised:
        raise raised[0]
    late = f"did not answer a PING within {PROBE_S:g} s (stopped or hung)"
    return {n.name: said.get(n.name, f"Redis node {n.name} {late}") for n in nodes}


def without(parts: dict[str, list[QueueKeys]], gone: Sequence[Down]) -> None:
    """Leave the partitions of the masters ``gone`` out of ``parts`` (a runtime's, in
    place): a reading command then reads the live ones only."""
    dead = {(k.queue, k.tag) for d in gone for k in d.parts}
    for ks in parts.values():
        ks[:] = [k for k in ks if (k.queue, k.tag) not in dead]
