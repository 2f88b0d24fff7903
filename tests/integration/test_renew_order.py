"""A running job's log lines and its progress ride on the same lease renewal, and a
follower who sees a line sees every progress report made before it: the renewal takes the
lines first, writes the progress, then the lines. (The lines went first: a reader between
the two round trips saw a line with the progress from before it.)"""

from __future__ import annotations

import json
import logging
import queue as stdqueue
from typing import Any

from runner.store import codec
from runner.worker.fetcher import Fetcher
from runner.worker.joblog import JobLogger
from runner.worker.ledger import Ledger, Run, Settlement
from runner.worker.renewer import Renewer

from conftest import Project


def test_a_line_is_written_after_the_progress_made_before_it(project: Project) -> None:
    rt = project.runtime
    q = rt.config.queues["fast"]
    project.client.enqueue("noop", {})
    ledger = Ledger(q.concurrency, 1, 1)
    inbox: stdqueue.SimpleQueue[Run | None] = stdqueue.SimpleQueue()
    outcomes: stdqueue.SimpleQueue[Settlement | None] = stdqueue.SimpleQueue()
    fetcher = Fetcher(rt, q, ledger, inbox, outcomes, "w-order")
    assert fetcher.claim(1, 1)[0] == 1
    (run,) = ledger.renewable()
    job_id = run.job.id
    # What a handler did: a report, then a line.
    run.progress = codec.dumps({"percent": 50, "message": "half way"})
    run.logs = JobLogger(logging.getLogger("runner.job"), {}, 1000, 1_000_000)
    run.logs.keep([json.dumps({"ts": 1, "level": "INFO", "msg": "sent"})])

    seen: list[tuple[Any, list[str]]] = []
    scripts = rt.scripts
    renew = scripts.renew

    def renew_and_look(*args: Any, **kwargs: Any) -> Any:
        # Just after the renewal's write: what a follower reading now sees.
        codes = renew(*args, **kwargs)
        view = project.client.get(job_id).as_dict()
        seen.append((view.get("progress"), [line["msg"] for line in project.client.logs(job_id)["lines"]]))
        return codes

    scripts.renew = renew_and_look  # type: ignore[method-assign]
    try:
        Renewer(rt, q, ledger).renew([run])
    finally:
        del scripts.renew
    assert seen == [({"percent": 50, "message": "half way"}, [])]
    # And once the renewal is through, the line is there with it.
    assert [line["msg"] for line in project.client.logs(job_id)["lines"]] == ["sent"]
    assert project.client.get(job_id).as_dict()["progress"] == {"percent": 50, "message": "half way"}
