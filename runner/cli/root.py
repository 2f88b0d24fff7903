"""What every `runner` command shares: the root group, exit codes, loading the config
and the runtime, Redis errors as exit code 3, and output (tables for people, JSON for
scripts)."""

from __future__ import annotations

import contextlib
import importlib
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import click

from runner import __version__
from runner import config as config_mod
from runner.cli.target import RULE, Target, resolve
from runner.errors import (
    ConfigError,
    NotReplicated,
    RedisUnavailable,
    RunnerError,
    UnknownFunction,
    ValidationFailed,
    password_problem,
)
from runner.store import urls

EXIT_OK, EXIT_REFUSED, EXIT_CONFIG, EXIT_REDIS = 0, 1, 2, 3
EXIT_PENDING = 4  # `runner call`: the job had not ended at the timeout
JSONL_BATCH = 500
_TARGET = "runner.target"  # the context's meta key of the server a command talks to
_RUNTIME = "runner.runtime"  # and of its runtime (unavailable() asks it which shard is down)


_JSON_OUT = "runner.json_out"  # the context's meta key: this command wrote JSON on stdout


def _json_error(body: dict[str, Any]) -> None:
    """A command run with --json that refuses says so in JSON on stdout too (a script reads
    one JSON document whatever happened), unless it wrote its JSON already."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None and ctx.params.get("as_json") and not ctx.meta.get(_JSON_OUT):
        emit(body, True)


def fail(message: str, code: int) -> NoReturn:
    message = urls.scrub(message)  # an error may quote a Redis password
    _json_error({"error": message, "exit_code": code})
    from runner.store import codec  # (not at import: every --help would load it)

    click.secho(codec.escaped(message, keep_lines=True), fg="red", err=True)
    sys.exit(code)


def load_config(path: str | None) -> config_mod.Config:
    try:
        return config_mod.load(path)
    except ConfigError as exc:
        fail(f"configuration error: {exc}", EXIT_CONFIG)


def target_config(path: str | None, client_only: bool = True) -> tuple[config_mod.Config, Target]:
    """The config of a command with the Redis it talks to (see target.py), remembered for
    the messages of redis_errors()."""
    cfg, where = resolve(load_config(path), config_named=path is not None, follow_dev=client_only)
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.meta[_TARGET] = where
    return cfg, where


def target(ctx: click.Context) -> Target:
    """The server this command talks to (set by build_runtime or target_config)."""
    where: Target = ctx.meta[_TARGET]
    return where


def current_target() -> Target | None:
    """The server the running command talks to, if it has picked one yet."""
    ctx = click.get_current_context(silent=True)
    where: Target | None = ctx.meta.get(_TARGET) if ctx is not None else None
    return where


def build_runtime(path: str | None, client_only: bool = False, reader: bool = False, retry: bool = False) -> Any:
    """The Runtime of a command; client commands follow a running `runner dev`'s embedded
    Redis unless REDIS_URL or the --config file names a server, and load functions/ and
    schemas/ only once they use them (`runner job` never does). ``reader``: a command that
    only reads, on a connection of the store's own when the URL allows (Runtime.create)."""
    from runner.runtime import Runtime

    cfg, _ = target_config(path, client_only)
    wait = 0.5
    while True:
        try:
            rt = Runtime.create(cfg, lazy=client_only, reader=reader)
            break
        except ConfigError as exc:
            fail(f"configuration error: {exc}", EXIT_CONFIG)
        except RedisUnavailable as exc:
            # A cluster client reads the layout as it is made: no node answering is an
            # outage at once, where a single server's client fails at its first command.
            # A command exits 3 as for any outage; ``retry`` (the worker) waits it out.
            if not retry:
                unavailable(exc)
            import logging
            import time

            logging.getLogger("runner.worker").warning("%s; retrying in %.1fs", urls.scrub(str(exc)), wait)
            time.sleep(wait)
            wait = min(wait * 2, 10.0)
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.meta[_RUNTIME] = rt
    return rt


def shards_down(rt: Any) -> list[Any]:
    """On Redis Cluster with some masters down and others answering: those masters
    (store/shards.py), their partitions left out of ``rt.parts``, so a reading command
    shows what the live ones hold; then ``said_down`` after its output. [] otherwise."""
    from runner.store import shards

    gone = shards.down(rt.redis, [k for parts in rt.parts.values() for k in parts])
    shards.without(rt.parts, gone)
    return gone


