"""The settler gathers settlements while a backlog waits: handlers that block end one by
one, and sent at once each run's start mark and outcome went out in script calls of a
job or two. Most prefetched runs that end within the wait need no start mark at all."""

from __future__ import annotations

from typing import Any

import pytest

from runner.store.scripts import Scripts
from runner.worker.worker import Worker

from conftest import Project, wait_for

JOBS = 300


def test_a_backlog_of_blocking_handlers_sends_few_start_marks(project: Project,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    project.write_config(concurrency=4, prefetch=8, batch=8)
    marks: list[int] = []
    acks: list[int] = []
    start, ack = Scripts.start, Scripts.ack

    def counting_start(self: Scripts, k: Any, owned: Any, *args: Any, **kw: Any) -> Any:
        marks.append(len(owned))
        return start(self, k, owned, *args, **kw)

    def counting_ack(self: Scripts, k: Any, done: Any, *args: Any, **kw: Any) -> Any:
        acks.append(len(done))
        return ack(self, k, done, *args, **kw)

    monkeypatch.setattr(Scripts, "start", counting_start)
    monkeypatch.setattr(Scripts, "ack", counting_ack)
    ids = [project.client.enqueue("sleepy", {"sleep": 0.0002}).id for _ in range(JOBS)]
    w = Worker(project.runtime, ["fast"])
    w.start()
    try:
        wait_for(lambda: project.client.get(ids[-1]).status == "done"
                 and all(project.client.get(i).status == "done" for i in ids), timeout=60)
    finally:
        w.stop(grace_s=5)
    assert sum(acks) == JOBS
    # Nearly every job but the first claim's 4 was claimed ahead of a free thread.
    assert sum(marks) < JOBS * 0.25, (sum(marks), len(marks))
    assert len(acks) < JOBS / 3, len(acks)  # more than 3 jobs per ack script call
