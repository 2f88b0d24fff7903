"""Administering: pause and resume, the dead-letter operations (requeue, delete, purge,
one job or in bulk), cancel, a schedule's manual tick, and the audit trail each of them
writes when it is done ``by`` someone. Every Redis command is a store function's or a
script's; Redis going away is one error (connection.reachable)."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from runner import outbox
from runner.catalog import templates
from runner.client import waking
from runner.client.enqueuing import Enqueued, encoded
from runner.client.inspecting import find, get, queue_keys
from runner.errors import (
    FieldError,
    JobEnded,
    JobNotFound,
    NotReplicated,
    NotWaiting,
    RedisUnavailable,
    RunnerError,
    SignalPending,
    SignalsFull,
    UnknownSchedule,
    ValidationFailed,
)
from runner.store import admin, codec, keys, records
from runner.store import audit as audit_log
from runner.store.connection import UNAVAILABLE, reachable
from runner.store.keys import QueueKeys
from runner.store.refusals import unreachable
from runner.store.schedules import ServerClock
from runner.store.scripts import NewJob, job_entry
from runner.store.steps import (
    MAX_KEPT_SIGNAL_BYTES,
    MAX_KEPT_SIGNALS,
    MAX_STEP_BYTES,
    VALUE_DEPTH,
    check_signal_name,
)

if TYPE_CHECKING:
    from runner.client import Client

# Dead jobs a bulk requeue or delete sends per round trip (and per script call).
BULK_BATCH = 500
# And at most this many bytes of their stored records (a requeue also rewrites each).
BULK_BYTES = records.SCRIPT_BYTES
# How long a cancel of a job claimed ahead waits to learn whether its worker dropped it.
CANCEL_AHEAD_S = 2.0

auditlog = logging.getLogger("runner.audit")
log = logging.getLogger("runner.client")


# --- pause and resume ------------------------------------------------------------------

def _pause_target(client: Client, queue: str | None, function: str | None) -> tuple[QueueKeys, str | None]:
    """The queue a pause names: a queue, or the queue of a function (UnknownFunction
    when it is not loaded here)."""
    if function is not None:
        return queue_keys(client, client.runtime.registry.get(function).queue), function
    if queue is None:
        raise ValueError("pause a queue or a function")
    return queue_keys(client, queue), None


def pause(client: Client, queue: str | None = None, *, function: str | None = None, by: str | None = None) -> None:
    """Pause a queue (workers claim nothing from it) or one function (its jobs are held,
    queued, spending nothing); running jobs finish. Every worker obeys at its next claim,
    and hands back at once what it claimed ahead of the pause and has not started.
    ``by`` (a token's name, ``cli:<user>``) puts the pause on the audit trail and the log;
    a pause of what is paused already changes nothing (not even its time) and is in the
    log alone."""
    k, fn = _pause_target(client, queue, function)
    rt = client.runtime
    with reachable():
        changed = admin.pause(rt.redis, rt.config.redis.prefix, rt.parts[k.queue], fn)
    if by is not None:
        (on_record if changed else _on_log)(client, by, "pause", k.queue, **({"function": fn} if fn else {}),
                                            **({} if changed else {"changed": False}))


def resume(client: Client, queue: str | None = None, *, function: str | None = None, by: str | None = None) -> int:
    """Lift a pause; a function's held jobs go back to the front of ready in their order.
    Returns how many were put back. ``by`` puts the resume on the audit trail and the log;
    one of what was not paused, that put nothing back, is in the log alone."""
    k, fn = _pause_target(client, queue, function)
    moved, lifted = 0, False
    with reachable():
        for part in client.runtime.parts[k.queue]:
            first = True
            while True:
                got, left, was = client.runtime.scripts.resume(part, fn, first)
                moved, first, lifted = moved + int(got), False, lifted or bool(int(was))
                if not int(left):
                    break
    if by is not None:
        changed = lifted or moved > 0
        (on_record if changed else _on_log)(client, by, "resume", k.queue, count=moved,
                                            **({"function": fn} if fn else {}),
                                            **({} if changed else {"changed": False}))
    return moved


# --- dead letters ----------------------------------------------------------------------

def requeue(
    client: Client, queue: str, job_id: str, payload: Any = None, version: int | None = None, *,
    by: str | None = None,
) -> records.Job:
    """Move a dead job back to ready with a fresh attempt budget. The payload (the
    stored one at its stored version, or an edited one at ``version``, default the
    newest) is validated and must lift to the newest version; an invalid one stays
    dead and the errors are raised. An edited payload is held to ``[api]
    max_body_bytes`` as an enqueued one is.

    ``by`` (a token's name, ``cli:<user>``) puts the requeue on record: an entry in the
    job's history, written in the same step, then the audit trail and the log."""
    k = _dead_in(client, queue, job_id)
    rt = client.runtime
    edited = payload is not None
    with reachable():
        fields = admin.stored(rt.redis, k, job_id)
        in_dead = admin.is_dead(rt.redis, k, job_id)
    if not fields or not in_dead:
        raise JobNotFound(job_id)
    type_ = fields.get("type") or ""
    fn = rt.registry.get(type_)
    if payload is None:
        # The stored payload keeps its stored version (it is upgraded at claim).
        try:
            payload = codec.loads(fields.get("payload") or "")
        except codec.DecodeError:
            problem = FieldError("$", "the stored payload is not JSON; send an edited payload")
            raise ValidationFailed(type_, 0, [problem]) from None
        if version is None:
            stored = fields.get("version") or ""
            version = int(stored) if stored.isdigit() else fn.versions.newest
    elif version is None:
        # An edited payload without a version is written against the newest schema.
        version = fn.versions.newest
    from runner.catalog.schemas import UpgradeFailed  # loaded with the registry above

    # An edited payload is new data, held to the bound; the stored one is already in Redis.
    try:
        body = encoded(client, type_, version, payload, edited)
    except ValidationFailed as exc:
        if edited:
            raise
        # A stored payload no job can carry (written by another producer, or a group's
        # then-job built from a result past 64 bits): say how to requeue it anyway.
        fixes = [FieldError(e.path, f"{e.message}; send an edited payload") for e in exc.errors]
        raise ValidationFailed(type_, version, fixes) from None
    try:
        fn.versions.lift(payload, version)
    except UpgradeFailed as exc:
        raise ValidationFailed(type_, version, [FieldError("$", str(exc))]) from None
    mark = {"edited": True} if edited else {}
    # Timed by the script (the server's clock), as the rest of the job's times are.
    entry = codec.dumps({"outcome": "requeued", "by": by, **mark}) if by is not None else ""
    with reachable():
        code = rt.scripts.requeue(k, job_id, body, str(version), codec.canonical_hash(type_, version, payload), entry)
    if int(code) < 0:
        raise JobNotFound(job_id)
    if by is not None:
        on_record(client, by, "requeue", queue, job_id=job_id, type=type_, **mark)
    return get(client, job_id)


def requeue_many(
    client: Client, queue: str, ids: Sequence[str], *, by: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> tuple[list[str], list[tuple[str, RunnerError]]]:
    """Requeue many dead jobs with their stored payloads, as ``requeue`` does one, in
    batches of BULK_BATCH: two round trips per batch (their records, then one script
    call), not several per job. An invalid payload stays dead and is refused.
    Returns (requeued ids, [(id, why refused)]); ``progress(n)`` after each batch.
    ``by`` puts the whole action on record as one entry: its count and first ids."""
    queue_keys(client, queue)
    rt = client.runtime
    entry = codec.dumps({"outcome": "requeued", "by": by}) if by is not None else ""
    done: list[str] = []
    refused: list[tuple[str, RunnerError]] = []

    def batch(k: QueueKeys, group: list[str]) -> None:
        raws = admin.record_texts(rt.redis, k, group)
        send: list[str] = []
        for job_id, raw in zip(group, raws, strict=True):
            if not isinstance(raw, str):  # gone, or a record of an older release
                try:
                    requeue(client, queue, job_id)
                    done.append(job_id)
                except RedisUnavailable:
                    raise
                except RunnerError as exc:
                    refused.append((job_id, exc))
                continue
            try:
                _check_stored(client, job_id, records.view(job_id, raw, {}, None, None))
            except RunnerError as exc:  # an unknown function, an invalid payload
                refused.append((job_id, exc))
                continue
            send.append(job_id)
        codes = rt.scripts.requeue_many(k, [(i, "", "", "", entry) for i in send]) if send else []
        for job_id, code in zip(send, codes, strict=True):
            if code < 0:
                refused.append((job_id, JobNotFound(job_id)))
            else:
                done.append(job_id)

    _in_batches(client, queue, ids, _bulk_record(client, by, "requeue", queue, len(ids)), done, batch, progress)
    return done, refused


def _check_stored(client: Client, job_id: str, fields: dict[str, str]) -> None:
    """A stored payload must lift to the newest version of its function to be requeued."""
    type_ = fields.get("type") or ""
    fn = client.runtime.registry.get(type_)
    try:
        payload = codec.loads(fields.get("payload") or "")
    except codec.DecodeError:
        problem = FieldError("$", "the stored payload is not JSON; send an edited payload")
        raise ValidationFailed(type_, 0, [problem]) from None
    stored = fields.get("version") or ""
    where = codec.not_json(payload) if codec.has_long_ints(fields.get("payload") or "") else None
    if where is not None:  # as requeue refuses it: no job may carry it
        problem = FieldError(where[0], f"{where[1]}; send an edited payload")
        raise ValidationFailed(type_, int(stored) if stored.isdigit() else 0, [problem])
    from runner.catalog.schemas import UpgradeFailed  # loaded with the registry above

    try:
        fn.versions.lift(payload, int(stored) if stored.isdigit() else fn.versions.newest)
    except UpgradeFailed as exc:
        raise ValidationFailed(type_, int(stored or 0), [FieldError("$", str(exc))]) from None


def delete_many(
    client: Client, queue: str, ids: Sequence[str], *, by: str | None = None, action: str = "delete",
    progress: Callable[[int], None] | None = None,
) -> tuple[list[str], list[str]]:
    """Delete many dead jobs, in batches of BULK_BATCH (one round trip each): (deleted
    ids, ids not in the dead letters). ``by`` puts the whole action on record as one
    ``action`` entry: its count and first ids."""
    queue_keys(client, queue)
    scripts = client.runtime.scripts
    done: list[str] = []
    missing: list[str] = []

    def batch(k: QueueKeys, group: list[str]) -> None:
        calls = scripts.batch()  # one round trip of script calls (store/scripts.py Batch)
        for job_id in group:
            scripts.remove(k, job_id, pipe=calls)
        for job_id, code in zip(group, calls.execute(), strict=True):
            (missing if int(code) < 0 else done).append(job_id)

    _in_batches(client, queue, ids, _bulk_record(client, by, action, queue, len(ids)), done, batch, progress)
    return done, missing


def _in_batches(
    client: Client, queue: str, ids: Sequence[str], record: audit_log.Bulk | None, done: list[str],
    batch: Callable[[QueueKeys, list[str]], None], progress: Callable[[int], None] | None,
) -> None:
    """A bulk action's walk: ``batch`` on each partition's share of every BULK_BATCH ids,
    cut into runs of at most BULK_BYTES of stored records (one STRLEN each, one round
    trip), so no script call or round trip carries more; the action's one audit entry
    written after the first batch that acted on a job, brought up to date after each
    chunk (``done`` so far) and ended whatever happens, ``progress(n)`` after each chunk."""
    parts = client.runtime.parts[queue]
    ok = False
    try:
        with acted(ACTED_IN_PART, lambda: bool(done)), reachable():
            for start in range(0, len(ids), BULK_BATCH):
                chunk = ids[start:start + BULK_BATCH]
                # Each id to the partition whose dead letters hold it (the first for none).
                by_part: dict[int, list[str]] = {}
                for job_id, at in zip(chunk, admin.dead_homes(client.runtime.redis, parts, chunk), strict=True):
                    by_part.setdefault(at or 0, []).append(job_id)
                for p, group in by_part.items():
                    sizes = admin.record_sizes(client.runtime.redis, parts[p], group)
                    for part in _by_bytes(group, sizes, BULK_BYTES):
                        batch(parts[p], part)
                        if record is not None and done and not record.written:
                            record.progress(done)  # on record from the first job it acted on
                if record is not None and start + BULK_BATCH < len(ids):
                    record.progress(done)
                if progress is not None:
                    progress(len(chunk))
            ok = True
    finally:
        if record is not None:
            record.end(done, ok)


def _by_bytes(ids: Sequence[str], sizes: Sequence[int], most: int) -> list[list[str]]:
    """``ids`` in order, cut into runs whose ``sizes`` add up to at most ``most`` bytes (a
    single id past it goes alone)."""
    out: list[list[str]] = []
    run: list[str] = []
    total = 0
    for job_id, n in zip(ids, sizes, strict=True):
        if run and total + n > most:
            out.append(run)
            run, total = [], 0
        run.append(job_id)
        total += n
    if run:
        out.append(run)
    return out


def delete_dead(client: Client, queue: str, job_id: str, *, by: str | None = None) -> None:
    """Delete a dead job and its record; ``by`` puts it on the audit trail and the log
    (the job's own history goes with it)."""
    k = _dead_in(client, queue, job_id)
    with reachable():
        code = client.runtime.scripts.remove(k, job_id)
    if int(code) < 0:
        raise JobNotFound(job_id)
    if by is not None:
        on_record(client, by, "delete", queue, job_id=job_id)


def _dead_in(client: Client, queue: str, job_id: str) -> QueueKeys:
    """The partition of ``queue`` whose dead letters hold ``job_id`` (the queue's home
    partition when none does: the operation then finds no such job, as before)."""
    k = queue_keys(client, queue)
    parts = client.runtime.parts[queue]
    if len(parts) == 1:
        return k
    with reachable():
        searched = list(parts)
        at = admin.dead_homes(client.runtime.redis, searched, [job_id])[0]
        if at is not None:
            return searched[at]
        if new := [p for p in client.runtime.discover_missed(searched) if p.queue == queue]:
            at = admin.dead_homes(client.runtime.redis, new, [job_id])[0]
            if at is not None:
                return new[at]
    return k


def purge_dead(client: Client, queue: str, *, by: str | None = None) -> int:
    """Delete every dead job of a queue; returns how many. ``by`` puts the purge on
    record as one entry with the count (in the log alone when it found none)."""
    from runner.client.inspecting import dead_ids

    done, _ = delete_many(client, queue, dead_ids(client, queue))
    if by is not None:
        record_bulk(client, by, "purge", queue, done)
    return len(done)


# --- the audit trail -------------------------------------------------------------------

def record_bulk(client: Client, by: str, action: str, queue: str, ids: Sequence[str]) -> None:
    """One action on many jobs of a queue, on the audit trail as one entry: its count
    and its first ids (store/audit.py MAX_IDS); in the log alone when it acted on none."""
    (on_record if ids else _on_log)(client, by, action, queue, **audit_log.bulk(ids))


def bulk_entry(client: Client, by: str, action: str, queue: str, expected: int) -> audit_log.Bulk:
    """A bulk action of the caller's own (the web's bulk cancel) on the audit trail as
    one entry, written when it first acts on a job and brought up to date as it goes
    (audit.Bulk)."""
    record = _bulk_record(client, by, action, queue, expected)
    assert record is not None
    return record


def _bulk_record(client: Client, by: str | None, action: str, queue: str, expected: int) -> audit_log.Bulk | None:
    """A bulk action's one audit entry (see audit.Bulk); logged when it first acts on a
    job and at its end, not at each batch."""
    if by is None:
        return None

    def put(fields: dict[str, Any], trail: bool) -> None:
        if fields["state"] != "running" or not bulk.written:
            (on_record if trail else _on_log)(client, by, action, queue, **fields)
            return
        with acted(), reachable():
            audit_log.record(client.runtime.scripts, keys.audit(client.runtime.config.redis.prefix),
                             {"by": by, "action": action, "queue": queue, **fields})

    bulk = audit_log.Bulk(put, expected)
    return bulk


def on_record(client: Client, by: str, action: str, queue: str, **detail: Any) -> None:
    """An operator's action, after it was done: on the audit trail (at the server's
    time, one more round trip for a rare action) and in the log."""
    _on_log(client, by, action, queue, **detail)
    entry = {"by": by, "action": action, "queue": queue, **detail}  # at_ms: the script's
    with acted(), reachable():
        audit_log.record(client.runtime.scripts, keys.audit(client.runtime.config.redis.prefix), entry)


ACTED = "; the action was done, but its entry on the audit trail was not written"
ACTED_IN_PART = "; the action was done in part (GET /audit and the jobs say how far)"


@contextlib.contextmanager
def acted(told: str = ACTED, landed: Callable[[], bool] = lambda: True) -> Iterator[None]:
    """Around a write made once an action has landed (its audit entry; a bulk action's
    later batches, once ``landed()``): Redis refusing it (maxmemory takes a delete but
    not the entry that records it) or going away must not read "nothing was written".
    The error says so (``told``) and carries ``acted`` for the HTTP answer."""
    try:
        yield
    except RedisUnavailable as exc:
        if not landed():
            raise
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        said = unreachable(cause, told)
        said.acted = True  # type: ignore[attr-defined]
        said.told = told  # type: ignore[attr-defined]  # (HTTP's words: they name no master)
        raise said from cause


def _on_log(client: Client, by: str, action: str, queue: str, **detail: Any) -> None:
    """An operator's action in the log alone: a bulk action that acted on no job (ids
    that name none) writes no audit entry, or requests that do nothing would push the
    real actions off the trail."""
    auditlog.info("%s by %s: %s %s", action, by, queue, detail.get("job_id", ""),
                  extra={"audit": action, "by": by, "queue": queue, **detail})


# --- schedules -------------------------------------------------------------------------

def trigger(client: Client, schedule_id: str, *, by: str | None = None) -> Enqueued:
    """Enqueue one tick of a schedule now (to try it by hand): its job carries the
    schedule, the time as its tick and ``"trigger": "manual"``; the schedule's own
    ticks go on as before. A manual run is not held back by OVERLAP = "skip" (the
    operator asked for this run), while the next tick is: it counts the manual run as
    the schedule's last job. ``by`` puts the trigger on the audit trail and the log."""
    rt = client.runtime
    scheds = rt.registry.schedules()
    s = next((x for x in scheds if x.id == schedule_id), None)
    if s is None:
        raise UnknownSchedule(schedule_id, [x.id for x in scheds])
    from runner.catalog.schedules import iso  # loaded with the registry above

    with reachable():
        now = ServerClock(rt.redis, rt.config.redis.prefix, [s.queue]).now_ms()
        meta = codec.dumps({"schedule": s.id, "tick": iso(now), "trigger": "manual"})
        job = NewJob(id=records.new_id(), type=s.function, version=s.version, payload=s.payload_json,
                     max_attempts=s.max_attempts, run_at_ms=0, delay_ms=0, idem_key="", payload_hash="-",
                     resource_key=s.resource_key, limits=s.limits, priority=s.priority,
                     meta=meta)
        home = rt.keys[s.queue]
        # A job whose keys route it to another partition goes there through the outbox
        # (tick.lua), and is placed at once; the relay would, a pass later.
        away = ""
        if s.limits and len(rt.parts[s.queue]) > 1:
            rt.discover_due(record=True)
            where = outbox.destinations(rt, s.queue, [outbox.Keyed(s.function, "", s.limits)])
            if rt.parts[s.queue][next(iter(where))].tag != home.tag:
                away = codec.dumps(job_entry(s.queue, job))
        short: NotReplicated | None = None
        try:
            reply = rt.scripts.tick(home, s.id, job, mode="manual", tick_ms=now, digest=s.digest, born_ms=now,
                                    overlap=s.overlap, missed=0, late_ms=0, now_ms=now, away=away)
        except NotReplicated as exc:  # it ran: only its copy on the replicas is unconfirmed
            reply, short = exc.replies[0], exc
    if away and int(reply[0]) == 1:
        # (the run is recorded: a failure here leaves its job to the relay, not to a retry)
        with contextlib.suppress(*UNAVAILABLE):
            outbox.remove(rt, home, outbox.place(rt, [away]))
    if by is not None:  # on record even unconfirmed: the run was written to the master
        on_record(client, by, "trigger", s.queue, schedule=s.id, job_id=reply[1],
                  **({"unconfirmed": True} if short is not None else {}))
    if short is not None:
        raise NotReplicated(short.acked, short.wanted, short.timeout_s, [str(reply[1])], short.replies,
                            write="trigger") from None
    return Enqueued(id=reply[1], type=s.function, version=s.version, queue=s.queue, status=reply[2])


# --- run now ---------------------------------------------------------------------------

def run_now(client: Client, job_id: str, *, by: str | None = None) -> str:
    """Move a job that waits for a time (scheduled, retrying, or a durable function's
    sleep) to ready at once, keeping its id and spending no attempt (see
    lua/run_now.lua); returns the status it had. Raises NotWaiting (with the job's
    status) for any other job, JobNotFound for no such job.

    ``by`` (a token's name, ``cli:<user>``) puts it on record: an entry in the job's
    history, written in the same step, then the audit trail and the log."""
    rt = client.runtime
    k, fields = find(client, job_id)
    status = fields.get("status", "queued")
    if status not in ("scheduled", "retrying", "sleeping"):
        raise NotWaiting(job_id, status)  # read just now: no script call to learn it again
    entry = codec.dumps({"outcome": "run now", "by": by}) if by is not None else ""  # timed by the script
    with reachable():
        code, had = rt.scripts.run_now(k, job_id, entry=entry)
    if int(code) == -1:  # gone since the look: ended (done), or deleted
        try:
            raise NotWaiting(job_id, get(client, job_id).status or "gone")
        except JobNotFound:
            raise JobNotFound(job_id) from None
    if int(code) == -2:
        raise NotWaiting(job_id, str(had))
    if by is not None:
        on_record(client, by, "run now", k.queue, job_id=job_id)
    return str(had)


# --- cancel ----------------------------------------------------------------------------

def cancel(client: Client, job_id: str, *, by: str | None = None, audited: bool = True,
           queue: str | None = None) -> str:
    """Cancel a job (see lua/cancel.lua): "cancelled" when it had not started (it never
    will), "requested" when it runs (its handler sees ctx.cancelled within 2 s).
    Raises JobEnded for a job that ended already, JobNotFound for no such job.

    ``by`` (a token's name, ``cli:<user>``) puts the cancel on record: an entry in the
    job's history, written in the same step, then the audit trail and the log (unless
    ``audited`` is False: a bulk cancel puts itself on the trail once, see
    ``record_bulk``). With ``queue``, a job of another queue is JobNotFound (a bulk
    request names each job's queue, and its record must say the truth)."""
    return _cancel(client, job_id, by, audited, queue)[0]


def cancel_many(client: Client, ids: Sequence[str], *, by: str | None = None,
                queue: str | None = None) -> list[tuple[str, str | RunnerError]]:
    """Cancel each of ``ids`` as ``cancel`` does one: [(id, its answer, or why it was
    refused)] in order. ``by`` puts the whole action on the audit trail as one entry per
    queue it acted in (its count and first ids), none for an id that named no job.

    On Redis Cluster a job found on none of the masters that answered while others did
    not (stalled, down) is refused with that RedisUnavailable (its ``left_out`` names the
    partitions: it may be there, not cancelled; retry it) and the others go on; when no
    job could be reached at all, that outage is raised, as any other is.

    Every job is tried before the audit entries are written. One that could not be (its
    master did not answer within a reader's bound, or refused) is the RedisUnavailable
    that says the action was done and its entry not written (``acted``), raised once the
    others are written, carrying the answers above as ``answers``."""
    out: list[tuple[str, str | RunnerError]] = []
    acted: dict[str, list[str]] = {}
    unreached: list[RedisUnavailable] = []
    unwritten: list[RedisUnavailable] = []
    try:
        for job_id in ids:
            try:
                answer, at = _cancel(client, job_id, by, False, queue)
            except RedisUnavailable as exc:
                if not exc.left_out:
                    raise
                unreached.append(exc)
                out.append((job_id, exc))
                continue
            except RunnerError as exc:
                out.append((job_id, exc))
                continue
            out.append((job_id, answer))
            acted.setdefault(at, []).append(job_id)
    finally:
        if by is not None:  # (each cancelled job's history names who already)
            for q, done in acted.items():
                try:
                    record_bulk(client, by, "cancel", q, done)
                except RedisUnavailable as exc:
                    if not getattr(exc, "acted", False):
                        raise
                    unwritten.append(exc)
    if unwritten:
        unwritten[0].answers = out  # type: ignore[attr-defined]
        raise unwritten[0]
    if unreached and len(unreached) == len(out):
        raise unreached[0]
    return out


def _cancel(client: Client, job_id: str, by: str | None, audited: bool, queue: str | None) -> tuple[str, str]:
    """``cancel``: (its answer, the job's queue)."""
    rt = client.runtime
    k, _ = find(client, job_id)
    if queue is not None and k.queue != queue:
        raise JobNotFound(job_id)
    ttl_ms = int(rt.config.retention.done_s * 1000)
    entry = codec.dumps({"outcome": "cancel", "by": by}) if by is not None else ""  # timed by the script
    with reachable():
        code, status, *damaged = rt.scripts.cancel(k, job_id, ttl_ms, entry=entry)
    if damaged:  # (its state key held another Redis type: answered by the queue's sets)
        log.warning("cancel of job %s: its state key held another Redis type; answered as %s%s", job_id, status,
                    "" if int(code) == -2 else f", the key set aside as {k.state(job_id)}:corrupt")
    if int(code) == -2:
        raise JobEnded(job_id, status, damaged="state" if damaged else "")
    if int(code) == -1:
        raise JobNotFound(job_id)
    if int(code) == 1:  # (a wait for an event leaves its registry)
        with contextlib.suppress(*UNAVAILABLE):
            waking.forget_job(client, k, job_id)
    if by is not None and audited:
        on_record(client, by, "cancel", k.queue, job_id=job_id)
    answer = _cancelled_ahead(client, k, job_id) if int(code) == 3 else "cancelled" if int(code) == 1 else "requested"
    if answer == "cancelled":
        _cancel_links(client, job_id, by)
    return answer, k.queue


def _cancel_links(client: Client, job_id: str, by: str | None) -> None:
    """A durable function's links of a job cancelled without running (ctx.invoke): its
    parent, waiting for it, is sent its end ("cancelled", JobFailed there) at once, as a
    worker sends the end of a child that ran; and the children it was suspended on are
    cancelled too (a cascade: each one's own children after it). A job that ran is
    settled by its worker, which sends its end then. Best effort: a parent or child that
    ended or is gone is left as it is, and a parent not told looks for its child itself
    at its next poll (30 s)."""
    try:
        view = get(client, job_id).as_dict()
    except RunnerError:
        return
    parent = view.get("invoked_by")
    if isinstance(parent, dict) and isinstance(parent.get("id"), str) and isinstance(parent.get("signal"), str):
        body = codec.dumps({"status": "cancelled", "error": view.get("last_error"), "reason": view.get("reason")})
        with contextlib.suppress(RunnerError):
            deliver_signal(client, parent["id"], parent["signal"], body)
    for entry in view.get("steps") or ():
        if not isinstance(entry, dict):
            continue
        child = entry.get("child")
        if entry.get("kind") == "invoke" and entry.get("status") == "waiting" and isinstance(child, str):
            with contextlib.suppress(RunnerError):
                cancel(client, child, by=by, audited=False)


# --- signals (docs/durable.md) -----------------------------------------------------------

def signal(client: Client, job_id: str, name: str, data: Any = None, *, key: str | None = None) -> str:
    """Send the signal ``name`` with ``data`` (any JSON value) to a durable function's
    job, for its ``ctx.wait_for_signal(name)``: "resumed" when the job waited for it (it
    is queued to run on at once), "kept" when it is kept until the job's wait reads it,
    "duplicate" when the last signal of that name the job took carried this ``key``
    (kept or read already: nothing is delivered again). Without a key the delivery gets
    one of its own, which a NotReplicated answer names (``key``): sending it again with
    that key is then safe. Raises JobEnded for a job that ended, JobNotFound for no such
    job, SignalPending when one of that name is kept already, unread."""
    check_signal_name(name)
    if key is None:
        key = os.urandom(12).hex()
    elif not isinstance(key, str) or not key or len(key.encode()) > templates.MAX_KEY_BYTES:
        raise ValueError(f"a signal's key must be 1 to {templates.MAX_KEY_BYTES} bytes of text")
    elif (bad := templates.control_character(key)) is not None:
        raise ValueError(f"a signal's key holds a control character ({bad}), which a key cannot carry")
    # Held as a step's value is: its log entry must read back (steps.VALUE_DEPTH).
    try:
        body = codec.dumpb_checked(data, VALUE_DEPTH).decode()
    except codec.TooDeep:
        raise
    except codec.EncodeError:  # NaN, an integer past 64 bits, a set: named as a payload's are
        raise ValueError(f"a signal's body must be JSON: {(codec.not_json(data) or ('$', 'not JSON'))[1]}") from None
    if len(body) > MAX_STEP_BYTES:
        raise ValueError(f"a signal's body is at most {MAX_STEP_BYTES:,} bytes of JSON, not {len(body):,}")
    return deliver_signal(client, job_id, name, body, bounded=True, key=key)


def deliver_signal(client: Client, job_id: str, name: str, body: str, *, bounded: bool = False,
                   key: str = "") -> str:
    """``signal`` with its body encoded already (JSON text); unbounded unless ``bounded``
    (the job's signals kept unread, MAX_KEPT_SIGNALS and MAX_KEPT_SIGNAL_BYTES): a child
    job's end (ctx.invoke) is bounded as its result is, and is never refused. ``key``:
    the delivery's (signal.lua), none for a child's end."""
    k, _ = find(client, job_id)
    try:
        with reachable():
            # A caller's signal is confirmed by the replicas as an enqueue is; a child's end
            # is not (its parent looks for the end itself at its next poll).
            code, status = client.runtime.scripts.signal(
                k, job_id, name, body, most=MAX_KEPT_SIGNALS if bounded else 0,
                most_bytes=MAX_KEPT_SIGNAL_BYTES if bounded else 0, durable=bounded, key=key)
    except NotReplicated as exc:
        raise NotReplicated(exc.acked, exc.wanted, exc.timeout_s, [job_id], exc.replies, signal=name,
                            key=key) from None
    if int(code) == -1:
        raise JobNotFound(job_id)
    if int(code) == -2:
        raise JobEnded(job_id, status)
    if int(code) == -3:
        raise SignalPending(job_id, name)
    if int(code) in (-4, -5):
        raise SignalsFull(job_id, f"{MAX_KEPT_SIGNALS} signals" if int(code) == -4 else
                          f"{MAX_KEPT_SIGNAL_BYTES:,} bytes of bodies")
    return "resumed" if int(code) == 2 else "duplicate" if int(code) == 3 else "kept"


def cancel_deferred(client: Client, *, queue: str | None = None, type: str | None = None, by: str | None = None,
                    batch: int = 200) -> dict[str, list[str]]:
    """Cancel every job deferred (a paused function's held jobs, the jobs parked on a
    limit) of ``queue`` (default: every queue) and ``type`` (default: any): queue ->
    the ids cancelled. Each batch finds its jobs and cancels them in one script call
    (see cancel.lua), so no job it reaches can be woken and run in between; a job is
    covered when it is deferred at the moment its list's batch runs (one woken before
    is queued by then); a list is read once, for at most as many jobs as it held when
    its turn came. A batch reads at most BULK_BYTES of records (the rest go in the
    next). One audit entry per queue (``by``); each job's history names who."""
    rt = client.runtime
    names = [queue] if queue else list(rt.keys)
    for q in names:
        queue_keys(client, q)
    if type is not None:
        rt.registry.get(type)
    ttl_ms = int(rt.config.retention.done_s * 1000)
    entry = codec.dumps({"outcome": "cancel", "by": by}) if by is not None else ""
    out: dict[str, list[str]] = {}
    with reachable():
        for q in names:
            types = sorted(f.name for f in rt.registry.functions.values()
                           if f.queue == q and (type is None or f.name == type))
            for k in rt.parts[q]:
                for list_key, limit in admin.deferred_lists(rt.redis, k, types):
                    # At most as many as the list held when its turn came: jobs parked
                    # faster than they are cancelled cannot keep the command going.
                    more, after, left = True, "", admin.length(rt.redis, list_key)
                    while more and left > 0:
                        more, moved, ids = rt.scripts.cancel_deferred(k, list_key, limit, min(batch, left),
                                                                      type or "", after, ttl_ms, entry,
                                                                      most_bytes=BULK_BYTES)
                        out.setdefault(q, []).extend(ids)
                        left -= len(ids)
                        if not ids and moved == after:
                            break  # nothing gained (the place read was woken meanwhile): done
                        after = moved
    if by is not None:
        for q, ids in out.items():
            if ids:
                record_bulk(client, by, "cancel", q, ids)
    return out


def _cancelled_ahead(client: Client, k: QueueKeys, job_id: str) -> str:
    """A job a worker had claimed ahead: that worker drops it ("cancelled") unless it
    was starting it at that instant ("requested": its handler is told). Which way
    it went shows within milliseconds; a worker that is gone leaves the job to its
    lease, after which it ends cancelled without running ("requested" meanwhile)."""
    deadline = time.monotonic() + CANCEL_AHEAD_S
    while True:
        with reachable():
            held = admin.claim(client.runtime.redis, k, job_id)
        if held is None:
            # The claim went: dropped (the same step ended the job cancelled), or it
            # started and ended in one settlement, its start mark never seen here.
            return "cancelled" if get(client, job_id).status == "cancelled" else "requested"
        if not held.ahead:
            return "requested"  # it started: a cancel of a running job
        if time.monotonic() > deadline:
            return "requested"
        time.sleep(0.005)