def left_down(rt: Any, left_out: Sequence[dict[str, str]]) -> list[Any]:
    """The masters of the partitions a read left out (figures.left_out_view: on Redis
    Cluster, a master that stopped answering since the command's probe, given up past a
    reader's bound), as ``shards_down`` names the masters down."""
    if not left_out:
        return []
    from runner.store import shards

    keys = {(k.queue, k.tag): k for parts in rt.parts.values() for k in parts}
    return shards.by_master(rt.redis, [keys[o["queue"], o["partition"]] for o in left_out],
                            "did not answer within 2 s (stopped or hung)")


def down_text(gone: Sequence[Any]) -> str:
    """The words for masters down while others answer (every command says them so)."""
    which = "; ".join(d.line() for d in gone)
    return (f"Redis Cluster master{'s' if len(gone) > 1 else ''} down: {which}; the other masters answer. "
            "What those partitions hold waits for them, as does a job whose key routes there: retry once "
            "they are back or a replica took over (keyless jobs go to the live partitions)")


def down_view(gone: Sequence[Any]) -> dict[str, Any]:
    """``{"down": [{node, partitions}]}`` for a command's --json, {} with none down."""
    if not gone:
        return {}
    return {"down": [{"node": d.node, "partitions": [{"queue": k.queue, "tag": k.tag} for k in d.parts]}
                     for d in gone]}


def said_down(gone: Sequence[Any]) -> NoReturn:
    """After a reading command's output over the live partitions: name the masters down,
    exit 3 (what it showed is not all of Redis)."""
    fail(f"not shown: {down_text(gone)}", EXIT_REDIS)


def said_damaged(views: Sequence[dict[str, Any]]) -> NoReturn:
    """After a reading command's output: name each key it could not read, of another Redis
    type (store/damage.py: what it holds and what to do), and exit 1."""
    fail("\n".join(f"not shown: {d['detail']}" for d in views), EXIT_REFUSED)


def password_said(exc: BaseException, where: Target | None) -> str | None:
    """What every command says when the server turned the password down (the words of
    errors.password_problem), or None for any other failure."""
    problem = password_problem(exc)
    if problem is None:
        return None
    what, todo = problem
    at = f" at {where.url} (from {where.source})" if where is not None else ""
    return (f"Redis{at} {what}.\n{todo[0].upper()}{todo[1:]}, in "
            f"{where.source if where is not None else 'REDIS_URL'}.")


def unavailable(exc: BaseException) -> NoReturn:
    """Exit 3, saying where the command looked and how to get a Redis (or, when the server
    turned the password down, what was wrong with it and how to put it right: the words of
    errors.password_problem, the same in every command)."""
    ctx = click.get_current_context(silent=True)
    where: Target | None = ctx.meta.get(_TARGET) if ctx is not None else None
    at = f" at {where.url} (from {where.source})" if where is not None else ""
    said = password_said(exc, where)
    if said is not None:
        fail(said, EXIT_REDIS)
    rt = ctx.meta.get(_RUNTIME) if ctx is not None else None
    if rt is not None:
        from runner.store import shards

        with contextlib.suppress(Exception):  # (only for better words: the outage stands)
            gone = shards.down(rt.redis, [k for parts in rt.parts.values() for k in parts])
            if gone:  # (the cause alone: the outage's own advice is for a server that is down)
                fail(f"Redis unavailable{at}: {exc.__cause__ or exc}\n{down_text(gone)}.", EXIT_REDIS)
    from runner.store.refusals import refusal, unreachable

    if refusal(exc) is not None:
        # Redis answered and refused (maxmemory, a replica, busy, loading...): the one
        # helper's sentence for that kind, as the client and HTTP say it; starting a
        # Redis is no remedy for any of them.
        fail(f"{unreachable(exc)}." + (f"\nRedis{at}." if at else ""), EXIT_REDIS)
    # Unreachable: what the connection said (never an outage worded already), then how
    # to get a Redis there.
    cause = exc.__cause__ if isinstance(exc, RedisUnavailable) and exc.__cause__ is not None else exc
    dev = "unset REDIS_URL and run" if where is not None and where.source == "REDIS_URL" else "run"
    fail(f"Redis unavailable{at}: {cause}\nStart a Redis there, point REDIS_URL (or [redis] url in "
         f"runner.toml) at one that runs, or {dev} `runner dev`, which starts one of its own.", EXIT_REDIS)


