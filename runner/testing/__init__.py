"""Testing helpers for projects that use runner: ``run_inline`` runs one job in the
test's own process, as a worker would (inline.py), and a pytest plugin (plugin.py,
registered as the ``runner_testing`` entry point) gives fixtures on a private embedded
server: ``runner_client``, ``runner_worker`` (``drain()``) and ``assert_enqueued``
(harness.py).

May import anything in runner: it is a shell over the whole engine, like the CLI.
"""

from __future__ import annotations

from runner.testing.inline import Followup, Outcome, run_inline

__all__ = ["Followup", "Outcome", "run_inline"]
