"""Fan-out/fan-in: ``Client.group([Request, ...], then=Request(...))`` and POST /groups.

The members run as independent jobs; the then-job runs once, after every member has
finished (done, dead or cancelled), with the members' outcomes in front of its own
payload, in member order::

    {"group": {"id": "g...", "total": 3, "done": 2, "dead": 1, "cancelled": 0,
               "outcomes": [{"id": "...", "status": "done", "result": ...},
                            {"id": "...", "status": "dead", "reason": "max attempts reached",
                             "error": {"type": "...", "message": "..."}}, ...]},
     ...the then request's own fields...}

``outcomes`` is null once they pass INLINE_BYTES together (a big group): the handler
reads them with ``ctx.group_outcomes(group_id)`` (or ``Client.group_outcomes``), from the
group's outcomes hash, kept for the done retention after the group completes.

There is no polling task: each member's settle (ack, bury, the lease reclaim's "worker
lost", a cancel ended by cancel.lua, the claim or a release) counts it down in its own
script step, once (lua/includes/groups.lua: group_settle),
and the step that finishes the last member writes the then-job. So the members must
share one queue (one hash tag, one Cluster slot); a request whose members run on several
queues is refused. The then-job may run on any queue: on another it goes through the
members' queue's outbox and the relay, like a follow-up, and so does a then-job of the
members' queue whose keys route it to another partition (docs/partitions.md).

Everything is validated before anything is written; the members are then written in
chunks of CHUNK (and of records.SCRIPT_BYTES of payloads at most), in one round trip, and
the last chunk seals the group (an unsealed group
never fires: a request that failed half-way leaves the members already written to run,
and no then-job). Members and the then-job take no idempotency key (the group is the
unit: each member counts once in it), so a function's IDEMPOTENCY_KEY does not apply to
them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from runner.catalog.listing import one_request
from runner.errors import (
    FieldError,
    InvalidGroup,
    NotReplicated,
    RedisUnavailable,
    RunnerError,
    UnknownFunction,
    UnknownVersion,
    ValidationFailed,
)
from runner.store import codec, records, routing
from runner.store import groups as groups_store
from runner.store.connection import UNAVAILABLE, unreachable
from runner.store.scripts import Batch, NewJob, job_entry

if TYPE_CHECKING:
    from runner.client import Client, Prepared, Request

MAX_MEMBERS = groups_store.MAX_MEMBERS  # (the store bounds what it reads back by it)
CHUNK = 500  # members per script call: each call's work stays small
LISTED = 5000  # member ids a call appends to the group's member list, at most
# (and at most records.SCRIPT_BYTES of their payloads: see _calls)
INLINE_BYTES = 256 * 1024  # outcomes up to this size ride in the then-job's payload
FIELD = "group"  # the then payload's field that carries the group

# What the then-job's schema must take: both shapes of the group field.
_SAMPLE_OUTCOMES: tuple[list[dict[str, Any]] | None, ...] = (
    [{"id": "0", "status": "done", "result": None},
     {"id": "1", "status": "dead", "reason": "permanent failure", "error": {"type": "E", "message": "m"}}],
    None,
)


@dataclass(frozen=True, slots=True)
class Group:
    id: str
    queue: str
    members: tuple[str, ...]
    then_id: str
    then_type: str
    then_queue: str

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "queue": self.queue, "members": list(self.members),
                "then": {"id": self.then_id, "type": self.then_type, "queue": self.then_queue,
                         "status": "waiting"}}


def new_id() -> str:
    """A group id: "g" and a job-style id (time-ordered, unique), never a job's."""
    return "g" + records.new_id()


def then_id(group_id: str) -> str:
    return f"{group_id}.then"


