"""The `runner` command: each subcommand parses, builds a runtime, makes one core call and
maps the outcome to an exit code. Tables for people by default; ``--json`` for scripts.

Exit codes (the same for every subcommand):

    0  success
    1  refused: an invalid payload, a conflict, no such job, a failed check,
       a line of --jsonl or a job of a bulk operation that was refused
    2  usage or configuration error (bad option, runner.toml, missing token)
    3  Redis unreachable

While `runner dev` runs its embedded Redis, the commands of the same project that talk
to Redis (enqueue, job, stats, dead, check) use that server.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import IO, Any, NoReturn

import click

from runner import codec
from runner import config as config_mod
from runner.connection import UNAVAILABLE
from runner.errors import (
    ConfigError,
    JobNotFound,
    RedisUnavailable,
    RunnerError,
    ValidationFailed,
)

EXIT_OK, EXIT_REFUSED, EXIT_CONFIG, EXIT_REDIS = 0, 1, 2, 3
JSONL_BATCH = 500


def fail(message: str, code: int) -> NoReturn:
    click.secho(message, fg="red", err=True)
    sys.exit(code)


def load_config(path: str | None) -> config_mod.Config:
    try:
        return config_mod.load(path)
    except ConfigError as exc:
        fail(f"configuration error: {exc}", EXIT_CONFIG)


def build_runtime(path: str | None, client_only: bool = False) -> Any:
    """The Runtime of a command; client commands follow a running `runner dev`'s embedded Redis."""
    from runner.runtime import Runtime

    cfg = load_config(path)
    if client_only:
        from runner.embedded import session_url

        url = session_url(cfg)
        if url is not None:
            cfg = replace(cfg, redis=replace(cfg.redis, url=url))
    try:
        return Runtime.create(cfg)
    except ConfigError as exc:
        fail(f"configuration error: {exc}", EXIT_CONFIG)


@contextlib.contextmanager
def redis_errors() -> Iterator[None]:
    """Redis going away anywhere in a command is exit code 3, with one readable line."""
    try:
        yield
    except RedisUnavailable as exc:
        fail(f"Redis unavailable: {exc}", EXIT_REDIS)
    except UNAVAILABLE as exc:
        fail(f"Redis unavailable: {exc}", EXIT_REDIS)


def emit(data: Any, as_json: bool, human: str | None = None) -> None:
    if as_json or human is None:
        click.echo(codec.dumpb(data).decode())
    else:
        click.echo(human)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def print_validation(exc: ValidationFailed) -> None:
    click.secho(f"invalid payload for {exc.type} v{exc.version}:", fg="red", err=True)
    for e in exc.errors:
        click.echo(f"  {e.path}: {e.message}", err=True)


def refusal(exc: RunnerError) -> dict[str, Any]:
    out: dict[str, Any] = {"error": str(exc), "kind": type(exc).__name__}
    if isinstance(exc, ValidationFailed):
        out["errors"] = [e.as_dict() for e in exc.errors]
    return out


