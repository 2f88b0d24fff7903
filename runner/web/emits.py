"""Events (docs/events.md): POST /events/{name} emits one, GET /events lists the recent
ones when asked for JSON (``Accept: application/json``; otherwise GET /events is the live
feed, events.py).

    POST /events/{name}   body: the event's data (JSON). 202 with the event's id and its
                          jobs (none when nobody subscribes); 200 for a duplicate of an
                          Idempotency-Key; 422 naming every subscriber that rejects the
                          data and each error (nothing written); 409 for a key held by an
                          emit of other data.
    GET /events           ?limit (1-500, default 50), ?name: the newest events first, each
                          with the jobs it started; "damaged_keys" names a partition's list
                          of another Redis type (read as none: store/damage.py).
"""

from __future__ import annotations

import falcon
import falcon.asgi

from runner.client import Client
from runner.client.emitting import MAX_LIST, BadEventName, check_name
from runner.store import damage
from runner.web.body import int_param, only_params, read_json, send
from runner.web.jobs import idempotency_key
from runner.web.offload import Offload
from runner.web.problems import Problem


def wants_list(req: falcon.asgi.Request) -> bool:
    """A GET /events that asks for JSON and not for the event stream."""
    accept = req.get_header("Accept") or ""
    return "application/json" in accept and "text/event-stream" not in accept


def _bad_name(exc: BadEventName) -> Problem:
    return Problem(400, "invalid-event-name", str(exc), title="Invalid event name", name=exc.name)


class Emit:
    def __init__(self, client: Client, offload: Offload) -> None:
        self.client = client
        self.offload = offload

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, name: str) -> None:
        try:
            check_name(name)
        except BadEventName as exc:
            raise _bad_name(exc) from None
        only_params(req)
        data = await read_json(req, self.client.runtime.config.api.max_body_bytes)
        key = idempotency_key(req)
        out = await self.offload(lambda: self.client.emit(name, data, idempotency_key=key))
        send(resp, out.as_dict(), 200 if out.duplicate else 202)


async def recent(client: Client, offload: Offload, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
    """GET /events as JSON: the recent events."""
    only_params(req, "limit", "name")
    limit = int_param(req, "limit", 1, MAX_LIST, 50) or 50
    name = req.get_param("name")
    if name is not None:
        try:
            check_name(name)
        except BadEventName as exc:
            raise _bad_name(exc) from None
    damaged: list[damage.Damaged] = []
    events = await offload(lambda: client.events(limit=limit, name=name, damaged=damaged))
    resp.cache_control = ["no-store"]
    send(resp, {"limit": limit, "events": events, **damage.views(damaged)})
