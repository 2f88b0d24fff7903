"""What every `runner` command shares: the root group, exit codes, loading the config
and the runtime, Redis errors as exit code 3, and output (tables for people, JSON for
scripts)."""

from __future__ import annotations

import contextlib
import getpass
import sys
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

import click

from runner import config as config_mod
from runner.errors import (
    ConfigError,
    RedisUnavailable,
    RunnerError,
    ValidationFailed,
)
from runner.store import codec
from runner.store.connection import UNAVAILABLE

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
        from runner.store.embedded import session_url

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


def operator() -> str:
    """Who the CLI's dead-letter actions go on record as: ``cli:<user>``."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no login name, no passwd entry (some containers)
        user = "unknown"
    return f"cli:{user}"


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
