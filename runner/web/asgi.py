"""``runner.web.asgi:app``: the ASGI app for any ASGI server, built lazily, on the first
request in each worker process, from ./runner.toml (or RUNNER_CONFIG) and the
environment. `runner web` does not need it (it builds the app in each gunicorn worker).

Lazily, so importing this module (a server's master, a preload, a test) opens no Redis
connection that a fork would then share between processes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from runner import config as config_mod
from runner.logs import setup as setup_logs
from runner.runtime import Runtime

log = logging.getLogger("runner.web")

ASGIApp = Callable[[dict[str, Any], Callable[..., Awaitable[Any]], Callable[..., Awaitable[Any]]],
                   Awaitable[None]]


class LazyApp:
    def __init__(self) -> None:
        self._app: ASGIApp | None = None
        self._lock = threading.Lock()

    def build(self) -> ASGIApp:
        with self._lock:
            if self._app is None:
                from runner.web import create_app

                cfg = config_mod.load()
                setup_logs(cfg.log)
                runtime = Runtime.create(cfg)
                for err in runtime.registry.errors.values():
                    log.error("function not loaded: %s", err)
                self._app = create_app(runtime)
            return self._app

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Awaitable[Any]],
                       send: Callable[..., Awaitable[Any]]) -> None:
        await (self._app or self.build())(scope, receive, send)


app = LazyApp()
