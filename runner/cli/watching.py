"""Watching a run: `runner logs ID [--follow]` prints a job's own log (what its handler
logged, and under process isolation what it printed), a line each; with --follow, the
lines as they land until the job ends."""

from __future__ import annotations

import re
import sys
from datetime import UTC, datetime
from typing import Any

import click

from runner.cli.jobs import refused_text
from runner.cli.root import (
    EXIT_OK,
    EXIT_REDIS,
    EXIT_REFUSED,
    RedisCommand,
    build_runtime,
    cli,
    down_text,
    emit,
    fail,
    redis_errors,
    said_damaged,
    shards_down,
)
from runner.errors import JobNotFound, RedisUnavailable, RunnerError

# A log line's text is a producer's: every control character but the newline is shown
# escaped, never sent to the terminal (a newline starts an indented continuation).
_CONTROL_BUT_NEWLINE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def shown(line: dict[str, Any]) -> str:
    """One log line for people: its UTC time, level, source and text."""
    ts = line.get("ts")
    when = datetime.fromtimestamp(ts / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z" \
        if isinstance(ts, int) and 0 <= ts < 2**46 else "-"
    text = _CONTROL_BUT_NEWLINE.sub(lambda m: f"\\x{ord(m.group()):02x}", str(line.get("msg", "")))
    level = _CONTROL_BUT_NEWLINE.sub("?", str(line.get("level", "")))[:10]
    src = _CONTROL_BUT_NEWLINE.sub("?", str(line.get("src", "")))[:10]
    return f"{when} {level:<7} {src:<6} " + text.replace("\n", "\n    ")


@cli.command(cls=RedisCommand)
@click.argument("job_id", metavar="ID")
@click.option("--follow", "-f", is_flag=True, help="Print lines as they land, until the job ends.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(0, 86_400), default=None, metavar="SECONDS",
              help="With --follow: stop after this long even if the job still runs.")
@click.option("--json", "as_json", is_flag=True,
              help="The job's status and lines as JSON (with --follow, one JSON object a line).")
@click.pass_context
def logs(ctx: click.Context, job_id: str, follow: bool, timeout_s: float | None, as_json: bool) -> None:
    """Print a job's own log: its handler's ctx.logger lines and, under process isolation,
    what it printed (the newest 500 lines and 256 KiB by default). Exit 1 for no such job."""
    from runner.client import Client

    rt = build_runtime(ctx.obj["config"], client_only=True)
    client = Client(rt)
    with redis_errors():
        gone = shards_down(rt)  # a Cluster master down or stalled: looked for on the live ones
        damaged: list[dict[str, Any]] = []
        try:
            if not follow:
                got = client.logs(job_id)
                damaged = got.get("damaged_keys", [])
                if as_json or got["lines"] or not damaged:
                    emit(got, as_json, "\n".join(shown(x) for x in got["lines"]) if got["lines"] else
                         f"(job {job_id} has logged nothing; status {got['status']})")
            else:
                for line in client.follow_logs(job_id, timeout_s=timeout_s, damaged=damaged):
                    emit(line, as_json, shown(line))
                    sys.stdout.flush()
        except RedisUnavailable:
            raise
        except JobNotFound as exc:
            if gone:  # it may live there: not "no such job"
                fail(f"job {job_id} is not on the masters that answer; {down_text(gone)}", EXIT_REDIS)
            fail(refused_text(exc), EXIT_REFUSED)
        except RunnerError as exc:
            fail(refused_text(exc), EXIT_REFUSED)
        finally:
            rt.close()
    if damaged:  # (a log key of another type: what was read is shown, then what to do)
        said_damaged(damaged)
    sys.exit(EXIT_OK)
