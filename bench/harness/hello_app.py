"""The HTTP scenario's reference: a WSGI app that does nothing but what every request
must (read the body, answer 202 with a job-sized JSON body), served by gunicorn with
`runner web`'s settings. Its requests/s are the ceiling that gunicorn itself sets on
this machine at this moment; runner's figure is read against it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

BODY = (b'{"id":"0190f0c1d2e3a4b5c6d7e8","type":"noop","version":1,"queue":"fast",'
        b'"status":"queued","duplicate":false}')


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    environ["wsgi.input"].read()
    start_response("202 Accepted", [("Content-Type", "application/json"),
                                    ("Content-Length", str(len(BODY)))])
    return [BODY]
