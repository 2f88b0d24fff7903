"""The store owns every Redis command, checked as the suite runs: redis-py's command entry
points, and the send of the store's own connections (link.py, aiolink.py), are wrapped
so that a command sent from runner code outside ``runner/store/`` is noted, and the test
that sent it fails at teardown (conftest.py's ``_store_owns_redis``).

The static walk (tests/unit/test_store_owns_redis.py) reads every module but can never see
every way a client is reached; this guard sees the commands the suite runs in its own
process, however the client got there, when the sender calls the command in its own
thread. It does not see what it does not run (a worker or a web server in a subprocess),
nor a command whose bound method is handed to a thread or an executor
(``asyncio.to_thread(client.get, k)``, ``Thread(target=client.ping)``): that frame's caller
is the thread machinery, not the sender; the static walk flags those forms for a client it
knows. Cheap: one frame walk per command, up to the first frame outside redis-py."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import redis.asyncio.client
import redis.asyncio.cluster
import redis.client
import redis.cluster

from runner.store import aiolink, link

# (the caller's module, line, the command) of each command sent from outside the store
seen: list[tuple[str, int, str]] = []

_ENTRY_POINTS: tuple[tuple[type, str], ...] = (*(
    (cls, name)
    for cls in (redis.client.Redis, redis.client.Pipeline, redis.client.PubSub, redis.cluster.RedisCluster,
                redis.cluster.ClusterPipeline, redis.asyncio.client.Redis, redis.asyncio.client.Pipeline,
                redis.asyncio.client.PubSub, redis.asyncio.cluster.RedisCluster,
                redis.asyncio.cluster.ClusterPipeline)
    for name in ("execute_command", "execute")
    if name in vars(cls)
), (link.Link, "send"), (aiolink.AsyncLink, "send"))  # (the last two: the store's own connections)
# Frames passed over on the way to the sender: redis-py's, and the store's connections'.
_CARRIERS = ("runner.store.link", "runner.store.aiolink")


def _outside_the_store(args: tuple[Any, ...]) -> None:
    f = sys._getframe(2)  # the wrapper's caller
    while f is not None:
        module = f.f_globals.get("__name__", "")
        if module != "redis" and not module.startswith("redis.") and module not in _CARRIERS:
            if module.startswith("runner.") and not module.startswith("runner.store"):
                what = str(args[0][0][0] if isinstance(args[0], list) else args[0]) if args else "execute"
                seen.append((module, f.f_lineno, what))
            return
        f = f.f_back


def _wrap(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def watched(self: Any, *args: Any, **kwargs: Any) -> Any:
        _outside_the_store(args)
        return method(self, *args, **kwargs)

    watched.__wrapped_by_guard__ = True  # type: ignore[attr-defined]
    return watched


def install() -> None:
    """Wrap the entry points (once)."""
    for cls, name in _ENTRY_POINTS:
        method = vars(cls)[name]
        if not getattr(method, "__wrapped_by_guard__", False):
            setattr(cls, name, _wrap(method))
