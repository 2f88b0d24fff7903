"""Every HTTP error as one JSON shape: RFC 9457 problem details (application/problem+json).

    {"type": "urn:runner:problem:<slug>", "title": "...", "status": 422,
     "detail": "...", "instance": "/jobs/send_email", ...extension members}

``type`` is stable and meant for code; ``title`` is the same for every problem of a type;
``detail`` is for humans. Extension members, by problem: ``errors`` (422: every
validation error with its JSON path; past catalog/listing.py's LIST_BYTES of payload, a
payload's first error and a note at its path that more may exist), ``job_id`` (404 job;
409: the job holding the key), ``idempotency_key`` (409), ``function``, ``queue`` (404),
``known_versions`` and ``version`` (422), ``parameter`` / ``header`` (400),
``max_body_bytes`` (413), ``group_id`` (404 group), ``allowed_methods`` (405), ``scope``
and ``token_name`` (403: the scope the token lacks), ``job_ids``, ``replicas_acked`` and
``replicas_wanted`` (503 not-replicated: the jobs were written to the master, but too few
replicas confirmed them in time), ``refusal`` (503 redis-unavailable when Redis answered
and refused: "OOM", "MISCONF", "READONLY", "BUSY", "LOADING" or "CLUSTER"; absent when it
is unreachable).
Falcon's own errors (no route, wrong method, bad header) go through the same serializer.
"""

from __future__ import annotations

import http
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import falcon
import falcon.asgi

from runner.errors import (
    EventConflict,
    EventRejected,
    EventTooLarge,
    FieldError,
    IdempotencyConflict,
    InvalidGroup,
    JobNotFound,
    NotReplicated,
    RedisUnavailable,
    UnknownFunction,
    UnknownQueue,
    UnknownVersion,
    ValidationFailed,
    password_line,
)
from runner.store import codec
from runner.store.connection import UNAVAILABLE, refusal, unreachable

MEDIA_TYPE = "application/problem+json"
TYPE_PREFIX = "urn:runner:problem:"
log = logging.getLogger("runner.web")

# Slugs for errors falcon raises itself, by status code.
_FALCON_SLUGS = {
    400: "bad-request",
    401: "unauthorized",
    404: "not-found",
    405: "method-not-allowed",
    411: "length-required",
    413: "payload-too-large",
    414: "uri-too-long",
    415: "unsupported-media-type",
    431: "headers-too-large",
    500: "internal-error",
    503: "unavailable",
}

# Redis errors that mean "not reachable now": a 503, never a 500.
REDIS_DOWN: tuple[type[Exception], ...] = (
    RedisUnavailable,
    # What the store calls unavailable (a lost connection, a timeout, loading, a replica,
    # OOM, MISCONF, BUSY, a cluster mid-failover), but not a local OSError, which is no
    # outage of Redis.
    *(e for e in UNAVAILABLE if e.__module__ != "builtins" and issubclass(e, Exception)),
)


class Problem(falcon.HTTPError):
    """An HTTP error with a stable ``slug`` and extension members."""

    def __init__(
        self, status: int, slug: str, detail: str, *, title: str | None = None,
        headers: dict[str, str] | None = None, **extra: Any,
    ) -> None:
        super().__init__(
            falcon.code_to_http_status(status),
            title=title or http.HTTPStatus(status).phrase,
            description=detail,
            headers=headers,
        )
        self.slug = slug
        self.extra = extra


def field_errors(errors: Iterable[FieldError]) -> list[dict[str, str]]:
    return [e.as_dict() for e in errors]


def invalid(detail: str, errors: list[FieldError], **extra: Any) -> Problem:
    return Problem(422, "invalid-payload", detail, title="Invalid payload",
                   errors=field_errors(errors), **extra)


