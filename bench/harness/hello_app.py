"""The HTTP scenario's reference: an ASGI app that does nothing but what every request
must (read the body, answer 202 with a job-sized JSON body), served by gunicorn with
`runner web`'s settings (its uvicorn worker class). Its requests/s are the ceiling that
the server itself sets on this machine at this moment; runner's figure is read against
it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

BODY = (b'{"id":"0190f0c1d2e3a4b5c6d7e8","type":"noop","version":1,"queue":"fast",'
        b'"status":"queued","duplicate":false}')
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]


async def app(scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]],
              send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 202, "headers": HEADERS})
    await send({"type": "http.response.body", "body": BODY})
