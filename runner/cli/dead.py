"""`runner dead ls|requeue|purge`: the dead-letter lists, one job or in bulk. Each
requeue and purge goes on record as ``cli:<user>`` (the job's history, the audit trail)."""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from runner.cli.root import (
    EXIT_CONFIG,
    EXIT_OK,
    EXIT_REFUSED,
    RedisCommand,
    build_runtime,
    cli,
    down_view,
    emit,
    fail,
    operator,
    print_refused,
    read_payload,
    redis_errors,
    refusal,
    said_down,
    shards_down,
    table,
)
from runner.errors import (
    JobNotFound,
    RedisUnavailable,
    RunnerError,
    likely,
)


@cli.group()
def dead() -> None:
    """Dead-letter operations: ls, requeue, purge."""


def _queues(rt: Any, queue: str | None) -> list[str]:
    if queue is None:
        return list(rt.config.queues)
    if queue not in rt.config.queues:
        close = likely(queue, list(rt.config.queues))
        hint = f"; did you mean {close}?" if close else ""
        fail(f"no queue {queue!r} in {rt.config.source}{hint} (have: {', '.join(rt.config.queues)})", EXIT_CONFIG)
    return [queue]


def _ago(ts: float | None) -> str:
    if not ts:
        return ""
    s = max(0.0, time.time() - ts)
    return f"{s:.0f}s ago" if s < 120 else f"{s / 60:.0f}m ago" if s < 7200 else f"{s / 3600:.0f}h ago"


@dead.command("ls", cls=RedisCommand)
@click.option("--queue", "-q", default=None, help="One queue (default: every queue).")
@click.option("--limit", type=click.IntRange(1, 500), default=50, show_default=True)
@click.option("--cursor", default=None, help="The cursor a previous page printed (with its --queue).")
@click.option("--offset", type=click.IntRange(0, 10_000_000), default=None,
              help="From this place instead (not stable while jobs die: the cursor is).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def dead_ls(ctx: click.Context, queue: str | None, limit: int, cursor: str | None, offset: int | None,
            as_json: bool) -> None:
    """List dead jobs, newest first, with the reason and last error, a page at a time."""
    from runner.client import Client

    if cursor is not None and (queue is None or offset is not None):
        raise click.UsageError("--cursor goes with the --queue of the page that printed it, and without --offset")
    rt = build_runtime(ctx.obj["config"], client_only=True)
    client = Client(rt)
    data: dict[str, Any] = {}
    rows = []
    more = []
    with redis_errors():
        gone = shards_down(rt)  # a Cluster master down: the live partitions' dead jobs, then exit 3
        for q in _queues(rt, queue):
            try:
                page = client.dead_page(q, limit, cursor=cursor, offset=offset)
            except ValueError as exc:
                fail(str(exc), EXIT_REFUSED)
            jobs = [j.as_dict() for j in page.jobs]
            data[q] = {"total": page.total, "jobs": jobs, "cursor": page.cursor}
            if page.cursor:
                more.append(f"next page: runner dead ls --queue {q} --limit {limit} --cursor {page.cursor}")
            for j in jobs:
                err = j["last_error"] or {}
                rows.append((q, j["id"], j["type"], j["version"], _ago(j["finished_at"]), j["reason"],
                             (f"{err.get('type')}: {err.get('message')}" if err else "")[:80]))
    totals = ", ".join(f"{q}: {d['total']}" for q, d in data.items())
    emit({**data, **down_view(gone)}, as_json, table(("queue", "id", "type", "v", "died", "reason", "last error"),
                                                     rows) + f"\ndead jobs: {totals}" + "".join(f"\n{m}" for m in more))
    if gone:
        said_down(gone)


def _targets(client: Any, rt: Any, ids: tuple[str, ...], queue: str | None, all_: bool) -> list[tuple[str, str]]:
    """(queue, id) pairs for a bulk command: the given ids (queue found per id) or --all."""
    if all_ == bool(ids):
        raise click.UsageError("give job ids or --all, not both" if all_ else "give job ids, or --all for every one")
    if all_:
        return [(q, i) for q in _queues(rt, queue) for i in client.dead_ids(q)]
    out = []
    for i in ids:
        if queue is not None:
            out.append((_queues(rt, queue)[0], i))
            continue
        try:
            out.append((client.get(i).queue, i))
        except JobNotFound:
            out.append(("", i))
    return out


