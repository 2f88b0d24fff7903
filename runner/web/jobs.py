"""POST /jobs/{type} (enqueue) and GET /jobs/{id} (one job). Both share one route, as
the path segment is a function type for POST and a job id for GET. POST
/jobs/{type}/batch enqueues many jobs of one type in one request. Either single-job
route takes ``?wait=S`` (call and wait): it answers once the job ended, or after S
seconds with the usual answer."""

from __future__ import annotations

from typing import Any

import falcon
import falcon.asgi

from runner.catalog.templates import MAX_KEY_BYTES, control_character
from runner.client import Client, Request
from runner.errors import (
    MAX_DELAY_S,
    IdempotencyConflict,
    JobEnded,
    JobNotFound,
    NotWaiting,
    RedisUnavailable,
    SignalPending,
    SignalsFull,
)
from runner.store import codec
from runner.store.listing import LISTED
from runner.store.records import ENDED, Job
from runner.store.refusals import refusal, unreachable
from runner.store.steps import MAX_STEP_BYTES, VALUE_DEPTH, check_signal_name
from runner.web.auth import caller
from runner.web.body import int_param, only_params, read_json, seconds_param, send
from runner.web.fastlane import ENQUEUE_ERROR
from runner.web.holding import Waits
from runner.web.offload import Offload
from runner.web.problems import Problem, body_of, conflict

# Jobs per batch request: enough to amortise a request many times over, few enough that
# one request holds a thread of the web process for milliseconds, not seconds.
MAX_BATCH_JOBS = 1000


def idempotency_key(req: falcon.Request) -> str | None:
    raw = req.get_header("Idempotency-Key")
    if raw is None:
        return None
    # Headers come as latin-1 text of the raw bytes; keys are UTF-8.
    data = raw.encode("latin-1", "replace")
    try:
        key = data.decode("utf-8")
    except UnicodeDecodeError:
        key = ""
    if not key or len(data) > MAX_KEY_BYTES:
        raise Problem(400, "invalid-header", f"Idempotency-Key must be 1 to {MAX_KEY_BYTES} bytes of UTF-8",
                      title="Invalid header", header="Idempotency-Key")
    bad = control_character(key)
    if bad is not None:
        raise Problem(400, "invalid-header", f"Idempotency-Key holds a control character ({bad}), which a key "
                      "cannot carry: send it without", title="Invalid header", header="Idempotency-Key")
    return key


def timing(req: falcon.Request) -> tuple[int | None, float | None, float | None]:
    """The version, delay and run_at query parameters of an enqueue."""
    if not req.query_string:
        return None, None, None
    version = int_param(req, "version", 1, 1_000_000)
    delay = seconds_param(req, "delay", MAX_DELAY_S)
    run_at = seconds_param(req, "run_at", 1e11)
    if delay is not None and run_at is not None:
        raise Problem(400, "invalid-parameter", "give either delay or run_at, not both",
                      title="Invalid parameter", parameter="run_at")
    return version, delay, run_at


