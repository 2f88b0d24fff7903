"""A process-isolated child's sentry (isolation.py) needs a shell: where there is none (a
minimal image), the child must still serve, unguarded, and say why; before, the failed
spawn ended the child at start and every process job failed as "executor crashed"."""

from __future__ import annotations

import logging
import os

import pytest

from runner.worker.isolation import _guard_group


def test_without_a_shell_the_child_serves_unguarded_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    r, w = os.pipe()
    try:
        with caplog.at_level(logging.WARNING):
            assert _guard_group(r, os.getpgid(0), shell="/nonexistent/sh") is None
        with pytest.raises(OSError):
            os.fstat(r)  # the read end is closed either way: only the worker's end keeps the pipe
        assert "no sentry for this child process" in caplog.text and "/nonexistent/sh" in caplog.text
    finally:
        os.close(w)
