"""The suite's net (conftest.py): no test reaches a Redis it did not start. REDIS_URL in
the test processes, and in the processes they start with their environment, names a port
a test process holds and never listens on, so a client nobody pointed at a server of the
test's (once, a handler's own ``Client.from_config()``) fails at once instead of writing
into whatever answers at the default 127.0.0.1:6379."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from runner.client import Client
from runner.errors import RedisUnavailable

from conftest import NO_REDIS, REPO


def test_redis_url_names_a_port_where_nothing_listens() -> None:
    url = os.environ["REDIS_URL"]
    assert url == os.environ[NO_REDIS]
    port = urlsplit(url).port
    assert port is not None and port != 6379
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_a_client_no_test_pointed_anywhere_fails_loudly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``Client.from_config()`` in a project that names no server, here and in a process
    started with this one's environment, is refused at the net's port."""
    (tmp_path / "runner.toml").write_text("[queues.fast]\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RUNNER_CONFIG", raising=False)
    port = str(urlsplit(os.environ["REDIS_URL"]).port)
    with pytest.raises(RedisUnavailable, match=port), Client.from_config() as client:
        client.stats()
    code = "from runner.client import Client\nwith Client.from_config() as c:\n    c.stats()\n"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode != 0 and "RedisUnavailable" in out.stderr and port in out.stderr, out.stderr
