"""A worker that is PID 1 with no init in front of it (a container's exec-form command
without ``--init``) says so at start when it runs thread-mode handlers, whose tools'
orphans would stay its zombies; elsewhere it says nothing."""

from __future__ import annotations

from runner.worker.isolation import without_init


def test_pid_1_running_thread_handlers_is_told_to_run_under_an_init() -> None:
    said = without_init(False, pid=1)
    assert "PID 1" in said and "zombie" in said and "docker run --init" in said and "init: true" in said


def test_no_word_when_not_pid_1_or_when_every_function_runs_in_a_child() -> None:
    assert without_init(False, pid=4242) == ""
    assert without_init(True, pid=1) == ""  # (it reaps what it adopts: isolation.contain)
    assert without_init(False) == ""  # (this test process is not PID 1)
