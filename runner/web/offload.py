"""Blocking work off the event loop: Redis reads, dead-letter operations, batches, the
metrics scrape. Each runs on a small thread pool of the app's own, so a slow or
unreachable Redis ties up those threads, never the loop that answers everything else.

The enqueue route does not come here: it validates on the loop and hands the job to the
client's group commit (``Client.asend``), which sends whatever queued meanwhile in one
round trip on the loop's own connection (store/aiolink.py).

The health check has a lane apart (``shared``): behind eight slow pages on the pool, a
/healthz would wait for a free thread and a load balancer would take a busy but healthy
process out of rotation.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class _Pool:
    """A thread pool built lazily in the process that serves: gunicorn builds the app
    before its fork, and threads do not survive one."""

    def __init__(self, threads: int, name: str) -> None:
        self.threads, self.name = threads, name
        self._pool: ThreadPoolExecutor | None = None
        self._pid = os.getpid()

    def get(self) -> ThreadPoolExecutor:
        if self._pool is None or self._pid != os.getpid():
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix=self.name)
            self._pid = os.getpid()
        return self._pool


class Offload:
    def __init__(self, threads: int) -> None:
        self.threads = max(1, threads)
        self._pool = _Pool(self.threads, "runner-web")
        self._apart = _Pool(1, "runner-web-apart")
        self._flying: dict[Callable[..., Any], asyncio.Future[Any]] = {}

    async def __call__(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        call = functools.partial(fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._pool.get(), call)

    async def shared(self, fn: Callable[[], T]) -> T:
        """``fn()`` on a thread of its own, never queued behind the pool's work. Callers
        that come while a call is in flight share its outcome: however many probes
        arrive while Redis hangs, one thread waits for it."""
        flying = self._flying.get(fn)
        if flying is None or flying.done():
            flying = asyncio.get_running_loop().run_in_executor(self._apart.get(), fn)
            self._flying[fn] = flying
        # shield: one caller that goes away (a client hung up) does not cancel the others' call
        return await asyncio.shield(flying)