def body_of(req: falcon.Request, exc: falcon.HTTPError) -> dict[str, Any]:
    code = exc.status_code
    if isinstance(exc, Problem):
        slug, extra = exc.slug, exc.extra
    else:
        slug, extra = _FALCON_SLUGS.get(code, f"http-{code}"), {}
    title = exc.title or http.HTTPStatus(code).phrase
    if not isinstance(exc, Problem) and title[:3].isdigit():
        # Falcon titles its own errors "404 Not Found"; keep the title the bare phrase.
        title = http.HTTPStatus(code).phrase
    detail = exc.description or title
    if code == 405 and not isinstance(exc, Problem):
        headers = exc.headers if isinstance(exc.headers, Mapping) else {}
        allowed = [m.strip() for m in headers.get("Allow", "").split(",") if m.strip()]
        extra = {"allowed_methods": allowed}
        detail = f"{req.method} is not allowed here; use {', '.join(allowed)}"
    elif code == 404 and not isinstance(exc, Problem):
        detail = f"no such path {req.path!r}; see GET /openapi.json"
    out: dict[str, Any] = {"type": TYPE_PREFIX + slug, "title": title, "status": code,
                           "detail": detail, "instance": req.path}
    out.update(extra)
    return out


def serialize(req: falcon.Request, resp: falcon.Response, exc: falcon.HTTPError) -> None:
    """The app's error serializer: always problem+json, whatever the client accepts."""
    resp.content_type = MEDIA_TYPE
    resp.data = codec.dumpb_view(body_of(req, exc))


# --- runner's exceptions -> problems -----------------------------------------------------


async def _unknown_function(req: falcon.Request, resp: falcon.Response, ex: Exception, params: Any) -> None:
    assert isinstance(ex, UnknownFunction)
    hint = f"; did you mean {ex.close}?" if ex.close else ""
    raise Problem(404, "unknown-function", f"no function of type {ex.type!r} is loaded{hint}; see GET /functions",
                  title="Unknown function", function=ex.type)


async def _unknown_version(req: falcon.Request, resp: falcon.Response, ex: Exception, params: Any) -> None:
    assert isinstance(ex, UnknownVersion)
    raise Problem(422, "unknown-version", str(ex), title="Unknown payload version",
                  errors=[{"path": "$", "message": str(ex)}], known_versions=ex.known)


def _counted(ex: ValidationFailed, what: str) -> str:
    """How many errors, and whether some payload's first one only is listed."""
    count = sum(1 for e in ex.errors if not e.note)
    if ex.complete:
        return f"{count} {what}(s)"
    return f"{count} {what}(s), a payload's first error only where a note says more may exist"


async def _validation(req: falcon.Request, resp: falcon.Response, ex: Exception, params: Any) -> None:
    assert isinstance(ex, ValidationFailed)
    raise invalid(f"the payload does not match {ex.type} v{ex.version} ({_counted(ex, 'error')})",
                  ex.errors, version=ex.version)


async def _invalid_group(req: falcon.Request, resp: falcon.Response, ex: Exception, params: Any) -> None:
    assert isinstance(ex, InvalidGroup)
    raise Problem(422, "invalid-group", f"the group cannot run ({_counted(ex, 'problem')}); nothing was written",
                  title="Invalid group", errors=field_errors(ex.errors))


async def _event_rejected(req: falcon.Request, resp: falcon.Response, ex: Exception, params: Any) -> None:
    assert isinstance(ex, EventRejected)
    raise Problem(422, "event-rejected", f"{len(ex.rejections)} subscriber(s) of {ex.name!r} reject its data "
                  f"({_counted(ex, 'error')}); nothing was enqueued", title="Event rejected",
                  functions=[{"function": fn, "version": v, "errors": field_errors(errs)}
                             for fn, (v, errs) in ex.rejections.items()],
                  errors=field_errors(ex.errors))


async def _event_too_large(req: falcon.Request, resp: falcon.Response, ex: Exception, params: Any) -> None:
    assert isinstance(ex, EventTooLarge)
    raise Problem(413, "event-too-large", str(ex), title="Event too large", bound=ex.bound,
                  subscribers=ex.subscribers, data_bytes=ex.data_bytes, bytes=ex.bytes)


