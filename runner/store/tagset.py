"""The hash tags in use per queue, recorded in Redis (docs/partitions.md, "Changing N").

The tags of ``partitions = N`` are a function of (queue, N), so a process knows its own
but not those of a count it never had. Each process that routes jobs or serves them adds
its tags to the queue's set (``keys.partition_set``, under the queue's own tag) and reads
the set back: a tag there that its own count lacks is a partition to keep serving and
reading (``draining``) until it holds nothing. So a change of N (3 to 4, 6 to 1) strands
no job, whichever processes are still on the old count.

A worker removes a draining tag once it saw the partition hold nothing (no job waiting,
running, dead or passing through its outbox) for a whole retention. Its check and the
removal are in two slots, so a producer still on the old count could write to it in
between. Such a job is still served by every worker that already knew the tag (a process
never drops a partition it serves), and a producer adds its tags again at its first
enqueue ``RECORD_EVERY_S`` after its last record, so later workers learn of it then. It
takes a producer idle for a whole retention on an old count, whose one enqueue lands in
that window, and every worker restarted before its next enqueue, to leave it unserved.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from runner.store.keys import QueueKeys, partition_set

RECORD_EVERY_S = 10.0  # how often a process adds its tags again and reads the others'


def record_and_read(redis: Any, prefix: str, tags: Mapping[str, Sequence[str]], *,
                    record: bool) -> dict[str, list[str]]:
    """Add each queue's ``tags`` to its set (``record``) and read every queue's set, in one
    pipelined round trip: queue -> its recorded tags, sorted (every process orders the
    draining partitions alike)."""
    pipe = redis.pipeline(transaction=False)
    for queue, own in tags.items():
        if record:
            pipe.sadd(partition_set(prefix, queue), *own)
        pipe.smembers(partition_set(prefix, queue))
    replies = pipe.execute()
    members = replies[1::2] if record else replies
    return {q: sorted(m or ()) for q, m in zip(tags, members, strict=True)}


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
