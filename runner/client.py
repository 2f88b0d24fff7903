"""The public Python client: enqueue (one or many), look up jobs, queue figures, and the
dead-letter operations. The HTTP API and the CLI are thin shells over it; a Django or
Flask app uses it directly::

    from runner import Client
    client = Client.from_config()                # ./runner.toml + environment
    job = client.enqueue("send_email", {"user_id": 7, "to": "a@b.c", "template": "welcome"})
    client.get(job.id).as_dict()["status"]
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from runner import config as config_mod
from runner import groups
from runner.catalog import templates
from runner.errors import (
    FieldError,
    GroupNotFound,
    IdempotencyConflict,
    JobEnded,
    JobFailed,
    JobNotFound,
    NotReplicated,
    RedisUnavailable,
    RunnerError,
    StillRunning,
    UnknownQueue,
    UnknownSchedule,
    ValidationFailed,
)
from runner.observe import tracing
from runner.runtime import Runtime
from runner.store import audit as audit_log
from runner.store import codec, keys, listing, records, routing, session, tracecontext
from runner.store import groups as group_store
from runner.store import link as link_mod
from runner.store.aiolink import AsyncLink
from runner.store.combiner import AsyncCombiner, Combiner, LoopCombiner
from runner.store.connection import UNAVAILABLE
from runner.store.keys import QueueKeys
from runner.store.schedules import ServerClock, State, read_states
from runner.store.scripts import NewJob, Stream
from runner.store.waiter import wait_until

if TYPE_CHECKING:
    # The catalog's loader (and the cron parser behind its schedules) comes with the first
    # registry loaded, not with the client: reading jobs loads none.
    from runner.catalog.registry import Function
    from runner.catalog.schedules import Schedule

MAX_BATCH = 500
# enqueue_many: jobs per script call, and calls in flight on its connection at once.
# Smaller calls let the client prepare the next while Redis runs the last.
STREAM_CHUNK = 100
STREAM_WINDOW = 2
# How long a cancel of a job claimed ahead waits to learn whether its worker dropped it.
CANCEL_AHEAD_S = 2.0

auditlog = logging.getLogger("runner.audit")
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Enqueued:
    id: str
    type: str
    version: int
    queue: str
    status: str
    duplicate: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "type": self.type, "version": self.version, "queue": self.queue,
                "status": self.status, "duplicate": self.duplicate}


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


class _Prepared(NamedTuple):  # one per job on the enqueue path: see NewJob
    fn: Function
    job: NewJob


def _too_large(size: int, limit: int) -> str:
    """Why a payload of ``size`` bytes of JSON is refused, and what to do instead."""
    return (f"the payload is {size:,} bytes of JSON, over [api] max_body_bytes = {limit:,} (the most one job "
            "may carry, from any producer): keep large data elsewhere (object storage, a table) and pass a "
            "reference to it, or raise the limit in runner.toml")


def _outcome(prep: _Prepared, queue: str, reply: Sequence[Any], n: int) -> Enqueued | IdempotencyConflict:
    """The n-th job's answer from the enqueue script: code, job id, status (see enqueue.lua)."""
    code, job_id, status = int(reply[3 * n]), reply[3 * n + 1], reply[3 * n + 2]
    if code < 0:
        return IdempotencyConflict(prep.job.idem_key, job_id)
    # Positional: on the web route's every request, keywords cost the frozen dataclass
    # about a third more.
    return Enqueued(job_id, prep.fn.name, prep.job.version, queue, status, code == 0)


# One caller's answer from a combined round trip: its job, or why not (a refusal, or the
# failure of the one script call that held the job: the round trip's other calls may
# have been answered).
_Answer = Enqueued | IdempotencyConflict | NotReplicated | Exception


def _one(out: _Answer) -> Enqueued:
    """A single enqueue's answer: the job, or its refusal (idempotency conflict, not
    replicated, its script call's failure) raised."""
    if isinstance(out, Exception):
        raise out
    return out


def _unconfirmed(exc: NotReplicated, replies: Sequence[Any] | None = None) -> NotReplicated:
    """``exc`` naming the jobs of the enqueue replies (code, id, status per job) it holds."""
    replies = exc.replies if replies is None else replies
    ids = [str(i) for reply in replies for i in reply[1::3]]
    return NotReplicated(exc.acked, exc.wanted, exc.timeout_s, job_ids=ids, replies=replies)


def _settle(answered: tuple[Any, Any], results: list[Any]) -> None:
    """Hand each job of one streamed call its answer (see Client._stream)."""
    (queue, items), reply = answered
    for n, (index, prep) in enumerate(items):
        results[index] = _outcome(prep, queue, reply, n)


