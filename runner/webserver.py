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
import os
import shlex
import socket
import socketserver
import threading
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from gunicorn.app.base import BaseApplication

from runner.config import Config
from runner.errors import ConfigError

log = logging.getLogger("runner.web")

# SIGTERM -> SIGKILL is 30 s on the common platforms; leave room for the interpreter to exit.
GRACEFUL_TIMEOUT_S = 20


def gunicorn_options(host: str, port: int, workers: int, threads: int) -> dict[str, Any]:
    return {
        "bind": f"{host}:{port}",
        "workers": workers,
        "worker_class": "gthread",
        "threads": threads,
        # Each worker process listens on a socket of its own and the kernel spreads new
        # connections over them. With one shared socket, whichever process is idle takes
        # every connection that arrives at once, and long-lived keep-alive clients then
        # load one process while the other idles: seen here as 32 connections on one
        # process and half the throughput. Unix-socket binds turn it off (load_config).
        "reuse_port": True,
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
        if any(not _is_tcp(addr) for addr in self.cfg.bind):
            # Every worker would bind (and first unlink) the same socket file.
            self.cfg.set("reuse_port", False)

    def load(self) -> Any:
        # Runs in each worker after the fork: its own Redis connections and registry.
        from runner.runtime import Runtime
        from runner.web import create_app

        runtime = Runtime.create(self.config)
        for err in runtime.registry.errors.values():
            log.error("function not loaded: %s", err)
        return create_app(runtime)


def _is_tcp(addr: str) -> bool:
    return not addr.startswith(("unix:", "fd://"))


def _bind_overridden() -> bool:
    args = shlex.split(os.environ.get("GUNICORN_CMD_ARGS", ""))
    return any(a == "-b" or a.startswith(("--bind", "-b")) for a in args)


def check_port_free(host: str, port: int) -> None:
    """Refuse a port that something already listens on. The workers bind with
    SO_REUSEPORT, so a second server on the same port would otherwise start without error
    and silently take a share of the first one's connections; a plain bind fails. (A bind
    given in GUNICORN_CMD_ARGS is gunicorn's to check.)"""
    if _bind_overridden():
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # As gunicorn binds: a port left in TIME_WAIT by a server just stopped is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def serve(config: Config, host: str, port: int, workers: int, threads: int) -> None:
    """Run gunicorn in this process until SIGTERM (graceful) or SIGINT/SIGQUIT (fast)."""
    check_port_free(host, port)
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
