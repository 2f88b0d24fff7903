"""`runner call`: enqueue a job, wait for its end (pushed, see store/waiter.py) and
print its result: exit 0 done, 1 dead, 4 still running at the timeout."""

from __future__ import annotations

import sys

import click

from runner.cli.jobs import refused_text
from runner.cli.root import (
    EXIT_OK,
    EXIT_PENDING,
    EXIT_REFUSED,
    RedisCommand,
    build_runtime,
    cli,
    emit,
    fail,
    print_validation,
    read_payload,
    redis_errors,
)
from runner.errors import RedisUnavailable, RunnerError, ValidationFailed


@cli.command(cls=RedisCommand)
@click.argument("type_", metavar="TYPE")
@click.argument("payload", required=False)
@click.option("--timeout", "timeout_s", type=click.FloatRange(0, 86_400), default=30.0, show_default=True,
              metavar="SECONDS", help="How long to wait for the job to end.")
@click.option("--version", "version", type=int, default=None, help="Payload version (default: newest).")
@click.option("--idempotency-key", default=None)
@click.option("--json", "as_json", is_flag=True, help="Print the whole job, not only its result.")
@click.pass_context
def call(ctx: click.Context, type_: str, payload: str | None, timeout_s: float, version: int | None,
         idempotency_key: str | None, as_json: bool) -> None:
    """Enqueue a job and wait for it; print its result (PAYLOAD as for `runner enqueue`)."""
    from runner.client import Client

    body = read_payload(payload)
    rt = build_runtime(ctx.obj["config"], client_only=True)
    client = Client(rt)
    with redis_errors():
        try:
            job = client.enqueue(type_, body, version=version, idempotency_key=idempotency_key, waited=True)
            ended = client.settle(job.id, timeout_s, watch=job.duplicate)
        except ValidationFailed as exc:
            print_validation(exc)
            sys.exit(EXIT_REFUSED)
        except RedisUnavailable:
            raise
        except RunnerError as exc:
            fail(refused_text(exc), EXIT_REFUSED)
        finally:
            rt.close()
    view = ended.as_dict()
    if ended.status == "done":
        emit(view if as_json else view.get("result"), True)
        sys.exit(EXIT_OK)
    if ended.status == "dead":
        if as_json:
            emit(view, True)
        error = view.get("last_error") or {}
        fail(f"job {job.id} is dead: {error.get('message') or view.get('reason')}", EXIT_REFUSED)
    if as_json:
        emit(view, True)
    fail(f"job {job.id} is still {ended.status} after {timeout_s:g} s; `runner job {job.id}` shows it later",
         EXIT_PENDING)
