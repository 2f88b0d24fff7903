"""The relay: moves follow-ups that an ack wrote to its queue's outbox (they belong to
another queue, another slot on Redis Cluster) into their queue, then off the outbox.

Placing is idempotent by the follow-up's id (relay.lua), so a relay that dies between
placing and removing, or two workers' relays racing over one outbox, place each once.
It runs in every worker's scheduler loop."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from runner.client import Client, Request
from runner.errors import JobNotFound, RunnerError
from runner.runtime import Runtime
from runner.store import codec, routing
from runner.store.keys import QueueKeys
from runner.store.scripts import Followup, followup_id, job_entry
from runner.worker.faults import fault

log = logging.getLogger("runner.scheduler")

BATCH = 200


def place(rt: Runtime, entries: Sequence[str]) -> list[str]:
    """Write the follow-ups of these outbox entries into their queues; returns the entries
    done with (placed, already there, or refused), which may leave the outbox. An entry
    for a queue this worker does not know stays for a worker that does."""
    by_queue: dict[str, list[tuple[str, list[str]]]] = {}
    finished: list[str] = []
    for raw in entries:
        try:
            queue, *fields = codec.loads(raw)
        except (codec.DecodeError, ValueError, TypeError):
            log.error("outbox: dropping a malformed entry %.80r", raw)
            finished.append(raw)
            continue
        if queue not in rt.keys or len(fields) not in (12, 13):
            log.warning("outbox: a follow-up for queue %r waits for a worker that knows it", queue)
            continue
        if len(fields) == 12:  # an entry of the release before: no priority
            fields.append("0")
        by_queue.setdefault(queue, []).append((raw, fields))
    for queue, items in by_queue.items():
        parts = rt.parts[queue]
        n = parts[0].partitions  # routed over the current count (a draining one takes none)
        by_part: dict[int, list[tuple[str, list[str]]]] = {}
        for raw, fields in items:  # a follow-up goes where its keys route it, as any job
            key = routing.route_of(fields[1], fields[7], fields[10]) if n > 1 else ""
            by_part.setdefault(routing.partition_of(key, n) if key else rt.keys[queue].partition,
                               []).append((raw, fields))
        for p, some in by_part.items():
            _relay(rt, parts[p], some, finished)
    return finished


def _relay(rt: Runtime, k: QueueKeys, items: list[tuple[str, list[str]]], finished: list[str]) -> None:
    codes = rt.scripts.relay(k, [f for _, f in items])
    for (raw, fields), code in zip(items, codes, strict=True):
        if int(code) < 0:
            log.warning("follow-up %s: its idempotency key holds another payload; not enqueued", fields[0])
        finished.append(raw)


def drain(rt: Runtime, k: QueueKeys) -> int:
    """One pass over a queue's outbox (at most BATCH entries); returns how many left it."""
    entries = rt.redis.lrange(k.outbox, 0, BATCH - 1)
    if not entries:
        return 0
    fault("before_relay")
    finished = place(rt, entries)
    fault("after_relay")  # placed, not yet off the outbox: the next pass places nothing twice
    _remove(rt, k.outbox, finished)
    return len(finished)


def _remove(rt: Runtime, key: str, items: Sequence[str]) -> None:
    """Take these entries off a list (one each), in one round trip."""
    if items:
        pipe = rt.redis.pipeline(transaction=False)
        for item in items:
            pipe.lrem(key, 1, item)
        pipe.execute()


def destination(client: Client, dest: str, tag: str, job_id: str, type_: str, version: int, attempt: int,
                queue: str, body: dict[str, Any]) -> Followup | None:
    """The job an ON_SUCCESS ("s") or ON_FAILURE ("f") destination gets: the source job
    and its result or error, under the id <source>.<tag>, which is written once whoever
    writes it (the settling script, or the lost list's pass below). None when the
    destination's schema refuses the record (it was checked at load)."""
    record = {"job": {"id": job_id, "type": type_, "version": version, "attempt": attempt, "queue": queue},
              **body}
    try:
        # Not held to [api] max_body_bytes: the runner builds the record from a result
        # already held to [worker] max_result_bytes, and a refusal would lose it.
        prep = client.prepare(Request(dest, record), bounded=False)
    except RunnerError as exc:
        log.error("job %s: not sent to %s: %s", job_id, dest, exc, extra={"job_id": job_id})
        return None
    return Followup(prep.fn.queue, prep.job._replace(id=followup_id(job_id, tag)))


def lost_destinations(rt: Runtime, client: Client, k: QueueKeys) -> int:
    """ON_FAILURE for jobs the reclaim buried as "worker lost" (reclaim.lua lists them):
    no worker settled them, so nobody wrote their destination with the burial. It is
    written here, to the same id a settler would give it (<id>.f, or <id>.f2 for a job
    requeued once, ...) and placed once by that id, so a pass that dies midway, or two
    schedulers at once, write it once. Returns how many ids left the list."""
    ids = rt.redis.lrange(k.lost, 0, BATCH - 1)
    for job_id in ids:
        try:
            job = client.get(job_id).as_dict()
        except JobNotFound:
            continue  # trimmed meanwhile: nothing left to tell
        fn = rt.registry.functions.get(str(job["type"]))
        if fn is None or not fn.on_failure or job["status"] != "dead":
            continue
        # Named as bury.lua names a settled burial's: <id>.f, then <id>.f2 after one requeue...
        tag = f"f{job['requeued'] + 1}" if job["requeued"] else "f"
        dest = destination(client, fn.on_failure, tag, job_id, str(job["type"]), job["version"] or 0,
                           job["attempt"], k.queue, {"error": job["last_error"]})
        if dest is not None:  # placed as the outbox's entries are: where its keys route it
            place(rt, [codec.dumps(job_entry(dest.queue, dest.job))])
    _remove(rt, k.lost, ids)
    return len(ids)
