"""``runner.web.asgi:app``: the ASGI app for any ASGI server, built lazily, on the first
request in each worker process, from ./runner.toml (or RUNNER_CONFIG) and the
environment. `runner web` does not need it (it builds the app in each gunicorn worker).

Lazily, so importing this module (a server's master, a preload, a test) opens no Redis
connection that a fork would then share between processes.

A config that leaves the API open by accident (no token, and auth not switched off in
runner.toml: see auth.refusal) is refused: the server's start-up fails (the ASGI
lifespan, which uvicorn and gunicorn's uvicorn workers run), and where the server runs
no lifespan every request gets a 503 problem that says why. Nothing is ever served.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from runner import config as config_mod
from runner.errors import ConfigError
from runner.observe.logs import setup as setup_logs

log = logging.getLogger("runner.web")

ASGIApp = Callable[[dict[str, Any], Callable[..., Awaitable[Any]], Callable[..., Awaitable[Any]]],
                   Awaitable[None]]


class LazyApp:
    def __init__(self) -> None:
        self._app: ASGIApp | None = None
        self._refused: str | None = None
        self._lock = threading.Lock()

    def build(self) -> ASGIApp:
        with self._lock:
            if self._app is None:
                from runner.web import app_for

                cfg = config_mod.load()
                setup_logs(cfg.log)
                try:
                    self._app = app_for(cfg)
                except ConfigError as exc:
                    self._refused = str(exc)
                    log.error("%s", exc)
                    self._app = self._refuse
            return self._app

    async def _refuse(self, scope: dict[str, Any], receive: Callable[..., Awaitable[Any]],
                      send: Callable[..., Awaitable[Any]]) -> None:
        if scope["type"] == "lifespan":
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.failed", "message": self._refused})
            return
        if scope["type"] != "http":
            return
        from runner.store import codec
        from runner.web.problems import MEDIA_TYPE, TYPE_PREFIX

        body = codec.dumpb({"type": TYPE_PREFIX + "not-configured", "title": "Not configured", "status": 503,
                            "detail": self._refused})
        await send({"type": "http.response.start", "status": 503,
                    "headers": [(b"content-type", MEDIA_TYPE.encode()), (b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})

    def drain(self) -> None:
        """The server's graceful shutdown begins: the built app ends its event streams."""
        drain = getattr(self._app, "drain", None)
        if drain is not None:
            drain()

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Awaitable[Any]],
                       send: Callable[..., Awaitable[Any]]) -> None:
        await (self._app or self.build())(scope, receive, send)


app = LazyApp()
