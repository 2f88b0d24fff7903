"""SAQ: one queue, concurrency 10 per worker process."""

from __future__ import annotations

import os
from typing import Any

from benchprobe import awork, hit
from saq import Queue

queue = Queue.from_url(os.environ["BENCH_REDIS_URL"])


async def noop(ctx: Any, *, t: float = 0.0) -> None:
    hit(t)
    await awork()


settings = {"queue": queue, "functions": [noop], "concurrency": 10}
