"""Which signal stops a process gracefully and which stops it at once: the one rule of
`runner worker` and `runner dev` (gunicorn's master under `runner web` keeps the same).

SIGTERM means "stop gracefully" however many times it comes. A stop that signals every
process sends it more than once: Heroku stopping a dyno that runs `honcho start`, and
systemd's KillMode=control-group, send SIGTERM to every process, and honcho or foreman
then forwards its own to the worker. Reading the second as "exit now" killed the running
handlers the grace period was for. What stops at once is asked for explicitly: a second
Ctrl-C (SIGINT) from a terminal, or SIGQUIT (Ctrl-\\).
"""

from __future__ import annotations

import signal

# Caught by the processes that stop gracefully; SIGQUIT only ends them.
CAUGHT = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)


class Stops:
    """The stop signals a process got so far. Only counters: it is called from a signal
    handler."""

    def __init__(self) -> None:
        self.count = 0  # SIGTERMs and SIGINTs (the graceful stop begins at the first)
        self.interrupts = 0  # SIGINTs of those

    def at_once(self, signum: int) -> bool:
        """Whether ``signum`` ends the process now: SIGQUIT, or a SIGINT after another.
        Otherwise it is counted, and the stop stays graceful."""
        if signum == signal.SIGQUIT or (signum == signal.SIGINT and self.interrupts):
            return True
        self.count += 1
        if signum == signal.SIGINT:
            self.interrupts += 1
        return False

    def words(self, signum: int, grace_s: float) -> str:
        """What the log says of a stop signal that did not end the process."""
        name = signal.Signals(signum).name
        if self.count > 1:
            return (f"signal {name}: already stopping gracefully (running jobs have {grace_s:g}s); "
                    "Ctrl-C again or SIGQUIT stops at once")
        return (f"signal {name}: stopping gracefully (running jobs finish, within {grace_s:g}s); "
                "Ctrl-C again or SIGQUIT stops at once")