def sample(group_id: str, outcomes: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {"id": group_id, "total": 2, "done": 1, "dead": 1, "cancelled": 0, "outcomes": outcomes}


def _meta(meta: str, **fields: Any) -> str:
    base = codec.loads(meta) if meta else {}
    return codec.dumps({**base, **fields})


def _prepared(client: Client, req: Request, path: str, errors: list[FieldError]) -> Prepared | None:
    """One job validated, its problems added to ``errors`` under ``path``."""
    if req.idempotency_key is not None:
        errors.append(FieldError(path, "a group's job takes no idempotency key"))
        return None
    try:
        return client.prepare(req)
    except ValidationFailed as exc:
        errors += [replace(e, path=f"{path}.payload{e.path[1:]}") for e in exc.errors]
    except (UnknownFunction, UnknownVersion) as exc:
        errors.append(FieldError(f"{path}.type", str(exc)))
    return None


def build(client: Client, members: Sequence[Request], then: Request) -> tuple[Group, list[NewJob], NewJob]:
    """Validate a group and build its jobs; raises InvalidGroup with every problem. One
    request: its payloads share one pattern budget and one limit on listed errors
    (catalog/listing.py)."""
    with one_request():
        return _build(client, members, then)


def _build(client: Client, members: Sequence[Request], then: Request) -> tuple[Group, list[NewJob], NewJob]:
    errors: list[FieldError] = []
    if not 1 <= len(members) <= MAX_MEMBERS:
        errors.append(FieldError("$.members", f"a group has 1 to {MAX_MEMBERS} members, not {len(members)}"))
    gid = new_id()
    jobs: list[NewJob] = []
    queues: dict[str, int] = {}
    for i, req in enumerate(members):
        prep = _prepared(client, req, f"$.members[{i}]", errors)
        if prep is None:
            continue
        queues.setdefault(prep.fn.queue, i)
        jobs.append(prep.job._replace(idem_key="", payload_hash="-",
                                      meta=_meta(prep.job.meta, group=gid, member=i + 1)))
    if len(queues) > 1:
        (q0, _), (q1, i1) = sorted(queues.items(), key=lambda item: item[1])[:2]
        errors.append(FieldError(f"$.members[{i1}].type", f"runs on queue {q1!r}, member 0 on {q0!r}: a "
                                 "group's members share one queue (its countdown is one step in that queue)"))
    then_prep = None
    if not isinstance(then.payload, dict):
        errors.append(FieldError("$.then.payload", f"must be a JSON object (it gets the {FIELD!r} field)"))
    elif FIELD in then.payload:
        errors.append(FieldError(f"$.then.payload.{FIELD}", "is the group's own field: leave it out"))
    else:
        for outcomes in _SAMPLE_OUTCOMES:
            then_prep = _prepared(client, replace(then, payload={FIELD: sample(gid, outcomes), **then.payload}),
                                  "$.then", errors)
            if then_prep is None:
                break
    if errors or then_prep is None or not queues:
        raise InvalidGroup(errors)
    queue = next(iter(queues))
    then_job = then_prep.job._replace(id=then_id(gid), payload=codec.dumps(then.payload), idem_key="",
                                      payload_hash="-", meta=_meta(then_prep.job.meta, group=gid))
    group = Group(id=gid, queue=queue, members=tuple(j.id for j in jobs), then_id=then_job.id,
                  then_type=then_prep.fn.name, then_queue=then_prep.fn.queue)
    return group, jobs, then_job


def _calls(jobs: Sequence[NewJob]) -> list[list[NewJob]]:
    """Members in the runs one script call writes: CHUNK at most, and at most
    records.SCRIPT_BYTES of payloads (the first whatever its size)."""
    return [list(run) for i in range(0, len(jobs), CHUNK)
            for run in records.by_bytes(jobs[i:i + CHUNK], lambda j: records.text_bytes(j.payload))]


def _part_way(group: Group, jobs: Sequence[NewJob], written_ids: set[str],
              failed: BaseException) -> RedisUnavailable:
    """RedisUnavailable for a group whose calls Redis refused (maxmemory) part-way: the
    members written run, and the group is never sealed (its then-job never runs; it
    expires after the keep time). ``results`` has one entry per member, as
    enqueue_many's: an Enqueued where written, None where not."""
    from runner.client import Enqueued

    results: list[Any] = [
        Enqueued(j.id, j.type, j.version, group.queue, "scheduled" if j.run_at_ms or j.delay_ms else "queued")
        if j.id in written_ids else None for j in jobs]
    written = len(written_ids)
    exc = unreachable(failed, f"; {written} of {len(results)} member(s) written (they run), group {group.id} "
                              "not sealed: its then-job never runs")
    exc.results = results
    exc.__cause__ = failed
    return exc


def create(client: Client, members: Sequence[Request], then: Request) -> Group:
    """Validate, then write every member and seal the group in one round trip."""
    group, jobs, then_job = build(client, members, then)
    rt = client.runtime
    k = rt.keys[group.queue]
    # The then-job is written by the step that counts the last member down, in the group's
    # partition: one whose keys route it to another partition of that queue goes through the
    # outbox and the relay instead (as a then-job of another queue does), so it meets the
    # other jobs of its lock there.
    here = group.then_queue == group.queue and routing.stays(then_job, k.partition, k.partitions)
    entry = codec.dumps(job_entry("" if here else group.then_queue, then_job))
    keep_ms = int(rt.config.retention.done_s * 1000)
    # On a partitioned queue a member goes where its keys route it, as any job, so that
    # its locks meet the other jobs of its keys; the group counts it in here, and its
    # settle there sends the count here through the outbox and the relay. Those members
    # are written after the group, and the group sealed after them (three round trips:
    # a count never finds no group, and a group never fires before its members exist).
    away: dict[int, list[NewJob]] = {}
    here_jobs = jobs
    if k.partitions > 1:
        here_jobs = []
        for j in jobs:
            key = routing.route(j)
            p = routing.partition_of(key, k.partitions) if key else k.partition
            (here_jobs if p == k.partition else away.setdefault(p, [])).append(j)
    also = sum(len(v) for v in away.values())
    chunks = _calls(here_jobs) or [[]]
    # Every member's id goes to the group's member list (its page of members), in member
    # order, shared out over the calls: more calls (of no member) when they would carry
    # more than LISTED each, so no call's work grows with the group.
    chunks += [[] for _ in range(-(-len(jobs) // LISTED) - len(chunks))]
    share = -(-len(jobs) // len(chunks))
    listed = [[j.id for j in jobs[n * share:(n + 1) * share]] for n in range(len(chunks))]
    # With [redis] wait_replicas every step is followed by a WAIT (group.lua and enqueue.lua
    # are durable scripts, transport.DURABLE); one short of replicas ran all the same, so
    # the group is written whole and then refused as any enqueue is: NotReplicated.
    short: list[NotReplicated] = []

    def execute(batch: Batch) -> list[Any]:
        try:
            return batch.execute(raise_on_error=False)
        except NotReplicated as exc:
            short.append(exc)
            return exc.replies

    try:
        batch = rt.scripts.batch()
        for n, chunk in enumerate(chunks):
            rt.scripts.group(k, group.id, chunk, first=n == 0, seal=n == len(chunks) - 1 and not away, then=entry,
                             inline_bytes=INLINE_BYTES, keep_ms=keep_ms, pipe=batch, also=also if n == 0 else 0,
                             listed=listed[n])
        replies = execute(batch)
        written = {j.id for chunk, r in zip(chunks, replies, strict=True)
                   if not isinstance(r, BaseException) and int(r[0]) >= 0 for j in chunk}
        failed = [r for r in replies if isinstance(r, BaseException)]
        if failed:
            raise _part_way(group, jobs, written, failed[0])
        refused = [r for r in replies if int(r[0]) < 0]
        if refused:  # an id collision or a group gone mid-write: never expected
            raise RunnerError(f"group {group.id}: refused by Redis ({refused[0][0]})")
        if away:
            batch = rt.scripts.batch()
            parts: list[list[NewJob]] = []
            for p, part in away.items():
                for chunk in _calls(part):
                    parts.append(chunk)
                    rt.scripts.enqueue(rt.parts[group.queue][p], parts[-1], pipe=batch)
            replies = execute(batch)
            failed = [r for r in replies if isinstance(r, BaseException)]
            if failed:
                written |= {j.id for part, r in zip(parts, replies, strict=True)
                            if not isinstance(r, BaseException) for j in part}
                raise _part_way(group, jobs, written, failed[0])
            batch = rt.scripts.batch()
            rt.scripts.group(k, group.id, [], first=False, seal=True, then=entry,
                             inline_bytes=INLINE_BYTES, keep_ms=keep_ms, pipe=batch)
            reply = execute(batch)[0]
            if isinstance(reply, BaseException):
                raise reply
            if int(reply[0]) < 0:
                raise RunnerError(f"group {group.id}: refused by Redis ({reply[0]})")
    except UNAVAILABLE as exc:
        raise unreachable(exc) from exc
    if short:
        raise NotReplicated(min(e.acked for e in short), short[0].wanted, short[0].timeout_s,
                            job_ids=[j.id for j in jobs], write="group")
    return group
