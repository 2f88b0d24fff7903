"""What a job's ctx builds only when its handler uses it (worker/context.py, child.py):
ctx.logger at its first use, once whatever the threads, the step log at the first
durable call, owned by the thread that built the ctx; and a TIMEOUT alarm that comes
after its handler returned raises nowhere."""

from __future__ import annotations

import logging
import threading

import pytest

from runner.errors import JobTimeout, PermanentFailure
from runner.worker import child
from runner.worker.context import Context, Flags, Hooks, for_job
from runner.worker.execute import Claimed
from runner.worker.joblog import Capture, JobLogger
from runner.worker.journal import Journal


class _Made(Hooks):
    """A worker's hooks as far as ctx.logger goes: a JobLogger, told to ``made``."""

    def __init__(self, made: list[JobLogger]) -> None:
        self.made = made

    def logger(self, ctx: Context) -> JobLogger:
        logger = JobLogger(logging.getLogger("runner.job"), {"job_id": ctx.job_id, "type": ctx.type,
                                                             "attempt": ctx.attempt}, 10, 10_000)
        self.made.append(logger)
        return logger


def _ctx(made: list[JobLogger], hooks: Hooks | None = None) -> Context:
    job = Claimed("j1", "t1", 1, "noop", "1", "{}", 3, "", "", 1, 1, "", "fast", 1, steps=0)
    return for_job(job, 1, 10.0, hooks or _Made(made), Flags(), 1 << 20)


def test_a_logger_is_made_at_its_first_use_and_once_whatever_the_threads() -> None:
    """A handler that never logs makes no JobLogger; the first use makes one, told to
    ``_made`` once, and eight threads that log first at once share it."""
    made: list[JobLogger] = []
    ctx = _ctx(made)
    assert ctx._logger is None and made == []
    seen: list[object] = []
    go = threading.Barrier(8)

    def first() -> None:
        go.wait()
        seen.append(ctx.logger)

    threads = [threading.Thread(target=first) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and isinstance(made[0], JobLogger)
    assert all(s is made[0] for s in seen) and ctx.logger is made[0]
    assert made[0].extra == {"job_id": "j1", "type": "noop", "attempt": 1}


def test_a_capture_makes_the_logger_at_its_first_write_only() -> None:
    """A child's sys.stdout while its handler runs: nothing written, no logger made."""
    made: list[JobLogger] = []
    ctx = _ctx(made)
    out = Capture(lambda: ctx.logger, "stdout")  # type: ignore[arg-type, return-value]
    out.finish()
    assert made == []
    out.write("hello\n")
    assert len(made) == 1 and made[0].buf is not None and len(made[0].buf.lines) == 1


def test_the_step_log_is_made_at_the_first_durable_call_for_the_thread_that_built_the_ctx() -> None:
    """The journal is built at the first durable call, not per job; its owner is the thread
    that built the ctx (which runs the handler), even when another thread calls first."""
    owner = threading.get_ident()
    recorded: list[tuple[int, str]] = []

    def record(pos: int, body: str) -> tuple[int, int]:
        recorded.append((pos, body))
        return 1, len(recorded)

    class Steps(Hooks):
        def journal(self, ctx: Context) -> Journal:
            return Journal("j1", list, record, owner=owner)

    ctx = _ctx([], Steps())
    assert ctx._journal is None and ctx.step_key is None
    failed: list[BaseException] = []

    def from_a_thread() -> None:
        try:
            ctx.step("a", lambda: 1)
        except BaseException as exc:
            failed.append(exc)

    t = threading.Thread(target=from_a_thread)
    t.start()
    t.join()
    assert len(failed) == 1 and isinstance(failed[0], PermanentFailure), failed
    assert ctx.step("a", lambda: 2) == 2 and len(recorded) == 1


def test_an_alarm_after_the_handler_returned_raises_nowhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """TIMEOUT's timer is set as each handler starts and left to run out: its alarm while
    a handler runs is that job's timeout; one after it returned is nobody's."""
    monkeypatch.setattr(child, "_alarmed", False)
    monkeypatch.setattr(child, "_timing", False)
    child._on_alarm(14, None)
    assert child._alarmed is False
    monkeypatch.setattr(child, "_timing", True)
    with pytest.raises(JobTimeout):
        child._on_alarm(14, None)
    assert child._alarmed is True
