"""A settlement call writes at most SCRIPT_BYTES of results (and kept payloads): the
settler sends up to 500 outcomes a round trip, and one ack call over many big results
held Redis for seconds (about 270 results of 1 MB: 1.3 s; 110 of 4 MB: 6.2 s, past the
busy limit). Past the bound the outcomes go in further calls of the same round trip.
Counted by script calls, not timed."""

from __future__ import annotations

import queue as stdqueue
from collections import Counter
from typing import Any

from runner.store import records
from runner.worker.execute import Done
from runner.worker.fetcher import Fetcher
from runner.worker.ledger import Ledger, Settlement
from runner.worker.settler import Settler

from conftest import Project

RESULT = 1_000_000  # about 1 MB a result: within the default max_result_bytes (1 MiB)
JOBS = 20


def _script_calls(r: Any) -> int:
    stats = r.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))


def test_one_round_trip_of_big_results_is_several_ack_calls_each_within_the_bound(project: Project) -> None:
    rt = project.runtime
    q = rt.config.queues["fast"]
    ids = [project.client.enqueue("noop", {"i": i}).id for i in range(JOBS)]
    ledger = Ledger(JOBS, JOBS, 1)
    inbox: stdqueue.SimpleQueue[Any] = stdqueue.SimpleQueue()
    fetcher = Fetcher(rt, q, ledger, inbox, stdqueue.SimpleQueue(), "w-bytes")
    settler = Settler(rt, q, ledger, stdqueue.SimpleQueue())
    runs = []
    while len(runs) < JOBS:
        got = fetcher.claim(JOBS, JOBS)
        assert got is not None and got[0] > 0, got
        while not inbox.empty():
            runs.append(inbox.get())
    results = {run.job.id: '"' + run.job.id + "r" * RESULT + '"' for run in runs}
    before = _script_calls(rt.redis)
    settler.send([Settlement(run, Done(results[run.job.id]), 0.001, run.job.claimed_ms) for run in runs])
    calls = _script_calls(rt.redis) - before
    # (one ack call, and in a fresh project a start call may go with it; each ack call
    # carries at most SCRIPT_BYTES of results: 20 MB need 3)
    most = records.SCRIPT_BYTES // (RESULT + 30)
    assert calls >= -(-JOBS // most), (calls, most)
    statuses = Counter(project.client.get(i).status for i in ids)
    assert statuses == {"done": JOBS}, statuses
    for job_id in ids[:3]:
        assert project.client.get(job_id).as_dict()["result"] == results[job_id][1:-1]
