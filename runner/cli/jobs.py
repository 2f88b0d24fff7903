"""Commands on jobs: `runner enqueue` (one payload or --jsonl lines), `runner job` and
`runner stats`."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import click

from runner.cli.root import (
    EXIT_CONFIG,
    EXIT_OK,
    EXIT_REDIS,
    EXIT_REFUSED,
    JSONL_BATCH,
    RedisCommand,
    build_runtime,
    cli,
    emit,
    fail,
    print_refused,
    print_validation,
    read_payload,
    redis_errors,
    refusal,
    table,
    target,
)
from runner.errors import (
    JobNotFound,
    NotReplicated,
    RedisUnavailable,
    RunnerError,
    UnknownFunction,
    ValidationFailed,
)

# As the HTTP API's ?delay=: a longer delay is almost surely a unit mistake (ms for s).
MAX_DELAY_S = 366 * 86_400.0


@cli.command(cls=RedisCommand)
@click.argument("type_", metavar="TYPE")
@click.argument("payload", required=False)
@click.option("--version", "version", type=int, default=None, help="Payload version (default: newest).")
@click.option("--delay", type=float, default=None, metavar="SECONDS", callback=lambda c, p, v: delay_s(v),
              help="Seconds to wait before running (0 to a year).")
@click.option("--idempotency-key", default=None)
@click.option("--priority", type=click.IntRange(0, 9), default=None,
              help="0-9, higher first (default: the function's PRIORITY).")
@click.option("--jsonl", "jsonl", default=None, metavar="FILE|-",
              help="Enqueue one job per line (each line a payload), in batches, with progress.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def enqueue(
    ctx: click.Context, type_: str, payload: str | None, version: int | None,
    delay: float | None, idempotency_key: str | None, priority: int | None, jsonl: str | None, as_json: bool,
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
                                     idempotency_key=idempotency_key, priority=priority)
        except ValidationFailed as exc:
            if as_json:
                emit(refusal(exc), True)
            print_validation(exc)
            sys.exit(EXIT_REFUSED)
        except RedisUnavailable:
            raise
        except NotReplicated as exc:  # exit 3 (redis_errors); the job id on stdout for --json
            if as_json:
                emit(refusal(exc), True)
            raise
        except RunnerError as exc:
            if as_json:
                emit(refusal(exc), True)
            fail(refused_text(exc), EXIT_REFUSED)
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
    from runner.store import codec
    from runner.store.connection import UNAVAILABLE

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
    except NotReplicated as exc:
        first = batch[0][0] if batch else last_ok + 1
        sent = f"lines 1 to {last_ok} were enqueued and confirmed; " if last_ok else ""
        fail(f"not replicated at line {first}: only {exc.acked} of {exc.wanted} replica(s) confirmed within "
             f"{exc.timeout_s:g} s.\n{sent}the batch from line {first} was written to the master but may be lost "
             f"in a failover. Resume from line {first} (a function with an IDEMPOTENCY_KEY makes that safe).",
             EXIT_REDIS)
    except (RedisUnavailable, *UNAVAILABLE) as exc:  # type: ignore[misc]
        first = batch[0][0] if batch else last_ok + 1
        sent = f"lines 1 to {last_ok} were enqueued; " if last_ok else ""
        fail(f"Redis unavailable at line {first}: {exc}\n{sent}the batch from line {first} may or may not "
             f"have been enqueued. Resume from line {first} (a function with an IDEMPOTENCY_KEY makes that safe).",
             EXIT_REDIS)
    # Lines that are not JSON are refused as they are read, the others when their batch
    # is answered: put them back in the order of the file.
    refused.sort(key=lambda r: int(r["line"]))
    summary = {"enqueued": done, "duplicates": dup, "refused": refused}
    if as_json:
        emit(summary, True)
    else:
        click.echo(f"enqueued {done} job(s) of {type_}" + (f" ({dup} duplicate(s))" if dup else "")
                   + (f"; {len(refused)} line(s) refused" if refused else ""))
        for r in refused:
            print_refused(f"line {r['line']}", r)
    return EXIT_REFUSED if refused else EXIT_OK


@cli.command(cls=RedisCommand)
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def job(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """Show one job."""
    # The lookup itself, not the Client: this command needs none of its other imports.
    from runner.store import codec, records

    rt = build_runtime(ctx.obj["config"], client_only=True, reader=True)
    with redis_errors():
        found = records.lookup(rt.read_scripts, [k for parts in rt.parts.values() for k in parts], job_id)
    if found is None:
        fail(str(JobNotFound(job_id)), EXIT_REFUSED)
    record = found.as_dict()
    human = "\n".join(f"{k:>16}: {codec.dumps(v) if isinstance(v, dict | list) else v}"
                      for k, v in record.items())
    emit(record, as_json, human)


@cli.command(cls=RedisCommand)
@click.option("--json", "as_json", is_flag=True,
              help='{"redis": {url, source, prefix}, "queues": [...]}, each queue as GET /queues shows it.')
@click.pass_context
def stats(ctx: click.Context, as_json: bool) -> None:
    """Queue figures (cluster-wide), and which Redis they come from."""
    import time

    from runner.observe.figures import queue_view, read_queues

    rt = build_runtime(ctx.obj["config"], client_only=True, reader=True)
    where = target(ctx)
    with redis_errors():
        # The table sums over functions: only --json lists each loaded function. The clock
        # is read here, not with records.now_ms: the table needs no JSON codec (orjson).
        figures = read_queues(rt, int(time.time() * 1000), loaded_functions=as_json)
    queues = [queue_view(q, rt.config.queues[q.name]) for q in figures]
    rows = [(q["name"], q["ready"], q["processing"], q["scheduled"], q["dead"],
             sum(f["succeeded"] for f in q["functions"].values()),
             sum(f["retried"] for f in q["functions"].values()),
             "queue" if q["paused"] else ", ".join(q["paused_functions"]) or "-") for q in queues]
    # A partitioned queue's partitions, each under its queue's sums.
    at = 0
    for q in queues:
        at += 1
        for p in q["partitions"]:
            rows.insert(at, (f"  {p['partition']} {{{p['tag']}}}", p["ready"], p["processing"], p["scheduled"],
                             p["dead"], "", "", "draining" if p["draining"] else ""))
            at += 1
    human = where.line() + "\n" + table(
        ("queue", "ready", "processing", "scheduled", "dead", "succeeded", "retried", "paused"), rows)
    emit({"redis": where.as_dict(), "queues": queues}, as_json, human)


def delay_s(value: float | None) -> float | None:
    """--delay: seconds from 0 to a year and a day (a usage error otherwise, exit 2)."""
    if value is not None and not 0 <= value <= MAX_DELAY_S:
        raise click.BadParameter(f"must be a number of seconds from 0 to {MAX_DELAY_S:.0f} (a year and a day), "
                                 f"got {value:g}")
    return value


def refused_text(exc: RunnerError) -> str:
    """A refusal's message, with where to look next."""
    if isinstance(exc, UnknownFunction):
        return f"{exc}; `runner functions` lists every function and what failed to load"
    return str(exc)