@contextlib.contextmanager
def redis_errors() -> Iterator[None]:
    """Redis going away anywhere in a command is exit code 3, with one readable line; so is
    an enqueue that too few replicas confirmed ([redis] wait_replicas)."""
    try:
        yield
    except RedisUnavailable as exc:
        unavailable(exc)
    except NotReplicated as exc:
        # Exit 3 as for an outage: the remedy is the same (retry once Redis is whole again).
        fail(f"not replicated: {exc}", EXIT_REDIS)
    except Exception as exc:
        # Imported here: a command that got this far has loaded redis-py already, and
        # one that never talks to Redis (every --help) must not pay for it.
        from runner.store.connection import UNAVAILABLE

        if isinstance(exc, UNAVAILABLE):
            unavailable(exc)
        raise


def operator() -> str:
    """Who the CLI's dead-letter actions go on record as: ``cli:<user>``."""
    import getpass

    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no login name, no passwd entry (some containers)
        user = "unknown"
    return f"cli:{user}"


# The CLI's own colours (click.style: SGR sequences, which only colour text), left as
# they are by the last guard of emit; every other escape is written out.
_OWN_STYLE = re.compile("\x1b\\[[0-9;]*m")


def plain(text: str) -> str:
    """``text`` with each character a terminal may act on written out (``\\x1b``,
    ``\\u202e``), newlines included: one field of job data (a payload, an error, a
    reason) for a terminal, which would otherwise act on an escape, or show a line
    reordered, as a producer or a handler put it there."""
    from runner.store import codec

    return codec.escaped(text)


def _guarded(human: str) -> str:
    """The last guard on a command's human output: anything a terminal acts on that a
    field's plain() missed is written out, but not the CLI's own colours."""
    from runner.store import codec

    out: list[str] = []
    at = 0
    for m in _OWN_STYLE.finditer(human):
        out.append(codec.escaped(human[at:m.start()], keep_lines=True))
        out.append(m.group())
        at = m.end()
    out.append(codec.escaped(human[at:], keep_lines=True))
    return "".join(out)


def emit(data: Any, as_json: bool, human: str | None = None) -> None:
    # As a view shows it: a record another producer wrote with bytes that are not UTF-8
    # prints with U+FFFD for them, never a traceback; and no control character reaches
    # the terminal raw (fields are escaped by plain(); this is the last guard).
    from runner.store import codec

    if as_json or human is None:
        ctx = click.get_current_context(silent=True)
        if ctx is not None:
            ctx.meta[_JSON_OUT] = True
        text = codec.dumpb_view(data).decode()
        # Only inside strings, where JSON takes the same character as a \u escape.
        click.echo(codec.escaped_json(text))
    else:
        click.echo(_guarded(codec.shown_text(human)))