class Client:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        # Threads that call enqueue wait on each round trip: their calls poll for the
        # reply before sleeping (scripts._Spin). The asyncio path does not: its sender
        # thread would hold the GIL against the event loop.
        self._combiner: Combiner[_Prepared, _Answer] = Combiner(
            functools.partial(self._send_prepared, spin=True), max_batch=MAX_BATCH
        )
        self._async_combiner: AsyncCombiner[_Prepared, _Answer] = AsyncCombiner(
            self._send_prepared, max_batch=MAX_BATCH
        )
        self._spread = routing.Spread()  # where jobs without a route go (partitioned queues)
        # The asyncio path's own connection on the caller's event loop (aiolink.py), made
        # on first use; None until then, False where the URL or [redis] wait_replicas
        # leaves it to the thread above (Sentinel, Cluster, WAIT).
        self._aiolink: AsyncLink | bool | None = None
        self._loop_combiner: LoopCombiner[_Prepared, _Answer] = LoopCombiner(self._asend_prepared, MAX_BATCH)

    @classmethod
    def from_config(cls, path: str | Path | None = None) -> Client:
        """A client for ./runner.toml (or ``path``, or $RUNNER_CONFIG) and the environment.
        The Redis is the CLI's: REDIS_URL, else the ``[redis] url`` of a file named; else,
        while `runner dev` runs its embedded server for the project, that one (where dev's
        worker runs the jobs); else the file's ``[redis] url`` or the default."""
        named = path is not None or bool(os.environ.get("RUNNER_CONFIG"))
        return cls(Runtime.create(session.follow_dev(config_mod.load(path), named)))

    # --- enqueue -------------------------------------------------------------------

    def prepare(self, req: Request, *, bounded: bool = True) -> _Prepared:
        """Validate and encode one job; raises before anything touches Redis. Without
        ``bounded``, the payload may be over ``[api] max_body_bytes``: only for one the
        runner builds itself from data already bounded (a destination's record)."""
        return self._prepare(req.type, req.payload, req.version, req.delay_s, req.run_at,
                             req.idempotency_key, req.traceparent, req.priority, bounded=bounded)

    def prepare_type(self, type_: str, payload: Any) -> _Prepared:
        """``prepare`` for a job with every option at its default."""
        return self._prepare(type_, payload, None, None, None, None)

    def _prepare(
        self, type_: str, payload: Any, version_: int | None, delay_s: float | None,
        run_at: float | None, idempotency_key: str | None, traceparent: str | None = None,
        priority: int | None = None,
        waited: bool = False,
        bounded: bool = True,
    ) -> _Prepared:
        fn = self.runtime.registry.get(type_)
        version = version_ if version_ is not None else fn.versions.newest
        prio = fn.priority if priority is None else priority
        if not isinstance(prio, int) or isinstance(prio, bool) or not 0 <= prio <= 9:
            raise ValidationFailed(fn.name, version, [FieldError("$", f"priority must be 0 to 9, got {prio!r}")])
        fn.versions.validate(payload, version)
        try:
            if idempotency_key is not None:
                ikey = str(idempotency_key)
                if not ikey or len(ikey.encode()) > templates.MAX_KEY_BYTES:
                    raise templates.TemplateError(
                        f"an idempotency key must be 1 to {templates.MAX_KEY_BYTES} bytes"
                    )
            elif fn.idempotency_key is not None:
                ikey = fn.idempotency_key.render(payload)
            else:
                ikey = ""
            rkey, lims = fn.render_limits(payload)
        except templates.TemplateError as exc:
            raise ValidationFailed(fn.name, version, [FieldError("$", str(exc))]) from None
        # A delay runs on the server's clock (enqueue.lua adds it to TIME); run_at is the
        # caller's own absolute time.
        run_at_ms = delay_ms = 0
        if run_at is not None:
            run_at_ms = int(run_at * 1000)
        elif delay_s:
            if delay_s < 0:
                raise ValidationFailed(fn.name, version, [FieldError("$", "delay must be >= 0")])
            delay_ms = int(delay_s * 1000)
        body = self._encoded(fn.name, version, payload) if bounded else codec.dumps(payload)
        meta = tracecontext.meta_for(traceparent) if traceparent else ""
        if waited:  # the exact text the scripts look for (see waited in _lib.lua)
            meta = '{"' + records.WAITED + '":1' + ("," + meta[1:] if meta else "}")
        # Positional, in NewJob's order (id, type, version, payload, max_attempts, run_at_ms,
        # delay_ms, idem_key, payload_hash, resource_key, limits, meta, priority): keywords
        # cost a NamedTuple 0.35 us more per job, on the route's every request.
        job = NewJob(
            records.new_id(), fn.name, version, body, fn.max_attempts, run_at_ms, delay_ms, ikey,
            codec.canonical_hash(fn.name, version, payload) if ikey else "-", rkey, lims, meta, prio,
        )
        return _Prepared(fn, job)

    def _encoded(self, type_: str, version: int, payload: Any) -> str:
        """The payload's JSON, refused when it is over ``[api] max_body_bytes``: a job
        from any producer (the client, a handler's ctx.enqueue, the CLI, a requeue with an
        edited payload) is held to what a request body may carry, so a large one is
        refused before it is written to Redis, kept with the job and handed to a worker.
        The check is a length of the bytes the job is written with."""
        raw = codec.dumpb(payload)
        limit = self.runtime.config.api.max_body_bytes
        if len(raw) > limit:
            raise ValidationFailed(type_, version, [FieldError("$", _too_large(len(raw), limit))])
        return raw.decode()

    def enqueue(
        self, type: str, payload: Any, *, version: int | None = None, delay: float | None = None,
        run_at: float | None = None, idempotency_key: str | None = None, traceparent: str | None = None,
        priority: int | None = None,
        waited: bool = False,
    ) -> Enqueued:
        """Validate and enqueue one job. A duplicate key returns the first job
        (``duplicate=True``); the same key with another payload raises IdempotencyConflict.
        With ``[redis] wait_replicas``, it returns once that many replicas hold the job,
        and raises NotReplicated (the job written, but not confirmed) when they do not.

        Safe from many threads at once: calls that overlap share one round trip. With
        ``waited``, the job's end is published for the waits of ``settle`` and ``call``.
        """
        if tracing.enabled():  # one check when tracing is off; the span only when on
            with tracing.enqueue_span(type) as span:
                tp = traceparent or tracing.current_traceparent()
                prep = self._prepare(type, payload, version, delay, run_at, idempotency_key, tp, priority,
                                     waited)
                out = _one(self._combiner.submit(prep))
                tracing.annotate(span, id=out.id, queue=out.queue)
                return out
        prep = self._prepare(type, payload, version, delay, run_at, idempotency_key, traceparent, priority,
                             waited)
        return _one(self._combiner.submit(prep))

    async def aenqueue(
        self, type: str, payload: Any, *, version: int | None = None, delay: float | None = None,
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
                prep = self._prepare(type, payload, version, delay, run_at, idempotency_key, tp, priority,
                                     waited)
                out = await self.asend(prep)
                tracing.annotate(span, id=out.id, queue=out.queue)
                return out
        prep = self._prepare(type, payload, version, delay, run_at, idempotency_key, traceparent, priority,
                             waited)
        return await self.asend(prep)

    async def asend(self, prep: _Prepared) -> Enqueued:
        """The write half of ``aenqueue``, for a job ``prepare`` made (the HTTP fast lane):
        on the event loop's own connection where it can (see aiolink.py), else on the
        thread of the client's own."""
        link = self._aiolink
        if link is None:
            link = self._aiolink = self._make_aiolink()
        if isinstance(link, AsyncLink) and link.usable() and not self.runtime.record_due():
            return _one(await self._loop_combiner.submit(prep))
        return _one(await self._async_combiner.submit(prep))

    def _make_aiolink(self) -> AsyncLink | bool:
        cfg = self.runtime.config.redis
        where = link_mod.address(cfg.url)
        if where is None or cfg.wait_replicas > 0:
            return False
        return AsyncLink(where, tls_verify=cfg.tls_verify, ca_cert=cfg.ca_cert)

    async def _asend_prepared(self, preps: Sequence[_Prepared]) -> list[_Answer]:
        """``_send_prepared`` on the event loop's connection: one enqueue script call per
        queue partition, pipelined in one write. A script Redis lost (a restart, SCRIPT
        FLUSH) ran nowhere: it is loaded and sent again."""
        link = self._aiolink
        assert isinstance(link, AsyncLink)
        scripts = self.runtime.scripts
        sha = scripts.shas["enqueue"]
        by_queue: dict[str, list[int]] = {}
        for i, prep in enumerate(preps):
            by_queue.setdefault(prep.fn.queue, []).append(i)
        order = [(queue, k, sub) for queue, idx in by_queue.items()
                 for k, sub in self._partitioned(queue, idx, lambda i: preps[i].job, discover=False)]
        calls = []
        for _, k, idx in order:
            _, keys, args = scripts.enqueue_call(k, [preps[i].job for i in idx])
            calls.append(("EVALSHA", sha, len(keys), *keys, *args))
        try:
            replies: list[Any] = await link.send(calls)
        except RedisUnavailable as exc:  # no reply read: every call's outcome is unknown
            raise RedisUnavailable(f"Redis is unreachable: {exc}") from exc
        # From here each call is answered on its own: a call that ran keeps its jobs'
        # answers whatever befalls a later one (a reload cut off, an error reply).
        lost: RedisUnavailable | None = None
        for n, reply in enumerate(replies):
            if isinstance(reply, link_mod.ReplyError) and reply.code == "NOSCRIPT":  # it ran nowhere
                if lost is None:
                    try:
                        _, replies[n] = await link.send([("SCRIPT", "LOAD", scripts.sources["enqueue"]), calls[n]])
                    except RedisUnavailable as exc:
                        lost = RedisUnavailable(f"Redis is unreachable: {exc}")
                replies[n] = lost if lost is not None else replies[n]
        out: list[Any] = [None] * len(preps)
        for (queue, _, idx), reply in zip(order, replies, strict=True):
            failure: Exception | None = reply if isinstance(reply, RedisUnavailable) else None
            if isinstance(reply, link_mod.ReplyError):
                failure = link_mod.raised(reply)
                if isinstance(failure, RedisUnavailable):
                    failure = RedisUnavailable(f"Redis is unreachable: {failure}")
                    failure.__cause__ = reply
            for n, i in enumerate(idx):
                out[i] = failure if failure is not None else _outcome(preps[i], queue, reply, n)
        return out

    def enqueue_many(
        self, requests: Iterable[Request], batch: int = MAX_BATCH
    ) -> list[Enqueued | RunnerError]:
        """Validate and enqueue many jobs: one script call per queue for every ``batch``
        jobs (at most STREAM_CHUNK), streamed on one connection so that the next call is
        prepared while Redis runs the last.

        Returns one entry per request, in order: the Enqueued job or the error that refused
        it (ValidationFailed, UnknownFunction, UnknownVersion, IdempotencyConflict).
        Redis going away raises RedisUnavailable; calls answered before it are kept, and
        the at most STREAM_WINDOW calls then in flight may or may not have run. With
        ``[redis] wait_replicas``, each call is confirmed by the replicas before its
        answer is read; the first that is not raises NotReplicated naming its jobs (the
        calls answered before it were confirmed; those in flight are undetermined).
        """
        results: list[Enqueued | RunnerError] = []

        def prepared() -> Iterator[tuple[int, _Prepared]]:
            for req in requests:
                try:
                    item = (len(results), self.prepare(req))
                except RunnerError as exc:
                    results.append(exc)
                    continue
                results.append(RunnerError("pending"))
                yield item

        self._send_streamed(prepared(), max(1, min(batch, STREAM_CHUNK)), results)
        return results

    def enqueue_all(self, requests: Sequence[Request]) -> list[Enqueued | IdempotencyConflict]:
        """Validate every request first, then enqueue them all as ``enqueue_many`` does.

        All or nothing at validation: one invalid payload raises ValidationFailed with the
        errors of every invalid one, each path prefixed with its index (``$[3].to``), and
        nothing is sent. An unknown type or version raises as for one job. After that, an
        idempotency conflict is that job's answer, not the batch's; Redis going away
        raises RedisUnavailable with the calls then in flight undetermined, and replicas
        short of ``wait_replicas`` raise NotReplicated (as ``enqueue_many``).
        """
        prepared: list[tuple[int, _Prepared]] = []
        invalid: ValidationFailed | None = None
        errors: list[FieldError] = []
        for i, req in enumerate(requests):
            try:
                prepared.append((i, self.prepare(req)))
            except ValidationFailed as exc:
                invalid = invalid or exc
                errors += [FieldError(f"$[{i}]{e.path[1:]}", e.message) for e in exc.errors]
        if invalid is not None:
            raise ValidationFailed(invalid.type, invalid.version, errors)
        results: list[Any] = [None] * len(prepared)
        self._send_streamed(prepared, STREAM_CHUNK, results)
        return results

    def _send_streamed(self, prepared: Iterable[tuple[int, _Prepared]], size: int, results: list[Any]) -> None:
        """Send the jobs in chunks of ``size`` on one stream, as they come, and put each
        answer at its index in ``results``."""
        stream = self.runtime.scripts.stream()
        chunk: list[tuple[int, _Prepared]] = []
        try:
            for item in prepared:
                chunk.append(item)
                if len(chunk) >= size:
                    self._stream(stream, chunk, results)
                    chunk = []
            if chunk:
                self._stream(stream, chunk, results)
            while len(stream):
                _settle(stream.read(), results)
        except UNAVAILABLE as exc:
            raise RedisUnavailable(f"Redis is unreachable: {exc}") from exc
        except NotReplicated as exc:
            raise _unconfirmed(exc) from None
        finally:
            stream.close()

    def _stream(self, stream: Stream, chunk: Sequence[tuple[int, _Prepared]], results: list[Any]) -> None:
        """Send one call per queue partition for the chunk; read the oldest replies past
        the window."""
        rt = self.runtime
        by_queue: dict[str, list[tuple[int, _Prepared]]] = {}
        for item in chunk:
            by_queue.setdefault(item[1].fn.queue, []).append(item)
        for queue, items in by_queue.items():
            for k, sub in self._partitioned(queue, items, lambda item: item[1].job):
                call = rt.scripts.enqueue_call(k, [p.job for _, p in sub])
                stream.send(*call, tag=(queue, sub), durable=True)
        while len(stream) > STREAM_WINDOW:
            _settle(stream.read(), results)

    def _partitioned(self, queue: str, items: Sequence[_T], job: Callable[[_T], NewJob],
                     discover: bool = True) -> list[tuple[QueueKeys, list[_T]]]:
        """``items`` of one queue by the partition their jobs go to (see store/routing.py);
        the current count's partitions only, never a draining one. ``discover``: record
        this producer's tags when due (tagset.py), a blocking round trip; the event loop's
        path leaves that to the thread's (see asend)."""
        if discover:
            self.runtime.discover_due(record=True)
        parts = self.runtime.parts[queue]
        n = parts[0].partitions
        if n == 1:
            return [(parts[0], list(items))]
        groups = routing.split([job(i) for i in items], n, self._spread)
        return [(parts[p], [items[i] for i in idx]) for p, idx in groups.items()]

    def _send_prepared(self, preps: Sequence[_Prepared], spin: bool = False) -> list[_Answer]:
        """One round trip: one enqueue script call per queue partition the jobs go to (and one WAIT
        after them all, with ``wait_replicas``: then each caller short of replicas is
        answered NotReplicated for its own job)."""
        rt = self.runtime
        short: NotReplicated | None = None
        by_queue: dict[str, list[int]] = {}
        for i, prep in enumerate(preps):
            by_queue.setdefault(prep.fn.queue, []).append(i)
        order = [(queue, k, sub) for queue, idx in by_queue.items()
                 for k, sub in self._partitioned(queue, idx, lambda i: preps[i].job)]
        try:
            if len(order) == 1:
                _, k, idx = order[0]
                replies = [rt.scripts.enqueue(k, [preps[i].job for i in idx], spin=spin)]
            else:
                batch = rt.scripts.batch()
                for _, k, idx in order:
                    rt.scripts.enqueue(k, [preps[i].job for i in idx], pipe=batch)
                # Each call answers its own callers: one that ran keeps its jobs' answers
                # whatever befalls a later one.
                replies = batch.execute(raise_on_error=False)
        except UNAVAILABLE as exc:
            raise RedisUnavailable(f"Redis is unreachable: {exc}") from exc
        except NotReplicated as exc:
            replies, short = exc.replies, exc
        out: list[Any] = [None] * len(preps)
        for (queue, _, idx), reply in zip(order, replies, strict=True):
            if isinstance(reply, Exception):
                failure = reply
                if isinstance(reply, UNAVAILABLE):
                    failure = RedisUnavailable(f"Redis is unreachable: {reply}")
                    failure.__cause__ = reply
                for i in idx:
                    out[i] = failure
                continue
            for n, i in enumerate(idx):
                out[i] = _outcome(preps[i], queue, reply, n)
                if short is not None and not isinstance(out[i], IdempotencyConflict):
                    out[i] = _unconfirmed(short, [reply[3 * n: 3 * n + 3]])
        return out

    # --- groups: fan-out/fan-in (see groups.py) -------------------------------------

    def group(self, members: Sequence[Request], then: Request) -> groups.Group:
        """Enqueue ``members`` (one queue) and a ``then`` job that runs once, after every
        member finished, with their outcomes in its payload's "group" field. Everything is
        validated first (InvalidGroup with every problem, nothing written)."""
        return groups.create(self, members, then)

    def _group_state(self, group_id: str) -> group_store.GroupState:
        if not group_id or len(group_id) > 200:
            raise GroupNotFound(group_id)
        try:
            state = group_store.read(self.runtime.redis, self.runtime.keys, group_id)
        except UNAVAILABLE as exc:
            raise RedisUnavailable(str(exc)) from exc
        if state is None:
            raise GroupNotFound(group_id)
        return state

    def get_group(self, group_id: str) -> dict[str, Any]:
        """A group's progress (GET /groups/{id}): total, done, dead, cancelled, pending, and
        the then-job with its status ("waiting" until the last member finished)."""
        state = self._group_state(group_id)
        view = state.view()
        queue, then_id, then_type = state.then
        status: str | None = "waiting"
        if state.complete:
            try:
                status = self.get(then_id).status
            except JobNotFound:
                status = "pending"  # on its way through the outbox to its queue
        view["then"] = {"id": then_id, "type": then_type, "queue": queue, "status": status}
        return view

    def group_outcomes(self, group_id: str) -> list[Any]:
        """Every member's outcome in member order (None for one not finished yet): what the
        then-job's payload carries, read from Redis for a group too big to carry them."""
        state = self._group_state(group_id)
        try:
            return list(group_store.outcomes(self.runtime.redis, self.runtime.keys[state.queue], group_id,
                                             state.total))
        except UNAVAILABLE as exc:
            raise RedisUnavailable(str(exc)) from exc

    # --- reading -------------------------------------------------------------------

    def _keys(self, queue: str) -> QueueKeys:
        if queue not in self.runtime.keys:
            raise UnknownQueue(queue, list(self.runtime.keys))
        return self.runtime.keys[queue]

    def get(self, job_id: str) -> records.Job:
        """The job record, from whichever queue holds it."""
        k, fields = self._find(job_id)
        return records.Job(job_id, k.queue, fields)

    def _find(self, job_id: str) -> tuple[QueueKeys, dict[str, str]]:
        """The keys of the queue (partition) that holds a job, and the job as readers see it."""
        rt = self.runtime
        if not job_id or len(job_id) > 200:
            raise JobNotFound(job_id)
        try:
            found = records.lookup_many(rt.scripts, self._every(), [job_id]).get(job_id)
        except UNAVAILABLE as exc:
            raise RedisUnavailable(str(exc)) from exc
        if found is None:
            raise JobNotFound(job_id)
        return found

    def _every(self) -> list[QueueKeys]:
        """The keys of every queue's every partition (draining ones included: the tags
        recorded are read again every tagset.RECORD_EVERY_S)."""
        self.runtime.discover_due()
        return [k for parts in self.runtime.parts.values() for k in parts]

    def get_many(self, job_ids: Sequence[str]) -> dict[str, records.Job]:
        """The jobs of these ids that exist, by id, in one round trip."""
        try:
            found = records.lookup_many(self.runtime.scripts, self._every(),
                                        [i for i in job_ids if i and len(i) <= 200])
        except UNAVAILABLE as exc:
            raise RedisUnavailable(str(exc)) from exc
        return {i: records.Job(i, k.queue, fields) for i, (k, fields) in found.items()}

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per queue: ready (plain and priority jobs due now), processing, scheduled, dead,
        and the cluster-wide counters; summed over a partitioned queue's partitions, which
        "partitions" lists one by one."""
        rt = self.runtime
        every = self._every()
        try:
            pipe = rt.redis.pipeline(transaction=False)
            for k in every:
                pipe.llen(k.ready)
                pipe.zcard(k.leases)
                pipe.zcard(k.scheduled)
                pipe.zcard(k.dead)
                pipe.hgetall(k.stats)
                pipe.zcard(k.prio)
            raw = pipe.execute()
        except UNAVAILABLE as exc:
            raise RedisUnavailable(str(exc)) from exc
        out: dict[str, dict[str, Any]] = {}
        for i, k in enumerate(every):
            ready, processing, scheduled, dead, counters, prio = raw[6 * i: 6 * i + 6]
            one = {"ready": ready + prio, "processing": processing, "scheduled": scheduled, "dead": dead,
                   "counters": {name: int(v) for name, v in counters.items()}}
            q = out.get(k.queue)
            if q is None:
                out[k.queue] = q = {**one, "counters": dict(one["counters"])}
            else:
                for f in ("ready", "processing", "scheduled", "dead"):
                    q[f] += one[f]
                for name, v in one["counters"].items():
                    q["counters"][name] = q["counters"].get(name, 0) + v
            if len(rt.parts[k.queue]) > 1:
                q.setdefault("partitions", []).append({"partition": k.partition, "tag": k.tag, **one})
        return out

    def _pause_target(self, queue: str | None, function: str | None) -> tuple[QueueKeys, str | None]:
        """The queue a pause names: a queue, or the queue of a function (UnknownFunction
        when it is not loaded here)."""
        if function is not None:
            return self._keys(self.runtime.registry.get(function).queue), function
        if queue is None:
            raise ValueError("pause a queue or a function")
        return self._keys(queue), None

    def pause(self, queue: str | None = None, *, function: str | None = None, by: str | None = None) -> None:
        """Pause a queue (workers claim nothing from it) or one function (its jobs are held,
        queued, spending nothing); running jobs finish. Every worker obeys at its next claim,
        and hands back at once what it claimed ahead of the pause and has not started.
        ``by`` (a token's name, ``cli:<user>``) puts the pause on the audit trail and the log."""
        k, fn = self._pause_target(queue, function)
        try:
            now = ServerClock(self.runtime.redis, self.runtime.config.redis.prefix).now_ms()
            pipe = self.runtime.redis.pipeline(transaction=False)
            for part in self.runtime.parts[k.queue]:  # each partition's claim reads its own
                pipe.hset(part.paused, "queue" if fn is None else f"fn:{fn}", now)
            pipe.execute()
            # Jobs a worker claimed ahead before the pause must not start either: told on
            # the channel its cancels come by, it hands them back (worker.py). (Not in the
            # pipeline: a cluster client refuses a pipelined PUBLISH.)
            for part in self.runtime.parts[k.queue]:
                self.runtime.redis.publish(part.cancels, f"pause {k.queue} {fn or '*'}")
        except UNAVAILABLE as exc:
            raise RedisUnavailable(str(exc)) from exc
        if by is not None:
            self._on_record(by, "pause", k.queue, **({"function": fn} if fn else {}))

    def resume(self, queue: str | None = None, *, function: str | None = None, by: str | None = None) -> int:
        """Lift a pause; a function's held jobs go back to the front of ready in their order.
        Returns how many were put back. ``by`` puts the resume on the audit trail and the log."""
        k, fn = self._pause_target(queue, function)
        moved = 0
        try:
            for part in self.runtime.parts[k.queue]:
                first = True
                while True:
                    got, left = self.runtime.scripts.resume(part, fn, first)
                    moved, first = moved + int(got), False
                    if not int(left):
                        break
        except UNAVAILABLE as exc:
            raise RedisUnavailable(str(exc)) from exc
        if by is not None:
            self._on_record(by, "resume", k.queue, count=moved,
                            **({"function": fn} if fn else {}))
        return moved

    def paused(self) -> dict[str, dict[str, Any]]:
        """Per queue: whether it is paused and which of its functions are (a pause is
        written to every partition of a queue; its home partition's is read)."""
        rt = self.runtime
        try:
            pipe = rt.redis.pipeline(transaction=False)
            for k in rt.keys.values():
                pipe.hgetall(k.paused)
            raw = pipe.execute()
        except UNAVAILABLE as exc:
            raise RedisUnavailable(str(exc)) from exc
        return {q: pause_view(h) for q, h in zip(rt.keys, raw, strict=True)}

    def flow(self, type_: str) -> dict[str, Any]:
        """A function's flow control now: paused or not, jobs held by its pause, and its
        concurrency limit with the slots in use and jobs parked on it (counted for a
        function-wide limit; a per-key limit has a key of its own per tenant)."""
        fn = self.runtime.registry.get(type_)
        k = self._keys(fn.queue)
        parts = self.runtime.parts[fn.queue]
        conc = fn.concurrency
        # A function-wide limit lives in the partition its key routes every job of it to.
        limit_keys = parts[routing.partition_of(f"c:{fn.name}", parts[0].partitions)]
        lim = limit_keys.limit(f"c:{fn.name}")
        try:
            pipe = self.runtime.redis.pipeline(transaction=False)
            pipe.hexists(k.paused, f"fn:{fn.name}")
            pipe.time()
            pipe.zrange(lim, 0, -1, withscores=True)
            pipe.llen(limit_keys.waiters(f"c:{fn.name}"))
            for part in parts:
                pipe.llen(part.held(fn.name))
            paused, (sec, usec), holders, waiting, *held_each = pipe.execute(raise_on_error=False)
            held = sum(int(n) for n in held_each)
        except UNAVAILABLE as exc:
            raise RedisUnavailable(str(exc)) from exc
        out: dict[str, Any] = {"paused": bool(paused), "held_by_pause": int(held), "concurrency": None}
        if conc is not None:
            now_ms = int(sec) * 1000 + int(usec) // 1000
            keyed = conc.key is not None
            # Holders past their lease are dead workers' slots, freed at the next claim.
            out["concurrency"] = {**conc.describe(),
                                  "running": None if keyed else sum(1 for _, end in holders if end > now_ms),
                                  "waiting": None if keyed else int(waiting)}
        return out

    def dead(self, queue: str, offset: int = 0, limit: int = 50) -> tuple[int, list[records.Job]]:
        """The dead-letter list of a queue, newest first (over all its partitions): (total, page)."""
        self._keys(queue)
        rt = self.runtime
        parts = rt.parts[queue]
        end = offset + max(limit, 1) - 1
        try:
            pipe = rt.redis.pipeline(transaction=False)
            for part in parts:
                pipe.zcard(part.dead)
                pipe.zrevrange(part.dead, 0 if len(parts) > 1 else offset, end, withscores=True)
            got = pipe.execute()
            total = sum(int(n) for n in got[::2])
            # Each partition's newest, merged by time of death; one partition is already a page.
            merged = sorted(((score, job_id, part) for part, rows in zip(parts, got[1::2], strict=True)
                             for job_id, score in rows), key=lambda x: -x[0])
            page = merged if len(parts) == 1 else merged[offset:end + 1]
            ids = [job_id for _, job_id, _ in page]
            pipe = rt.redis.pipeline(transaction=False)
            for _, job_id, k in page:
                pipe.get(k.job(job_id))
                pipe.hgetall(k.state(job_id))
            rows = pipe.execute(raise_on_error=False)
        except UNAVAILABLE as exc:
            raise RedisUnavailable(str(exc)) from exc
        jobs = []
        for n, job_id in enumerate(ids):
            rec, state = rows[2 * n], rows[2 * n + 1]
            rec = rec if isinstance(rec, str) else None
            state = state if isinstance(state, dict) else {}
            jobs.append(records.Job(job_id, queue, records.view(job_id, rec, state, None, None)))
        return total, jobs

    # --- dead-letter operations ----------------------------------------------------

    def requeue(
        self, queue: str, job_id: str, payload: Any = None, version: int | None = None, *,
        by: str | None = None,
    ) -> records.Job:
        """Move a dead job back to ready with a fresh attempt budget. The payload (the
        stored one at its stored version, or an edited one at ``version``, default the
        newest) is validated and must lift to the newest version; an invalid one stays
        dead and the errors are raised. An edited payload is held to ``[api]
        max_body_bytes`` as an enqueued one is.

        ``by`` (a token's name, ``cli:<user>``) puts the requeue on record: an entry in the
        job's history, written in the same step, then the audit trail and the log."""
        k = self._dead_in(queue, job_id)
        rt = self.runtime
        edited = payload is not None
        try:
            fields = self._stored(k, job_id)
            in_dead = rt.redis.zscore(k.dead, job_id) is not None
        except UNAVAILABLE as exc:
            raise RedisUnavailable(str(exc)) from exc
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

        try:
            fn.versions.lift(payload, version)
        except UpgradeFailed as exc:
            raise ValidationFailed(type_, version, [FieldError("$", str(exc))]) from None
        # An edited payload is new data, held to the bound; the stored one is already in Redis.
        body = self._encoded(type_, version, payload) if edited else codec.dumps(payload)
        mark = {"edited": True} if edited else {}
        # Timed by the script (the server's clock), as the rest of the job's times are.
        entry = codec.dumps({"outcome": "requeued", "by": by, **mark}) if by is not None else ""
        try:
            code = rt.scripts.requeue(k, job_id, body, str(version),
                                      codec.canonical_hash(type_, version, payload), entry)
        except UNAVAILABLE as exc:
            raise RedisUnavailable(str(exc)) from exc
        if int(code) < 0:
            raise JobNotFound(job_id)
        if by is not None:
            self._on_record(by, "requeue", queue, job_id=job_id, type=type_, **mark)
        return self.get(job_id)

    def _stored(self, k: QueueKeys, job_id: str) -> dict[str, str]:
        """A job's record and state as stored (a record of the release before this one is
        a hash holding both: the scripts convert it when they next touch it)."""
        r = self.runtime.redis
        kind = r.type(k.job(job_id))
        if kind == "hash":
            return dict(r.hgetall(k.job(job_id)))
        if kind != "string":
            return {}
        return records.view(job_id, r.get(k.job(job_id)), r.hgetall(k.state(job_id)), None, None)

    def delete_dead(self, queue: str, job_id: str, *, by: str | None = None) -> None:
        """Delete a dead job and its record; ``by`` puts it on the audit trail and the log
        (the job's own history goes with it)."""
        k = self._dead_in(queue, job_id)
        try:
            code = self.runtime.scripts.remove(k, job_id)
        except UNAVAILABLE as exc:
            raise RedisUnavailable(str(exc)) from exc
        if int(code) < 0:
            raise JobNotFound(job_id)
        if by is not None:
            self._on_record(by, "delete", queue, job_id=job_id)

    def dead_ids(self, queue: str) -> list[str]:
        self._keys(queue)
        return [i for part in self.runtime.parts[queue] for i in self.runtime.redis.zrange(part.dead, 0, -1)]

    def _dead_in(self, queue: str, job_id: str) -> QueueKeys:
        """The partition of ``queue`` whose dead letters hold ``job_id`` (the queue's home
        partition when none does: the operation then finds no such job, as before)."""
        k = self._keys(queue)
        parts = self.runtime.parts[queue]
        if len(parts) == 1:
            return k
        try:
            pipe = self.runtime.redis.pipeline(transaction=False)
            for part in parts:
                pipe.zscore(part.dead, job_id)
            found = pipe.execute()
        except UNAVAILABLE as exc:
            raise RedisUnavailable(str(exc)) from exc
        return next((part for part, score in zip(parts, found, strict=True) if score is not None), k)

    def purge_dead(self, queue: str, *, by: str | None = None) -> int:
        """Delete every dead job of a queue; returns how many. ``by`` puts the purge on
        record as one entry with the count."""
        n = 0
        for job_id in self.dead_ids(queue):
            try:
                self.delete_dead(queue, job_id)
                n += 1
            except JobNotFound:
                pass
        if by is not None:
            self._on_record(by, "purge", queue, count=n)
        return n

    # --- the audit trail -----------------------------------------------------------

    def _on_record(self, by: str, action: str, queue: str, **detail: Any) -> None:
        """An operator's action, after it was done: on the audit trail (at the server's
        time, one more round trip for a rare action) and in the log."""
        auditlog.info("%s by %s: %s %s", action, by, queue, detail.get("job_id", ""),
                      extra={"audit": action, "by": by, "queue": queue, **detail})
        try:
            now_ms = ServerClock(self.runtime.redis, self.runtime.config.redis.prefix).now_ms()
            entry = {"at_ms": now_ms, "by": by, "action": action, "queue": queue, **detail}
            audit_log.record(self.runtime.redis, keys.audit(self.runtime.config.redis.prefix), entry)
        except UNAVAILABLE as exc:
            raise RedisUnavailable(str(exc)) from exc

    def audit(self, offset: int = 0, limit: int = 50) -> tuple[int, list[dict[str, Any]]]:
        """Who did what, newest first: (entries held, one page). The trail is capped
        (store/audit.py MAX_ENTRIES); the log keeps every entry."""
        try:
            return audit_log.read(self.runtime.redis, keys.audit(self.runtime.config.redis.prefix),
                                  offset, limit)
        except UNAVAILABLE as exc:
            raise RedisUnavailable(str(exc)) from exc
    # --- schedules -----------------------------------------------------------------

    def schedules(self) -> list[dict[str, Any]]:
        """Every schedule of the loaded functions, by id: its definition, the next tick by
        the server's clock, the last tick that fired and the last job with its status,
        and its counts (see _schedule_view)."""
        rt = self.runtime
        scheds = rt.registry.schedules()
        wanted: dict[str, tuple[QueueKeys, list[str]]] = {}
        for s in scheds:
            wanted.setdefault(s.queue, (rt.keys[s.queue], []))[1].append(s.id)
        try:
            now = ServerClock(rt.redis, rt.config.redis.prefix).now_ms()
            states = read_states(rt.redis, wanted, rt.scripts) if scheds else {}
        except UNAVAILABLE as exc:
            raise RedisUnavailable(str(exc)) from exc
        return [_schedule_view(s, states.get(s.id), now) for s in scheds]

    def trigger(self, schedule_id: str) -> Enqueued:
        """Enqueue one tick of a schedule now (to try it by hand): its job carries the
        schedule, the time as its tick and ``"trigger": "manual"``; the schedule's own
        ticks go on as before."""
        rt = self.runtime
        scheds = rt.registry.schedules()
        s = next((x for x in scheds if x.id == schedule_id), None)
        if s is None:
            raise UnknownSchedule(schedule_id, [x.id for x in scheds])
        from runner.catalog.schedules import iso  # loaded with the registry above

        try:
            now = ServerClock(rt.redis, rt.config.redis.prefix).now_ms()
            meta = codec.dumps({"schedule": s.id, "tick": iso(now), "trigger": "manual"})
            job = NewJob(id=records.new_id(), type=s.function, version=s.version, payload=s.payload_json,
                         max_attempts=s.max_attempts, run_at_ms=0, delay_ms=0, idem_key="", payload_hash="-",
                         resource_key=s.resource_key, limits=s.limits, priority=s.priority,
                         meta=meta)
            reply = rt.scripts.tick(rt.keys[s.queue], s.id, job, mode="manual", tick_ms=now, digest=s.digest,
                                    born_ms=now, overlap=s.overlap, missed=0, late_ms=0, now_ms=now)
        except UNAVAILABLE as exc:
            raise RedisUnavailable(str(exc)) from exc
        except NotReplicated as exc:
            raise _unconfirmed(exc) from None
        return Enqueued(id=reply[1], type=s.function, version=s.version, queue=s.queue, status=reply[2])

    def ping(self) -> bool:
        try:
            return bool(self.runtime.redis.ping())
        except UNAVAILABLE:
            return False

    def jobs(self, status: str, *, queue: str | None = None, type: str | None = None, limit: int = 50,
             cursor: str | None = None) -> listing.Page:
        """One page of jobs in ``status`` (see store/listing.py), newest first; pass the
        page's cursor for the next. Raises ValueError for an unknown status or cursor,
        UnknownQueue and UnknownFunction for a queue or type that is not there."""
        if status not in listing.LISTED:
            raise ValueError(f"status must be one of {', '.join(listing.LISTED)}")
        rt = self.runtime
        names = [queue] if queue else list(rt.keys)
        for q in names:
            self._keys(q)  # an unknown queue is refused, naming the configured ones
        if type is not None:
            rt.registry.get(type)  # a type not loaded (a typo) is refused, naming the loaded ones
        # A partitioned queue's partitions are listed one after another, as queues are.
        queues = [(q, k) for q in names for k in rt.parts[q]]
        types_of: dict[str, list[str]] = {}  # each queue's function types (a paused one's jobs are held)
        for fn in sorted(rt.registry.functions.values(), key=lambda f: f.name):
            types_of.setdefault(fn.queue, []).append(fn.name)
        try:
            return listing.page(rt.redis, rt.scripts, queues, status, type, max(1, limit), cursor, types_of)
        except UNAVAILABLE as exc:
            raise RedisUnavailable(str(exc)) from exc

    def by_idempotency_key(self, key: str, *, type: str | None = None) -> list[records.Job]:
        """The jobs holding idempotency key ``key``: of function ``type``, or of any
        loaded function (a key is per type, so several may hold the same one). One round
        trip for the keys, one lookup per job found; a key whose job is gone finds none.
        Raises UnknownFunction for a type not loaded."""
        rt = self.runtime
        fns = [rt.registry.get(type)] if type is not None else list(rt.registry.functions.values())
        # A key's job lives where its route sent it: on a partitioned queue, any partition.
        candidates = [(fn.name, k) for fn in fns if fn.queue in rt.parts for k in rt.parts[fn.queue]]
        try:
            found = listing.holders(rt.redis, candidates, key) if candidates else []
        except UNAVAILABLE as exc:
            raise RedisUnavailable(str(exc)) from exc
        jobs = []
        for _, job_id in found:
            with contextlib.suppress(JobNotFound):
                jobs.append(self.get(job_id))
        return jobs

    # --- cancel -------------------------------------------------------------------

    def cancel(self, job_id: str, *, by: str | None = None) -> str:
        """Cancel a job (see lua/cancel.lua): "cancelled" when it had not started (it never
        will), "requested" when it runs (its handler sees ctx.cancelled within 2 s).
        Raises JobEnded for a job that ended already, JobNotFound for no such job.

        ``by`` (a token's name, ``cli:<user>``) puts the cancel on record: an entry in the
        job's history, written in the same step, then the audit trail and the log."""
        rt = self.runtime
        k, _ = self._find(job_id)
        ttl_ms = int(rt.config.retention.done_s * 1000)
        entry = codec.dumps({"outcome": "cancel", "by": by}) if by is not None else ""  # timed by the script
        try:
            code, status = rt.scripts.cancel(k, job_id, ttl_ms, entry=entry)
        except UNAVAILABLE as exc:
            raise RedisUnavailable(str(exc)) from exc
        if int(code) == -2:
            raise JobEnded(job_id, status)
        if int(code) == -1:
            raise JobNotFound(job_id)
        if by is not None:
            self._on_record(by, "cancel", k.queue, job_id=job_id)
        if int(code) == 3:
            return self._cancelled_ahead(k, job_id)
        return "cancelled" if int(code) == 1 else "requested"

    def _cancelled_ahead(self, k: QueueKeys, job_id: str) -> str:
        """A job a worker had claimed ahead: that worker drops it ("cancelled") unless it
        was starting it at that instant ("requested": its handler is told). Which way
        it went shows within milliseconds; a worker that is gone leaves the job to its
        lease, after which it ends cancelled without running ("requested" meanwhile)."""
        deadline = time.monotonic() + CANCEL_AHEAD_S
        while True:
            try:
                claim = self.runtime.redis.hget(k.claims, job_id)
            except UNAVAILABLE as exc:
                raise RedisUnavailable(str(exc)) from exc
            if claim is None:
                if self.get(job_id).status == "cancelled":
                    return "cancelled"
            elif "p" not in claim.split(" ")[-1]:
                return "requested"  # it started: a cancel of a running job
            if time.monotonic() > deadline:
                return "requested"
            time.sleep(0.005)

    # --- call and wait ------------------------------------------------------------

    def settle(self, job_id: str, timeout_s: float, *, watch: bool = True) -> records.Job:
        """The job once it ended (done or dead), or as it is when ``timeout_s`` passes.

        Pushed, not polled: the wait registers with the process's one subscriber (see
        store/waiter.py) and reads the job after subscribing and after each notice. With
        ``watch`` the job is marked as waited for first (one round trip), so its end is
        published even when it was enqueued without ``waited``."""
        deadline = time.monotonic() + timeout_s
        seen: list[records.Job] = []

        def check() -> bool:
            seen[:] = [self.get(job_id)]
            return seen[0].status in records.ENDED

        def mark() -> None:
            if not check():  # ended already: nothing to mark
                self._watch(job_id, seen[0].queue)

        wait_until(self.runtime.waiter, deadline, check, mark if watch else None, job_id)
        return seen[-1] if seen else self.get(job_id)

    def _watch(self, job_id: str, queue: str) -> None:
        rt = self.runtime
        # A partitioned queue: the mark goes beside the job, in the partition that holds it.
        k = rt.keys[queue] if len(rt.parts[queue]) == 1 else self._find(job_id)[0]
        try:
            rt.scripts.watch(k, job_id)
        except UNAVAILABLE as exc:
            raise RedisUnavailable(str(exc)) from exc

    async def asettle(self, job_id: str, timeout_s: float, *, watch: bool = True) -> records.Job:
        """``settle`` for asyncio code: the wait is a future of the event loop, woken by
        the process's one subscriber; only the reads run on threads."""
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + timeout_s
        event = asyncio.Event()

        def poke() -> None:
            loop.call_soon_threadsafe(event.set)

        waiter = self.runtime.waiter
        waiter.add(job_id, poke)
        try:
            await asyncio.to_thread(waiter.ready, timeout_s)
            job = await asyncio.to_thread(self.get, job_id)
            if watch and job.status not in records.ENDED:
                await asyncio.to_thread(self._watch, job_id, job.queue)
                job = await asyncio.to_thread(self.get, job_id)
            while job.status not in records.ENDED:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), left)
                event.clear()
                # Redis away: the subscription coming back pokes the wait again.
                with contextlib.suppress(RedisUnavailable):
                    job = await asyncio.to_thread(self.get, job_id)
            return job
        finally:
            waiter.discard(job_id, poke)

    def result(self, job_id: str, timeout: float = 30.0) -> Any:
        """The job's result once it is done; raises JobFailed when it ends dead and
        StillRunning when ``timeout`` seconds pass first."""
        return _ended(self.settle(job_id, timeout))

    async def aresult(self, job_id: str, timeout: float = 30.0) -> Any:
        return _ended(await self.asettle(job_id, timeout))

    def call(self, type: str, payload: Any, *, timeout: float = 30.0, version: int | None = None,
             idempotency_key: str | None = None) -> Any:
        """Enqueue and wait for the result (a serverless invoke): as ``result``."""
        job = self.enqueue(type, payload, version=version, idempotency_key=idempotency_key, waited=True)
        # A duplicate is another request's job: it may not carry the waited mark.
        return _ended(self.settle(job.id, timeout, watch=job.duplicate))

    async def acall(self, type: str, payload: Any, *, timeout: float = 30.0, version: int | None = None,
                    idempotency_key: str | None = None) -> Any:
        job = await self.aenqueue(type, payload, version=version, idempotency_key=idempotency_key, waited=True)
        return _ended(await self.asettle(job.id, timeout, watch=job.duplicate))

    def wait(self, job_id: str, timeout_s: float = 10.0, statuses: Sequence[str] = ("done", "dead")) -> records.Job:
        """Poll until the job reaches one of ``statuses`` (tests, scripts and the CLI)."""
        deadline = time.monotonic() + timeout_s
        while True:
            job = self.get(job_id)
            if job.status in statuses or time.monotonic() > deadline:
                return job
            time.sleep(0.02)