class Jobs:
    def __init__(self, client: Client, offload: Offload, waits: Waits) -> None:
        self.client = client
        self.offload = offload
        self.waits = waits

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, name: str) -> None:
        """Validate and enqueue. 202 new, 200 duplicate; nothing touches Redis before the
        payload, the options and the key have passed every check."""
        rt = self.client.runtime
        fn = rt.registry.get(name)  # 404 before the body is read
        only_params(req, "version", "delay", "run_at", "priority", "wait")
        payload = await read_json(req, rt.config.api.max_body_bytes)
        version, delay, run_at = timing(req)
        priority = int_param(req, "priority", 0, 9, None)
        wait = seconds_param(req, "wait", rt.config.api.max_wait_s) if req.query_string else None
        key = idempotency_key(req)
        failed = req.scope.get(ENQUEUE_ERROR)
        if failed is not None:  # the fast lane tried this enqueue: never twice
            raise failed
        job = await self.client.aenqueue(fn.name, payload, version=version, delay=delay, run_at=run_at,
                                         idempotency_key=key, priority=priority, waited=wait is not None)
        if wait is not None:
            # 200 with the job's end when it comes within the wait, else the usual answer,
            # at once when this token (or the process) holds its most waits already: the
            # job is in, and a wait is a convenience a poll can make up for.
            with self.waits.holding(req) as held:
                if held:
                    # A duplicate is another request's job, enqueued perhaps without the mark.
                    ended: Job | None = None
                    try:
                        ended = await self.client.await_job(job.id, wait, watch=job.duplicate)
                    except RedisUnavailable:
                        pass  # the job is in, Redis stopped answering the wait: the usual answer
                    except JobNotFound:
                        if not job.duplicate:
                            raise
                        # The key outlived the first job's record (trimmed by done_max): the
                        # duplicate's answer is all there is to give.
                        send(resp, job.as_dict(), 200)
                        return
                    if ended is not None and ended.status in ENDED:
                        send(resp, ended.as_dict(), 200)
                        return
        if not job.duplicate:
            resp.location = f"/jobs/{job.id}"
        send(resp, job.as_dict(), 200 if job.duplicate else 202)

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, name: str) -> None:
        only_params(req, "wait")
        wait = seconds_param(req, "wait", self.client.runtime.config.api.max_wait_s) if req.query_string else None
        if wait is None:
            # Decoded on the pool's thread: a job's payload or result may be 1 MiB.
            send(resp, await self.offload(lambda: self.client.get(name).as_dict()))
            return
        with self.waits.admit(req):  # past its bound a 429: the answer is the wait's
            job = await self.client.await_job(name, wait)
        send(resp, job.as_dict())


    async def on_delete(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, name: str) -> None:
        """Cancel: 200 {"id", "cancel": "cancelled" | "requested"}; 409 once ended."""
        only_params(req)
        try:
            outcome = await self.offload(self.client.cancel, name, by=caller(req))
        except JobEnded as exc:
            # (the client's words: they name a damaged key, when one is)
            raise Problem(409, "job-ended", str(exc), title="Job ended", job_status=exc.status) from None
        send(resp, {"id": name, "cancel": outcome})


class JobRunNow:
    """POST /jobs/{id}/run-now: a scheduled, retrying or sleeping job goes to ready at once,
    keeping its id and spending no attempt. 200 {"id", "run_now": "queued", "was": the
    status it had}; 409 with the job's status for any other; 404 no job."""

    def __init__(self, client: Client, offload: Offload) -> None:
        self.client = client
        self.offload = offload

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, name: str) -> None:
        only_params(req)
        try:
            was = await self.offload(lambda: self.client.run_now(name, by=caller(req)))
        except NotWaiting as exc:
            raise Problem(409, "not-waiting", str(exc), title="Not waiting for a time", job_id=name,
                          job_status=exc.status) from None
        send(resp, {"id": name, "run_now": "queued", "was": was})


class JobSignal:
    """POST /jobs/{id}/signals/{signal}: the body (any JSON) for the job's
    ctx.wait_for_signal(signal). 202 {"id", "signal", "delivery": "resumed" | "kept"};
    200 {..., "delivery": "duplicate", "duplicate": true} for the Idempotency-Key of the
    last signal of that name the job took (kept or read: nothing delivered);
    409 for a job that ended, or one holding an unread signal of that name; 404 no job."""

    def __init__(self, client: Client, offload: Offload) -> None:
        self.client = client
        self.offload = offload

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, name: str, signal: str) -> None:
        only_params(req)
        try:
            check_signal_name(signal)
        except ValueError as exc:
            raise Problem(400, "invalid-signal", str(exc), title="Invalid signal name") from None
        try:
            data = await read_json(req, min(self.client.runtime.config.api.max_body_bytes, MAX_STEP_BYTES))
        except Problem as exc:
            if exc.slug != "too-deep":
                raise
            # One limit named, whatever the depth: a signal's body is held to VALUE_DEPTH.
            raise Problem(400, "too-deep", f"a signal's body is nested past the limit of {VALUE_DEPTH} levels "
                          "of arrays and objects; flatten it", title="Nested too deep",
                          max_depth=VALUE_DEPTH) from None
        key = idempotency_key(req)  # the delivery's: sent again with it, never delivered twice
        try:
            delivery = await self.offload(self.client.signal, name, signal, data, key=key)
        except JobEnded as exc:
            raise Problem(409, "job-ended", f"job {name} has ended ({exc.status}): no wait will read a signal",
                          title="Job ended", job_status=exc.status) from None
        except SignalPending as exc:
            raise Problem(409, "signal-pending", str(exc), title="Signal pending") from None
        except SignalsFull as exc:
            # Too many kept is a conflict that reading them resolves; too many bytes, too large.
            status, kind = (409, "too-many-signals") if "signals" in exc.what else (413, "signals-too-large")
            raise Problem(status, kind, str(exc), title="Too many signals kept") from None
        except codec.TooDeep as exc:
            raise Problem(400, "too-deep", f"a signal's body: {exc}", title="Nested too deep",
                          max_depth=exc.limit) from None
        if delivery == "duplicate":  # the job holds it or read it already: nothing delivered
            send(resp, {"id": name, "signal": signal, "delivery": delivery, "duplicate": True}, 200)
            return
        send(resp, {"id": name, "signal": signal, "delivery": delivery}, 202)


