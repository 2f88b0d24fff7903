"""Commands on events (docs/events.md): `runner emit` and `runner events`."""

from __future__ import annotations

import sys
from typing import Any

import click

from runner.cli.root import (
    EXIT_REFUSED,
    RedisCommand,
    build_runtime,
    cli,
    down_view,
    emit,
    fail,
    plain,
    read_payload,
    redis_errors,
    refusal,
    said_damaged,
    said_down,
    shards_down,
    table,
    utc,
)
from runner.errors import EventRejected, NotReplicated, RedisUnavailable, RunnerError


@cli.command("emit", cls=RedisCommand)
@click.argument("name")
@click.argument("data", required=False)
@click.option("--idempotency-key", default=None, help="Dedupes the whole emit: the same key emits once.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def emit_cmd(ctx: click.Context, name: str, data: str | None, idempotency_key: str | None, as_json: bool) -> None:
    """Emit event NAME: one job per function whose TRIGGERS name it. DATA is JSON, @file,
    or - for stdin (default {})."""
    from runner.client import Client

    body = read_payload(data)
    rt = build_runtime(ctx.obj["config"], client_only=True)
    with redis_errors():
        try:
            out = Client(rt).emit(name, body, idempotency_key=idempotency_key)
        except (RedisUnavailable, NotReplicated):  # exit 3, as an enqueue (redis_errors)
            raise
        except EventRejected as exc:
            if as_json:
                emit({**refusal(exc), "exit_code": EXIT_REFUSED}, True)
            click.secho(f"event {name!r} rejected, nothing was enqueued:", fg="red", err=True)
            for fn, (version, errors) in exc.rejections.items():
                for e in errors:
                    click.echo(f"  {plain(fn)} v{version} {plain(e.path)}: {plain(e.message)}", err=True)
            sys.exit(EXIT_REFUSED)
        except RunnerError as exc:
            if as_json:
                emit({**refusal(exc), "exit_code": EXIT_REFUSED}, True)
            fail(str(exc), EXIT_REFUSED)
    dup = " (duplicate: the key's first emit)" if out.duplicate else ""
    lines = [f"event {out.id} {plain(name)}: {len(out.jobs)} job(s){dup}"]
    lines += [f"  {j['id']} {plain(str(j['type']))} -> {plain(str(j['queue']))} {j['status']}" for j in out.jobs]
    emit(out.as_dict(), as_json, "\n".join(lines))


@cli.command("events", cls=RedisCommand)
@click.option("--name", default=None, help="Only events of this name.")
@click.option("--limit", type=click.IntRange(1, 500), default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def events_cmd(ctx: click.Context, name: str | None, limit: int, as_json: bool) -> None:
    """The recent events, newest first, with the jobs each started and the waiting jobs
    (ctx.wait_for_event) each resumed."""
    from runner.client import Client
    from runner.store import damage

    rt = build_runtime(ctx.obj["config"], client_only=True)
    damaged: list[damage.Damaged] = []
    with redis_errors():
        gone = shards_down(rt)  # a Cluster master down: the live partitions' events, then exit 3
        try:
            out = Client(rt).events(limit=limit, name=name, damaged=damaged)
        except RedisUnavailable:
            raise
        except RunnerError as exc:
            fail(str(exc), EXIT_REFUSED)
    rows = [(utc(e["at_ms"] / 1000) if isinstance(e.get("at_ms"), int) else "?", e.get("id"),
             e.get("name"), str(e.get("waiters_resumed", 0)),
             " ".join(str(j.get("id") if isinstance(j, dict) else j) for j in _listed(e.get("jobs"))) or "-")
            for e in out]
    views = damage.views(damaged)
    if as_json or rows or not views:  # (none read from a damaged list: only what to do)
        emit({"events": out, **down_view(gone), **views}, as_json,
             table(("at (UTC)", "id", "name", "resumed", "jobs"), rows) if rows else "no events")
    if gone:
        said_down(gone)
    if views:  # (a partition's list of another Redis type: what to do, exit 1)
        said_damaged(views["damaged_keys"])


def _listed(jobs: Any) -> list[Any]:
    """An event's jobs as a list (the store reads only lists of objects back; this holds
    for any other reader's record too)."""
    return jobs if isinstance(jobs, list) else []
