"""Commands on jobs: `runner enqueue` (one payload or --jsonl lines), `runner job` and
`runner stats`."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, NoReturn

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
    current_target,
    down_text,
    down_view,
    emit,
    fail,
    left_down,
    plain,
    print_refused,
    print_validation,
    read_payload,
    redis_errors,
    refusal,
    said_down,
    shards_down,
    table,
    target,
    utc,
)
from runner.errors import (
    MAX_DELAY_S,
    JobNotFound,
    NotReplicated,
    RedisUnavailable,
    RunnerError,
    UnknownFunction,
    ValidationFailed,
)


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
                emit({**refusal(exc), "exit_code": EXIT_REFUSED}, True)
            print_validation(exc)
            sys.exit(EXIT_REFUSED)
        except RedisUnavailable:
            raise
        except NotReplicated as exc:  # exit 3 (redis_errors); the job id on stdout for --json
            if as_json:
                emit({**refusal(exc), "exit_code": EXIT_REDIS}, True)
            raise
        except RunnerError as exc:
            if as_json:  # the text with where to look next, as on stderr
                emit({**refusal(exc), "error": refused_text(exc), "exit_code": EXIT_REFUSED}, True)
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

    cut: dict[str, list[int]] = {}  # the batch Redis refused or lost part-way: its lines by outcome

    def send(batch: list[tuple[int, Request]]) -> None:
        nonlocal done, dup, last_ok
        try:
            results = client.enqueue_many([r for _, r in batch])
        except RedisUnavailable as exc:
            if len(exc.results) == len(batch):  # sent, and cut short: say what became of each line
                unsure = set(exc.undetermined)
                for i, ((n, _), res) in enumerate(zip(batch, exc.results, strict=True)):
                    if i in unsure:
                        cut.setdefault("unknown", []).append(n)
                    elif res is None or isinstance(res, RedisUnavailable):
                        cut.setdefault("missing", []).append(n)
                    elif isinstance(res, RunnerError):
                        refused.append({"line": n, **refusal(res)})
                    else:
                        done += 1
                        dup += int(res.duplicate)
                cut["end"] = [batch[-1][0]]
            raise
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
    except RedisUnavailable as exc:
        if not cut:
            _unavailable(exc, batch, last_ok)
        missing, unknown = cut.get("missing", []), cut.get("unknown", [])
        resume = min(missing + unknown) if missing or unknown else cut["end"][0] + 1
        refused.sort(key=lambda r: int(r["line"]))
        message = (f"Redis unavailable part-way through lines {batch[0][0]} to {cut['end'][0]}: {exc}\n"
                   f"{done} line(s) were enqueued; not enqueued: lines {_spans(missing) or 'none'}"
                   + (f"; unknown (in flight when the connection went, may have been enqueued): lines "
                      f"{_spans(unknown)}" if unknown else "")
                   + f"; lines from {cut['end'][0] + 1} on were not read. Send the lines not enqueued again "
                   f"(the unknown ones only if the function has an IDEMPOTENCY_KEY), then resume from line "
                   f"{cut['end'][0] + 1}.")
        if as_json:
            emit({"error": message, "exit_code": EXIT_REDIS, "enqueued": done, "duplicates": dup,
                  "refused": refused, "not_enqueued_lines": missing, "unknown_lines": unknown,
                  "resume_from_line": resume, "unread_from_line": cut["end"][0] + 1}, True)
        fail(message, EXIT_REDIS)
    except UNAVAILABLE as exc:
        _unavailable(exc, batch, last_ok)
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


def _unavailable(exc: BaseException, batch: list[Any], last_ok: int) -> NoReturn:
    """Redis gone before a batch's answers said anything of its lines."""
    first = batch[0][0] if batch else last_ok + 1
    sent = f"lines 1 to {last_ok} were enqueued; " if last_ok else ""
    fail(f"Redis unavailable at line {first}: {exc}\n{sent}the batch from line {first} may or may not "
         f"have been enqueued. Resume from line {first} (a function with an IDEMPOTENCY_KEY makes that safe).",
         EXIT_REDIS)


