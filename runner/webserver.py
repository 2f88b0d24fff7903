"""Serving the WSGI app: gunicorn for `runner web`, a threaded server for `runner dev`.

`runner web` runs gunicorn programmatically: the config is loaded once in the master (so a
broken runner.toml fails before any fork), and each worker process builds its own Runtime
(Redis connections must not cross a fork) and serves ``create_app(runtime)``. Settings fit
a PaaS: bind 0.0.0.0:$PORT, $WEB_CONCURRENCY processes of gthread workers, and a graceful
timeout well under the usual 30 s between SIGTERM and SIGKILL. GUNICORN_CMD_ARGS still
overrides any of them.

`runner dev` serves the same app from a thread of its own process, so the app and the
workers share one Runtime and a reload is seen by both at once.
"""

from __future__ import annotations

import logging
import socketserver
import threading
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from gunicorn.app.base import BaseApplication

from runner.config import Config

log = logging.getLogger("runner.web")

# SIGTERM -> SIGKILL is 30 s on the common platforms; leave room for the interpreter to exit.
GRACEFUL_TIMEOUT_S = 20


def gunicorn_options(host: str, port: int, workers: int, threads: int) -> dict[str, Any]:
    return {
        "bind": f"{host}:{port}",
        "workers": workers,
        "worker_class": "gthread",
        "threads": threads,
        "graceful_timeout": GRACEFUL_TIMEOUT_S,
        # A request that takes this long is stuck: enqueueing is a few Redis round trips.
        "timeout": 30,
        "keepalive": 5,
        "accesslog": None,
        "errorlog": "-",
        "proc_name": "runner-web",
    }


class GunicornApp(BaseApplication):  # type: ignore[misc]
    def __init__(self, config: Config, options: dict[str, Any]) -> None:
        self.config = config
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)
        if "control_socket_disable" in self.cfg.settings:
            # Newer gunicorns open a control socket under $HOME by default: read-only on
            # some platforms, and shared by every instance on a machine.
            self.cfg.set("control_socket_disable", True)
        # The operator's overrides, as with the gunicorn command.
        parser = self.cfg.parser()
        env_args = parser.parse_args(self.cfg.get_cmd_args_from_env())
        for key, value in vars(env_args).items():
            if value is not None and key != "args":
                self.cfg.set(key.lower(), value)

    def load(self) -> Any:
        # Runs in each worker after the fork: its own Redis connections and registry.
        from runner.runtime import Runtime
        from runner.web import create_app

        runtime = Runtime.create(self.config)
        for err in runtime.registry.errors.values():
            log.error("function not loaded: %s", err)
        return create_app(runtime)


def serve(config: Config, host: str, port: int, workers: int, threads: int) -> None:
    """Run gunicorn in this process until SIGTERM (graceful) or SIGINT/SIGQUIT (fast)."""
    GunicornApp(config, gunicorn_options(host, port, workers, threads)).run()


# --- dev ---------------------------------------------------------------------------------


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        # Reads (the dashboard polls) at DEBUG, everything else at INFO.
        level = logging.DEBUG if self.command in ("GET", "HEAD") else logging.INFO
        log.log(level, "%s %s", self.address_string(), format % args)


class DevServer:
    """A threaded WSGI server on its own thread, with start()/stop()."""

    def __init__(self, app: Any, host: str, port: int) -> None:
        self.server = make_server(host, port, app, server_class=_ThreadingServer,
                                  handler_class=_QuietHandler)
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)
