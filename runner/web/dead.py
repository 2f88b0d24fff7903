"""The dead-letter views: GET /dead/{queue} (newest first, paged by cursor or offset), POST
/dead/{queue}/{id}/requeue (optionally with an edited payload and version; an invalid
one stays dead and gets a 422) and DELETE /dead/{queue}/{id}. A requeue and a delete go
on record under the caller's token name (see client.Client.requeue)."""

from __future__ import annotations

from typing import Any

import falcon
import falcon.asgi

from runner.client import Client
from runner.errors import FieldError, UnknownFunction
from runner.web.auth import caller
from runner.web.body import NO_BODY, int_param, only_params, read_json, send
from runner.web.offload import Offload
from runner.web.problems import Problem, invalid

MAX_PAGE = 500


def _queue(client: Client, queue: str) -> str:
    if queue not in client.runtime.keys:
        raise Problem(404, "unknown-queue", f"no queue {queue!r} (have: {', '.join(client.runtime.keys)})",
                      title="Unknown queue", queue=queue)
    return queue


def _requeue_body(body: Any) -> tuple[Any, int | None]:
    """(payload or None to keep the stored one, version or None)."""
    if body is NO_BODY or body is None:
        return None, None
    if not isinstance(body, dict):
        raise invalid("send {} or {\"payload\": ..., \"version\": N}", [FieldError("$", "must be an object")])
    errors = [FieldError(f"$.{k}", "unknown member; expected payload and version") for k in body
              if k not in ("payload", "version")]
    version = body.get("version")
    if version is not None and (not isinstance(version, int) or isinstance(version, bool) or version < 1):
        errors.append(FieldError("$.version", "must be a positive integer"))
    if errors:
        raise invalid("the requeue request is malformed", errors)
    return body.get("payload"), version


class DeadList:
    def __init__(self, client: Client, offload: Offload) -> None:
        self.client = client
        self.offload = offload

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, queue: str) -> None:
        only_params(req, "offset", "limit", "cursor")
        offset = int_param(req, "offset", 0, 10_000_000)
        limit = int_param(req, "limit", 1, MAX_PAGE, 50) or 50
        cursor = req.get_param("cursor") or None
        if cursor is not None and offset is not None:
            raise Problem(400, "invalid-parameter", "give a cursor or an offset, not both",
                          title="Invalid parameter", parameter="offset")
        name = _queue(self.client, queue)

        def listed() -> dict[str, Any]:
            # The views too are built on the pool's thread: nothing of a page decodes on the loop.
            page = self.client.dead_page(name, limit, cursor=cursor, offset=offset)
            # A cursor's page has no offset (jobs died and left since the first page).
            where = {"offset": offset or 0} if cursor is None else {}
            return {"queue": queue, "total": page.total, **where, "limit": limit,
                    "jobs": [j.as_dict() for j in page.jobs], "cursor": page.cursor}

        try:
            body = await self.offload(listed)
        except ValueError as exc:
            raise Problem(400, "invalid-parameter", str(exc), title="Invalid parameter", parameter="cursor") from None
        send(resp, body)


class DeadRequeue:
    def __init__(self, client: Client, offload: Offload) -> None:
        self.client = client
        self.offload = offload

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, queue: str, job_id: str) -> None:
        _queue(self.client, queue)
        only_params(req)
        body = await read_json(req, self.client.runtime.config.api.max_body_bytes, optional=True)
        payload, version = _requeue_body(body)
        try:
            job = await self.offload(self.client.requeue, queue, job_id, payload, version, by=caller(req))
        except UnknownFunction as exc:
            # The job exists; its function does not (any more): it stays dead.
            raise invalid(f"the job's function {exc.type!r} is not loaded; it stays dead",
                          [FieldError("$", str(exc))]) from None
        send(resp, job.as_dict())


class DeadItem:
    def __init__(self, client: Client, offload: Offload) -> None:
        self.client = client
        self.offload = offload

    async def on_delete(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, queue: str, job_id: str) -> None:
        only_params(req)
        await self.offload(self.client.delete_dead, _queue(self.client, queue), job_id, by=caller(req))
        resp.status = falcon.HTTP_204
