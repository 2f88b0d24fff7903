"""Huey: RedisHuey with blocking reads; results are not stored."""

from __future__ import annotations

import os

from benchprobe import hit, work
from huey import RedisHuey

huey = RedisHuey("bench", url=os.environ["BENCH_REDIS_URL"], blocking=True, results=False)


@huey.task()
def noop(t: float = 0.0) -> None:
    hit(t)
    work()
