"""taskiq with taskiq-redis's stream broker.

The consumer group starts at the stream's beginning ("0"): with the default ("$") jobs
queued before the first worker started are never delivered.
"""

from __future__ import annotations

import os

from benchprobe import awork, hit
from taskiq_redis import RedisStreamBroker

broker = RedisStreamBroker(os.environ["BENCH_REDIS_URL"], consumer_id="0")


@broker.task
async def noop(t: float = 0.0) -> None:
    hit(t)
    await awork()
