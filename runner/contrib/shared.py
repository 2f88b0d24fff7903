"""The one Client a web process shares: built at first use from runner.toml and the
environment (REDIS_URL, RUNNER_REDIS_PREFIX, ...), reused by every request and thread
(the client batches overlapping enqueues into one round trip).

A test pins its own client (``pinned``, entered by the pytest plugin's fixtures): while
pinned, every integration (Django, FastAPI, SQLAlchemy) gets that client whatever the
settings say, so each test's app enqueues under that test's prefix."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from runner import config as config_mod
from runner.client import Client
from runner.runtime import Runtime
from runner.store import session

_lock = threading.Lock()
_clients: dict[tuple[str, tuple[tuple[str, str], ...]], Client] = {}
_pins: list[Client] = []  # a stack: the innermost pin wins


def shared_client(config: str | Path | None = None, env: Mapping[str, str] | None = None) -> Client:
    """The process's client for this config file and environment overrides (the pinned
    client while one is pinned)."""
    key = (str(config or ""), tuple(sorted((env or {}).items())))
    with _lock:
        if _pins:
            return _pins[-1]
        client = _clients.get(key)
        if client is None:
            merged = {**os.environ, **(env or {})}
            cfg = config_mod.load(config, env=merged)
            # Beside `runner dev`, an app's jobs go where dev's worker runs them (see
            # Client.from_config).
            cfg = session.follow_dev(cfg, config is not None or bool(merged.get("RUNNER_CONFIG")))
            client = _clients[key] = Client(Runtime.create(cfg))
        return client


def pinned_client() -> Client | None:
    """The client pinned now, if any (an integration that caches a client of its own, as
    FastAPI's app.state does, asks this first)."""
    with _lock:
        return _pins[-1] if _pins else None


@contextmanager
def pinned(client: Client) -> Iterator[Client]:
    """Every shared client is ``client`` within the block (a test's client, so that the
    app under test enqueues where the test looks). The caller owns and closes it."""
    with _lock:
        _pins.append(client)
    try:
        yield client
    finally:
        with _lock:
            _pins.remove(client)


def close_all() -> None:
    """Close every shared client (at shutdown; a pinned client is its owner's to close)."""
    with _lock:
        for client in _clients.values():
            client.runtime.close()
        _clients.clear()
