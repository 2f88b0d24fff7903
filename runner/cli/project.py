"""Commands on the project: `runner functions`, `runner new` and `runner check`."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import click

from runner.cli.root import (
    EXIT_CONFIG,
    EXIT_OK,
    EXIT_REDIS,
    EXIT_REFUSED,
    RedisCommand,
    cli,
    down_text,
    emit,
    fail,
    load_config,
    password_said,
    shards_down,
    table,
)
from runner.errors import ConfigError
from runner.store import urls


@cli.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def functions(ctx: click.Context, as_json: bool) -> None:
    """Discovered functions, their queues and schema versions, and what failed to load."""
    from runner.catalog import registry
    from runner.store import codec

    cfg = load_config(ctx.obj["config"])
    reg = registry.load(cfg, payload_check=codec.payload_problem)
    data = {
        "functions": [f.describe() for f in reg.functions.values()],
        "errors": [str(e) for e in reg.errors.values()],
    }
    rows = []
    for f in reg.functions.values():
        d = f.describe()
        rows.append((f.name, f.queue, ",".join(f"v{v}" for v in d["versions"]), _options(d)))
    lines = [table(("type", "queue", "versions", "options"), rows)]
    lines += [click.style(f"not loaded: {e}", fg="red") for e in reg.errors.values()]
    emit(data, as_json, "\n".join(lines))
    if reg.errors:
        sys.exit(EXIT_REFUSED)


def _per(limit: str, key: str | None) -> str:
    """A limit as the table shows it: cluster-wide, or "per <key template>"."""
    return f"{limit} per {key}" if key else limit


def _options(d: dict[str, Any]) -> str:
    """A function's options for the table, the defaults left out (--json has them all)."""
    opts = [f"attempts={d['max_attempts']}", f"timeout={d['timeout']:g}s"]
    if d["isolation"] != "thread":
        opts.append(f"isolation={d['isolation']}" + (f" memory={d['memory_mb']:g}MB" if d["memory_mb"] else ""))
    if d["idempotency_key"]:
        opts.append(f"idem={d['idempotency_key']}")
    if d["resource_key"]:
        opts.append(f"resource={d['resource_key']}")
    if c := d["concurrency"]:
        opts.append(_per(f"concurrency={c['limit']}", c["key"]))
    if r := d["rate_limit"]:
        opts.append(_per(f"rate={r['limit']}/{r['period']:g}s", r["key"]))
    if d["priority"]:
        opts.append(f"priority={d['priority']}")
    if d["max_age"]:
        opts.append(f"max_age={d['max_age']:g}s")
    if d["keep_result"]:
        opts.append(f"keep_result={d['keep_result']:g}s")
    for key in ("on_success", "on_failure"):
        if d[key]:
            opts.append(f"{key}={d[key]}")
    for s in d["schedules"]:
        opts.append(f"schedule={s['cron']!r}" + (f" {s['tz']}" if s["tz"] != "UTC" else ""))
    return " ".join(opts)


@cli.command()
@click.argument("name")
@click.option("--queue", "-q", default=None, help="Queue of the new function (default: the first in runner.toml).")
@click.option("--force", is_flag=True, help="Overwrite existing files.")
@click.pass_context
def new(ctx: click.Context, name: str, queue: str | None, force: bool) -> None:
    """Scaffold functions/NAME.py and schemas/NAME/v1.json, ready to run (and runner.toml,
    in a folder with no project yet)."""
    import os
    from pathlib import Path

    from runner.catalog.scaffold import ScaffoldError, new_project, project_config, project_missing_here, scaffold
    from runner.config import find

    here = Path.cwd()
    # No runner.toml here or in a parent folder: a new project here (its runner.toml is
    # written once the files are), unless this is the functions/ or schemas/ folder of a
    # project that has none (the files would nest in a second project).
    fresh = ctx.obj["config"] is None and not os.environ.get("RUNNER_CONFIG") and not find().is_file()
    above = project_missing_here(here) if fresh else None
    if above is not None:
        fail(f"no runner.toml here or in a parent folder, and {here} looks like the {here.name} folder of the "
             f"project in {above}: run `runner new {name}` there (it writes runner.toml with the defaults; "
             "commands run here then find it)", EXIT_CONFIG)
    first = queue or "default"
    try:
        # A new project's queue is the one asked for (with no runner.toml, the defaults
        # have one queue, "default", and `--queue fast` named a queue of no file).
        cfg = project_config(here, first) if fresh else load_config(ctx.obj["config"])
        made = scaffold(cfg, name, queue=queue, force=force)
    except ConfigError as exc:
        fail(str(exc), EXIT_CONFIG)
    except ScaffoldError as exc:
        fail(str(exc), EXIT_REFUSED)
    if fresh:
        click.echo(f"created {new_project(here, first)} (the defaults, one queue \"{first}\": no runner.toml "
                   "was found here or in a parent folder)")
    from runner.config import state_dir

    state_dir(cfg.root)  # .runner/ ignores itself before anything lands there
    click.echo(f"created {made.function}\ncreated {made.schema}\n"
               f"try it: runner enqueue {name} '{{\"name\": \"world\"}}'")


