"""The hash tags in use per queue, recorded in Redis (docs/partitions.md, "Changing N").

The tags of ``partitions = N`` are a function of (queue, N), so a process knows its own
but not those of a count it never had. Each process that routes jobs or serves them adds
its tags to the queue's set (``keys.partition_set``, under the queue's own tag) and reads
the set back: a tag there that its own count lacks is a partition to keep serving and
reading (``draining``) until it holds nothing. So a change of N (3 to 4, 6 to 1) strands
no job, whichever processes are still on the old count.

The counts themselves are recorded too (``keys.partition_counts``, each with when a process
last said it routes by it): a key that another count placed elsewhere is looked for where
that count put it, until its keys there have expired (routing.py, ``Placement``). A count
is kept while a process said so within ``keep_s`` (the longest of the done and
idempotency retentions, and an hour: the life of a key after its last job; a host's clock
is good enough at that scale), and a process says again each old count one of whose
partitions is still recorded (a job delayed for hours waits there, a busy key keeps going
there), so the look-up lasts as long as anything keyed may remain in its partitions.

A worker removes a draining tag once it saw the partition hold nothing (no job waiting,
running, dead or passing through its outbox) for the longest of the done and idempotency
retentions. Its check and the
removal are in two slots, so a producer still on the old count could write to it in
between. Such a job is still served by every worker that already knew the tag (a process
never drops a partition it serves), and a producer adds its tags again at its first
enqueue ``RECORD_EVERY_S`` after its last record, so later workers learn of it then. It
takes a producer idle for a whole retention on an old count, whose one enqueue lands in
that window, and every worker restarted before its next enqueue, to leave it unserved.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from runner.store.keys import QueueKeys, partition_counts, partition_set

RECORD_EVERY_S = 10.0  # how often a process adds its tags again and reads the others'


@dataclass(frozen=True, slots=True)
class Recorded:
    """What processes recorded per queue: the tags (sorted: every process orders the
    draining partitions alike) and the counts said within the window (ascending)."""

    tags: dict[str, list[str]]
    counts: dict[str, list[int]]


def record_and_read(redis: Any, prefix: str, tags: Mapping[str, Sequence[str]], *,
                    record: bool) -> dict[str, list[str]]:
    """Each queue's recorded tags (see ``record_and_read_all``)."""
    return record_and_read_all(redis, prefix, tags, {}, record=record, keep_s=0).tags


def record_and_read_all(redis: Any, prefix: str, tags: Mapping[str, Sequence[str]], counts: Mapping[str, int], *,
                        record: bool, keep_s: float) -> Recorded:
    """Add each queue's ``tags`` to its set and its count (``counts``) to its counts
    (``record``), and read both back, in one pipelined round trip. Counts not said for
    ``keep_s`` leave the set (0: counts are neither kept nor read)."""
    now_ms = int(time.time() * 1000)
    pipe = redis.pipeline(transaction=False)
    reads = []  # where each queue's SMEMBERS reply is
    sent = 0
    for queue, own in tags.items():
        if record:
            pipe.sadd(partition_set(prefix, queue), *own)
            sent += 1
        reads.append(sent)
        pipe.smembers(partition_set(prefix, queue))
        sent += 1
        if keep_s > 0:
            key = partition_counts(prefix, queue)
            since = now_ms - int(keep_s * 1000)
            if record and queue in counts:
                pipe.zadd(key, {str(counts[queue]): now_ms})
                pipe.zremrangebyscore(key, "-inf", f"({since}")
                sent += 2
            pipe.execute_command("ZRANGEBYSCORE", key, since, "+inf")
            sent += 1
    replies = pipe.execute()
    out_tags: dict[str, list[str]] = {}
    out_counts: dict[str, list[int]] = {}
    for q, at in zip(tags, reads, strict=True):
        out_tags[q] = sorted(replies[at] or ())
        if keep_s > 0:
            got = replies[at + (3 if record and q in counts else 1)] or ()
            text = (c.decode() if isinstance(c, bytes) else str(c) for c in got)
            out_counts[q] = sorted({int(c) for c in text if c.isdigit() and int(c) > 0})
    return Recorded(out_tags, out_counts)


def say_counts(redis: Any, prefix: str, counts: Mapping[str, Sequence[int]]) -> None:
    """Record ``counts`` as said now (each queue's, in one pipelined round trip)."""
    now_ms = int(time.time() * 1000)
    pipe = redis.pipeline(transaction=False)
    for queue, said in counts.items():
        if said:
            pipe.zadd(partition_counts(prefix, queue), {str(c): now_ms for c in said})
    pipe.execute()


def drained(redis: Any, k: QueueKeys) -> bool:
    """Whether a partition holds nothing a worker must still serve or a reader find: no job
    not done (the census counts queued, scheduled, held, running and dead ones), no lease,
    no follow-up in its outbox and no burial awaiting its ON_FAILURE job."""
    pipe = redis.pipeline(transaction=False)
    pipe.hvals(k.census)
    pipe.zcard(k.leases)
    pipe.llen(k.outbox)
    pipe.llen(k.lost)
    census, leases, outbox, lost = pipe.execute()
    return not any(_positive(v) for v in census or ()) and not (leases or outbox or lost)


def retire(redis: Any, k: QueueKeys) -> None:
    """Stop recording a drained partition's tag (a process that routes to it adds it again)."""
    redis.srem(partition_set(k.prefix, k.queue), k.tag)


def _positive(value: Any) -> bool:
    try:
        return int(value) > 0
    except (TypeError, ValueError):
        return True  # a damaged count: keep serving rather than strand a job


def draining_keys(prefix: str, queue: str, current: Iterable[QueueKeys], recorded: Iterable[str],
                  ) -> list[QueueKeys]:
    """The keys of the recorded tags that ``current`` lacks, numbered after it."""
    own = list(current)
    have = {k.tag for k in own}
    n = own[0].partitions if own else 1
    extra = [t for t in recorded if t not in have]
    return [QueueKeys(prefix=prefix, queue=queue, tag=t, partition=len(own) + i, partitions=n)
            for i, t in enumerate(extra)]
