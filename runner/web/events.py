"""GET /events: the live feed as server-sent events (text/event-stream), fed by the
process's one read loop (hub.py). A request that asks for JSON (``Accept:
application/json``) gets the recent emitted events instead (emits.py).

    event: health   {"redis": "ok" | "unreachable"}, first and whenever it changes
    event: queues   {"queues": [...], "full": true} first (every queue, as GET /queues),
                    then {"queues": [the queues whose figures changed], "full": false}
    event: job      a watched job (?job=<id>, repeatable) as GET /jobs/{id}, first and
                    whenever its view changed (status, attempt, progress, history...)
    event: job-gone {"id"}: a watched job that does not exist (or no longer does)

A stream lasts at most STREAM_S, then ends; its ``retry`` field tells the client when to
come back. So a token revoked or rotated is asked for again within that time, and pages
spread over the worker processes again. A comment line every HEARTBEAT_S keeps proxies
from timing the connection out, and lets the server notice a page that went away.

The token goes in the Authorization header as for every route (the page reads the stream
with fetch, not EventSource, which cannot send one): never in the URL.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import falcon
import falcon.asgi

from runner.web import emits
from runner.web.auth import ANONYMOUS
from runner.web.body import only_params
from runner.web.hub import MAX_WATCHED, Hub, TooManyWatched
from runner.web.problems import Problem

STREAM_S = 300.0
HEARTBEAT_S = 5.0
RETRY_MS = 2000
MAX_JOBS = 20  # watched by one stream
MAX_ID = 200   # characters, as GET /jobs/{id}


def _owner(req: falcon.asgi.Request) -> str:
    """Whose share of the watched jobs a stream takes: its token's ("" with auth off)."""
    token = getattr(req.context, "token", None)
    return "" if token is None or token is ANONYMOUS else token.name


class Events:
    def __init__(self, hub: Hub) -> None:
        self.hub = hub

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        if emits.wants_list(req):  # the emitted events (emits.py), not the feed
            await emits.recent(self.hub.client, self.hub.offload, req, resp)
            return
        only_params(req, "job", repeatable=("job",))
        jobs = req.get_param_as_list("job") or []
        if len(jobs) > MAX_JOBS or any(not j or len(j) > MAX_ID for j in jobs):
            raise Problem(400, "invalid-parameter", f"query parameter 'job' takes 1 to {MAX_JOBS} job ids "
                          f"of 1 to {MAX_ID} characters", title="Invalid parameter", parameter="job")
        owner = _owner(req)
        crowded = self.hub.too_many_streams(owner)
        if crowded:
            raise Problem(429, "too-many-streams", crowded, title="Too many event streams",
                          headers={"Retry-After": "30"}, max_streams=self.hub.per_token)
        refused = self.hub.too_many(jobs, owner)
        if refused:
            raise Problem(503, "too-many-watched", refused, title="Too many watched jobs",
                          headers={"Retry-After": "10"}, max_watched=MAX_WATCHED)
        resp.cache_control = ["no-store"]
        resp.set_header("X-Accel-Buffering", "no")  # nginx: pass each event on at once
        resp.sse = self._emit(jobs, owner)

    async def _emit(self, jobs: list[str], owner: str) -> AsyncIterator[falcon.asgi.SSEvent | None]:
        # The stream opens here, not in on_get: only a generator that started runs its
        # finally, so only here is every stream opened sure to be closed.
        yield falcon.asgi.SSEvent(retry=RETRY_MS)
        try:
            stream = self.hub.open(jobs, owner)
        except TooManyWatched:  # taken meanwhile by another page (or stream): come back later
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STREAM_S
        try:
            while True:
                left = deadline - loop.time()
                if left <= 0:
                    return
                try:
                    item = await asyncio.wait_for(stream.events.get(), min(HEARTBEAT_S, left))
                except TimeoutError:
                    yield None  # a comment line (": ping")
                    continue
                if item is None:
                    return
                name, data = item  # encoded once by the hub, for every stream
                yield falcon.asgi.SSEvent(event=name, data=data)
        finally:
            self.hub.close(stream)