async def _event_conflict(req: falcon.Request, resp: falcon.Response, ex: Exception, params: Any) -> None:
    assert isinstance(ex, EventConflict)
    raise Problem(409, "idempotency-conflict", str(ex), title="Idempotency conflict", event_id=ex.event_id,
                  idempotency_key=ex.key)


def conflict(ex: IdempotencyConflict) -> Problem:
    return Problem(409, "idempotency-conflict",
                   f"idempotency key {ex.key!r} is held by job {ex.job_id}, enqueued with another payload",
                   title="Idempotency conflict", job_id=ex.job_id, idempotency_key=ex.key)


async def _conflict(req: falcon.Request, resp: falcon.Response, ex: Exception, params: Any) -> None:
    assert isinstance(ex, IdempotencyConflict)
    raise conflict(ex)


async def _not_found(req: falcon.Request, resp: falcon.Response, ex: Exception, params: Any) -> None:
    assert isinstance(ex, JobNotFound)
    if isinstance(ex, UnknownQueue):
        raise Problem(404, "unknown-queue", str(ex), title="Unknown queue", queue=ex.queue)
    raise Problem(404, "job-not-found", f"no job {ex.job_id!r}", title="Job not found", job_id=ex.job_id)


def password_refused(req: falcon.Request, ex: BaseException, **extra: Any) -> Problem | None:
    """The problem of a request whose Redis turned this process's password down (no
    outage: it lasts until the URL or the server changes), or None for any other failure.
    Said only to a caller with a token, as /healthz does: the words name no address and
    no password, yet how the deployment is set up is not a stranger's to learn."""
    refused = password_line(ex)
    if refused is None or getattr(req.context, "token", None) is None:
        return None
    return Problem(503, "redis-password-refused",
                   f"{refused} the web process; nothing was done, and a retry fails the same way until then.",
                   title="Redis refused the password", **extra)


async def _redis_down(req: falcon.Request, resp: falcon.Response, ex: Exception, params: Any) -> None:
    said = password_line(ex)
    if said is not None:
        log.error("%s %s: %s", req.method, req.path, said)
        problem = password_refused(req, ex)
        if problem is not None:
            raise problem
    else:
        log.warning("%s %s: Redis unreachable: %s", req.method, req.path, ex)
    kind = refusal(ex)
    headers = {"Retry-After": "1"}
    if kind is not None:
        # Redis answered and refused (maxmemory, a replica, busy, loading...): the one
        # helper's words for that kind, as the client and the CLI say them. The refused
        # command ran nowhere, so a write says nothing was written.
        if getattr(ex, "acted", False):  # an action that landed, then its audit entry (or a later batch) refused
            raise Problem(503, "redis-unavailable", str(ex), title="Redis unavailable", headers=headers,
                          refusal=kind)
        told = "" if req.method in ("GET", "HEAD") else "; nothing was written"
        raise Problem(503, "redis-unavailable", str(unreachable(ex, told)), title="Redis unavailable",
                      headers=headers, refusal=kind)
    # A connection lost after the request went out leaves its outcome unknown, and the
    # answer must not promise otherwise. (The words name no address: the caller may be
    # a stranger, see password_refused.)
    if getattr(ex, "acted", False):  # the action landed; its audit entry (or a later batch) did not
        raise Problem(503, "redis-unavailable", f"Redis did not answer (stopped, hung or down){told_of(ex)}. "
                      "Check what was done (GET /jobs/{id}, GET /audit) before any retry.",
                      title="Redis unavailable", headers=headers, acted=True)
    left_out = getattr(ex, "left_out", None)
    if left_out and req.method in ("GET", "HEAD"):
        # Redis Cluster: found on none of the masters that answered, while others did not;
        # it may be on those (never a 404 for it). Partitions are named; masters are not.
        raise Problem(503, "redis-unavailable", "Not found on the Redis masters that answered; "
                      f"{unanswered(left_out)}, and what was asked for may be there. Retry shortly.",
                      title="Redis unavailable", headers=headers,
                      left_out=[{"queue": q, "partition": tag} for q, tag in left_out])
    if req.method in ("GET", "HEAD"):  # a read changes nothing: nothing to be unsure of
        detail = "Redis is unreachable. Retry shortly; GET /healthz says when it is back."
    elif (req.path.startswith("/jobs/") and req.method == "POST") or req.path == "/groups":
        detail = ("Redis is unreachable; the request was not confirmed (one cut off after it was sent may "
                  "have been written). Retry shortly: an enqueue retried with the same Idempotency-Key is "
                  "never written twice.")
    else:
        detail = ("Redis is unreachable; the request was not confirmed (one cut off after it was sent may "
                  "have been done). Retry shortly, then check the result: GET /jobs/{id}, GET /audit.")
    raise Problem(503, "redis-unavailable", detail, title="Redis unavailable", headers=headers)


