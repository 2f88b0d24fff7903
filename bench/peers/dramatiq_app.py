"""Dramatiq: the Redis broker with its default middleware; no retries for the no-op."""

from __future__ import annotations

import os

import dramatiq
from benchprobe import hit, work
from dramatiq.brokers.redis import RedisBroker

broker = RedisBroker(url=os.environ["BENCH_REDIS_URL"])
dramatiq.set_broker(broker)


@dramatiq.actor(max_retries=0)
def noop(t: float = 0.0) -> None:
    hit(t)
    work()
