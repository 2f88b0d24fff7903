"""The relay: moves the jobs written to an outbox (follow-ups of another queue, a
then-job or a schedule's tick whose keys route it to another partition: another slot on
Redis Cluster) into their queue, then off the outbox (runner/outbox.py), and brings the
counts of group members that finished outside their group's partition to it; and tells
the waiters (ctx.wait_for_event) of events whose emitter did not (client/waking.py).

Placing is idempotent by the job's id (relay.lua), so a relay that dies between
placing and removing, or two workers' relays racing over one outbox (or a ticker placing
its own), place each once. It runs in every worker's scheduler loop."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from runner import outbox
from runner.client import Client, Request, waking
from runner.errors import JobNotFound, RunnerError
from runner.observe import tracing
from runner.runtime import Runtime
from runner.store import codec, followups, listeners
from runner.store.connection import UNAVAILABLE
from runner.store.keys import QueueKeys
from runner.store.outage import OUTAGE
from runner.store.scripts import STAGED, Followup, followup_id, job_entry
from runner.worker.faults import fault

log = logging.getLogger("runner.scheduler")

BATCH = 200
# How long an event's entry on a ``wakes`` list is left to its emitter before the relay
# tells its waiters (client/waking.py).
WAKE_AFTER_S = 2.0
COUNT = '["#group",'  # an outbox entry that counts a group's member down (group_count.lua)


def drain(rt: Runtime, k: QueueKeys) -> int:
    """One pass over a queue's outbox (at most BATCH entries, and BATCH jobs of a committed
    stage); returns how many left it, BATCH while a stage has more to place."""
    # Every call is given up on a stalled master as the worker's claims are (Transport.on_node;
    # the placements, fenced by id, in outbox.place): an entry whose placement could not be
    # confirmed stays in the outbox for the next pass, which places nothing twice.
    on = rt.scripts.on_node
    entries = on(k.outbox, lambda: followups.outbox_head(rt.redis, k, BATCH))
    if not entries:
        return 0
    stages = [e for e in entries if e.startswith(f'["{STAGED}"')]
    fault("before_relay")
    counts = [e for e in entries if e.startswith(COUNT)]
    plain = [e for e in entries if not e.startswith((f'["{STAGED}"', COUNT))]
    finished = outbox.place(rt, plain) if plain else []
    if counts:
        try:
            finished += _count(rt, k, counts)
        except OUTAGE as exc:  # the home partition's master is away: counted by a later pass
            log.debug("outbox: group counts of queue %s not brought home now: %s", k.queue, exc)
    more = False
    for raw in stages:
        if _unstage(rt, k, raw):
            finished.append(raw)
        else:
            more = True
            break  # one stage's batch a pass: each relay pass stays bounded
    fault("after_relay")  # placed, not yet off the outbox: the next pass places nothing twice
    outbox.remove(rt, k, finished)
    return BATCH if more else len(finished)


def tell_waiters(client: Client, k: QueueKeys, seen: dict[tuple[str, int], float]) -> int:
    """Tell the waiters of the events on ``k``'s ``wakes`` list that an emitter left (it
    died, or its event had more waiters than it tells itself): an entry is taken once it
    has been there WAKE_AFTER_S by this process's clock (its emitter tells its own within
    that), a bounded batch of waiters per pass. Returns the entries still waiting."""
    on = client.runtime.scripts.on_node  # (given up on a stalled master: see drain)
    entries = on(k.wakes, lambda: listeners.wakes_head(client.runtime.redis, k, BATCH))
    now = time.monotonic()
    heads = {(k.tag, hash(raw)) for raw in entries}
    for key in [key for key in seen if key[0] == k.tag and key not in heads]:
        del seen[key]  # (told by their emitter meanwhile)
    finished: list[str] = []
    left = 0
    budget = BATCH * 5
    for raw in entries:
        first = seen.setdefault((k.tag, hash(raw)), now)
        if now - first < WAKE_AFTER_S or budget <= 0:
            left += 1
            continue
        fault("before_wake")
        try:
            done = waking.tell_all(client, raw, budget)
        except UNAVAILABLE as exc:  # the name's registry is on a shard away: not this partition's outage
            log.warning("events: the waiters of a pending event could not be told now (%s); next pass", exc)
            done = False
        if done:
            finished.append(raw)
        else:
            left += 1
        budget -= waking.INLINE
    fault("after_wake")  # told, not yet off the list: the next pass tells nobody twice
    if finished:
        on(k.wakes, lambda: listeners.drop_wakes(client.runtime.redis, k, finished))
    return left


def _unstage(rt: Runtime, k: QueueKeys, raw: str) -> bool:
    """Place the next BATCH follow-ups of a committed stage (ack.lua), each once by its
    id, then take them off it; True once the stage is empty (and gone)."""
    try:
        _, suffix = codec.loads(raw)
    except (codec.DecodeError, ValueError, TypeError):
        log.error("outbox: dropping a malformed stage entry %.80r", raw)
        return True
    key = k.job_prefix + str(suffix)
    on = rt.scripts.on_node
    chunk = on(key, lambda: followups.stage_head(rt.redis, key, BATCH))
    if not chunk:
        return True
    finished = set(outbox.place(rt, chunk))
    # Entries for a queue this worker does not know wait on the outbox for one that does,
    # and so do those whose partition's master is away now (placed by a later pass).
    waiting = [e for e in chunk if e not in finished]
    rt.scripts.unstage(k, key, chunk[0], len(chunk), waiting)  # (a script call: bounded as every one is)
    return False


def _count(rt: Runtime, k: QueueKeys, entries: Sequence[str]) -> list[str]:
    """Bring the counts of group members that finished in this partition to their group
    in the queue's home partition (group_count.lua; each member counts once there)."""
    counts: list[list[str]] = []
    for raw in entries:
        try:
            _, *fields = codec.loads(raw)
        except (codec.DecodeError, ValueError, TypeError):
            fields = []
        if len(fields) == 5 and all(isinstance(f, str) for f in fields):
            counts.append(fields)
        else:
            log.error("outbox: dropping a malformed group count %.80r", raw)
    home = rt.keys.get(k.queue)
    if home is None:
        return []
    if counts:
        rt.scripts.group_count(home, counts)
    return list(entries)


