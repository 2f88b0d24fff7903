"""Celery: Redis broker, no result backend, default acks (on receipt)."""

from __future__ import annotations

import os

from benchprobe import hit, work
from celery import Celery

app = Celery("bench", broker=os.environ["BENCH_REDIS_URL"])
app.conf.update(task_ignore_result=True, broker_connection_retry_on_startup=True,
                worker_hijack_root_logger=False)


@app.task
def noop(t: float = 0.0) -> None:
    hit(t)
    work()
