"""Telling an event's waiters (ctx.wait_for_event, docs/events.md): the jobs that began to
wait for its name, with a match its data satisfies, before it was emitted.

What is atomic with what. The emit writes the event and an entry on its home partition's
``wakes`` list in one step (lua/emit.lua). A waiter is put on its name's registry (another
slot: store/listeners.py) before its run suspends, so every emit after the wait began
finds it. Telling one waiter is one step in its job's slot: the event is kept for the
wait at its position and a waiting job is woken (lua/signal.lua, as a signal; refused
once that wait is over); then the told waiters leave the registry, and once all were
told the entry leaves ``wakes``. Each step may be repeated: a job keeps the first event
its wait got, so a crash anywhere between them tells nobody twice and loses nobody.

The emitter tells up to INLINE waiters itself, at once; the relay (worker/relay.py) tells
the rest, and those of an emitter that died, a bounded batch per call.
"""

from __future__ import annotations

import contextlib
import logging
from functools import partial
from typing import TYPE_CHECKING, Any

from runner.errors import JobNotFound, RedisUnavailable
from runner.store import codec, listeners
from runner.store.connection import UNAVAILABLE
from runner.store.keys import EventKeys, QueueKeys

if TYPE_CHECKING:
    from runner.client import Client

log = logging.getLogger("runner.events")

# The waiters an emitter tells itself before answering; the relay tells the rest.
INLINE = 200
# A waiter's server not answering (one shard of a Redis Cluster away): told later.
AWAY: tuple[type[BaseException], ...] = (*UNAVAILABLE, RedisUnavailable)
# What a delivery answers (signal.lua): kept for the wait, or kept and the job woken.
TOLD = (1, 2)


def signal_of(position: int) -> str:
    """The signal an event's delivery sends the wait at ``position`` (runner's own name)."""
    return f"event.{position}"


def tell_all(client: Client, raw: str, budget: int) -> bool:
    """Tell the waiters of one ``wakes`` entry, at most ``budget`` of them; True once none
    is left (the entry may leave its list)."""
    try:
        event = codec.loads(raw)
        name, event_id, ts = str(event["name"]), str(event["id"]), int(event["ts"])
    except (codec.DecodeError, KeyError, TypeError, ValueError):
        log.error("events: dropping a malformed wake entry %.80r", raw)
        return True
    rt = client.runtime
    ek = EventKeys(rt.config.redis.prefix, name)
    data = event.get("data")
    away = 0  # waiters whose job's server did not answer: told by a later pass
    # The registry's reads given up on a stalled master in a worker's node wait, as its
    # script calls are (Transport.on_node): the entry waits for a later pass.
    on = rt.scripts.on_node
    for shape in on(ek.shapes, lambda: listeners.shapes(rt.redis, ek), "the event's waiters"):
        bucket = listeners.digest_for(shape, data)
        if bucket is None:
            continue
        skipped = 0  # (they stay first in the bucket: every waiter before them left it)
        while True:
            found = on(ek.shapes, partial(listeners.waiters, rt.redis, ek, bucket, ts, offset=skipped),
                       "the event's waiters")
            if not found:
                break
            told: list[tuple[str, str, str]] = []
            resumed = 0
            for m in found:
                try:
                    code = _tell(client, m, raw)
                except AWAY:  # one shard away (Redis Cluster): the others are told
                    skipped += 1
                    continue
                resumed += code in TOLD
                told.append((bucket, shape, m))
            if told:
                rt.scripts.unlisten(ek, told, event_id, resumed, listeners.WOKE_KEEP_MS)
            budget -= len(found)
            if budget <= 0:
                return False
            if len(found) < listeners.BATCH:
                break
        away += skipped
    return away == 0


def _tell(client: Client, raw_member: str, body: str) -> int:
    """Deliver the event to one waiter: signal.lua's code (-1 and below: it no longer waits)."""
    m = listeners.parse_member(raw_member)
    if m is None:
        return -1
    queue, tag, job_id, position = m
    k = _partition(client, queue, tag, job_id)
    if k is None:
        return -1
    code, _ = client.runtime.scripts.signal(k, job_id, signal_of(position), body, position=position)
    return int(code)


def _partition(client: Client, queue: str, tag: str, job_id: str) -> QueueKeys | None:
    for k in client.runtime.parts.get(queue, ()):
        if k.tag == tag:
            return k
    from runner.client.inspecting import find

    try:
        return find(client, job_id)[0]
    except JobNotFound:
        return None


def after_emit(client: Client, home: QueueKeys, raw: str) -> None:
    """An emitter tells its event's waiters at once (up to INLINE); Redis going away, or
    more waiters than that, leaves the entry to the relay."""
    with contextlib.suppress(*UNAVAILABLE):
        if tell_all(client, raw, INLINE):
            listeners.drop_wakes(client.runtime.redis, home, [raw])


def listen(client: Client, name: str, match: dict[str, Any], member: str) -> int:
    """Put a waiter on ``name``'s registry; returns listen.lua's code (-1: too many field
    lists for that name)."""
    rt = client.runtime
    ek = EventKeys(rt.config.redis.prefix, name)
    shape = listeners.shape_of(match)
    code, _ = rt.scripts.listen(ek, shape, listeners.digest_of(match), member, listeners.MAX_SHAPES)
    return int(code)


def unlisten(client: Client, name: str, match: dict[str, Any], member: str) -> None:
    """Take one waiter off ``name``'s registry (its wait is over, or its job cancelled)."""
    rt = client.runtime
    ek = EventKeys(rt.config.redis.prefix, name)
    rt.scripts.unlisten(ek, [(listeners.digest_of(match), listeners.shape_of(match), member)])


def forget_job(client: Client, k: QueueKeys, job_id: str) -> None:
    """A job that ended while it waited for an event (a cancel) leaves its registry: read
    what it waited for from its state. Best effort: a waiter left behind is taken off by
    the next event that reaches it (its delivery is refused)."""
    from runner.store import steps

    found = steps.waiting_event(client.runtime.redis, k, job_id)
    if found is None:
        return
    name, match, position = found
    unlisten(client, name, match, listeners.member(k.queue, k.tag, job_id, position))
