"""A worker's threads are vital: when one dies, the worker dies with it.

Every part of a worker is a thread that loops until it is stopped, and each handles the
errors it expects (Redis away, a refused script) and logs and retries the rest. An error
that still escapes a loop (a bug outside those handlers) would end that thread
alone, and the process would live on without it: without its settler, finished jobs stay
leased and renewed for ever and are never acknowledged; without its renewer, the leases
of running jobs lapse and another worker runs them again while they still run here. So
such an error ends the process, at once and loudly (exit status 70, EX_SOFTWARE): a
supervisor (the PaaS, systemd, Kubernetes) starts a fresh worker, and the dead one's jobs
are reclaimed when their leases lapse, as after any crash. `runner dev` runs its worker
beside its web server in one process: the dev session ends too, with the traceback on
its console. An executor's loop is guarded too (outside the handler's own run, which
catches everything): a run it dropped would stay leased, renewed for ever.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable

log = logging.getLogger("runner.worker")

EXIT_STATUS = 70


def vital(loop: Callable[[], None]) -> Callable[[], None]:
    """``loop`` as a thread's target whose escaping error ends the process."""

    def run() -> None:
        try:
            loop()
        except BaseException as exc:
            name = threading.current_thread().name
            log.critical("the %s thread died (%s: %s); exiting with status %d so that a supervisor "
                         "restarts this worker (its jobs are reclaimed when their leases lapse)",
                         name, type(exc).__name__, exc, EXIT_STATUS, exc_info=True)
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(OSError, ValueError):
                    stream.flush()
            os._exit(EXIT_STATUS)

    return run