def told_of(ex: BaseException) -> str:
    """What became of an action that landed before Redis stopped answering (the ``told``
    of client.administering.acted): its words, without the master's address."""
    told = getattr(ex, "told", "")
    return told if isinstance(told, str) else ""


def unanswered(left_out: Sequence[tuple[str, str]]) -> str:
    """The words for partitions (queue, tag) whose Redis Cluster master did not answer a
    read: named by their tags, never by the master's address (the caller may be a
    stranger, see password_refused; the address goes to the log)."""
    return (f"the master of partition {', '.join('{' + tag + '}' for _, tag in left_out)} did not answer "
            "(stopped, hung, down, or busy in a long script)")


async def _not_replicated(req: falcon.Request, resp: falcon.Response, ex: Exception, params: Any) -> None:
    assert isinstance(ex, NotReplicated)
    log.warning("%s %s: %s", req.method, req.path, ex)
    which = f"job {ex.job_ids[0]}" if len(ex.job_ids) == 1 else \
        f"{len(ex.job_ids)} jobs" if ex.job_ids else "the write"
    if ex.signal is not None:
        raise Problem(503, "not-replicated", str(ex), title="Not replicated", headers={"Retry-After": "1"},
                      job_ids=ex.job_ids, replicas_acked=ex.acked, replicas_wanted=ex.wanted, key=ex.key)
    raise Problem(503, "not-replicated",
                  f"{which} written to the Redis master, but only {ex.acked} of {ex.wanted} replica(s) "
                  f"confirmed within {ex.timeout_s:g} s: the job exists but a failover now could lose it. "
                  f"{ex.advice.replace('idempotency key', 'Idempotency-Key')}.",
                  title="Not replicated", headers={"Retry-After": "1"}, job_ids=ex.job_ids,
                  replicas_acked=ex.acked, replicas_wanted=ex.wanted)


async def _unexpected(req: falcon.Request, resp: falcon.Response, ex: Exception, params: Any) -> None:
    log.exception("%s %s failed", req.method, req.path)
    raise Problem(500, "internal-error", "an unexpected error; the web process log has the traceback",
                  title="Internal error")


def install(app: falcon.asgi.App[falcon.asgi.Request, falcon.asgi.Response]) -> None:
    """Register the serializer and the handlers (falcon picks the most specific by MRO)."""
    app.set_error_serializer(serialize)
    # Falcon's default handlers for its own HTTPError/HTTPStatus stay (more specific by MRO)
    # and call the serializer above.
    app.add_error_handler(Exception, _unexpected)
    app.add_error_handler(UnknownFunction, _unknown_function)
    app.add_error_handler(UnknownVersion, _unknown_version)
    app.add_error_handler(ValidationFailed, _validation)
    app.add_error_handler(InvalidGroup, _invalid_group)
    app.add_error_handler(IdempotencyConflict, _conflict)
    app.add_error_handler(EventRejected, _event_rejected)
    app.add_error_handler(EventConflict, _event_conflict)
    app.add_error_handler(EventTooLarge, _event_too_large)
    app.add_error_handler(JobNotFound, _not_found)
    app.add_error_handler(NotReplicated, _not_replicated)
    for exc_type in REDIS_DOWN:
        app.add_error_handler(exc_type, _redis_down)
