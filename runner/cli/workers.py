"""`runner workers`: the worker processes alive now (the roster, store/roster.py), each
with its queues, concurrency, isolation, release and the jobs its handlers run."""

from __future__ import annotations

from typing import Any

import click

from runner.cli.root import (
    RedisCommand,
    build_runtime,
    cli,
    down_view,
    emit,
    redis_errors,
    said_damaged,
    said_down,
    shards_down,
    table,
    utc,
)


def _when(seconds: float | None) -> str:
    return f"{utc(seconds)} UTC"


def _human(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no worker alive: start one with `runner worker` (or `runner dev`)"
    lines = table(("id", "queues", "concurrency", "isolation", "release", "started", "last seen", "running"),
                  [(w["id"], ",".join(w["queues"]), w["concurrency"], w["isolation"] or "-",
                    w["release"] or w["version"] or "-", _when(w["started_at"]), _when(w["last_seen"]),
                    len(w["running"])) for w in rows])
    running = [f"  {w['id']}: {r['id']} {r['type']} since {_when(r['started'])}" for w in rows for r in w["running"]]
    return lines + ("\n\nrunning now:\n" + "\n".join(running) if running else "")


@cli.command(cls=RedisCommand)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def workers(ctx: click.Context, as_json: bool) -> None:
    """The workers alive now, and the jobs each runs (as of its last heartbeat, UTC)."""
    from runner.client import Client
    from runner.store import damage

    rt = build_runtime(ctx.obj["config"], client_only=True)
    damaged: list[damage.Damaged] = []
    with redis_errors():
        gone = shards_down(rt)  # a Cluster master down: named after the list (exit 3)
        rows = Client(rt).workers(damaged)
    views = damage.views(damaged)
    if as_json or rows or not views:  # (none read from a damaged roster: only what to do)
        emit({"workers": rows, **down_view(gone), **views}, as_json, _human(rows))
    if gone:
        said_down(gone)
    if views:  # (a roster of another Redis type: what to do, exit 1)
        said_damaged(views["damaged_keys"])
