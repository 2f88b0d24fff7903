"""The client's reads and administrative writes that are not one script: queue counts,
pauses, a function's flow state, dead-letter look-ups, stored records, and a
claim read back. Each takes the Redis client and the keys, and knows the key shapes, so
that the client above it issues no command of its own.

Every function lets the connection's errors through (UNAVAILABLE); the caller maps them
with connection.reachable, in one place, to RedisUnavailable.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from redis.exceptions import NoPermissionError

from runner.store import records
from runner.store.keys import QueueKeys
from runner.store.outage import checked
from runner.store.schedules import ServerClock
from runner.store.stats import both_sets, stats_hashes, weigh

log = logging.getLogger("runner.admin")


def counts(redis: Any, every: Sequence[QueueKeys], names: Callable[[], Sequence[str]]) -> list[dict[str, Any]]:
    """Per partition, in ``every``'s order, in two round trips: ready (plain and priority
    jobs due now), processing, scheduled (sleeping jobs too: they wait in a set of their
    own, see suspend.lua), dead and the counters of its stats hash (one too wide to read
    whole by the fields ``names()`` lists: stats.stats_hashes), with how many of its
    fields were left out."""
    pipe = redis.pipeline(transaction=False)
    for k in every:
        pipe.llen(k.ready)
        pipe.zcard(k.leases)
        pipe.zcard(k.scheduled)
        pipe.zcard(k.dead)
        pipe.hlen(k.stats)
        pipe.zcard(k.prio)
        pipe.zcard(k.sleeping)
        weigh(pipe, k)  # (exact up to STATS_WHOLE fields: stats_hashes)
        both_sets(pipe, k)  # (an earlier release's sleepers, in scheduled too: counted once)
    raw = pipe.execute(raise_on_error=False)
    n = 9
    for i in range(len(every)):
        for v in raw[n * i: n * i + 6]:
            if isinstance(v, Exception):
                raise v  # (as execute() would: an outage, or a damaged queue key)
    sizes = [int(raw[n * i + 4]) for i in range(len(every))]
    # (a server that refuses the script: the hash's size alone decides)
    weights = [0 if isinstance(raw[n * i + 7], Exception) else raw[n * i + 7] for i in range(len(every))]
    hashes = stats_hashes(redis, every, sizes, weights, names)
    out = []
    for i in range(len(every)):
        ready, processing, scheduled, dead, _, prio, sleeping, _, old = raw[n * i: n * i + n]
        if isinstance(sleeping, Exception) or isinstance(old, Exception):
            sleeping = old = 0  # a damaged sleeping set counts nothing; the reclaim puts it aside
        # (own|<type>: a mark of the types counted under their own names, no figure)
        counters = {name: int(v) for name, v in hashes[i].items()
                    if v.lstrip("-").isdigit() and not name.startswith("own|")}
        out.append({"ready": ready + prio, "processing": processing, "scheduled": scheduled + sleeping - old,
                    "dead": dead, "counters": counters, "stats_fields_left_out": sizes[i] - len(hashes[i])})
    return out


def pause(redis: Any, prefix: str, parts: Sequence[QueueKeys], function: str | None) -> bool:
    """Pause a queue (``function`` None) or one function of it, in every partition (each
    partition's claim reads its own), at the server's time. Returns whether it paused
    anything: False when every partition was paused already (kept paused since then)."""
    now = ServerClock(redis, prefix, [parts[0].queue] if parts else []).now_ms()
    pipe = redis.pipeline(transaction=False)
    for part in parts:
        pipe.hsetnx(part.paused, "queue" if function is None else f"fn:{function}", now)
    if not any(int(set_) for set_ in pipe.execute()):
        return False
    # Jobs a worker claimed ahead before the pause must not start either: told on the
    # channel its cancels come by, it hands them back (worker.py). (Not in the pipeline: a
    # cluster client refuses a pipelined PUBLISH.)
    for part in parts:
        try:
            redis.publish(part.cancels, f"pause {part.queue} {function or '*'}")
        except NoPermissionError as exc:  # (an ACL user with no channels: paused all the same)
            log.warning("paused; the Redis user may not publish on runner's channels (%s), so jobs a "
                        "worker claimed ahead (at most its prefetch) may still start; grant them: ACL "
                        "SETUSER <user> '&%s:*' (or allchannels)", exc, prefix)
            break
    return True


def pauses(redis: Any, homes: Iterable[QueueKeys]) -> list[dict[str, str]]:
    """Each queue's pause hash (its home partition's: a pause is written to every one)."""
    pipe = redis.pipeline(transaction=False)
    for k in homes:
        pipe.hgetall(k.paused)
    return list(pipe.execute())


def flow(redis: Any, home: QueueKeys, parts: Sequence[QueueKeys], limit_keys: QueueKeys, function: str
         ) -> dict[str, Any]:
    """A function's flow state in one round trip: whether it is paused (its queue's
    ``home`` partition says, as for ``pauses``), the jobs held by
    its pause (over every partition), the server's time, and its function-wide limit's
    holders (id, lease end in ms) and parked jobs (``limit_keys``: the partition the
    limit's key routes to)."""
    name = f"c:{function}"
    pipe = redis.pipeline(transaction=False)
    pipe.hexists(home.paused, f"fn:{function}")
    pipe.time()
    pipe.zrange(limit_keys.limit(name), 0, -1, withscores=True)
    pipe.llen(limit_keys.waiters(name))
    for part in parts:
        pipe.llen(part.held(function))
    paused, (sec, usec), holders, waiting, *held_each = checked(pipe.execute(raise_on_error=False))
    return {"paused": bool(paused), "held": sum(int(n) for n in held_each),
            "now_ms": int(sec) * 1000 + int(usec) // 1000, "holders": list(holders), "waiting": int(waiting)}


def dead_ids(redis: Any, parts: Sequence[QueueKeys]) -> list[str]:
    """Every dead job's id of a queue, partition by partition."""
    return [i for part in parts for i in redis.zrange(part.dead, 0, -1)]


def is_dead(redis: Any, k: QueueKeys, job_id: str) -> bool:
    return redis.zscore(k.dead, job_id) is not None


def dead_homes(redis: Any, parts: Sequence[QueueKeys], ids: Sequence[str]) -> list[int | None]:
    """For each id, the index in ``parts`` of the partition whose dead letters hold it
    (None: none does), in one round trip; a queue of one partition is not asked."""
    if len(parts) == 1:
        return [0] * len(ids)
    pipe = redis.pipeline(transaction=False)
    for job_id in ids:
        for part in parts:
            pipe.zscore(part.dead, job_id)
    found = pipe.execute()
    return [next((p for p, score in enumerate(found[n * len(parts):(n + 1) * len(parts)]) if score is not None),
                 None) for n in range(len(ids))]


def stored(redis: Any, k: QueueKeys, job_id: str) -> dict[str, str]:
    """A job's record and state as stored (a record of the release before this one is a
    hash holding both: the scripts convert it when they next touch it)."""
    kind = redis.type(k.job(job_id))
    if kind == "hash":
        return _hash_fields(redis, k.job(job_id), (*records.RECORD_FIELDS, "payload", *records.STATE_SHOWN))
    if kind != "string":
        return {}
    return records.view(job_id, redis.get(k.job(job_id)), state_of(redis, k, job_id), None, None)


def state_of(redis: Any, k: QueueKeys, job_id: str) -> dict[str, str]:
    """A job's state hash: whole, or past records.MAX_STATE_FIELDS (damage) only the
    fields of records.STATE_SHOWN and records.WIDE (its count of fields), never its every
    field (HGETALL of 300,000 held Redis a fraction of a second, every client waiting)."""
    key = k.state(job_id)
    if redis.type(key) != "hash":
        return {}
    return _hash_fields(redis, key, records.STATE_SHOWN)


def _hash_fields(redis: Any, key: str, shown: Sequence[str]) -> dict[str, str]:
    """A hash whole, or past records.MAX_STATE_FIELDS (damage, or a record of the release
    before grown by another writer: one of 300,000 fields held Redis 0.2 s in one HGETALL)
    only the fields ``shown``, by name, and records.WIDE (its count of fields)."""
    width = int(redis.hlen(key))
    if width <= records.MAX_STATE_FIELDS:
        return dict(redis.hgetall(key))
    got = redis.hmget(key, list(shown))
    fields = {name: v for name, v in zip(shown, got, strict=True) if v is not None}
    fields[records.WIDE] = str(width)
    return fields


def record_sizes(redis: Any, k: QueueKeys, ids: Sequence[str]) -> list[int]:
    """The bytes of each id's stored record, in one round trip (0 when gone or not a
    string): what a bulk action weighs before it reads or sends any record whole."""
    pipe = redis.pipeline(transaction=False)
    for job_id in ids:
        pipe.strlen(k.job(job_id))
    return [n if isinstance(n, int) else 0 for n in pipe.execute(raise_on_error=False)]


def record_texts(redis: Any, k: QueueKeys, ids: Sequence[str]) -> list[Any]:
    """The stored record of each id, in one round trip: its text, or what else the key
    held (None when gone)."""
    pipe = redis.pipeline(transaction=False)
    for job_id in ids:
        pipe.get(k.job(job_id))
    return checked(pipe.execute(raise_on_error=False))


def claim(redis: Any, k: QueueKeys, job_id: str) -> records.Claim | None:
    """A job's claim as records.parse_claim reads it; None while no worker holds it."""
    raw = redis.hget(k.claims, job_id)
    return None if raw is None else records.parse_claim(raw)


def deferred_lists(redis: Any, k: QueueKeys, held_types: Sequence[str]) -> list[tuple[str, str]]:
    """The lists a partition defers jobs on: each held type's pause list and each limit's
    parked list, as (list key, limit name or "")."""
    lists = [(k.held(t), "") for t in held_types]
    return lists + [(k.waiters(name), name) for name in sorted(redis.zrange(k.limwait, 0, -1))]


def length(redis: Any, list_key: str) -> int:
    return int(redis.llen(list_key))