def _bulk(label: str, targets: list[tuple[str, str]], op: Any) -> tuple[int, list[dict[str, Any]]]:
    """Run ``op(queue, ids, progress)`` -> (done ids, [(id, refusal)]) once per queue: a
    bulk action goes in batches, and on record as one entry per queue."""
    ok, refused = 0, []
    by_queue: dict[str, list[str]] = {}
    for q, i in targets:
        if not q:
            refused.append({"id": i, "queue": None, **refusal(JobNotFound(i))})
        else:
            by_queue.setdefault(q, []).append(i)
    with click.progressbar(length=len(targets), label=label, file=sys.stderr, show_pos=True) as bar:
        for q, ids in by_queue.items():
            done, failed = op(q, ids, bar.update)
            ok += len(done)
            refused += [{"id": i, "queue": q, **refusal(exc)} for i, exc in failed]
    return ok, refused


def _one(target: tuple[str, str], op: Any) -> tuple[int, list[dict[str, Any]]]:
    """One job, on record as itself (an edited payload goes this way)."""
    q, i = target
    try:
        if not q:
            raise JobNotFound(i)
        op(q, i)
    except RedisUnavailable:
        raise
    except RunnerError as exc:
        return 0, [{"id": i, "queue": q or None, **refusal(exc)}]
    return 1, []


def _report_bulk(verb: str, ok: int, refused: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        emit({verb: ok, "refused": refused}, True)
    else:
        click.echo(f"{verb} {ok} job(s)" + (f"; {len(refused)} refused" if refused else ""))
        for r in refused:
            print_refused(r["id"], r)
    sys.exit(EXIT_REFUSED if refused else EXIT_OK)


@dead.command("requeue", cls=RedisCommand)
@click.argument("ids", nargs=-1)
@click.option("--queue", "-q", default=None, help="The queue (default: found per job; with --all: every queue).")
@click.option("--all", "all_", is_flag=True, help="Every dead job (of --queue, or of every queue).")
@click.option("--payload", default=None, metavar="JSON|@FILE|-", help="An edited payload (one job only).")
@click.option("--version", "version", type=int, default=None, help="The version of the edited payload.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def dead_requeue(ctx: click.Context, ids: tuple[str, ...], queue: str | None, all_: bool,
                 payload: str | None, version: int | None, as_json: bool) -> None:
    """Move dead jobs back to their queue with a fresh attempt budget. Each payload is
    validated (and upgraded) first; an invalid one stays dead and its errors are shown."""
    from runner.client import Client

    if (payload is not None or version is not None) and (all_ or len(ids) != 1):
        raise click.UsageError("--payload and --version edit one job: give exactly one id")
    body = read_payload(payload) if payload is not None else None
    rt = build_runtime(ctx.obj["config"], client_only=True)
    client = Client(rt)
    with redis_errors():
        targets = _targets(client, rt, ids, queue, all_)
        by = operator()
        if body is not None or version is not None or (len(targets) == 1 and not all_):
            ok, refused = _one(targets[0], lambda q, i: client.requeue(q, i, body, version, by=by))
        else:
            ok, refused = _bulk("requeueing", targets,
                                lambda q, ids, progress: client.requeue_many(q, ids, by=by, progress=progress))
    _report_bulk("requeued", ok, refused, as_json)


@dead.command("purge", cls=RedisCommand)
@click.argument("ids", nargs=-1)
@click.option("--queue", "-q", default=None, help="The queue (default: found per job; with --all: every queue).")
@click.option("--all", "all_", is_flag=True, help="Every dead job (of --queue, or of every queue).")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation of --all.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def dead_purge(ctx: click.Context, ids: tuple[str, ...], queue: str | None, all_: bool, yes: bool,
               as_json: bool) -> None:
    """Delete dead jobs for good."""
    from runner.client import Client

    rt = build_runtime(ctx.obj["config"], client_only=True)
    client = Client(rt)
    with redis_errors():
        targets = _targets(client, rt, ids, queue, all_)
        if all_ and targets and not yes:
            try:
                click.confirm(f"delete {len(targets)} dead job(s) for good?", abort=True, err=True)
            except click.Abort:  # declined, or no answer to read (a script's run)
                fail("not confirmed: nothing was deleted; pass --yes to delete without asking", EXIT_REFUSED)
        by = operator()
        if len(targets) == 1 and not all_:
            ok, refused = _one(targets[0], lambda q, i: client.delete_dead(q, i, by=by))
        else:
            ok, refused = _bulk("purging", targets, lambda q, ids, progress: _purged(
                client.delete_many(q, ids, by=by, action="purge", progress=progress)))
    _report_bulk("purged", ok, refused, as_json)


def _purged(outcome: tuple[list[str], list[str]]) -> tuple[list[str], list[tuple[str, RunnerError]]]:
    done, missing = outcome
    return done, [(i, JobNotFound(i)) for i in missing]
