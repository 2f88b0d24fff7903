"""RQ: the job function (workers are `rq worker` with SimpleWorker, no fork per job)."""

from __future__ import annotations

from benchprobe import hit, work


def noop(t: float = 0.0) -> None:
    hit(t)
    work()
