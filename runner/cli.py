"""The `runner` command: each subcommand parses, builds a runtime, makes one core call and
maps the outcome to an exit code.

Exit codes: 0 success; 1 the operation was refused (invalid payload, conflict, job not
found, check failed); 2 usage or configuration error; 3 Redis unreachable.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from runner import codec
from runner import config as config_mod
from runner.errors import ConfigError, RedisUnavailable, RunnerError, ValidationFailed

EXIT_REFUSED, EXIT_CONFIG, EXIT_REDIS = 1, 2, 3


def fail(message: str, code: int) -> NoReturn:
    click.secho(message, fg="red", err=True)
    sys.exit(code)


def load_config(path: str | None) -> config_mod.Config:
    try:
        return config_mod.load(path)
    except ConfigError as exc:
        fail(f"configuration error: {exc}", EXIT_CONFIG)


def build_runtime(path: str | None) -> Any:
    from runner.runtime import Runtime

    cfg = load_config(path)
    try:
        return Runtime.create(cfg)
    except ConfigError as exc:
        fail(f"configuration error: {exc}", EXIT_CONFIG)


def emit(data: Any, as_json: bool, human: str | None = None) -> None:
    if as_json or human is None:
        click.echo(codec.dumpb(data).decode())
    else:
        click.echo(human)


def print_validation(exc: ValidationFailed) -> None:
    click.secho(f"invalid payload for {exc.type} v{exc.version}:", fg="red", err=True)
    for e in exc.errors:
        click.echo(f"  {e.path}: {e.message}", err=True)


@click.group()
@click.option("--config", "config_path", envvar="RUNNER_CONFIG", default=None,
              help="Path to runner.toml (default: ./runner.toml).")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None) -> None:
    """runner: functions in functions/, schemas in schemas/, jobs in Redis."""
    ctx.obj = {"config": config_path}


@cli.command()
@click.option("--queue", "-q", "queues", multiple=True, help="Queue(s) to serve (default: all).")
@click.pass_context
def worker(ctx: click.Context, queues: tuple[str, ...]) -> None:
    """Run a production worker (the scheduler runs inside it)."""
    from runner.logs import setup
    from runner.worker import Worker

    rt = build_runtime(ctx.obj["config"])
    setup(rt.config.log)
    names = list(queues) or list(rt.config.queues)
    for q in names:
        if q not in rt.config.queues:
            fail(f"configuration error: no queue {q!r} in {rt.config.source} "
                 f"(have: {', '.join(rt.config.queues)})", EXIT_CONFIG)
    for _path, err in rt.registry.errors.items():
        logging.getLogger("runner").error("function not loaded: %s", err)
    from runner.guard import warn_redis_settings

    warn_redis_settings(rt)
    Worker(rt, names).run()


@cli.command()
@click.argument("type_")
@click.argument("payload", required=False)
@click.option("--version", "version", type=int, default=None, help="Payload version (default: newest).")
@click.option("--delay", type=float, default=None, help="Seconds to wait before running.")
@click.option("--idempotency-key", default=None)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def enqueue(
    ctx: click.Context, type_: str, payload: str | None, version: int | None,
    delay: float | None, idempotency_key: str | None, as_json: bool,
) -> None:
    """Validate and enqueue one job; PAYLOAD is JSON, @file, or - for stdin."""
    from runner.client import Client

    rt = build_runtime(ctx.obj["config"])
    raw = payload if payload is not None else "{}"
    if raw == "-":
        raw = sys.stdin.read()
    elif raw.startswith("@"):
        raw = Path(raw[1:]).read_text(encoding="utf-8")
    try:
        body = codec.loads(raw)
    except codec.DecodeError as exc:
        fail(f"payload is not valid JSON: {exc}", EXIT_REFUSED)
    try:
        job = Client(rt).enqueue(type_, body, version=version, delay=delay,
                                 idempotency_key=idempotency_key)
    except ValidationFailed as exc:
        print_validation(exc)
        sys.exit(EXIT_REFUSED)
    except RedisUnavailable as exc:
        fail(f"Redis unavailable: {exc}", EXIT_REDIS)
    except RunnerError as exc:
        fail(str(exc), EXIT_REFUSED)
    dup = " (duplicate: the key's first job)" if job.duplicate else ""
    emit(job.as_dict(), as_json, f"{job.id} {job.type} v{job.version} -> {job.queue} {job.status}{dup}")


@cli.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def job(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """Show one job."""
    from runner.client import Client

    rt = build_runtime(ctx.obj["config"])
    try:
        record = Client(rt).get(job_id).as_dict()
    except RedisUnavailable as exc:
        fail(f"Redis unavailable: {exc}", EXIT_REDIS)
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

    rt = build_runtime(ctx.obj["config"])
    try:
        figures = Client(rt).stats()
    except RedisUnavailable as exc:
        fail(f"Redis unavailable: {exc}", EXIT_REDIS)
    lines = [f"{'queue':<12}{'ready':>10}{'processing':>12}{'scheduled':>11}{'dead':>8}"]
    for q, f in figures.items():
        lines.append(f"{q:<12}{f['ready']:>10}{f['processing']:>12}{f['scheduled']:>11}{f['dead']:>8}")
    emit(figures, as_json, "\n".join(lines))


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
    lines = [f"{'type':<24}{'queue':<10}{'versions':<12}options"]
    for f in reg.functions.values():
        d = f.describe()
        opts = f"attempts={d['max_attempts']} timeout={d['timeout']:g}s"
        if d["idempotency_key"]:
            opts += f" idem={d['idempotency_key']}"
        if d["resource_key"]:
            opts += f" resource={d['resource_key']}"
        lines.append(f"{f.name:<24}{f.queue:<10}{','.join(f'v{v}' for v in d['versions']):<12}{opts}")
    for e in reg.errors.values():
        lines.append(click.style(f"not loaded: {e}", fg="red"))
    emit(data, as_json, "\n".join(lines))
    if reg.errors:
        sys.exit(EXIT_REFUSED)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
