"""`runner pause` and `runner resume`: a queue, or one function with --function."""

from __future__ import annotations

from typing import Any

import click

from runner.cli.root import EXIT_REFUSED, RedisCommand, build_runtime, cli, emit, fail, operator, redis_errors
from runner.errors import UnknownFunction, UnknownQueue


def _client(ctx: click.Context, queue: str | None, function: str | None) -> Any:
    from runner.client import Client  # (the CLI imports no Redis client until a command runs)

    if (queue is None) == (function is None):
        raise click.UsageError("name a QUEUE or --function TYPE (one of them)")
    rt = build_runtime(ctx.obj["config"], client_only=True)  # the registry loads only for --function
    if queue is not None and queue not in rt.keys:
        fail(str(UnknownQueue(queue, list(rt.keys))), EXIT_REFUSED)
    return Client(rt)


def _named(queue: str | None, function: str | None) -> str:
    return f"function {function}" if function else f"queue {queue}"


def _queue_of(client: Any, queue: str | None, function: str | None) -> str | None:
    return client.runtime.registry.get(function).queue if function else queue


@cli.command(cls=RedisCommand)
@click.argument("queue", required=False)
@click.option("--function", "function", metavar="TYPE", help="Pause one function: its jobs are held, queued.")
@click.option("--json", "as_json", is_flag=True, help='{"queue", "function", "paused": true}')
@click.pass_context
def pause(ctx: click.Context, queue: str | None, function: str | None, as_json: bool) -> None:
    """Stop claims from a queue (or of one function's jobs); running jobs finish."""
    client = _client(ctx, queue, function)
    with redis_errors():
        try:
            client.pause(queue, function=function, by=operator())
        except UnknownFunction as exc:
            fail(str(exc), EXIT_REFUSED)
    emit({"queue": _queue_of(client, queue, function), "function": function, "paused": True}, as_json,
         f"paused {_named(queue, function)}")


@cli.command(cls=RedisCommand)
@click.argument("queue", required=False)
@click.option("--function", "function", metavar="TYPE", help="Resume one function: its held jobs go back in order.")
@click.option("--json", "as_json", is_flag=True, help='{"queue", "function", "paused": false, "moved": N}')
@click.pass_context
def resume(ctx: click.Context, queue: str | None, function: str | None, as_json: bool) -> None:
    """Lift a pause of a queue (or of one function)."""
    client = _client(ctx, queue, function)
    with redis_errors():
        try:
            moved = client.resume(queue, function=function, by=operator())
        except UnknownFunction as exc:
            fail(str(exc), EXIT_REFUSED)
    emit({"queue": _queue_of(client, queue, function), "function": function, "paused": False, "moved": moved},
         as_json, f"resumed {_named(queue, function)}" + (f"; {moved} held job(s) back" if function else ""))
