"""``runner.web.asgi:app``: the ASGI app for any ASGI server, built lazily, on the first
request in each worker process, from ./runner.toml (or RUNNER_CONFIG) and the
environment. `runner web` does not need it (it builds the app in each gunicorn worker).

Lazily, so importing this module (a server's master, a preload, a test) opens no Redis
connection that a fork would then share between processes.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from typing import Any

from runner import config as config_mod
from runner.observe.logs import setup as setup_logs

ASGIApp = Callable[[dict[str, Any], Callable[..., Awaitable[Any]], Callable[..., Awaitable[Any]]],
                   Awaitable[None]]


class LazyApp:
    def __init__(self) -> None:
        self._app: ASGIApp | None = None
        self._lock = threading.Lock()

    def build(self) -> ASGIApp:
        with self._lock:
            if self._app is None:
                from runner.web import app_for

                cfg = config_mod.load()
                setup_logs(cfg.log)
                self._app = app_for(cfg)
            return self._app

    def drain(self) -> None:
        """The server's graceful shutdown begins: the built app ends its event streams."""
        drain = getattr(self._app, "drain", None)
        if drain is not None:
            drain()

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Awaitable[Any]],
                       send: Callable[..., Awaitable[Any]]) -> None:
        await (self._app or self.build())(scope, receive, send)


app = LazyApp()
