"""arq: default settings but a 10 ms poll delay (its default of 0.5 s would dominate latency)."""

from __future__ import annotations

import os
from typing import Any

from arq.connections import RedisSettings
from benchprobe import awork, hit


async def noop(ctx: Any, t: float = 0.0) -> None:
    hit(t)
    await awork()


class WorkerSettings:
    functions = [noop]  # noqa: RUF012
    redis_settings = RedisSettings.from_dsn(os.environ["BENCH_REDIS_URL"])
    poll_delay = 0.01
