"""BullMQ's Python port: a Queue and a Worker (concurrency 10) with default job options."""

from __future__ import annotations

import os
from typing import Any

from benchprobe import awork, hit

URL = os.environ["BENCH_REDIS_URL"]
QUEUE = "bench"
CONCURRENCY = 10


async def process(job: Any, token: str) -> None:
    hit(job.data.get("t", 0.0))
    await awork()
