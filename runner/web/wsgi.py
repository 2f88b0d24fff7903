"""``gunicorn runner.web.wsgi:app``: the app built lazily, on the first request in each
worker process, from ./runner.toml (or RUNNER_CONFIG) and the environment.

Lazily, so importing this module (gunicorn's master, a `--preload`, a test) opens no
Redis connection that a fork would then share between processes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from runner import config as config_mod
from runner.logs import setup as setup_logs
from runner.runtime import Runtime

log = logging.getLogger("runner.web")


class LazyApp:
    def __init__(self) -> None:
        self._app: Callable[..., Iterable[bytes]] | None = None
        self._lock = threading.Lock()

    def build(self) -> Callable[..., Iterable[bytes]]:
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

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        return (self._app or self.build())(environ, start_response)


app = LazyApp()
