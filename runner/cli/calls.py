"""Calling a function and controlling a job: `runner call` enqueues a job, waits for its
end (pushed, see store/waiter.py) and prints its result (exit 0 done, 1 dead or
cancelled, 4 still running at the timeout); `runner cancel` cancels jobs; `runner run-now`
runs a scheduled, retrying or sleeping job now; `runner signal` sends a durable function's
job a signal."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence

import click

from runner.cli.jobs import refused_text
from runner.cli.root import (
    EXIT_OK,
    EXIT_PENDING,
    EXIT_REDIS,
    EXIT_REFUSED,
    RedisCommand,
    build_runtime,
    cli,
    down_view,
    emit,
    fail,
    operator,
    print_validation,
    read_payload,
    redis_errors,
    said_down,
    shards_down,
)
from runner.errors import JobNotFound, NotReplicated, NotWaiting, RedisUnavailable, RunnerError, ValidationFailed


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
            ended = client.wait(job.id, timeout_s, watch=job.duplicate)
        except ValidationFailed as exc:
            print_validation(exc)
            sys.exit(EXIT_REFUSED)
        except (RedisUnavailable, NotReplicated):
            raise
        except RunnerError as exc:
            fail(refused_text(exc), EXIT_REFUSED)
        finally:
            rt.close()
    view = ended.as_dict()
    if ended.status == "done":
        emit(view if as_json else view.get("result"), True)
        sys.exit(EXIT_OK)
    if ended.status in ("dead", "cancelled"):
        if as_json:
            emit(view, True)
        error = view.get("last_error") or {}
        fail(f"job {job.id} is {ended.status}: {error.get('message') or view.get('reason')}", EXIT_REFUSED)
    if as_json:
        emit(view, True)
    fail(f"job {job.id} is still {ended.status} after {timeout_s:g} s; `runner job {job.id}` shows it later",
         EXIT_PENDING)


@cli.command(cls=RedisCommand)
@click.argument("job_ids", metavar="[ID]...", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Every job in --status (of --type, in --queue).")
@click.option("--status", default="queued", show_default=True, type=click.Choice(["queued", "scheduled", "deferred"]),
              help="With --all: the jobs to cancel.")
@click.option("--type", "type_", default=None, help="With --all: only jobs of this function type.")
@click.option("--queue", default=None, help="With --all: only this queue.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def cancel(ctx: click.Context, job_ids: tuple[str, ...], all_: bool, status: str, type_: str | None,
           queue: str | None, as_json: bool) -> None:
    """Cancel jobs: one not started ends cancelled at once, a running one is asked to stop.
    Exit 1 when any was refused (ended already, no such job); exit 3 when any could not be
    reached (Redis Cluster: its master did not answer; the others were cancelled), or when
    the audit entry could not be written (each job's answer is printed all the same)."""
    from runner.client import Client

    if bool(job_ids) == all_:
        raise click.UsageError("give job ids, or --all (with --status, --type, --queue), not both" if all_ else
                               "give the ids of the jobs to cancel, or --all (with --status, --type, --queue)")
    rt = build_runtime(ctx.obj["config"], client_only=True)
    client = Client(rt)
    answers: list[dict[str, str]] = []
    unreached = [False]
    unwritten: list[str] = []  # (Redis Cluster: the audit trail's master did not answer)
    by = operator()

    def each(ids: Sequence[str]) -> None:
        # Several jobs are one action: one audit entry per queue acted in, none for an id
        # that names no job (each job's history names who); one job is on record as itself.
        if len(ids) == 1:
            try:
                answers.append({"id": ids[0], "cancel": client.cancel(ids[0], by=by)})
            except RedisUnavailable:
                raise
            except RunnerError as exc:
                answers.append({"id": ids[0], "error": str(exc)})
            return
        try:
            got = client.cancel_many(ids, by=by)
        except RedisUnavailable as exc:
            # The jobs were acted on, their audit entry not written: each one's answer,
            # then the entry's outage (exit 3).
            if getattr(exc, "answers", None) is None:
                raise
            got = exc.answers  # type: ignore[attr-defined]
            unwritten.append(str(exc))
            unreached[0] = True
        for i, a in got:
            answers.append({"id": i, "error": str(a)} if isinstance(a, RunnerError) else {"id": i, "cancel": a})
            # (Redis Cluster: a job on a master that did not answer; the others went on)
            unreached[0] |= isinstance(a, RedisUnavailable)

    with redis_errors():
        each(job_ids)
        if all_ and status == "deferred":
            # Found and cancelled in one step, a batch at a time (a job found, then woken
            # before its cancel, would run): see Client.cancel_deferred.
            try:
                gone = client.cancel_deferred(queue=queue, type=type_, by=by)
            except RedisUnavailable:
                raise
            except RunnerError as exc:  # a misspelt --type or --queue: nothing cancelled
                fail(refused_text(exc), EXIT_REFUSED)
            answers += [{"id": job_id, "cancel": "cancelled"} for ids in gone.values() for job_id in ids]
        elif all_:
            # The ids first, then the cancels: a cancel moves a job out of the list being
            # paged (scheduled at once), which would shift the pages under the cursor.
            found: dict[str, str] = {}  # id -> its queue
            cursor: str | None = None
            while True:
                try:
                    page = client.jobs(status, queue=queue, type=type_, limit=500, cursor=cursor)
                except RedisUnavailable:
                    raise
                except RunnerError as exc:  # a misspelt --type or --queue: nothing cancelled
                    fail(refused_text(exc), EXIT_REFUSED)
                found.update((j.id, j.queue) for j in page.jobs)
                cursor = page.cursor
                if cursor is None:
                    break
            each(list(found))
    human = "\n".join(f"{a['id']} {a.get('cancel') or a.get('error')}" for a in answers)
    if all_ and not as_json:
        human += ("\n" if human else "") + f"cancelled {sum('cancel' in a for a in answers)} job(s)"
    emit(answers, as_json, human)
    for said in unwritten:
        click.echo(f"error: {said}", err=True)
    sys.exit(EXIT_REDIS if unreached[0] else EXIT_REFUSED if any("error" in a for a in answers) else EXIT_OK)


@cli.command(cls=RedisCommand)
@click.argument("job_id", metavar="ID")
@click.argument("name", metavar="NAME")
@click.argument("data", metavar="[JSON]", required=False)
@click.option("--key", default=None, help="The delivery's key: a signal sent again with the key of one the job "
              "took (kept or read) is answered duplicate and not delivered twice (exit 3 names the key).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def signal(ctx: click.Context, job_id: str, name: str, data: str | None, key: str | None, as_json: bool) -> None:
    """Send the signal NAME (JSON body, default null; @file or - as for a payload) to a job
    waiting in ctx.wait_for_signal(NAME), or keep it for its next wait. Exit 1 when refused
    (the job ended, no such job, one of that name is unread)."""
    from runner.client import Client

    body = None if data is None else read_payload(data)
    rt = build_runtime(ctx.obj["config"], client_only=True)
    with redis_errors():
        try:
            delivery = Client(rt).signal(job_id, name, body, key=key)
        except (RedisUnavailable, NotReplicated):  # exit 3 (redis_errors)
            raise
        except (ValueError, RunnerError) as exc:
            fail(refused_text(exc) if isinstance(exc, RunnerError) else str(exc), EXIT_REFUSED)
        finally:
            rt.close()
    emit({"id": job_id, "signal": name, "delivery": delivery}, as_json, f"{job_id} {name} {delivery}")
    sys.exit(EXIT_OK)


@cli.command(cls=RedisCommand)
@click.option("--status", default="queued", show_default=True,
              type=click.Choice(["queued", "scheduled", "processing", "deferred", "sleeping", "waiting", "done",
                                 "dead", "cancelled"]))
@click.option("--type", "type_", default=None, help="Only jobs of this function type.")
@click.option("--queue", default=None, help="Only this queue (default: every queue).")
@click.option("--limit", type=click.IntRange(1, 500), default=50, show_default=True)
@click.option("--cursor", default=None, help="The cursor a previous page printed.")
@click.option("--json", "as_json", is_flag=True, help='{"jobs": [...], "cursor": ...}')
@click.pass_context
def jobs(ctx: click.Context, status: str, type_: str | None, queue: str | None, limit: int, cursor: str | None,
         as_json: bool) -> None:
    """List jobs in a status, newest first, a page at a time."""
    from runner.cli.root import table
    from runner.client import Client

    rt = build_runtime(ctx.obj["config"], client_only=True)
    with redis_errors():
        gone = shards_down(rt)  # a Cluster master down: the live ones' jobs, then exit 3
        try:
            page = Client(rt).jobs(status, queue=queue, type=type_, limit=limit, cursor=cursor)
        except RedisUnavailable:
            raise
        except (ValueError, RunnerError) as exc:
            fail(str(exc), EXIT_REFUSED)
    views = [j.as_dict() for j in page.jobs]
    rows = [(v["id"], v.get("queue", ""), v.get("type", ""), v.get("status", ""), v.get("attempt", "")) for v in views]
    # The next page's command repeats every filter of this one: without them its cursor
    # would page through another selection.
    same = "".join(f" {flag} {shlex.quote(value)}" for flag, value in
                   (("--type", type_), ("--queue", queue), ("--limit", str(limit))) if value is not None)
    human = table(("id", "queue", "type", "status", "attempt"), rows) + (
        f"\nnext page: runner jobs --status {status}{same} --cursor {page.cursor}" if page.cursor else "")
    emit({"jobs": views, "cursor": page.cursor, **down_view(gone)}, as_json, human)
    if gone:
        said_down(gone)


@cli.command("run-now", cls=RedisCommand)
@click.argument("job_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def run_now(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """Run a scheduled, retrying or sleeping job now: it goes to ready at once, keeping its
    id and spending no attempt. Exit 1 for any other job (its status is said)."""
    from runner.client import Client

    rt = build_runtime(ctx.obj["config"], client_only=True)
    with redis_errors():
        try:
            was = Client(rt).run_now(job_id, by=operator())
        except (NotWaiting, JobNotFound) as exc:
            fail(str(exc), EXIT_REFUSED)
    emit({"id": job_id, "run_now": "queued", "was": was}, as_json, f"{job_id}: {was} -> queued (runs now)")