def destination(client: Client, dest: str, tag: str, job_id: str, type_: str, version: int, attempt: int,
                queue: str, body: dict[str, Any], traceparent: str | None = None) -> Followup | None:
    """The job an ON_SUCCESS ("s") or ON_FAILURE ("f") destination gets: the source job
    and its result or error, under the id <source>.<tag>, which is written once whoever
    writes it (the settling script, or the lost list's pass below). None when the
    destination's schema refuses the record (it was checked at load)."""
    record = {"job": {"id": job_id, "type": type_, "version": version, "attempt": attempt, "queue": queue},
              **body}
    try:
        # Not held to [api] max_body_bytes: the runner builds the record from a result
        # already held to [worker] max_result_bytes, and a refusal would lose it.
        prep = client.prepare(Request(dest, record, traceparent=traceparent), bounded=False)
    except (RunnerError, TypeError, ValueError) as exc:
        # TypeError, ValueError: a body the encoder refuses (execute.run refuses such a
        # result first); raised here, it would fail the whole settle and re-run the job.
        log.error("job %s: not sent to %s: %s", job_id, dest, exc, extra={"job_id": job_id})
        return None
    return Followup(prep.fn.queue, prep.job._replace(id=followup_id(job_id, tag)))


def lost_destinations(rt: Runtime, client: Client, k: QueueKeys) -> int:
    """ON_FAILURE for jobs the reclaim buried as "worker lost" (reclaim.lua lists them):
    no worker settled them, so nobody wrote their destination with the burial. It is
    written here, to the same id a settler would give it (<id>.f, or <id>.f2 for a job
    requeued once, ...) and placed once by that id, so a pass that dies midway, or two
    schedulers at once, write it once. Returns how many ids left the list."""
    on = rt.scripts.on_node  # (given up on a stalled master: see drain)
    ids = on(k.lost, lambda: followups.lost_head(rt.redis, k, BATCH))
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
        with tracing.enqueue_under(job.get("traceparent"), fn.on_failure) as traceparent:
            dest = destination(client, fn.on_failure, tag, job_id, str(job["type"]), job["version"] or 0,
                               job["attempt"], k.queue, {"error": job["last_error"]}, traceparent)
        if dest is not None:  # placed as the outbox's entries are: where its keys route it
            held: list[str] = []
            outbox.place(rt, [codec.dumps(job_entry(dest.queue, dest.job))], held=held)
            if held:  # its partition's master is away: this id and those after it, next pass
                ids = ids[:ids.index(job_id)]
                break
    if ids:
        on(k.lost, lambda: followups.forget_lost(rt.redis, k, ids))
    return len(ids)
