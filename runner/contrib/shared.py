"""The one Client a web process shares: built at first use from runner.toml and the
environment (REDIS_URL, RUNNER_REDIS_PREFIX, ...), reused by every request and thread
(the client batches overlapping enqueues into one round trip)."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path

from runner import config as config_mod
from runner.client import Client
from runner.runtime import Runtime
from runner.store import session

_lock = threading.Lock()
_clients: dict[tuple[str, tuple[tuple[str, str], ...]], Client] = {}


def shared_client(config: str | Path | None = None, env: Mapping[str, str] | None = None) -> Client:
    """The process's client for this config file and environment overrides."""
    key = (str(config or ""), tuple(sorted((env or {}).items())))
    with _lock:
        client = _clients.get(key)
        if client is None:
            merged = {**os.environ, **(env or {})}
            cfg = config_mod.load(config, env=merged)
            # Beside `runner dev`, an app's jobs go where dev's worker runs them (see
            # Client.from_config).
            cfg = session.follow_dev(cfg, config is not None or bool(merged.get("RUNNER_CONFIG")))
            client = _clients[key] = Client(Runtime.create(cfg))
        return client


def close_all() -> None:
    """Close every shared client (at shutdown, or between tests that change settings)."""
    with _lock:
        for client in _clients.values():
            client.runtime.close()
        _clients.clear()
