"""The enqueue route's fast lane: ``POST /jobs/{type}`` with a JSON body and nothing
else (no query string, no Idempotency-Key, Transfer-Encoding or Content-Encoding
header), from a caller the token admits, for a payload that validates, is answered here
without falcon's request and response objects and its middleware, which cost as much as
the rest of the route.

Every other request, and every refusal, goes to the falcon app with the body replayed,
so each error keeps its one renderer (problems.py) and its exact answer. An enqueue that
was attempted is never attempted again: its error rides to the route in the ASGI scope
(ENQUEUE_ERROR), and the route raises it where it would have called the client.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from runner.client import Client
from runner.observe import tracing
from runner.runtime import Runtime
from runner.store import codec
from runner.web.auth import Access
from runner.web.body import is_json

ENQUEUE_ERROR = "runner.enqueue_error"
_PREFIX = "/jobs/"
_SKIP = (b"idempotency-key", b"transfer-encoding", b"content-encoding")

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
App = Callable[[dict[str, Any], Receive, Send], Awaitable[None]]


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that hands the app the body already read, then the client's own events
    (a disconnect)."""
    sent = False

    async def again() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


class FastLane:
    def __init__(self, app: App, runtime: Runtime, client: Client, access: Access, limit: int) -> None:
        self.app = app
        self.runtime = runtime
        self.client = client
        self.access = access
        self.limit = limit

    def drain(self) -> None:
        """The server's graceful shutdown began (see _AnnouncedTooLarge.drain)."""
        drain = getattr(self.app, "drain", None)
        if drain is not None:
            drain()

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if (scope["type"] != "http" or scope["method"] != "POST" or scope.get("query_string")
                or not path.startswith(_PREFIX) or "/" in path[len(_PREFIX):] or len(path) == len(_PREFIX)
                or tracing.enabled()):
            return await self.app(scope, receive, send)
        length = -1
        content_type = authorization = None
        headers = scope["headers"]
        if type(headers) is not list:  # any iterable of pairs, by the spec: keep what is read
            headers = scope["headers"] = [tuple(h) for h in headers]
        for name, value in headers:
            if name == b"content-length":
                length = int(value) if value.isdigit() else -1
            elif name == b"content-type":
                content_type = value
            elif name == b"authorization":
                if authorization is not None:  # falcon joins repeated ones: let it judge
                    return await self.app(scope, receive, send)
                authorization = value
            elif name in _SKIP:
                return await self.app(scope, receive, send)
        if not 0 < length <= self.limit or content_type is None or not is_json(content_type.decode("latin-1")) \
                or not self.access.admits("POST", path, authorization):
            return await self.app(scope, receive, send)
        fn = self.runtime.registry.functions.get(path[len(_PREFIX):])
        if fn is None or fn.versions.backtracks:  # the route validates that one off the loop
            return await self.app(scope, receive, send)
        chunks: list[bytes] = []
        size = 0
        while True:
            event = await receive()
            if event["type"] != "http.request":  # gone before the body came
                return await self.app(scope, _replay(b"".join(chunks), receive), send)
            chunk = event.get("body", b"")
            chunks.append(chunk)
            size += len(chunk)
            if size > self.limit or not event.get("more_body", False):
                break
        body = b"".join(chunks)
        try:
            if size > self.limit or not body.strip():
                raise ValueError(body[:0])
            prep = self.client.prepare_type(path[len(_PREFIX):], codec.loads_wire(body))
        except Exception:  # a refusal: the route says why, the one way it always does
            return await self.app(scope, _replay(body, receive), send)
        try:
            job = await self.client.asend(prep)
        except Exception as exc:
            scope[ENQUEUE_ERROR] = exc
            return await self.app(scope, _replay(body, receive), send)
        answer = codec.dumpb_view(job.as_dict())
        headers = [(b"content-type", b"application/json"), (b"x-content-type-options", b"nosniff"),
                   (b"content-length", str(len(answer)).encode())]
        if not job.duplicate:
            headers.insert(0, (b"location", f"/jobs/{job.id}".encode()))
        await send({"type": "http.response.start", "status": 200 if job.duplicate else 202, "headers": headers})
        await send({"type": "http.response.body", "body": answer})
