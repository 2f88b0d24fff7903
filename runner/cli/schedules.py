"""`runner schedules`: every schedule with its next and last tick and last job, and
`runner schedules trigger ID`, which runs one tick now."""

from __future__ import annotations

import sys
from typing import Any

import click

from runner.cli.root import (
    EXIT_REFUSED,
    build_runtime,
    cli,
    down_view,
    emit,
    fail,
    operator,
    redis_errors,
    said_down,
    shards_down,
    table,
)
from runner.errors import UnknownSchedule


def _human(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no schedules: a function declares one with SCHEDULE = \"*/15 * * * *\""

    def last_job(r: dict[str, Any]) -> str:
        j = r["last_job"]
        return f"{j['id']} {j['status']}" if j else "-"

    lines = table(("id", "function", "cron", "tz", "next", "last", "last job", "state"),
                  [(r["id"], r["function"], r["cron"], r["tz"], r["next"], r["last"] or "-", last_job(r),
                    r["state"]) for r in rows])
    return lines


@cli.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def schedules(ctx: click.Context, as_json: bool) -> None:
    """Schedules (SCHEDULE in function files): next tick, last tick, last job (UTC)."""
    if ctx.invoked_subcommand is not None:
        return
    from runner.client import Client

    rt = build_runtime(ctx.obj["config"], client_only=True)
    with redis_errors():
        gone = shards_down(rt)  # a Cluster master down: named after the list (exit 3)
        rows = Client(rt).schedules()
    # A function file that did not load declares no schedule: say so, or a schedule with a
    # mistake in it (a 6-field cron) would just be missing from the list.
    errors = [e.shown() for e in rt.registry.errors.values()]
    out: dict[str, Any] = {"schedules": rows}
    if errors:
        out["errors"] = errors
    emit({**out, **down_view(gone)}, as_json, _human(rows))
    for e in errors:
        click.echo(click.style(f"not loaded, so no schedule of it is listed: {e}", fg="red"),
                   err=True)
    if gone:
        said_down(gone)


@schedules.command()
@click.argument("schedule_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def trigger(ctx: click.Context, schedule_id: str, as_json: bool) -> None:
    """Run one tick of schedule ID now (its own ticks go on as before); on the audit trail."""
    from runner.client import Client

    rt = build_runtime(ctx.obj["config"], client_only=True)
    with redis_errors():
        try:
            job = Client(rt).trigger(schedule_id, by=operator())
        except UnknownSchedule as exc:
            if as_json:
                emit({"error": str(exc), "kind": "UnknownSchedule"}, True)
            fail(str(exc), EXIT_REFUSED)
    emit(job.as_dict(), as_json, f"{job.id} {job.type} v{job.version} -> {job.queue} {job.status} "
                                 f"(tick of {schedule_id}, now)")
    sys.exit(0)