def read_payload(raw: str | None) -> Any:
    """A payload given as JSON text, @file, or - for standard input."""
    text = "{}" if raw is None else raw
    if text == "-":
        text = sys.stdin.read()
    elif text.startswith("@"):
        try:
            text = Path(text[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            fail(f"cannot read payload file: {exc}", EXIT_CONFIG)
    try:
        return codec.loads_wire(text.encode("utf-8", "surrogatepass"))
    except (codec.DecodeError, ValueError) as exc:
        fail(f"payload is not valid JSON: {exc}", EXIT_REFUSED)


@click.group()
@click.option("--config", "config_path", envvar="RUNNER_CONFIG", default=None,
              help="Path to runner.toml (default: ./runner.toml).")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None) -> None:
    """runner: functions in functions/, schemas in schemas/, jobs in Redis."""
    ctx.obj = {"config": config_path}


# --- processes -------------------------------------------------------------------------


@cli.command()
@click.option("--queue", "-q", "queues", multiple=True, help="Queue(s) to serve (default: all).")
@click.pass_context
def worker(ctx: click.Context, queues: tuple[str, ...]) -> None:
    """Run a production worker (the scheduler runs inside it)."""
    from runner.guard import warn_redis_settings
    from runner.logs import setup
    from runner.worker import Worker

    rt = build_runtime(ctx.obj["config"])
    setup(rt.config.log)
    names = list(queues) or list(rt.config.queues)
    for q in names:
        if q not in rt.config.queues:
            fail(f"configuration error: no queue {q!r} in {rt.config.source} "
                 f"(have: {', '.join(rt.config.queues)})", EXIT_CONFIG)
    for err in rt.registry.errors.values():
        logging.getLogger("runner").error("function not loaded: %s", err)
    warn_redis_settings(rt)
    Worker(rt, names).run()


@cli.command()
@click.option("--host", default="0.0.0.0", show_default=True)
@click.option("--port", envvar="PORT", type=int, default=8000, show_default=True, help="Also $PORT.")
@click.option("--workers", envvar="WEB_CONCURRENCY", type=int, default=2, show_default=True,
              help="gunicorn worker processes; also $WEB_CONCURRENCY.")
@click.option("--threads", envvar="RUNNER_WEB_THREADS", type=int, default=8, show_default=True,
              help="Threads per worker process; also $RUNNER_WEB_THREADS.")
@click.pass_context
def web(ctx: click.Context, host: str, port: int, workers: int, threads: int) -> None:
    """Run the production web server (gunicorn) for the HTTP API and dashboard."""
    from runner.logs import setup
    from runner.webserver import serve

    cfg = load_config(ctx.obj["config"])
    if cfg.api.auth and not cfg.api.token:
        fail("refusing to serve the API without a token: set RUNNER_API_TOKEN, or switch auth off "
             f"explicitly with `[api] auth = false` in {cfg.source}", EXIT_CONFIG)
    setup(cfg.log)
    try:
        serve(cfg, host=host, port=port, workers=max(1, workers), threads=max(1, threads))
    except ConfigError as exc:  # the port is taken
        fail(str(exc), EXIT_CONFIG)


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", envvar="PORT", type=int, default=8000, show_default=True, help="Also $PORT.")
@click.option("--embedded", is_flag=True, help="Use the embedded Redis even when one is configured and up.")
@click.pass_context
def dev(ctx: click.Context, host: str, port: int, embedded: bool) -> None:
    """Web + workers for every queue + scheduler, with hot reload; starts an embedded Redis
    when none is reachable."""
    from runner.dev import Dev

    cfg = load_config(ctx.obj["config"])
    code = Dev(cfg, ctx.obj["config"], host=host, port=port, force_embedded=embedded).run()
    sys.exit(code)


# --- jobs ------------------------------------------------------------------------------


@cli.command()
@click.argument("type_", metavar="TYPE")
@click.argument("payload", required=False)
@click.option("--version", "version", type=int, default=None, help="Payload version (default: newest).")
@click.option("--delay", type=float, default=None, help="Seconds to wait before running.")
@click.option("--idempotency-key", default=None)
@click.option("--jsonl", "jsonl", default=None, metavar="FILE|-",
              help="Enqueue one job per line (each line a payload), in batches, with progress.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def enqueue(
    ctx: click.Context, type_: str, payload: str | None, version: int | None,
    delay: float | None, idempotency_key: str | None, jsonl: str | None, as_json: bool,
) -> None:
    """Validate and enqueue a job; PAYLOAD is JSON, @file, or - for stdin (default {})."""
    from runner.client import Client

    if jsonl is not None:
        if payload is not None or idempotency_key is not None:
            raise click.UsageError("--jsonl takes the payloads from its lines: give no PAYLOAD "
                                   "and no --idempotency-key (the function's template applies)")
        rt = build_runtime(ctx.obj["config"], client_only=True)
        sys.exit(enqueue_lines(Client(rt), type_, jsonl, version, delay, as_json))
    body = read_payload(payload)
    rt = build_runtime(ctx.obj["config"], client_only=True)
    with redis_errors():
        try:
            job = Client(rt).enqueue(type_, body, version=version, delay=delay,
                                     idempotency_key=idempotency_key)
        except ValidationFailed as exc:
            if as_json:
                emit(refusal(exc), True)
            print_validation(exc)
            sys.exit(EXIT_REFUSED)
        except RedisUnavailable:
            raise
        except RunnerError as exc:
            if as_json:
                emit(refusal(exc), True)
            fail(str(exc), EXIT_REFUSED)
    dup = " (duplicate: the key's first job)" if job.duplicate else ""
    emit(job.as_dict(), as_json, f"{job.id} {job.type} v{job.version} -> {job.queue} {job.status}{dup}")


@contextlib.contextmanager
def _lines(source: str) -> Iterator[Iterator[tuple[int, bytes]]]:
    """Numbered lines of a file or stdin, with a progress bar on stderr (bytes of a file,
    lines of a stream)."""
    if source == "-":
        stream: IO[bytes] = sys.stdin.buffer
        with click.progressbar(enumerate(stream, 1), label="enqueueing", file=sys.stderr,
                               show_pos=True) as lines:
            yield iter(lines)
        return
    try:
        f = open(source, "rb")  # noqa: SIM115 - closed below
    except OSError as exc:
        fail(f"cannot read {source}: {exc}", EXIT_CONFIG)
    size = Path(source).stat().st_size
    with f, click.progressbar(length=size, label="enqueueing", file=sys.stderr) as bar:
        def gen() -> Iterator[tuple[int, bytes]]:
            for n, raw in enumerate(f, 1):
                bar.update(len(raw))
                yield n, raw
        yield gen()


def enqueue_lines(client: Any, type_: str, source: str, version: int | None, delay: float | None,
                  as_json: bool) -> int:
    """One job per line, JSONL_BATCH lines per round of scripts; every refused line reported."""
    from runner.client import Request

    done = dup = 0
    last_ok = 0
    refused: list[dict[str, Any]] = []

    def send(batch: list[tuple[int, Request]]) -> None:
        nonlocal done, dup, last_ok
        results = client.enqueue_many([r for _, r in batch])
        for (n, _), res in zip(batch, results, strict=True):
            if isinstance(res, RunnerError):
                refused.append({"line": n, **refusal(res)})
            else:
                done += 1
                dup += int(res.duplicate)
        last_ok = batch[-1][0]

    batch: list[tuple[int, Request]] = []
    try:
        with _lines(source) as lines:
            for n, raw in lines:
                text = raw.strip()
                if not text:
                    continue
                try:
                    body = codec.loads_wire(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
                except (codec.DecodeError, ValueError) as exc:
                    refused.append({"line": n, "error": f"not valid JSON: {exc}", "kind": "DecodeError"})
                    continue
                batch.append((n, Request(type_, body, version=version, delay_s=delay)))
                if len(batch) >= JSONL_BATCH:
                    send(batch)
                    batch = []
            if batch:
                send(batch)
    except (RedisUnavailable, *UNAVAILABLE) as exc:  # type: ignore[misc]
        first = batch[0][0] if batch else last_ok + 1
        sent = f"lines 1 to {last_ok} were enqueued; " if last_ok else ""
        fail(f"Redis unavailable at line {first}: {exc}\n{sent}the batch from line {first} may or may not "
             f"have been enqueued. Resume from line {first} (a function with an IDEMPOTENCY_KEY makes that safe).",
             EXIT_REDIS)
    summary = {"enqueued": done, "duplicates": dup, "refused": refused}
    if as_json:
        emit(summary, True)
    else:
        click.echo(f"enqueued {done} job(s) of {type_}" + (f" ({dup} duplicate(s))" if dup else "")
                   + (f"; {len(refused)} line(s) refused" if refused else ""))
        for r in refused:
            click.secho(f"line {r['line']}: {r['error']}", fg="red", err=True)
            for e in r.get("errors", []):
                click.echo(f"    {e['path']}: {e['message']}", err=True)
    return EXIT_REFUSED if refused else EXIT_OK


@cli.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def job(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """Show one job."""
    from runner.client import Client

    rt = build_runtime(ctx.obj["config"], client_only=True)
    with redis_errors():
        try:
            record = Client(rt).get(job_id).as_dict()
        except RedisUnavailable:
            raise
        except RunnerError as exc:
            fail(str(exc), EXIT_REFUSED)
    human = "\n".join(f"{k:>16}: {codec.dumps(v) if isinstance(v, dict | list) else v}"
                      for k, v in record.items())
    emit(record, as_json, human)


@cli.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def stats(ctx: click.Context, as_json: bool) -> None:
    """Queue figures (cluster-wide)."""
    from runner.client import Client

    rt = build_runtime(ctx.obj["config"], client_only=True)
    with redis_errors():
        figures = Client(rt).stats()
    rows = [(q, f["ready"], f["processing"], f["scheduled"], f["dead"],
             sum(v for k, v in f["counters"].items() if k.startswith("succeeded|")))
            for q, f in figures.items()]
    emit(figures, as_json, table(("queue", "ready", "processing", "scheduled", "dead", "succeeded"), rows))


@cli.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def functions(ctx: click.Context, as_json: bool) -> None:
    """Discovered functions, their queues and schema versions, and what failed to load."""
    from runner import registry

    cfg = load_config(ctx.obj["config"])
    reg = registry.load(cfg)
    data = {
        "functions": [f.describe() for f in reg.functions.values()],
        "errors": [str(e) for e in reg.errors.values()],
    }
    rows = []
    for f in reg.functions.values():
        d = f.describe()
        opts = f"attempts={d['max_attempts']} timeout={d['timeout']:g}s"
        if d["idempotency_key"]:
            opts += f" idem={d['idempotency_key']}"
        if d["resource_key"]:
            opts += f" resource={d['resource_key']}"
        rows.append((f.name, f.queue, ",".join(f"v{v}" for v in d["versions"]), opts))
    lines = [table(("type", "queue", "versions", "options"), rows)]
    lines += [click.style(f"not loaded: {e}", fg="red") for e in reg.errors.values()]
    emit(data, as_json, "\n".join(lines))
    if reg.errors:
        sys.exit(EXIT_REFUSED)


# --- the dead-letter lists -------------------------------------------------------------


@cli.group()
def dead() -> None:
    """Dead-letter operations: ls, requeue, purge."""


def _queues(rt: Any, queue: str | None) -> list[str]:
    if queue is None:
        return list(rt.config.queues)
    if queue not in rt.config.queues:
        fail(f"no queue {queue!r} in {rt.config.source} (have: {', '.join(rt.config.queues)})", EXIT_CONFIG)
    return [queue]


def _ago(ts: float | None) -> str:
    if not ts:
        return ""
    s = max(0.0, time.time() - ts)
    return f"{s:.0f}s ago" if s < 120 else f"{s / 60:.0f}m ago" if s < 7200 else f"{s / 3600:.0f}h ago"


@dead.command("ls")
@click.option("--queue", "-q", default=None, help="One queue (default: every queue).")
@click.option("--limit", type=int, default=50, show_default=True)
@click.option("--offset", type=int, default=0)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def dead_ls(ctx: click.Context, queue: str | None, limit: int, offset: int, as_json: bool) -> None:
    """List dead jobs, newest first, with the reason and last error."""
    from runner.client import Client

    rt = build_runtime(ctx.obj["config"], client_only=True)
    client = Client(rt)
    data: dict[str, Any] = {}
    rows = []
    with redis_errors():
        for q in _queues(rt, queue):
            total, page = client.dead(q, offset=offset, limit=limit)
            jobs = [j.as_dict() for j in page]
            data[q] = {"total": total, "jobs": jobs}
            for j in jobs:
                err = j["last_error"] or {}
                rows.append((q, j["id"], j["type"], j["version"], _ago(j["finished_at"]), j["reason"],
                             (f"{err.get('type')}: {err.get('message')}" if err else "")[:80]))
    totals = ", ".join(f"{q}: {d['total']}" for q, d in data.items())
    emit(data, as_json, table(("queue", "id", "type", "v", "died", "reason", "last error"), rows)
         + f"\ndead jobs: {totals}")


def _targets(client: Any, rt: Any, ids: tuple[str, ...], queue: str | None, all_: bool) -> list[tuple[str, str]]:
    """(queue, id) pairs for a bulk command: the given ids (queue found per id) or --all."""
    if all_ == bool(ids):
        raise click.UsageError("give job ids or --all (not both)")
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
    ok, refused = 0, []
    with click.progressbar(targets, label=label, file=sys.stderr, show_pos=True) as bar:
        for q, i in bar:
            try:
                if not q:
                    raise JobNotFound(i)
                op(q, i)
                ok += 1
            except RedisUnavailable:
                raise
            except RunnerError as exc:
                refused.append({"id": i, "queue": q or None, **refusal(exc)})
    return ok, refused


def _report_bulk(verb: str, ok: int, refused: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        emit({verb: ok, "refused": refused}, True)
    else:
        click.echo(f"{verb} {ok} job(s)" + (f"; {len(refused)} refused" if refused else ""))
        for r in refused:
            click.secho(f"{r['id']}: {r['error']}", fg="red", err=True)
            for e in r.get("errors", []):
                click.echo(f"    {e['path']}: {e['message']}", err=True)
    sys.exit(EXIT_REFUSED if refused else EXIT_OK)


@dead.command("requeue")
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
        ok, refused = _bulk("requeueing", targets, lambda q, i: client.requeue(q, i, body, version))
    _report_bulk("requeued", ok, refused, as_json)


@dead.command("purge")
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
            click.confirm(f"delete {len(targets)} dead job(s) for good?", abort=True, err=True)
        ok, refused = _bulk("purging", targets, client.delete_dead)
    _report_bulk("purged", ok, refused, as_json)


# --- project -----------------------------------------------------------------------------


@cli.command()
@click.argument("name")
@click.option("--queue", "-q", default=None, help="Queue of the new function (default: the first in runner.toml).")
@click.option("--force", is_flag=True, help="Overwrite existing files.")
@click.pass_context
def new(ctx: click.Context, name: str, queue: str | None, force: bool) -> None:
    """Scaffold functions/NAME.py and schemas/NAME/v1.json, ready to run."""
    from runner.scaffold import ScaffoldError, scaffold

    cfg = load_config(ctx.obj["config"])
    try:
        made = scaffold(cfg, name, queue=queue, force=force)
    except ConfigError as exc:
        fail(str(exc), EXIT_CONFIG)
    except ScaffoldError as exc:
        fail(str(exc), EXIT_REFUSED)
    click.echo(f"created {made.function}\ncreated {made.schema}\n"
               f"try it: runner enqueue {name} '{{\"name\": \"world\"}}'")


@cli.command()
@click.option("--strict", is_flag=True, help="Warnings (risky Redis settings, function warnings) fail too.")
@click.option("--offline", is_flag=True, help="Skip Redis: no settings check, no deploy gate.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def check(ctx: click.Context, strict: bool, offline: bool, as_json: bool) -> None:
    """Check config, functions and schemas, the Redis settings, and (deploy gate) that every
    job waiting in Redis can be run by the functions on disk. Non-zero on any error."""
    from runner import checks

    report = checks.check_files(ctx.obj["config"])
    code = EXIT_OK
    if report.config is None:
        code = EXIT_CONFIG
    elif not offline:
        from runner.embedded import session_url
        from runner.registry import Registry
        from runner.runtime import Runtime

        reg = report.registry or Registry()
        cfg = report.config
        url = session_url(cfg)
        if url is not None:
            cfg = replace(cfg, redis=replace(cfg.redis, url=url))
        rt = Runtime.create(cfg, reg=reg)
        try:
            report.problems.extend(checks.check_redis_settings(rt.redis))
            report.scanned, report.stranded = checks.deploy_gate(rt, reg)
            report.redis_checked = True
        except UNAVAILABLE as exc:
            report.problems.append(checks.Problem(
                "redis", f"cannot reach {checks.redact(report.config.redis.url)}: {exc} "
                "(the deploy gate did not run; --offline skips it)"))
            code = EXIT_REDIS
        finally:
            rt.close()
    if code == EXIT_OK and report.failed(strict):
        code = EXIT_REFUSED
    if as_json:
        emit({**report.as_dict(), "ok": code == EXIT_OK}, True)
    else:
        click.echo(render_check(report, strict, code))
    sys.exit(code)


def render_check(report: Any, strict: bool, code: int) -> str:
    out = []
    if report.config is not None:
        out.append(f"config     {report.config.source}: queues {', '.join(report.config.queues)}")
    if report.registry is not None:
        names = sorted(report.registry.functions)
        out.append(f"functions  {len(names)} loaded: {', '.join(names) or '-'}")
    for p in report.problems:
        color = "red" if p.severity == "error" or strict else "yellow"
        out.append(click.style(f"{p.severity:<10} {p.where}: {p.message}", fg=color))
    if report.redis_checked:
        out.append(f"redis      {report.scanned} waiting job(s) scanned")
        if report.stranded:
            total = sum(s.count for s in report.stranded)
            out.append(click.style(f"deploy gate: {total} waiting job(s) the functions on disk cannot run:",
                                   fg="red"))
            rows = [(s.queue, s.state, s.type, s.version, s.count, s.problem) for s in report.stranded]
            out.append(table(("queue", "state", "type", "version", "count", "problem"), rows))
            out.append("fix: restore the function or schema, add an upgrade(), or clear them with "
                       "`runner dead purge`")
        else:
            out.append("deploy gate: every waiting job can run")
    out.append(click.style("ok", fg="green") if code == EXIT_OK else click.style("check failed", fg="red"))
    return "\n".join(out)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
