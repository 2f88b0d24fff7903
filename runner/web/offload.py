"""Blocking work off the event loop: Redis reads, dead-letter operations, batches, the
metrics scrape. Each runs on a small thread pool of the app's own, so a slow or
unreachable Redis ties up those threads, never the loop that answers everything else.

The enqueue route does not come here: it validates on the loop and hands the job to the
client's group commit (``Client.asend``), which sends whatever queued meanwhile in one
round trip on the loop's own connection (store/aiolink.py).
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class Offload:
    def __init__(self, threads: int) -> None:
        self.threads = max(1, threads)
        self._pool: ThreadPoolExecutor | None = None
        self._pid = os.getpid()

    async def __call__(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self._pool is None or self._pid != os.getpid():
            # Lazily, in the process that serves: gunicorn builds the app after its fork.
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="runner-web")
            self._pid = os.getpid()
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))