class JobList:
    """GET /jobs?status=&queue=&type=&limit=&cursor=: one page, newest first (status
    queued unless given). GET /jobs?idempotency_key=K[&type=T]: the jobs holding that
    key, whatever their status (the dashboard's search), on one page."""

    def __init__(self, client: Client, offload: Offload) -> None:
        self.client = client
        self.offload = offload

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        only_params(req, "status", "queue", "type", "limit", "cursor", "idempotency_key")
        type_ = req.get_param("type") or None
        if type_ is not None and type_ not in self.client.runtime.registry.functions:
            raise Problem(400, "invalid-parameter", "query parameter 'type' must be a loaded function type",
                          title="Invalid parameter", parameter="type")
        key = req.get_param("idempotency_key")
        if key is not None:
            await self._by_key(req, resp, key, type_)
            return
        status = req.get_param("status")
        status = "queued" if status is None else status  # ?status= (empty) names no status: refused below
        if status not in LISTED:
            raise Problem(400, "invalid-parameter", f"query parameter 'status' must be one of {', '.join(LISTED)}",
                          title="Invalid parameter", parameter="status")
        queue = req.get_param("queue") or None
        if queue is not None and queue not in self.client.runtime.keys:
            raise Problem(404, "unknown-queue", f"no queue {queue!r} (have: {', '.join(self.client.runtime.keys)})",
                          title="Unknown queue", queue=queue)
        limit = int_param(req, "limit", 1, 500, 50) or 50
        cursor = req.get_param("cursor") or None

        def listed() -> dict[str, Any]:
            # The views too are built on the pool's thread: nothing of a page decodes on the loop.
            page = self.client.jobs(status, queue=queue, type=type_, limit=limit, cursor=cursor)
            body: dict[str, Any] = {"jobs": [j.as_dict() for j in page.jobs], "cursor": page.cursor}
            if page.left_out:  # (Redis Cluster: a master away; the cursor comes back to them)
                body["left_out"] = [{"queue": o.queue, "partition": o.tag} for o in page.left_out]
            return body

        try:
            body = await self.offload(listed)
        except ValueError as exc:
            raise Problem(400, "invalid-parameter", str(exc), title="Invalid parameter", parameter="cursor") from None
        send(resp, body)

    async def _by_key(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, key: str,
                      type_: str | None) -> None:
        # A lookup, not a listing: a status, queue or cursor would filter nothing.
        for name in ("status", "queue", "limit", "cursor"):
            if req.get_param(name) is not None:
                raise Problem(400, "invalid-parameter", f"query parameter {name!r} does not go with "
                              "idempotency_key (give type, or nothing)", title="Invalid parameter", parameter=name)
        if not key or len(key.encode()) > MAX_KEY_BYTES:
            raise Problem(400, "invalid-parameter", f"query parameter 'idempotency_key' must be 1 to "
                          f"{MAX_KEY_BYTES} bytes", title="Invalid parameter", parameter="idempotency_key")
        # The views built on the pool's thread too: a key's job may carry a payload of 1 MiB.
        views = await self.offload(lambda: [j.as_dict() for j in self.client.by_idempotency_key(key, type=type_)])
        send(resp, {"jobs": views, "cursor": None})