def _ended(job: records.Job) -> Any:
    """A waited job's result, or its end raised (JobFailed, StillRunning)."""
    view = job.as_dict()
    if job.status == "done":
        return view.get("result")
    if job.status in ("dead", "cancelled"):
        raise JobFailed(job.id, view.get("last_error"), view.get("reason"))
    raise StillRunning(job.id, job.status)


def _schedule_view(s: Schedule, st: State | None, now_ms: int) -> dict[str, Any]:
    """One schedule as `runner schedules --json`, GET /schedules and the dashboard show it.

    ``state`` says whether the workers fire this definition: "active" (Redis holds it),
    "pending" (no worker has registered it yet) or "superseded" (Redis holds another: a
    different release of the function file is running)."""
    from runner.catalog.schedules import iso  # loaded with the registry that holds ``s``

    st = st or State(digest=None, tick_ms=None, fired_ms=None, job_id=None, job_status=None, late_ms=None)
    state = "pending" if not st.digest else "active" if st.digest == s.digest else "superseded"
    return {
        **s.describe(),
        "next": iso(s.timeline.next_after(now_ms)),
        "last": iso(st.fired_ms),
        "last_job": {"id": st.job_id, "status": st.job_status} if st.job_id else None,
        "state": state,
        "late_s": st.late_ms / 1000 if st.late_ms is not None else None,
        "counts": {"fired": st.fired, "missed": st.missed, "overlap": st.overlapped, "manual": st.manual},
    }


__all__ = ["Client", "Enqueued", "Request"]


def pause_view(raw: dict[str, str]) -> dict[str, Any]:
    """A queue's pause hash as shown: {"paused": bool, "paused_functions": [type, ...]}."""
    return {"paused": "queue" in raw, "paused_functions": sorted(f[3:] for f in raw if f.startswith("fn:"))}
