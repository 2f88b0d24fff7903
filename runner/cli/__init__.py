"""The `runner` command: each subcommand parses, builds a runtime, makes one core call and
maps the outcome to an exit code. Tables for people by default; ``--json`` for scripts.
The top of the stack: it may import every layer, and nothing imports it.

Exit codes (the same for every subcommand):

    0  success
    1  refused: an invalid payload, a conflict, no such job, a failed check,
       a line of --jsonl or a job of a bulk operation that was refused
    2  usage or configuration error (bad option, runner.toml, missing token)
    3  Redis unreachable
    4  `runner call`: the job had not ended when the timeout passed

While `runner dev` runs its embedded Redis, the commands of the same project that talk
to Redis (enqueue, job, stats, dead, check) use that server.
"""

from __future__ import annotations

import gc

# The subcommands' modules are imported on first use (root.COMMANDS).
from runner.cli.root import cli


def main() -> None:
    try:
        cli()
    except SystemExit as done:
        _past_calls_given_up(done)
        raise
    except Exception as exc:
        # A setting of the URL the server refused as the connection opened (any command,
        # the worker's start-up check included): one line naming it, not a traceback.
        from runner.cli.root import EXIT_CONFIG, fail
        from runner.errors import setting_problem

        said = setting_problem(exc)
        if said is None:
            raise
        fail(said, EXIT_CONFIG)
    finally:
        # The process ends here. The collections the interpreter runs on its way out would
        # walk every object the imports made (redis-py's alone cost a command about 15 ms)
        # to free memory the exit frees anyway; frozen, they skip them. atexit handlers,
        # the flush of the streams and the join of threads still run.
        gc.freeze()



def _past_calls_given_up(done: SystemExit) -> None:
    """Redis Cluster: a call given up on a stalled master (within a reader's bound) waits
    on a pool thread until the master answers or its socket times out, again after each
    read of the layout; Python's exit joins that thread, and a `runner cancel` that had
    printed its answers in 4 s held its caller for the whole stall (43 s of a 45 s one).
    With the command's answer given, the process ends without those threads, its exit
    hooks run and its streams flushed as a stopped worker's are."""
    import threading

    code = done.code
    if not (code is None or isinstance(code, int)):
        return
    if any(t.name.startswith("redis-send") and t.is_alive() for t in threading.enumerate()):
        from runner.cli.processes import _exit_past_handler_threads

        _exit_past_handler_threads(code or 0)


__all__ = ["cli", "main"]
