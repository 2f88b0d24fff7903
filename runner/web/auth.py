"""Bearer-token auth for the API: ``Authorization: Bearer <token>``, compared in constant time.

With ``api.auth`` on and a token set (RUNNER_API_TOKEN), every request needs the token but
/healthz and the dashboard's static shell (``/`` and ``/static/*``), which carry no data:
the dashboard's script asks for the token and sends it as a header on every API call.
Without a token the API is open; `runner web` refuses to start that way outside dev.
"""

from __future__ import annotations

import hmac
from typing import Any

import falcon
import falcon.asgi

from runner.config import ApiConfig
from runner.web.problems import Problem

PUBLIC_PATHS = frozenset({"/healthz", "/"})
PUBLIC_PREFIXES = ("/static/",)


def required(api: ApiConfig) -> bool:
    return bool(api.auth and api.token)


class BearerAuth:
    """Falcon middleware; runs before routing, so unknown paths do not leak either."""

    def __init__(self, token: str) -> None:
        self._expected = token.encode()

    async def process_request(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        path = req.path
        if path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES):
            return
        header = req.get_header("Authorization") or ""
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise _unauthorized("send the API token as 'Authorization: Bearer <token>'", "missing")
        # Header strings are latin-1 over the raw bytes, so this gets the bytes sent;
        # compare_digest keeps the time independent of where they differ.
        if not hmac.compare_digest(given.strip().encode("latin-1", "replace"), self._expected):
            raise _unauthorized("the bearer token is wrong", "wrong")


def _unauthorized(detail: str, why: str) -> Problem:
    challenge = 'Bearer realm="runner"' + (', error="invalid_token"' if why == "wrong" else "")
    return Problem(401, "unauthorized", detail, title="Unauthorized",
                   headers={"WWW-Authenticate": challenge})


def middleware(api: ApiConfig) -> list[Any]:
    return [BearerAuth(api.token)] if required(api) and api.token else []