def utc(seconds: Any, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    """A time in epoch seconds as a UTC date in ``fmt`` ("%f": microseconds); "?" for
    anything a date cannot show (not a number, NaN, before 1970, past the year 9999): a
    record another writer put must print, not raise (a time of 1e300 was an
    OverflowError, 1e14 s a ValueError)."""
    import datetime

    if not isinstance(seconds, int | float) or isinstance(seconds, bool) or not 0 <= seconds < 253_402_300_800:
        return "?"
    try:
        return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime(fmt)
    except (OverflowError, ValueError, OSError):
        return "?"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [["" if c is None else plain(str(c)) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def print_validation(exc: ValidationFailed) -> None:
    _json_error({**refusal(exc), "exit_code": EXIT_REFUSED})
    click.secho(f"invalid payload for {exc.type} v{exc.version}:", fg="red", err=True)
    for e in exc.errors:
        click.echo(f"  {plain(e.path)}: {plain(e.message)}", err=True)


def print_refused(label: str, refused: dict[str, Any]) -> None:
    """One refused line or job of a bulk command: its message, then each validation error
    on a line of its own (the message of a validation failure would repeat them)."""
    errors = refused.get("errors", [])
    head = str(refused["error"]).split(": ", 1)[0] if errors else refused["error"]
    click.secho(plain(f"{label}: {head}"), fg="red", err=True)
    for e in errors:
        click.echo(f"    {plain(str(e['path']))}: {plain(str(e['message']))}", err=True)


def refusal(exc: RunnerError) -> dict[str, Any]:
    """A refusal as --json shows it: "error", "kind" (the error's class; "BrokenFunction"
    for a function whose file did not load, which is there, not unknown) and its details."""
    out: dict[str, Any] = {"error": str(exc), "kind": type(exc).__name__}
    if isinstance(exc, UnknownFunction):
        out["function"] = exc.type
        if exc.broken:
            out.update(kind="BrokenFunction", broken=exc.broken)
    if isinstance(exc, ValidationFailed):
        out["errors"] = [e.as_dict() for e in exc.errors]
    if isinstance(exc, NotReplicated):
        out["job_ids"] = exc.job_ids
        if exc.signal is not None:
            out["key"] = exc.key  # a signal's: `runner signal --key` sends it again safely
    return out


def read_payload(raw: str | None) -> Any:
    """A payload given as JSON text, @file, or - for standard input."""
    from runner.store import codec

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


def _here_and_now(ctx: click.Context, follow_dev: bool) -> str:
    """The server a command would talk to now, for its --help; never fails the help."""
    path = ctx.find_root().params.get("config_path")
    try:
        cfg = config_mod.load(path)
    except ConfigError as exc:
        return f"Redis: cannot tell, the configuration is broken ({exc})."
    _, where = resolve(cfg, config_named=path is not None, follow_dev=follow_dev)
    note = f" {where.note}" if where.note else ""
    return f"Redis here and now: {where.url} ({where.source}).{note}"


class RedisCommand(click.Command):
    """A command that talks to Redis: its --help ends with which server, and why."""

    def __init__(self, *args: Any, follow_dev: bool = True, **kwargs: Any) -> None:
        self.follow_dev = follow_dev
        super().__init__(*args, **kwargs)

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_epilog(ctx, formatter)
        formatter.write_paragraph()
        formatter.write_text(_here_and_now(ctx, self.follow_dev))


# Which module defines each subcommand. A module is imported when one of its commands is
# looked up (invoked, or listed by --help), so a command pays for its own module only.
# Each module registers its commands on `cli` as it is imported.
COMMANDS = {
    "call": "calls", "cancel": "calls", "jobs": "calls", "signal": "calls", "run-now": "calls",
    "dead": "dead",
    "emit": "events", "events": "events",
    "enqueue": "jobs", "job": "jobs", "stats": "jobs",
    "pause": "pauses", "resume": "pauses",
    "worker": "processes", "web": "processes", "dev": "processes",
    "functions": "project", "new": "project", "check": "project",
    "schedules": "schedules",
    "token": "tokens",
    "logs": "watching",
    "workers": "workers",
}


_WANTS_JSON = "runner.wants_json"  # the context's meta key: --json is on the command line


def _wants_json(args: Sequence[str]) -> bool:
    """--json among the options (before a ``--`` that ends them)."""
    for arg in args:
        if arg == "--":
            return False
        if arg == "--json":
            return True
    return False


def _usage_json(exc: click.ClickException) -> None:
    """Click's own refusal (a bad option or value, a missing argument) of a command run
    with --json, as JSON on stdout like every other refusal; click still writes its text
    and usage line on stderr."""
    emit({"error": exc.format_message(), "kind": type(exc).__name__, "exit_code": exc.exit_code}, True)


class RootGroup(click.Group):
    """`runner`: its subcommands loaded on first use (COMMANDS); its --help ends with the
    rule that picks a Redis, and the one it picks now. Under --json, a usage error is
    JSON on stdout too: the parse of every command, and the usage errors its body raises,
    run inside the root's make_context and invoke."""

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        wants = _wants_json(args)
        try:
            ctx = super().make_context(info_name, args, parent, **extra)
        except click.ClickException as exc:
            if wants:
                _usage_json(exc)
            raise
        ctx.meta[_WANTS_JSON] = wants
        return ctx

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.ClickException as exc:
            if ctx.meta.get(_WANTS_JSON) and not ctx.meta.get(_JSON_OUT):
                _usage_json(exc)
            raise

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            importlib.import_module(f"runner.cli.{COMMANDS[cmd_name]}")
        return self.commands.get(cmd_name)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None,
                                                                            list[str]]:
        if args and args[0] not in self.commands and args[0] not in COMMANDS:
            # No such command: click suggests the closest of the ones registered, so
            # register them all first (a typo's cost only).
            for module in sorted(set(COMMANDS.values())):
                importlib.import_module(f"runner.cli.{module}")
        return super().resolve_command(ctx, args)

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_epilog(ctx, formatter)
        formatter.write_paragraph()
        formatter.write_text(RULE)
        formatter.write_paragraph()
        formatter.write_text(_here_and_now(ctx, True))


@click.group(cls=RootGroup)
@click.version_option(__version__, "--version", prog_name="runner",
                      message="%(prog)s %(version)s (runner-redis)")
@click.option("--config", "config_path", envvar="RUNNER_CONFIG", default=None,
              help="Path to runner.toml (default: ./runner.toml, or the nearest one in a parent folder "
              "of the repository). A [redis] url in it wins over a "
              "running `runner dev`.")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None) -> None:
    """runner: functions in functions/, schemas in schemas/, jobs in Redis."""
    ctx.obj = {"config": config_path}
