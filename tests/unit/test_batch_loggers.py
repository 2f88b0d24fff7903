"""A batch's members' loggers and ctx.jobs without Redis: each member's logger is made at
its first line (a batch that logs nothing makes none), a line of ctx.logger reaches every
member's log, a logger kept from before goes on, and ctx.jobs is built at its first read."""

from __future__ import annotations

import logging

from runner.worker import batching
from runner.worker.context import Flags
from runner.worker.joblog import JobLogger, batch_loggers

LOG = logging.getLogger("runner.job.test")


def test_a_members_logger_is_made_at_its_first_line_only() -> None:
    """Nothing made up front; ctx.jobs[1].logger makes member 1's alone, its line in its
    own log, and the run hears of it (its lines go with its renewal and settlement)."""
    made: list[int] = []
    members, _ = batch_loggers(LOG, "bulk", [("a", 1), ("b", 1), ("c", 2)], (100, 10_000),
                               on_made=lambda i, lg: made.append(i))
    assert [members.made(i) for i in range(3)] == [None, None, None]
    members[1].info("item b")
    assert made == [1]
    own = members.made(1)
    assert own is not None and own.buf is not None and len(own.buf.take()) == 1
    assert members.made(0) is None and members.made(2) is None
    assert members[1] is own  # (made once)


def test_a_line_of_the_whole_batch_reaches_every_member_and_a_kept_logger_goes_on() -> None:
    kept = JobLogger(LOG, {"job_id": "b"}, 100, 10_000)
    kept.info("before the batch")
    members, shared = batch_loggers(LOG, "bulk", [("a", 1), ("b", 1)], (100, 10_000), kept=[None, kept])
    shared.info("the batch")
    assert members[1] is kept
    got = [members.made(i) for i in range(2)]
    assert all(m is not None and m.buf is not None for m in got)
    assert [len(m.buf.take()) for m in got if m is not None and m.buf is not None] == [1, 2]


def test_ctx_jobs_is_built_at_its_first_read() -> None:
    """A handler that never reads ctx.jobs costs no BatchJob; one that does sees each
    item's id, attempt and own logger, by index."""
    built: list[int] = []
    members, shared = batch_loggers(LOG, "bulk", [("a", 1), ("b", 3)], (100, 10_000))

    def jobs() -> list[batching.BatchJob]:
        built.append(1)
        return [batching.BatchJob("a", 1, 3, None, Flags(), members, 0),
                batching.BatchJob("b", 3, 3, "k", Flags(), members, 1)]

    ctx = batching.BatchContext("bulk", 1, "fast", jobs, 10.0, shared)
    assert built == []
    assert [(j.id, j.attempt, j.idempotency_key) for j in ctx.jobs] == [("a", 1, None), ("b", 3, "k")]
    assert ctx.jobs[1].logger is members[1] and members.made(0) is None
    assert ctx.jobs is ctx.jobs and built == [1]