class JobBatch:
    def __init__(self, client: Client, offload: Offload) -> None:
        self.client = client
        self.offload = offload

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, name: str) -> None:
        """Validate every payload of a JSON array, then enqueue them all: 202 with one
        answer per payload, in order. One invalid payload is a 422 naming every error by
        index, and nothing is enqueued. Per-job idempotency keys come from the function's
        template; a job whose key is held with another payload gets a 409 problem as its
        answer while the others go in."""
        rt = self.client.runtime
        fn = rt.registry.get(name)
        only_params(req, "version", "delay", "run_at")
        if req.get_header("Idempotency-Key") is not None:
            raise Problem(400, "invalid-header", "a batch takes no Idempotency-Key; the function's "
                          "IDEMPOTENCY_KEY template keys each job", title="Invalid header",
                          header="Idempotency-Key")
        payloads = await read_json(req, rt.config.api.max_body_bytes)
        if not isinstance(payloads, list) or not 1 <= len(payloads) <= MAX_BATCH_JOBS:
            raise Problem(400, "invalid-batch", f"send a JSON array of 1 to {MAX_BATCH_JOBS} payloads",
                          title="Invalid batch")
        version, delay, run_at = timing(req)
        # Up to a thousand validations and a few round trips: on a thread, not the loop.
        try:
            answers = await self.offload(
                self.client.enqueue_all, [Request(fn.name, p, version, delay, run_at) for p in payloads])
        except RedisUnavailable as exc:
            if exc.results:  # sent, and cut short: say what became of each job
                raise part_way(req, exc) from exc
            raise
        jobs = [body_of(req, conflict(a)) if isinstance(a, IdempotencyConflict) else a.as_dict()
                for a in answers]
        send(resp, {"jobs": jobs}, 202)


def part_way(req: falcon.asgi.Request, exc: RedisUnavailable, what: str = "jobs", noun: str = "job",
             where: str = "the batch", extra: dict[str, object] | None = None) -> Problem:
    """The 503 of a batch Redis refused or lost part-way: one entry per job, in order
    (under ``what``), with its ``outcome``: "written" (the job as a 202 gives it),
    "conflict" (its 409), "not_written" (safe to send again) or "unknown" (its call was
    in flight when the connection went: send it again only with an idempotency key)."""
    unknown = set(exc.undetermined)
    jobs: list[dict[str, object]] = []
    for i, r in enumerate(exc.results):
        if i in unknown:
            jobs.append({"outcome": "unknown"})
        elif isinstance(r, IdempotencyConflict):
            jobs.append({"outcome": "conflict", **body_of(req, conflict(r))})
        elif r is None or isinstance(r, BaseException):
            jobs.append({"outcome": "not_written"})
        else:
            jobs.append({"outcome": "written", **r.as_dict()})
    written = sum(1 for j in jobs if j["outcome"] == "written")
    missing = sum(1 for j in jobs if j["outcome"] == "not_written")
    told = f"{written} of {len(jobs)} {noun}(s) written, {missing} not written"
    if unknown:
        told += (f", {len(unknown)} unknown (in flight when the connection went: they may have been "
                 "written; send them again only if the function has an IDEMPOTENCY_KEY)")
    each = f"Each entry of '{what}' says which (its 'outcome')"
    kind = None if unknown else refusal(exc)
    if kind is not None:  # Redis answered and refused: its kind and its next step, as a single call's 503
        detail = (f"{unreachable(exc, f'; part-way through {where}, {told}')}. "
                  f"{each}: send only those not written again.")
    else:
        detail = (f"Redis {'went away' if unknown else 'refused writes'} part-way through {where}: {told}. "
                  f"{each}; retry shortly with those not written.")
    return Problem(503, "redis-unavailable", detail, title="Redis unavailable", headers={"Retry-After": "1"},
                   **{what: jobs, "undetermined": sorted(unknown), **(extra or {}),
                      **({"refusal": kind} if kind is not None else {})})
