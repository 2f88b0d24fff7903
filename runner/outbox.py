"""Placing the jobs of an outbox: a job written where it cannot be enqueued in the same
step (another queue's slot, or another partition of its queue on Redis Cluster) goes to
the writing partition's outbox as an entry (its queue, its 12 enqueue fields, its
priority) and is placed from there into the partition its keys route it to, once by its
id whoever places it (lua/relay.lua), then taken off the outbox.

The relay (worker/relay.py) drains every outbox; a writer that wants its job placed at
once (the ticker, a manual run of a schedule) places its own entries right after
writing them, and whichever of the two comes second places nothing again.

An entry leaves its outbox only once its job is placed: a reader that finds a job's
entry gone from the outbox then finds the job (OVERLAP reads a schedule's last job so:
store/schedules.py, last_jobs).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import NamedTuple

from runner.errors import NotReplicated
from runner.runtime import Runtime
from runner.store import codec, followups, records, routing
from runner.store.keys import QueueKeys
from runner.store.outage import OUTAGE

log = logging.getLogger("runner.scheduler")


class Keyed(NamedTuple):
    """What routing reads of an outbox entry (its meta: a DEBOUNCE function's job routes
    by its debounce key, as an enqueue does; see routing.route_of)."""

    type: str
    idem_key: str
    limits: str
    meta: str = ""


def destinations(rt: Runtime, queue: str, jobs: Sequence[routing.Routed]) -> dict[int, list[int]]:
    """The indexes of ``jobs`` of ``queue`` by the partition (an index of ``rt.parts``)
    they go to: where their keys route them by the current count, or where another count
    put a key while it lives there (one look-up then); a keyless one to the home partition
    (the writer's step keeps it there)."""
    parts = rt.parts[queue]
    n = parts[0].partitions  # routed over the current count (a draining one takes none)
    groups: dict[int, list[int]] = {}
    for i, job in enumerate(jobs):
        key = routing.route(job) if n > 1 else ""
        groups.setdefault(routing.partition_of(key, n) if key else rt.keys[queue].partition, []).append(i)
    place = rt.placements.get(queue)
    if place is not None:  # another count was in use lately: its keys are looked up
        groups = place.relocate(rt.redis, jobs, groups, parts)
    return groups


def place(rt: Runtime, entries: Sequence[str], absorbed: dict[str, tuple[str, str]] | None = None,
          held: list[str] | None = None) -> list[str]:
    """Write the jobs of these outbox entries into their queues; returns the entries
    done with (placed, already there, or refused), which may leave the outbox. An entry
    for a queue this process does not know stays for one that does. ``absorbed``, when
    given, gets the entry's job id -> (id, status) of the job that stands for it: the
    DEBOUNCE burst's job it joined, or the job that holds its idempotency key.

    An entry whose partition's master is away or stalled (an outage of that partition:
    the placement may even land later) is not done with: it stays for a later pass, which
    places it once by its id, while the other partitions' entries are placed now; it goes
    on ``held`` when given."""
    by_queue: dict[str, list[tuple[str, list[str]]]] = {}
    finished: list[str] = []
    for raw in entries:
        try:
            queue, *fields = codec.loads(raw)
        except (codec.DecodeError, ValueError, TypeError):
            log.error("outbox: dropping a malformed entry %.80r", raw)
            finished.append(raw)
            continue
        if queue not in rt.keys:
            log.warning("outbox: a follow-up for queue %r waits for a worker that knows it", queue)
            continue
        if len(fields) != 13:  # its 12 enqueue fields and its priority (scripts.job_entry)
            log.error("outbox: dropping a malformed entry %.80r", raw)
            finished.append(raw)
            continue
        by_queue.setdefault(queue, []).append((raw, fields))
    for queue, items in by_queue.items():
        parts = rt.parts[queue]
        groups = destinations(rt, queue, [Keyed(f[1], f[7], f[10], f[11]) for _, f in items])
        for p, idx in groups.items():
            try:
                _relay(rt, parts[p], [items[i] for i in idx], finished, absorbed)
            except OUTAGE as exc:
                if held is not None:
                    held += [items[i][0] for i in idx]
                log.debug("outbox: %d job(s) for queue %s, partition {%s}, not placed now: %s",
                          len(idx), queue, parts[p].tag, exc)
    return finished


def _relay(rt: Runtime, k: QueueKeys, items: list[tuple[str, list[str]]], finished: list[str],
           absorbed: dict[str, tuple[str, str]] | None = None) -> None:
    # At most records.SCRIPT_BYTES of payloads (field 3) a call, as every enqueue.
    for run in records.by_bytes(items, lambda item: records.text_bytes(str(item[1][3]))):
        _relay_call(rt, k, list(run), finished, absorbed)


def _relay_call(rt: Runtime, k: QueueKeys, items: list[tuple[str, list[str]]], finished: list[str],
                absorbed: dict[str, tuple[str, str]] | None = None) -> None:
    try:
        reply = rt.scripts.relay(k, [f for _, f in items])
    except NotReplicated as exc:
        # Placed, but not on enough replicas yet: the entries stay in their outbox (on its
        # replicas), so a failover of this master loses no job; a later pass places them
        # again, nothing twice, and takes them off once confirmed.
        log.warning("outbox: %d job(s) placed on queue %s, not yet confirmed by %d replica(s) (%d did); "
                    "kept in the outbox until they are", len(items), k.queue, exc.wanted, exc.acked)
        return
    codes = reply[:len(items)]
    if absorbed is not None:  # then (index, id, status) per job another job stands for
        for i in range(len(items), len(reply) - 2, 3):
            absorbed[str(items[int(reply[i])][1][0])] = (_text(reply[i + 1]), _text(reply[i + 2]))
    for (raw, fields), code in zip(items, codes, strict=True):
        if int(code) < 0:
            log.warning("follow-up %s: its idempotency key holds another payload; not enqueued", fields[0])
        finished.append(raw)


def _text(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def remove(rt: Runtime, k: QueueKeys, entries: Sequence[str]) -> None:
    """Take placed entries off ``k``'s outbox (one each), in one round trip (given up on a
    stalled master as a worker's script calls are: Transport.on_node)."""
    if entries:
        rt.scripts.on_node(k.outbox, lambda: followups.take_off_outbox(rt.redis, k, entries))
