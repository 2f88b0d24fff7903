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


__all__ = ["cli", "main"]