@cli.command(cls=RedisCommand)
@click.option("--strict", is_flag=True, help="Warnings (risky Redis settings, function warnings) fail too.")
@click.option("--offline", is_flag=True, help="Skip Redis: no settings check, no deploy gate.")
@click.option("--scan", is_flag=True, help="Deploy gate by reading every waiting job (per state) instead of "
              "the counts the scripts keep; slow on a deep queue.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def check(ctx: click.Context, strict: bool, offline: bool, scan: bool, as_json: bool) -> None:
    """Check config, functions and schemas, the Redis settings, and (deploy gate) that every
    job waiting in Redis can be run by the functions on disk. Non-zero on any error."""
    from runner.catalog import checks
    from runner.store import codec

    report = checks.check_files(ctx.obj["config"], payload_check=codec.payload_problem)
    code = EXIT_OK
    where = None
    if report.config is None:
        code = EXIT_CONFIG
    elif not offline:
        from runner.catalog.registry import Registry
        from runner.cli.target import resolve
        from runner.runtime import Runtime
        from runner.store import roster, steps
        from runner.store.census import counts, waiting_versions
        from runner.store.guard import redis_risks
        from runner.store.link import is_outage

        reg = report.registry or Registry()
        cfg, where = resolve(report.config, config_named=ctx.obj["config"] is not None)
        rt = None
        try:
            # The counts need a few reads: on the store's own connection where the URL
            # allows (importing redis-py would be most of the gate's time); --scan walks
            # every job with redis-py's SCAN.
            rt = Runtime.create(cfg, reg=reg, lazy=True, reader=not scan)
            # A Cluster master down while others answer: the gate counts the live ones and
            # names it (exit 3), rather than take all of Redis for unreachable.
            gone = shards_down(rt)
            if gone:
                report.problems.append(checks.Problem(
                    "redis", f"{down_text(gone)}; the deploy gate counted the live partitions only"))
                code = EXIT_REDIS
            report.problems.extend(checks.Problem("redis", risk, "warning") for risk in
                                   redis_risks(rt.redis, cfg.redis.wait_replicas))
            every = [k for parts in rt.parts.values() for k in parts]  # the gate counts every partition
            report.problems.extend(checks.Problem("redis", m, "warning") for m in held_partitions(rt, every))
            if scan:
                report.scanned, groups = waiting_versions(rt.redis, every)
            else:
                report.scanned, groups = counts(rt.redis, every)
            report.stranded = checks.gate(reg, groups)
            with _unless_down(gone, report, "the partitions recorded (the change of count) were not read"):
                report.partitions = _partition_changes(rt, gone)
                report.problems.extend(checks.Problem("partitions", m, "warning")
                                       for m in (c.message() for c in report.partitions) if m)
            with _unless_down(gone, report, "the workers' roster was not read (their code versions)"):
                damaged: list[Any] = []
                report.problems.extend(checks.behind(reg, roster.read(rt.redis, cfg.redis.prefix, damaged=damaged)))
                report.problems.extend(checks.Problem("deploy gate", f"the workers' code versions were not read: "
                                                      f"{d.detail}", "warning") for d in damaged)
            sleepers, short = steps.suspended(rt.redis, every)
            report.problems.extend(checks.drift(reg, sleepers))
            report.problems.extend(checks.Problem("deploy gate", (
                f"queue {q}: read the first {read:,} of {held:,} scheduled jobs for sleeping and waiting durable "
                "functions; the rest were not checked against the new code"), "warning") for q, read, held in short)
            report.redis_checked = True
        except Exception as exc:
            if not is_outage(exc):
                raise
            # The words of every other command, scrubbed as fail() scrubs them.
            said = urls.scrub(password_said(exc, where) or (
                f"cannot reach {where.url} ({where.source}): {exc!s}"))
            report.problems.append(checks.Problem("redis", f"{said} (the deploy gate did not run; --offline skips it)"))
            code = EXIT_REDIS
        finally:
            if rt is not None:
                rt.close()
    if code == EXIT_OK and report.failed(strict):
        code = EXIT_REFUSED
    if as_json:
        emit({**report.as_dict(), "ok": code == EXIT_OK}, True)
    else:
        click.echo(render_check(report, strict, code, where))
    sys.exit(code)


def held_partitions(rt: Any, every: list[Any]) -> list[str]:
    """A line per partition held for its replicas: its master has fewer connected than
    [redis] wait_replicas, so its claims are not confirmed (none of its jobs runs) and
    enqueues to it are refused, until a replica is back."""
    from runner.store.guard import replicas_by_key

    wanted = rt.config.redis.wait_replicas
    if not wanted:
        return []
    have = replicas_by_key(rt.redis, [k.ready for k in every])
    return [f"partition {{{k.tag}}} of queue {k.queue} is held: its master has {n} of {wanted} replica(s) "
            "connected ([redis] wait_replicas), so none of its jobs runs and enqueues there are refused "
            "until a replica is back (a master just promoted: its replica rejoins, or add one)"
            for k, n in zip(every, have, strict=True) if n is not None and n < wanted]


@contextlib.contextmanager
def _unless_down(gone: list[Any], report: Any, what: str) -> Iterator[None]:
    """A read of the check that a Cluster master down (``gone``) may refuse: said as a
    warning, and the check goes on (it exits 3 for that master already)."""
    from runner.catalog import checks
    from runner.store.link import is_outage

    try:
        yield
    except Exception as exc:
        if not (gone and is_outage(exc)):
            raise
        report.problems.append(checks.Problem("redis", f"{what}: its key is on a master that is down", "warning"))


def _partition_changes(rt: Any, gone: list[Any]) -> list[Any]:
    """What the configured counts of partitions imply against the tags recorded in Redis
    (of ``gone``, the masters down, the partitions are the count's own all the same)."""
    from runner.catalog.partitioning import changes
    from runner.runtime import KEEP_MARGIN_S
    from runner.store import tagset
    from runner.store.census import counts

    own = {q: tuple(k.tag for k in p if not k.draining) for q, p in rt.parts.items()}
    for d in gone:  # (left out of rt.parts: cli shards_down)
        for k in d.parts:
            if not k.draining:
                own[k.queue] += (k.tag,)
    seen = tagset.record_and_read_all(rt.redis, rt.config.redis.prefix, own, {}, record=False,
                                      keep_s=rt.config.retention.done_s + KEEP_MARGIN_S)
    jobs = {f"{k.queue}|{k.tag}": counts(rt.redis, [k])[0] for p in rt.parts.values() for k in p if k.draining}
    return changes({q: c.partitions for q, c in rt.config.queues.items()}, own, seen.tags, jobs, seen.counts)


def render_check(report: Any, strict: bool, code: int, where: Any = None) -> str:
    out = []
    if report.config is not None:
        out.append(f"config     {report.config.source}: queues {', '.join(report.config.queues)}")
    if where is not None:
        out.append(f"server     {where.url} ({where.source})")
    if report.registry is not None:
        names = sorted(report.registry.functions)
        out.append(f"functions  {len(names)} loaded: {', '.join(names) or '-'}")
    for p in report.problems:
        color = "red" if p.severity == "error" or strict else "yellow"
        out.append(click.style(f"{p.severity:<10} {p.where}: {p.message}", fg=color))
    for c in report.partitions:
        line = f"partitions {c.queue}: {c.partitions}"
        if c.added:
            line += f", new to Redis: {', '.join('{' + t + '}' for t in c.added)}"
        if c.draining:
            line += f", draining: {', '.join('{' + t + '}' for t in c.draining)} ({c.draining_jobs} job(s))"
        out.append(line)
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
        elif not any(p.where == "deploy gate" and p.severity == "error" for p in report.problems):
            # A sleeping job whose recorded steps the new code no longer reaches is the
            # gate's error too, named above: the all-clear would contradict it.
            out.append("deploy gate: every waiting job can run")
    out.append(click.style("ok", fg="green") if code == EXIT_OK else click.style("check failed", fg="red"))
    return "\n".join(out)