def _spans(lines: list[int]) -> str:
    """1, 2, 3, 7 as "1-3, 7"."""
    out: list[str] = []
    for n in sorted(lines):
        if out and out[-1].split("-")[-1] == str(n - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{n}"
        else:
            out.append(str(n))
    return ", ".join(out)


@cli.command(cls=RedisCommand)
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def job(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """Show one job."""
    # The lookup itself, not the Client: this command needs none of its other imports.
    from runner.store import records

    rt = build_runtime(ctx.obj["config"], client_only=True, reader=True)
    with redis_errors():
        gone = shards_down(rt)  # a Cluster master down or stalled: looked for on the live ones
        found = records.lookup(rt.read_scripts, [k for parts in rt.parts.values() for k in parts], job_id)
    if found is None:
        if gone:  # it may live there: not "no such job"
            fail(f"job {job_id} is not on the masters that answer; {down_text(gone)}", EXIT_REDIS)
        fail(str(JobNotFound(job_id)), EXIT_REFUSED)
    record = found.as_dict()
    emit(record, as_json, "\n".join(f"{k:>16}: {_shown(k, v)}" for k, v in record.items() if v is not None))


def _shown(name: str, value: Any) -> str:
    """One field of `runner job` for people: times (``*_at``, epoch seconds) as UTC dates
    with the epoch beside them, the history an attempt a line with its times as UTC dates,
    an empty list as "none", JSON as JSON."""
    from runner.store import codec

    if name.endswith("_at") and isinstance(value, int | float) and not isinstance(value, bool):
        return f"{utc(value, '%Y-%m-%d %H:%M:%S.%f')[:23]} UTC ({value})"
    if value == []:  # no history yet, no children: words, not a bracket pair
        return "none"
    if name == "history" and isinstance(value, list):
        return "\n".join(_entry(e) if isinstance(e, dict) else codec.dumps_view(e) for e in value).replace(
            "\n", "\n" + " " * 18)
    if name == "steps" and isinstance(value, list) and value:
        return "\n".join(plain(_step(i, e)) for i, e in enumerate(value, 1)).replace("\n", "\n" + " " * 18)
    if name == "last_error" and isinstance(value, dict):
        return _error(value).replace("\n", "\n" + " " * 18)
    return codec.dumps_view(value) if isinstance(value, dict | list) else plain(codec.shown_text(str(value)))


def _error(e: dict[str, Any]) -> str:
    """A job's last error for people: ``Type: message``, then its traceback's lines as
    lines (they were one JSON string of escaped newlines), then any other field."""
    from runner.store import codec

    head = plain(codec.shown_text(f"{e.get('type') or 'Error'}: {e.get('message') or ''}".rstrip(": ")))
    lines = [head]
    tb = e.get("traceback")
    if isinstance(tb, str) and tb.strip():
        lines += [plain(codec.shown_text(x)) for x in tb.rstrip("\n").split("\n")]
    rest = {k: v for k, v in e.items() if k not in ("type", "message", "traceback")}
    if rest:
        lines.append(plain(codec.shown_text(codec.dumps_view(rest))))
    return "\n".join(lines)


def _step(i: int, e: Any) -> str:
    """One step of a durable function: ``3. charge (step) ok, finished <date>; {result}``."""
    from runner.store import codec

    if not isinstance(e, dict):
        return f"{i}. {codec.dumps_view(e)}"
    line = f"{i}. {codec.shown_text(str(e.get('name')))} ({e.get('kind')}) {e.get('status')}"
    for key in ("finished_at", "until"):
        t = e.get(key)
        if isinstance(t, int | float) and not isinstance(t, bool):
            line += f", {key.replace('_at', '')} {utc(t)} UTC"
    for key in ("signal", "child", "event"):
        if e.get(key):
            line += f", {key} {codec.shown_text(str(e[key]))}"
    if e.get("kind") == "event" and isinstance(e.get("match"), dict):
        line += f" matching {codec.shown_text(codec.dumps_view(e['match']))}"
    if e.get("result") is not None:
        line += f"; {codec.shown_text(str(e['result']))}"
    if isinstance(e.get("error"), dict):
        line += f"; {codec.shown_text(str(e['error'].get('type')))}: {codec.shown_text(str(e['error'].get('message')))}"
    return line


def _entry(entry: dict[str, Any]) -> str:
    """One history entry: ``attempt 2: retry, started <date>, at <date>; Type: message``,
    each ``*_ms`` epoch as a UTC ISO date; fields of other shapes as JSON."""
    from runner.store import codec

    def iso(ms: int) -> str:
        return utc(ms / 1000, "%Y-%m-%dT%H:%M:%S.%f")[:23] + "Z"

    parts: list[str] = []
    rest = dict(entry)
    attempt, outcome, error = rest.pop("attempt", None), rest.pop("outcome", None), rest.pop("error", None)
    for key, value in rest.items():
        if key.endswith("_ms") and isinstance(value, int) and not isinstance(value, bool):
            parts.append(f"{'started' if key == 'started_ms' else key.removesuffix('_ms')} {iso(value)}")
        else:
            parts.append(f"{key} {codec.dumps_view(value)}")
    head = " ".join(str(x) for x in ("attempt", attempt) if attempt is not None)
    text = ", ".join(str(x) for x in (outcome, *parts) if x is not None)
    if isinstance(error, dict):
        text += plain(f"; {error.get('type')}: {error.get('message')}")
    elif error is not None:
        text += f"; {codec.dumps_view(error)}"
    return f"{head}: {text}" if head else text


@cli.command(cls=RedisCommand)
@click.option("--json", "as_json", is_flag=True,
              help='{"redis": {url, source, prefix}, "queues": [...]}, each queue as GET /queues shows it.')
@click.pass_context
def stats(ctx: click.Context, as_json: bool) -> None:
    """Queue figures (cluster-wide), and which Redis they come from."""

    from runner.observe.figures import left_out_view, queue_view, read_queues

    rt = build_runtime(ctx.obj["config"], client_only=True, reader=True)
    where = target(ctx)
    with redis_errors():
        gone = shards_down(rt)  # a Cluster master down: the live ones' figures, then exit 3
        # The table sums over functions: only --json lists each loaded function.
        figures = read_queues(rt, loaded_functions=as_json)
        # (and one that stopped answering since, given up past a reader's bound)
        gone += left_down(rt, left_out_view(figures))
    queues = [queue_view(q, rt.config.queues[q.name]) for q in figures]
    left_out = [{"queue": k.queue, "partition": k.tag} for d in gone for k in d.parts]
    rows = [(q["name"], q["ready"], q["processing"], q["scheduled"], q["sleeping"], q["waiting"], q["dead"],
             sum(f["succeeded"] for f in q["functions"].values()),
             sum(f["retried"] for f in q["functions"].values()),
             sum(f["cancelled"] for f in q["functions"].values()),  # an outcome apart from dead
             "queue" if q["paused"] else ", ".join(q["paused_functions"]) or "-") for q in queues]
    # A partitioned queue's partitions, each under its queue's sums.
    at = 0
    for q in queues:
        at += 1
        for p in q["partitions"]:
            rows.insert(at, (f"  {p['partition']} {{{p['tag']}}}", p["ready"], p["processing"], p["scheduled"],
                             "", "", p["dead"], "", "", "", "draining" if p["draining"] else ""))
            at += 1
    human = where.line() + "\n" + table(
        ("queue", "ready", "processing", "scheduled", "sleeping", "waiting", "dead", "succeeded", "retried",
         "cancelled", "paused"), rows)
    for q in queues:
        if q["stats_fields_left_out"]:
            human += (f"\n{q['name']}: {q['stats_fields_left_out']} fields of its stats hash left out (too many to "
                      "read whole: only the functions loaded here are read)")
    human += held_text(queues, rt.config.redis.wait_replicas)
    emit({"redis": where.as_dict(), "queues": queues, **down_view(gone),
          **({"left_out": left_out} if left_out else {})}, as_json, human)
    if gone:
        said_down(gone)


def held_text(queues: list[dict[str, Any]], wanted: int) -> str:
    """A line per queue with partitions held for their replicas (none: nothing)."""
    lines = [f"\n{q['name']}: held {', '.join(f'{{{t}}}' for t in q['held'])}: its master has fewer than "
             f"{wanted} replica(s) connected ([redis] wait_replicas), so none of its jobs runs and enqueues "
             "there are refused until a replica is back" for q in queues if q["held"]]
    return "".join(lines)


def delay_s(value: float | None) -> float | None:
    """--delay: seconds from 0 to a year and a day (a usage error otherwise, exit 2)."""
    if value is not None and not 0 <= value <= MAX_DELAY_S:
        raise click.BadParameter(f"must be a number of seconds from 0 to {MAX_DELAY_S:.0f} (a year and a day), "
                                 f"got {value:g}")
    return value


def refused_text(exc: RunnerError) -> str:
    """A refusal's message, with where to look next. A function whose file is broken is
    refused here (this command loads the files as they are now), while a `runner dev`
    that loaded it before keeps its last good version: say so, rather than disagree in
    silence with dev's HTTP API."""
    if isinstance(exc, UnknownFunction) and exc.broken:
        where = current_target()
        if where is not None and where.dev_pid is not None:
            return (f"{exc}\nThe `runner dev` running for this project (pid {where.dev_pid}) serves the last good "
                    f"version of {exc.type} until the file loads again (POST /jobs/{exc.type} and its workers); "
                    "fix the file to enqueue it from here.")
        return f"{exc}\nFix the file; `runner functions` lists what failed to load."
    if isinstance(exc, UnknownFunction):
        return f"{exc}; `runner functions` lists every function and what failed to load"
    return str(exc)
