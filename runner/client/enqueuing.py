"""Enqueueing: a job checked and encoded (``prepare``), then written by ONE send path.

Every enqueue (one, many, from asyncio, a group's) goes the same way: ``Sender.plan``
splits the prepared jobs into one enqueue script call per queue partition, a transport
carries the calls, and ``Sender.answer`` turns each call's reply, or its failure, into
each job's answer. The transports differ only in how the calls travel:

    batch   one round trip of every call (redis-py; calls that overlap from many threads
            share it through a Combiner, one per queue partition on Redis Cluster):
            enqueue, enqueue from asyncio with replicas
    loop    the event loop's own connection (aiolink.py): aenqueue, the HTTP fast lane
    stream  chunks streamed on one connection, the next prepared while Redis runs the
            last: enqueue_many, enqueue_all
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Container, Iterable, Iterator, Sequence, Sized
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from redis import exceptions as redis_errors

from runner import groups
from runner.catalog import templates
from runner.catalog.listing import Unlisted, one_request
from runner.errors import (
    DELAY_RANGE,
    FieldError,
    IdempotencyConflict,
    NotReplicated,
    RedisUnavailable,
    RunnerError,
    ValidationFailed,
    is_delay,
)
from runner.observe import tracing
from runner.runtime import Runtime
from runner.store import codec, records, routing, tracecontext, transport
from runner.store import link as link_mod
from runner.store.aiolink import AsyncLink
from runner.store.combiner import AsyncCombiner, Combiner, LoopCombiner
from runner.store.connection import UNAVAILABLE, NodeStalled, reachable, refusal, unreachable
from runner.store.keys import QueueKeys
from runner.store.scripts import NewJob, Stream

if TYPE_CHECKING:
    # The catalog's loader comes with the first registry loaded, not with the client.
    from runner.catalog.registry import Function
    from runner.client import Client

MAX_BATCH = 500
# enqueue_many: jobs per script call, and calls in flight on its connection at once.
# Smaller calls let the client prepare the next while Redis runs the last.
STREAM_CHUNK = 100
STREAM_WINDOW = 2

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Enqueued:
    id: str
    type: str
    version: int
    queue: str
    status: str
    duplicate: bool = False
    debounced: bool = False  # a DEBOUNCE function's: the id is the burst's one job

    def as_dict(self) -> dict[str, Any]:
        out = {"id": self.id, "type": self.type, "version": self.version, "queue": self.queue,
               "status": self.status, "duplicate": self.duplicate}
        if self.debounced:
            out["debounced"] = True
        return out


@dataclass(frozen=True, slots=True)
class Request:
    """One job to enqueue."""

    type: str
    payload: Any
    version: int | None = None
    delay_s: float | None = None
    run_at: float | None = None  # epoch seconds
    idempotency_key: str | None = None
    traceparent: str | None = None  # W3C trace context of the producer (see store/tracecontext.py)
    priority: int | None = None  # 0-9, higher first; None: the function's PRIORITY


class Prepared(NamedTuple):
    """One job checked and encoded, not sent yet: its function and the fields the enqueue
    script writes (see NewJob). A group builds its jobs from these."""

    fn: Function
    job: NewJob


# One caller's answer from a combined round trip: its job, or why not (a refusal, or the
# failure of the one script call that held the job: the round trip's other calls may
# have been answered).
_Answer = Enqueued | IdempotencyConflict | NotReplicated | Exception
# A job of a send: its index in the answers, and the job. One script call of a send: the
# queue, the partition's keys, and its jobs.
_Item = tuple[int, Prepared]
_Call = tuple[str, QueueKeys, list[_Item]]
_UNSENT = RunnerError("pending")  # enqueue_many's place of a job not answered yet


# --- prepare: checks and encoding, before anything touches Redis ------------------------

def prepare(client: Client, req: Request, *, bounded: bool = True) -> Prepared:
    """Validate and encode one job; raises before anything touches Redis. Without
    ``bounded``, the payload may be over ``[api] max_body_bytes`` and nested into the
    headroom of runner's own records (codec.READ_DEPTH): only for one the runner builds
    itself from data already bounded (a destination's record)."""
    return _prepare(client, req.type, req.payload, req.version, req.delay_s, req.run_at,
                    req.idempotency_key, req.traceparent, req.priority, bounded=bounded)


def prepare_type(client: Client, type_: str, payload: Any) -> Prepared:
    """``prepare`` for a job with every option at its default, for an event loop: only
    for a function whose schema has no backtracking pattern, and an invalid payload
    raises Unlisted, its errors unlisted (see ``_aprepare``)."""
    return _prepare(client, type_, payload, None, None, None, None, listing=False)


def _prepare(
    client: Client, type_: str, payload: Any, version_: int | None, delay_s: float | None,
    run_at: float | None, idempotency_key: str | None, traceparent: str | None = None,
    priority: int | None = None,
    waited: bool = False,
    bounded: bool = True,
    *,
    listing: bool = True,
) -> Prepared:
    fn = client.runtime.registry.get(type_)
    version = version_ if version_ is not None else fn.versions.newest
    prio = fn.priority if priority is None else priority
    if not isinstance(prio, int) or isinstance(prio, bool) or not 0 <= prio <= 9:
        raise ValidationFailed(fn.name, version, [FieldError("$", f"priority must be 0 to 9, got {prio!r}")])
    # Encoded first: a payload past the nesting limit is refused before anything walks it.
    body = encoded(client, fn.name, version, payload, bounded)
    fn.versions.validate(payload, version, listing=listing)
    fn.refuse_stranded(version)
    try:
        if idempotency_key is not None:
            ikey = str(idempotency_key)
            if not ikey or len(ikey.encode()) > templates.MAX_KEY_BYTES:
                raise templates.TemplateError(
                    f"an idempotency key must be 1 to {templates.MAX_KEY_BYTES} bytes"
                )
            bad = templates.control_character(ikey)
            if bad is not None:
                raise templates.TemplateError(
                    f"the idempotency key holds a control character ({bad}), which a key cannot "
                    "carry: remove it"
                )
        elif fn.idempotency_key is not None:
            ikey = fn.idempotency_key.render(payload)
        else:
            ikey = ""
        rkey, lims = fn.render_limits(payload)
    except templates.TemplateError as exc:
        raise ValidationFailed(fn.name, version, [FieldError(
            "$" if exc.field is None else f"$.{exc.field}", str(exc))]) from None
    # A delay runs on the server's clock (enqueue.lua adds it to TIME); run_at is the
    # caller's own absolute time.
    run_at_ms = delay_ms = 0
    refusal = timing_refusal(delay_s, run_at)
    if refusal is not None:
        raise ValidationFailed(fn.name, version, [FieldError("$", refusal)])
    if run_at is not None:
        run_at_ms = int(run_at * 1000)
    elif delay_s:
        delay_ms = int(delay_s * 1000)
    meta = tracecontext.meta_for(traceparent) if traceparent else ""
    if fn.debounce is not None:
        meta, delay_ms = _debounced(fn, version, payload, meta, idempotency_key, run_at, delay_s)
        run_at_ms = 0
    if waited:  # the exact text the scripts look for (see waited in lua/includes/ended.lua)
        meta = '{"' + records.WAITED + '":1' + ("," + meta[1:] if meta else "}")
    # Positional, in NewJob's order (id, type, version, payload, max_attempts, run_at_ms,
    # delay_ms, idem_key, payload_hash, resource_key, limits, meta, priority): keywords
    # cost a NamedTuple 0.35 us more per job, on the route's every request.
    job = NewJob(
        records.new_id(), fn.name, version, body, fn.max_attempts, run_at_ms, delay_ms, ikey,
        codec.canonical_hash(fn.name, version, payload) if ikey else "-", rkey, lims, meta, prio,
    )
    return Prepared(fn, job)


# The latest run_at an enqueue takes, as HTTP's ?run_at= (the year 5138): past it the
# epoch seconds are surely in the wrong unit, and a finite 1e308 overflows into milliseconds.
MAX_RUN_AT = 1e11


def timing_refusal(delay_s: Any, run_at: Any) -> str | None:
    """Why an enqueue's delay or run_at cannot be kept (None when both can): a delay is
    0 to a year and a day, as over HTTP, and a run_at finite epoch seconds up to MAX_RUN_AT
    (before now runs at once). A job due later than that is a unit mistake that would sit
    scheduled for ever, or fail converting to milliseconds far from the call."""
    if delay_s is not None and not is_delay(delay_s):
        return f"delay must be {DELAY_RANGE}, got {delay_s!r}"
    if run_at is not None and (isinstance(run_at, bool) or not isinstance(run_at, int | float)
                               or not -MAX_RUN_AT <= run_at <= MAX_RUN_AT):
        return f"run_at must be epoch seconds up to {MAX_RUN_AT:.0f}, got {run_at!r}"
    return None


def _debounced(fn: Function, version: int, payload: Any, meta: str, idempotency_key: str | None,
               run_at: float | None, delay_s: float | None) -> tuple[str, int]:
    """The meta and delay of a DEBOUNCE function's job: its rendered key, period and
    max_wait for the enqueue script (job_put in lua/includes/jobs.lua), due a period on."""
    d = fn.debounce
    assert d is not None
    if idempotency_key is not None or run_at is not None or delay_s:
        raise ValidationFailed(fn.name, version, [FieldError("$", (
            f"{fn.name} is debounced (DEBOUNCE): its start follows its burst, and its burst's enqueues "
            "share one job, so an enqueue takes no idempotency key, delay or run_at"))])
    try:
        key = d.key.render(payload)
    except templates.TemplateError as exc:
        raise ValidationFailed(fn.name, version, [FieldError(
            "$" if exc.field is None else f"$.{exc.field}", f"DEBOUNCE key: {exc}")]) from None
    period_ms, max_ms = int(d.period_s * 1000), int(d.max_wait_s * 1000)
    spec = codec.dumps({records.DEBOUNCE: {"key": key, "period_ms": period_ms, "max_wait_ms": max_ms}})
    return (spec if not meta else spec[:-1] + "," + meta[1:]), period_ms


def encoded(client: Client, type_: str, version: int, payload: Any, bounded: bool = True) -> str:
    """The payload's JSON, refused (ValidationFailed, naming the path) when JSON cannot
    carry a part of it (an integer past 64 bits), when it is nested past codec.MAX_DEPTH or (when
    ``bounded``) over ``[api] max_body_bytes``: a job from any producer (the client, a
    handler's ctx.enqueue, the CLI, a requeue with an edited payload) is held to what a
    request body may carry, so it is refused before it is written to Redis, kept with
    the job and handed to a worker. The size check is a length of the bytes the job is
    written with. Not ``bounded`` (a record runner builds around values already held to
    the limit: a destination's, a stored payload requeued as it is), it is held to what a
    record may hold read back (codec.READ_DEPTH) instead of the user's limit."""
    raw = checked_json(type_, version, payload, codec.MAX_DEPTH if bounded else codec.READ_DEPTH)
    limit = client.runtime.config.api.max_body_bytes
    if bounded and len(raw) > limit:
        raise ValidationFailed(type_, version, [FieldError("$", _too_large(len(raw), limit))])
    return raw.decode()


def checked_json(type_: str, version: int, payload: Any, limit: int = codec.MAX_DEPTH) -> bytes:
    """The payload's JSON by the one encoder, or ValidationFailed naming the path: nested
    past ``limit``, or a part JSON cannot carry (NaN, an infinity, an integer past 64 bits,
    a set). A process-isolated handler's ctx.enqueue and ctx.invoke call it before their
    payload crosses the channel to the parent, whose plain encoding wrote NaN as null."""
    try:
        return codec.dumpb_checked(payload, limit)
    except codec.TooDeep as exc:
        raise ValidationFailed(type_, version, [FieldError(exc.path, str(exc))]) from None
    except codec.EncodeError:  # an integer past 64 bits, a set...: named as HTTP and the CLI name it
        path, why = codec.not_json(payload) or ("$", "the payload is not JSON")
        raise ValidationFailed(type_, version, [FieldError(path, why)]) from None


def _too_large(size: int, limit: int) -> str:
    """Why a payload of ``size`` bytes of JSON is refused, and what to do instead."""
    return (f"the payload is {size:,} bytes of JSON, over [api] max_body_bytes = {limit:,} (the most one job "
            "may carry, from any producer): keep large data elsewhere (object storage, a table) and pass a "
            "reference to it, or raise the limit in runner.toml")


async def _aprepare(client: Client, type_: str, *args: Any) -> Prepared:
    """``_prepare`` in the caller, or on a thread for a function whose schema has a
    backtracking pattern (see catalog/schemas.py): its matching may take up to
    PATTERN_BUDGET_S, and the event loop serves other requests meanwhile. So are the
    errors of an invalid payload listed: the caller only asks whether it validates."""
    if client.runtime.registry.get(type_).versions.backtracks:
        return await asyncio.to_thread(_prepare, client, type_, *args)
    try:
        return _prepare(client, type_, *args, listing=False)
    except Unlisted:
        return await asyncio.to_thread(_prepare, client, type_, *args)


# --- the public calls ------------------------------------------------------------------

def enqueue(
    client: Client, type: str, payload: Any, *, version: int | None = None, delay: float | None = None,
    run_at: float | None = None, idempotency_key: str | None = None, traceparent: str | None = None,
    priority: int | None = None,
    waited: bool = False,
) -> Enqueued:
    """Validate and enqueue one job. A duplicate key returns the first job
    (``duplicate=True``); the same key with another payload raises IdempotencyConflict.
    With ``[redis] wait_replicas``, it returns once that many replicas hold the job,
    and raises NotReplicated (the job written, but not confirmed) when they do not.

    Safe from many threads at once: calls that overlap share one round trip. With
    ``waited``, the job's end is published for the waits of ``wait`` and ``call``.
    """
    if tracing.enabled():  # one check when tracing is off; the span only when on
        with tracing.enqueue_span(type) as span:
            tp = traceparent or tracing.current_traceparent()
            prep = _prepare(client, type, payload, version, delay, run_at, idempotency_key, tp, priority, waited)
            out = _one(client.sender.submit(prep))
            tracing.annotate(span, id=out.id, queue=out.queue)
            return out
    prep = _prepare(client, type, payload, version, delay, run_at, idempotency_key, traceparent, priority, waited)
    return _one(client.sender.submit(prep))


async def aenqueue(
    client: Client, type: str, payload: Any, *, version: int | None = None, delay: float | None = None,
    run_at: float | None = None, idempotency_key: str | None = None, traceparent: str | None = None,
    priority: int | None = None,
    waited: bool = False,
) -> Enqueued:
    """``enqueue`` for asyncio code (an ASGI app, a FastAPI route): the same checks and
    answers, without blocking the event loop. Validation runs in the caller; the
    round trip runs on a thread of the client's own, and calls that overlap, from any
    number of tasks, share one."""
    if tracing.enabled():
        with tracing.enqueue_span(type) as span:
            tp = traceparent or tracing.current_traceparent()
            prep = await _aprepare(client, type, payload, version, delay, run_at, idempotency_key, tp, priority,
                                   waited)
            out = await client.sender.asend(prep)
            tracing.annotate(span, id=out.id, queue=out.queue)
            return out
    prep = await _aprepare(client, type, payload, version, delay, run_at, idempotency_key, traceparent, priority,
                           waited)
    return await client.sender.asend(prep)


async def asend(client: Client, prep: Prepared) -> Enqueued:
    """The write half of ``aenqueue``, for a job ``prepare`` made (the HTTP fast lane):
    on the event loop's own connection where it can (see aiolink.py), else on the
    thread of the client's own."""
    return await client.sender.asend(prep)


def enqueue_many(client: Client, requests: Iterable[Request], batch: int = MAX_BATCH) -> list[Enqueued | RunnerError]:
    """Validate and enqueue many jobs: one script call per queue for every ``batch``
    jobs (at most STREAM_CHUNK), streamed on one connection so that the next call is
    prepared while Redis runs the last.

    Returns one entry per request, in order: the Enqueued job or the error that refused
    it (ValidationFailed, UnknownFunction, UnknownVersion, IdempotencyConflict).
    Redis going away or refusing (maxmemory) raises RedisUnavailable, whose
    ``results`` say what became of each job (``written``: those written; from an
    iterator, those taken from it: the rest were not sent) and whose
    ``undetermined`` names those of the at most STREAM_WINDOW calls in flight on a
    lost connection, which may or may not have run. With
    ``[redis] wait_replicas``, each call is confirmed by the replicas before its
    answer is read; the first that is not raises NotReplicated naming its jobs (the
    calls answered before it were confirmed; those in flight are undetermined).
    """
    results: list[Enqueued | RunnerError] = []

    def prepared() -> Iterator[tuple[int, Prepared]]:
        for req in requests:
            try:
                item = (len(results), prepare(client, req))
            except RunnerError as exc:
                results.append(exc)
                continue
            results.append(_UNSENT)
            yield item

    try:
        client.sender.stream(prepared(), max(1, min(batch, STREAM_CHUNK)), results)
    except RedisUnavailable as exc:
        if isinstance(requests, Sized):  # the requests never taken were not sent either
            exc.results += [None] * (len(requests) - len(exc.results))
        raise
    return results


def enqueue_all(client: Client, requests: Sequence[Request]) -> list[Enqueued | IdempotencyConflict]:
    """Validate every request first, then enqueue them all as ``enqueue_many`` does.

    All or nothing at validation: one invalid payload raises ValidationFailed with the
    errors of every invalid one, each path prefixed with its index (``$[3].to``), and
    nothing is sent. An unknown type or version raises as for one job. After that, an
    idempotency conflict is that job's answer, not the batch's; Redis going away
    raises RedisUnavailable saying which jobs were written (as ``enqueue_many``), and replicas
    short of ``wait_replicas`` raise NotReplicated (as ``enqueue_many``).
    """
    prepared: list[tuple[int, Prepared]] = []
    invalid: ValidationFailed | None = None
    errors: list[FieldError] = []
    with one_request():  # its payloads share one pattern budget and one limit on listed errors
        for i, req in enumerate(requests):
            try:
                prepared.append((i, prepare(client, req)))
            except ValidationFailed as exc:
                invalid = invalid or exc
                errors += [replace(e, path=f"$[{i}]{e.path[1:]}") for e in exc.errors]
    if invalid is not None:
        raise ValidationFailed(invalid.type, invalid.version, errors)
    results: list[Any] = [None] * len(prepared)
    client.sender.stream(prepared, STREAM_CHUNK, results)
    return results


def group(client: Client, members: Sequence[Request], then: Request) -> groups.Group:
    """Enqueue ``members`` (one queue) and a ``then`` job that runs once, after every
    member finished, with their outcomes in its payload's "group" field. Everything is
    validated first (InvalidGroup with every problem, nothing written). Redis refusing
    the writes part-way (maxmemory; a group goes 500 members a call) raises
    RedisUnavailable whose ``results`` name the members written: they run, and the
    group is never sealed (its then-job never runs)."""
    if tracing.enabled():  # one enqueue span; every member and the then-job in its trace
        with tracing.enqueue_span("group") as span:
            tp = tracing.current_traceparent()
            out = groups.create(client, [m if m.traceparent else replace(m, traceparent=tp) for m in members],
                                then if then.traceparent else replace(then, traceparent=tp))
            tracing.annotate(span, group=out.id, queue=out.queue)
            return out
    return groups.create(client, members, then)


# --- the one send path -----------------------------------------------------------------

class Sender:
    """A client's enqueue writes: where each job goes (``plan``), the three transports,
    and what each job is answered (``answer``)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        # Threads that call enqueue wait on each round trip: their calls poll for the
        # reply before sleeping (transport._Spin). The asyncio path does not: its sender
        # thread would hold the GIL against the event loop.
        self.combiner: Combiner[Prepared, _Answer] = Combiner(
            functools.partial(self.send, spin=True), max_batch=MAX_BATCH
        )
        self._async_combiner: AsyncCombiner[Prepared, _Answer] = AsyncCombiner(self.send, max_batch=MAX_BATCH)
        self.spread = routing.Spread()  # where jobs without a route go (partitioned queues)
        # The asyncio path's own connection on the caller's event loop (aiolink.py), made
        # on first use; None until then, False where the URL or [redis] wait_replicas
        # leaves it to the thread above (Sentinel, Cluster, WAIT).
        self.aiolink: AsyncLink | bool | None = None
        # (the HTTP fast lane's merged bodies: a round trip of SCRIPT_BYTES of payloads at most)
        self._loop_combiner: LoopCombiner[Prepared, _Answer] = LoopCombiner(
            self._send_on_loop, MAX_BATCH, size=_prepared_bytes, max_bytes=records.SCRIPT_BYTES)
        # Redis Cluster: a combiner (and an asyncio one) per queue partition, so one round
        # trip holds one master's calls only: a master slow to answer (a WAIT short of
        # replicas, a stalled process) delays its own callers, never those of the others.
        # One server: the one combiner above (one round trip per call, as ever).
        self._by_partition = "+cluster://" in runtime.config.redis.url
        self._lanes: dict[tuple[str, int], Combiner[Prepared, _Answer]] = {}
        self._async_lanes: dict[tuple[str, int], AsyncCombiner[Prepared, _Answer]] = {}

    def close(self) -> None:
        if isinstance(self.aiolink, AsyncLink):
            self.aiolink.close()

    def submit(self, prep: Prepared) -> _Answer:
        """One job sent in the round trip it shares with concurrent callers (its
        partition's, on Redis Cluster): its answer."""
        if not self._by_partition:
            return self.combiner.submit(prep)
        lane = self._lane(prep)
        combiner = self._lanes.get(lane)
        if combiner is None:  # (setdefault: threads that race for a new lane get one)
            combiner = self._lanes.setdefault(lane, Combiner(
                functools.partial(self.send, spin=True, to=lane[1]), max_batch=MAX_BATCH))
        return combiner.submit(prep)

    async def _asubmit(self, prep: Prepared) -> _Answer:
        """``submit`` from an event loop, on a sender thread (one per partition on Redis
        Cluster)."""
        if not self._by_partition:
            return await self._async_combiner.submit(prep)
        lane = self._lane(prep)
        combiner = self._async_lanes.get(lane)
        if combiner is None:
            combiner = self._async_lanes.setdefault(lane, AsyncCombiner(
                functools.partial(self.send, to=lane[1]), max_batch=MAX_BATCH))
        return await combiner.submit(prep)

    def _lane(self, prep: Prepared) -> tuple[str, int]:
        """The queue and partition a job goes to by the current count (as ``plan`` places
        it; a keyless job's is picked now, and its round trip sends it there)."""
        queue = prep.fn.queue
        n = self.runtime.parts[queue][0].partitions
        if n <= 1:
            return queue, 0
        key = routing.route(prep.job)
        return queue, (routing.partition_of(key, n) if key else self.spread.current(n))

    def plan(self, items: Iterable[_Item], discover: bool = True, to: int = -1) -> list[_Call]:
        """The enqueue script calls of a send: one per queue partition its jobs go to
        (keyless jobs to partition ``to`` when given)."""
        by_queue: dict[str, list[_Item]] = {}
        for item in items:
            by_queue.setdefault(item[1].fn.queue, []).append(item)
        # A partition's jobs in calls of at most records.SCRIPT_BYTES of payloads each.
        return [(queue, k, list(part)) for queue, queued in by_queue.items()
                for k, sub in self.partitioned(queue, queued, _job_of, discover, to)
                for part in (records.by_bytes(sub, _payload_bytes) if len(sub) > 1 else (sub,))]

    def partitioned(self, queue: str, items: Sequence[_T], job: Callable[[_T], NewJob],
                    discover: bool = True, to: int = -1) -> list[tuple[QueueKeys, list[_T]]]:
        """``items`` of one queue by the partition their jobs go to (see store/routing.py);
        the current count's partitions only, never a draining one. ``discover``: record
        this producer's tags when due (tagset.py), a blocking round trip; the event loop's
        path leaves that to the thread's (see asend). ``to``: the partition of the jobs
        without a route (-1: the spread's next)."""
        rt = self.runtime
        if discover:
            rt.discover_due(record=True, aside=self._by_partition)
        parts = rt.parts[queue]
        n = parts[0].partitions
        place = rt.placements.get(queue)
        if n == 1 and place is None:
            return [(parts[0], list(items))]
        jobs = [job(i) for i in items]
        split = routing.split(jobs, n, self.spread, to)
        if place is not None:  # another count was in use lately: its keys are looked up
            with reachable():
                split = place.relocate(rt.redis, jobs, split, parts)
        return [(parts[p], [items[i] for i in idx]) for p, idx in split.items()]

    def answer(self, calls: Sequence[_Call], replies: Sequence[Any], out: list[Any],
               short: NotReplicated | None = None, short_calls: Container[int] | None = None) -> None:
        """Each job's answer from its call's reply (code, job id, status per job: see
        enqueue.lua) at its index in ``out``: its job, an idempotency conflict, or the
        call's failure (Redis away: RedisUnavailable, and a partition of a partitioned
        queue is passed over by keyless jobs for a while). ``short``: the replicas did
        not confirm the calls numbered in ``short_calls`` (None: every call), each of
        whose jobs is written but NotReplicated; the other calls' jobs were confirmed."""
        for c, ((queue, k, items), reply) in enumerate(zip(calls, replies, strict=True)):
            if isinstance(reply, BaseException):
                failure: BaseException = link_mod.raised(reply) if isinstance(reply, link_mod.ReplyError) else reply
                if isinstance(failure, (*UNAVAILABLE, RedisUnavailable)):
                    # The reply itself as the cause: the HTTP API tells a refused write
                    # (MISCONF, OOM) from a lost connection by it.
                    failure = unreachable(failure, _unknown(reply))
                    failure.__cause__ = reply
                    if k.partitions > 1:
                        # A master given up (stalled) is passed over until it answers again.
                        nodes = self.runtime.scripts.nodes
                        node = nodes.node([k.ready]) if isinstance(reply, NodeStalled) else ""
                        self.spread.avoid(k.partition, functools.partial(nodes.stalled, node) if node else None)
                for index, _ in items:
                    out[index] = failure
                continue
            unconfirmed = short is not None and (short_calls is None or c in short_calls)
            for n, (index, prep) in enumerate(items):
                out[index] = one = _outcome(prep, queue, reply, n)
                if unconfirmed and short is not None and not isinstance(one, IdempotencyConflict):
                    out[index] = _unconfirmed(short, [reply[3 * n: 3 * n + 3]])

    # The batch: one round trip (the Combiner's send) --------------------------------

    def send(self, preps: Sequence[Prepared], spin: bool = False, again: int = 8, to: int = -1) -> list[_Answer]:
        """One round trip: one enqueue script call per queue partition the jobs go to (and one WAIT
        after them all, with ``wait_replicas``: then each caller short of replicas is
        answered NotReplicated for its own job). A partition whose node could not be
        reached is avoided for a while by keyless jobs, and the keyless jobs of a call that
        was never sent go to another partition at once (they may go anywhere; ``again``
        more times at most). ``to``: the partition of the keyless jobs (-1: the spread's
        next; a partition's combiner on Redis Cluster picked it already, and the jobs
        picked after this go to the next)."""
        if to >= 0:
            self.spread.advance()
        out = self._send_once(preps, spin, to)
        if again <= 0:
            return out
        spare = [i for i, o in enumerate(out)
                 if isinstance(o, RedisUnavailable) and _never_sent(o) and not routing.route(preps[i].job)
                 and len(self.runtime.parts[preps[i].fn.queue]) > 1]
        if spare:
            for i, o in zip(spare, self.send([preps[i] for i in spare], spin, again - 1), strict=True):
                out[i] = o
        return out

    def _send_once(self, preps: Sequence[Prepared], spin: bool = False, to: int = -1) -> list[_Answer]:
        scripts = self.runtime.scripts
        short: NotReplicated | None = None
        short_calls: list[int] = []
        calls = self.plan(enumerate(preps), to=to)
        batch = None
        try:
            if len(calls) == 1:
                _, k, items = calls[0]
                replies = [scripts.enqueue(k, [p.job for _, p in items], spin=spin)]
            else:
                batch = scripts.batch()
                for _, k, items in calls:
                    scripts.enqueue(k, [p.job for _, p in items], pipe=batch)
                # Each call answers its own callers: one that ran keeps its jobs' answers
                # whatever befalls a later one.
                replies = batch.execute(raise_on_error=False)
        except UNAVAILABLE as exc:
            if len(calls) != 1:
                raise unreachable(exc) from exc
            replies = [exc]  # one call: its jobs' answer, as a batch's call failing alone
        except NotReplicated as exc:
            replies, short = exc.replies, exc
            # Only the calls whose own WAIT fell short are unconfirmed (on Redis Cluster
            # each call waits on its own master; on one server the one WAIT is every
            # call's): the others' jobs are on masters whose replicas hold them.
            short_calls = batch.short if batch is not None else [0]
            # Keyless jobs may go anywhere: a partition whose master is short of replicas
            # (a promoted one with none yet) costs each round trip there the whole WAIT
            # timeout and a NotReplicated, so it is passed over for a while, as one that
            # could not be reached.
            for j in short_calls:
                k = calls[j][1]
                if k.partitions > 1:
                    self.spread.avoid(k.partition)
        out: list[Any] = [None] * len(preps)
        self.answer(calls, replies, out, short, short_calls)
        return out

    # The loop: the event loop's own connection ------------------------------------

    async def asend(self, prep: Prepared) -> Enqueued:
        link = self.aiolink
        if link is None:
            link = self.aiolink = self._make_aiolink()
        # (A queue whose keys another count placed lately looks them up first, on the thread.)
        rt = self.runtime
        if (isinstance(link, AsyncLink) and link.usable() and not rt.record_due()
                and prep.fn.queue not in rt.placements):
            return _one(await self._loop_combiner.submit(prep))
        return _one(await self._asubmit(prep))

    def _make_aiolink(self) -> AsyncLink | bool:
        cfg = self.runtime.config.redis
        where = link_mod.address(cfg.url)
        if where is None or cfg.wait_replicas > 0:
            return False
        return AsyncLink(where, tls_verify=cfg.tls_verify, ca_cert=cfg.ca_cert)

    async def _send_on_loop(self, preps: Sequence[Prepared]) -> list[_Answer]:
        """``send`` on the event loop's connection: the calls pipelined in one write (a
        script Redis lost is loaded and sent again: transport.send_on_loop)."""
        link = self.aiolink
        assert isinstance(link, AsyncLink)
        scripts = self.runtime.scripts
        calls = self.plan(enumerate(preps), discover=False)
        wire = [scripts.enqueue_call(k, [p.job for _, p in items], mark_ms=scripts.mark_for(k))
                for _, k, items in calls]
        try:
            replies = await transport.send_on_loop(link, scripts, wire)
        except RedisUnavailable as exc:  # no reply read: every call's outcome is unknown
            raise unreachable(exc) from exc
        out: list[Any] = [None] * len(preps)
        self.answer(calls, replies, out)
        return out

    # The stream: chunks on one connection, as they come ----------------------------

    def stream(self, prepared: Iterable[_Item], size: int, results: list[Any]) -> None:
        """Send the jobs in chunks of ``size`` on one stream, as they come, and put each
        answer at its index in ``results``."""
        stream = self.runtime.scripts.stream()
        chunk: list[_Item] = []
        try:
            for item in prepared:
                chunk.append(item)
                if len(chunk) >= size:
                    self._stream_chunk(stream, chunk, results)
                    chunk = []
            if chunk:
                self._stream_chunk(stream, chunk, results)
            while len(stream):
                self._hand_answer(stream.read(), results)
        except UNAVAILABLE as exc:
            raise self._part_way(exc, stream, results) from exc
        except NotReplicated as exc:
            raise _unconfirmed(exc) from None
        finally:
            stream.close()

    def _stream_chunk(self, stream: Stream, chunk: Sequence[_Item], results: list[Any]) -> None:
        """Send one call per queue partition for the chunk (the call is its tag); read the
        oldest replies past the window."""
        scripts = self.runtime.scripts
        for call in self.plan(chunk):
            _, k, items = call
            size = sum(map(_payload_bytes, items))
            # Sent once the calls in flight and it hold WRITE_BYTES of payloads at most (or
            # it is alone): a chunk's 12 calls of 8 MiB, read into a paused server's buffer
            # (CLIENT PAUSE WRITE), ran back to back once let go, a PING waiting 0.6-0.9 s.
            while len(stream) and stream.held + size > transport.WRITE_BYTES:
                self._hand_answer(stream.read(), results)
            stream.send(*scripts.enqueue_call(k, [p.job for _, p in items], mark_ms=scripts.mark_for(k)),
                        tag=call, durable=True, size=size)
        while len(stream) > STREAM_WINDOW:
            self._hand_answer(stream.read(), results)

    def _hand_answer(self, answered: tuple[_Call, Any], results: list[Any]) -> None:
        """Hand each job of one streamed call its answer."""
        call, reply = answered
        self.answer([call], [reply], results)

    def _part_way(self, exc: BaseException, stream: Stream, results: list[Any]) -> RedisUnavailable:
        """RedisUnavailable for a batch cut short: each job's answer where Redis gave one
        (the calls read behind a refused one included: see Stream), None where nothing was
        written, and the jobs of calls in flight on a lost connection as undetermined."""
        answered, lost = stream.answered()  # (Redis Cluster: the calls still on the masters' threads)
        for tag, reply in [*answered, *getattr(exc, "behind", ())]:
            if not isinstance(reply, BaseException):
                self._hand_answer((tag, reply), results)
        unknown = sorted(index for _, _, items in [*getattr(exc, "unknown", ()), *lost] for index, _ in items)
        final = [None if r is _UNSENT else r for r in results]
        n = sum(1 for r in final if r is None or isinstance(r, Enqueued))
        written = sum(1 for r in final if isinstance(r, Enqueued))
        told = f"; {written} of {n} job(s) written (RedisUnavailable.written)" if n > 1 else ""
        if unknown:
            told += f", {len(unknown)} undetermined (RedisUnavailable.undetermined)"
        out = unreachable(exc, told)
        out.results, out.undetermined = final, unknown
        return out


def _job_of(item: _Item) -> NewJob:
    return item[1].job


def _payload_bytes(item: _Item) -> int:
    return records.text_bytes(item[1].job.payload)


def _prepared_bytes(prep: Prepared) -> int:
    return records.text_bytes(prep.job.payload)


def _outcome(prep: Prepared, queue: str, reply: Sequence[Any], n: int) -> Enqueued | IdempotencyConflict:
    """The n-th job's answer from the enqueue script: code, job id, status (see enqueue.lua)."""
    code, job_id, status = int(reply[3 * n]), reply[3 * n + 1], reply[3 * n + 2]
    if code < 0:
        return IdempotencyConflict(prep.job.idem_key, job_id)
    # Positional: on the web route's every request, keywords cost the frozen dataclass
    # about a third more.
    if prep.fn.debounce is not None:  # code 2: absorbed into the burst's job (see jobs.lua)
        return Enqueued(job_id, prep.fn.name, prep.job.version, queue, status, False, True)
    return Enqueued(job_id, prep.fn.name, prep.job.version, queue, status, code == 0)


def _one(out: _Answer) -> Enqueued:
    """A single enqueue's answer: the job, or its refusal (idempotency conflict, not
    replicated, its script call's failure) raised."""
    if isinstance(out, Exception):
        raise out
    return out


def _unconfirmed(exc: NotReplicated, replies: Sequence[Any] | None = None, write: str = "enqueue") -> NotReplicated:
    """``exc`` naming the jobs of the enqueue replies (code, id, status per job) it holds."""
    replies = exc.replies if replies is None else replies
    ids = [str(i) for reply in replies for i in reply[1::3]]
    return NotReplicated(exc.acked, exc.wanted, exc.timeout_s, job_ids=ids, replies=replies, write=write)


def _never_sent(exc: BaseException) -> bool:
    """Whether an enqueue failed while connecting (refused, or timed out before a
    connection was made), or was not sent to a master known stalled: nothing reached
    Redis, so its jobs may go elsewhere without being written twice."""
    cause = exc.__cause__
    if isinstance(cause, NodeStalled):
        return not cause.sent
    return cause is not None and " connecting to " in str(cause)


def _unknown(reply: BaseException) -> str:
    """What an enqueue's failure tells of its jobs when the call went out and no answer
    came (a timeout, a connection lost mid-call, a stalled master given up): they may
    have been written. Nothing for a refusal, or a call never sent."""
    if refusal(reply) is not None or isinstance(reply, (link_mod.ReplyError, redis_errors.ResponseError)):
        return ""
    if (isinstance(reply, NodeStalled) and not reply.sent) or " connecting to " in str(reply):
        return ""
    return ("; the job(s) may have been written (the call went out and no answer came): send again "
            "with the same idempotency key (never written twice), or look the job up first")
