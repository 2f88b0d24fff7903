"""``run_inline``: one job through the worker's own steps, in the caller's process, with
no Redis: resolve (type, version, validation, upgrades), a real ``Context``, the handler,
and the worker's classification of what happened (done, retry with its delay, dead with
its reason).

What the handler does through ``ctx`` (checkpoints, progress, follow-up jobs) is recorded
on the returned Outcome instead of reaching Redis. TIMEOUT is not enforced for a plain
``def`` handler here (no timer thread interrupts the test); an ``async def`` one still
runs under it.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner import config as config_mod
from runner.catalog import registry as registry_mod
from runner.catalog import templates
from runner.catalog.registry import Function, Registry
from runner.config import Config
from runner.errors import FieldError, ValidationFailed
from runner.store import codec, records
from runner.store.scripts import followup_id
from runner.worker import batching, journal
from runner.worker.context import Context, Flags, Hooks
from runner.worker.execute import Claimed, Dead, Done, RetryLater, Suspended, resolve
from runner.worker.execute import run as run_handler

joblog = logging.getLogger("runner.job")


@dataclass(frozen=True, slots=True)
class Followup:
    """A job the handler enqueued through ``ctx.enqueue`` (validated, not sent). Like the
    worker's answer it has the follow-up's ``id`` (its parent's and its place), ``queue``
    and ``status`` ("pending"), so a handler that uses them runs the same here."""

    type: str
    payload: Any
    version: int
    delay: float | None = None
    idempotency_key: str | None = None
    priority: int | None = None  # None: the function's PRIORITY
    id: str = ""
    queue: str = ""
    status: str = "pending"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a worker would have done with the job.

    ``status`` is "done" (``result`` holds the handler's return value), "retry" (``delay``
    seconds until the next attempt, ``error`` the exception) or "dead" (``reason``: "invalid
    payload", "permanent failure", "max attempts reached", "unknown version", ...)."""

    status: str
    job_id: str
    result: Any = None
    error: dict[str, Any] | None = None
    reason: str | None = None
    delay: float | None = None
    enqueued: tuple[Followup, ...] = ()
    checkpoints: tuple[Any, ...] = ()
    progress: tuple[Any, ...] = ()
    steps: tuple[dict[str, Any], ...] = ()  # the step log as the run left it (durable calls)
    payload: Any = None  # as the handler saw it: validated and upgraded to the newest version

    @property
    def ok(self) -> bool:
        return self.status == "done"


@dataclass(slots=True)
class _Recorder:
    registry: Registry
    job_id: str = ""
    enqueued: list[Followup] = field(default_factory=list)
    checkpoints: list[Any] = field(default_factory=list)
    progress: list[Any] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)

    def record_step(self, position: int, body: str) -> tuple[int, int]:
        """A step's entry, as step.lua would keep it (bounded alike)."""
        if len(self.steps) >= journal.MAX_STEPS:
            return journal.FULL, len(self.steps)
        decoded = codec.loads(body)
        self.steps.append(records.entry_of(decoded) or decoded)  # (as a worker's read expands it)
        return journal.RECORDED, len(self.steps)

    def save(self, body: str) -> bool:
        self.checkpoints.append(codec.loads(body))
        return True

    def enqueue(self, type_: str, payload: Any, *, version: int | None = None, delay: float | None = None,
                idempotency_key: str | None = None, priority: int | None = None) -> Followup:
        """Validate as the client would (an invalid follow-up fails the handler, as it would
        in a worker), then record."""
        fn = self.registry.get(type_)
        v = version if version is not None else fn.versions.newest
        if priority is not None and (not isinstance(priority, int) or isinstance(priority, bool)
                                     or not 0 <= priority <= 9):
            raise ValidationFailed(fn.name, v, [FieldError("$", f"priority must be 0 to 9, got {priority!r}")])
        fn.versions.validate(payload, v)
        fn.refuse_stranded(v)  # a worker's ctx.enqueue refuses it too
        job = Followup(type_, payload, v, delay, idempotency_key, priority,
                       id=followup_id(self.job_id, len(self.enqueued)), queue=fn.queue)
        self.enqueued.append(job)
        return job


class _InlineHooks(Hooks):
    """The ctx calls of an inline run: recorded (see Outcome), never refused."""

    __slots__ = ("rec",)

    def __init__(self, rec: _Recorder) -> None:
        self.rec = rec

    def save(self, body: str) -> bool:
        return self.rec.save(body)

    def progress(self, ctx: Context, value: Any) -> None:
        self.rec.progress.append(value)

    def enqueue(self, type_: str, payload: Any, **options: Any) -> Followup:
        return self.rec.enqueue(type_, payload, **options)


def load_project(project: str | Path = ".") -> tuple[Config, Registry]:
    """The config (runner.toml, when the project has one) and the functions of a project."""
    root = Path(project)
    toml = root / "runner.toml"
    cfg = config_mod.load(toml) if toml.exists() else config_mod.parse({}, root.resolve(), str(toml), {})
    return cfg, registry_mod.load(cfg, payload_check=codec.payload_problem)


def _render(template: templates.Template | None, payload: Any) -> str:
    if template is None or not isinstance(payload, dict):
        return ""
    try:
        return template.render(payload)
    except templates.TemplateError:
        return ""  # the payload is invalid: resolve() reports that with every error


def run_inline(
    type: str, payload: Any, *, version: int | None = None, project: str | Path = ".",
    registry: Registry | None = None, **ctx_overrides: Any,
) -> Outcome:
    """Run one job of ``type`` now, in this process, as a worker would, and say how it ended.

    For a BATCH function ``payload`` is a list of payloads, and the answer a list of
    Outcomes, one per payload in order: the payloads are validated and upgraded one by one
    (one that cannot run ends as a worker would end it, without the call), grouped by
    rendered BATCH key and cut to BATCH size as a worker would, and each group goes to
    ``handle_batch`` in one call (its ``ctx.jobs[i]`` shows each item's id and attempt).
    ``ctx_overrides`` there: ``attempt``, ``max_attempts``, ``cancelled`` (every item's)
    and ``job_id`` (the items' ids are ``<job_id>.<index>``).

    ``ctx_overrides`` set what the handler's ``ctx`` shows: ``attempt`` (default 1),
    ``max_attempts`` (default the function's), ``job_id``, ``checkpoint`` (as left by an
    earlier attempt), ``idempotency_key``, ``resource_key``, ``cancelled`` and ``lock_lost``;
    ``steps``, a step log left by an earlier run (``Outcome.steps``), replays it. Durable
    calls run: ``ctx.step`` records, ``ctx.sleep`` returns at once, ``ctx.wait_for_signal``
    returns the body given in ``signals={name: body}`` (none: SignalTimeout), and
    ``ctx.wait_for_event`` the event whose data ``events={name: data}`` gives, when it holds
    the wait's match (else None, as on a timeout).
    ``registry`` skips loading the project (a test that runs many jobs loads it once); the
    result and checkpoints are then held to the default ``[worker] max_result_bytes``."""
    if registry is None:
        cfg, reg = load_project(project)
        max_result, max_step = cfg.worker.max_result_bytes, cfg.worker.max_step_bytes
    else:
        reg, max_result, max_step = registry, config_mod.MAX_RESULT_BYTES, journal.MAX_STEP_BYTES
    fn = reg.get(type)
    if fn.batch is not None:
        return _run_batch(fn, reg, payload, version, max_result, ctx_overrides)  # type: ignore[return-value]
    known = {"attempt", "max_attempts", "job_id", "checkpoint", "idempotency_key", "resource_key",
             "cancelled", "lock_lost", "steps", "signals", "events"}
    unknown = set(ctx_overrides) - known
    if unknown:
        raise TypeError(f"run_inline: unknown ctx override(s) {sorted(unknown)}; known: {sorted(known)}")
    now_ms = int(time.time() * 1000)
    job = Claimed(
        id=str(ctx_overrides.get("job_id") or uuid.uuid4().hex), token=uuid.uuid4().hex,
        attempt=int(ctx_overrides.get("attempt", 1)), type=type,
        version_raw=str(version if version is not None else fn.versions.newest),
        payload_raw=codec.dumps(payload), max_attempts=int(ctx_overrides.get("max_attempts", fn.max_attempts)),
        idem_key=ctx_overrides.get("idempotency_key") or _render(fn.idempotency_key, payload),
        resource_key=ctx_overrides.get("resource_key") or _render(fn.resource_key, payload),
        ready_ms=now_ms, created_ms=now_ms,
        checkpoint_raw=codec.dumps(ctx_overrides["checkpoint"]) if "checkpoint" in ctx_overrides else "",
        queue=fn.queue, claimed_ms=now_ms,
    )
    # No grace for an unknown version: a worker would hand it back for a newer worker,
    # but inline there is none to wait for.
    resolved = resolve(job, reg, 0.0, now_ms)
    if isinstance(resolved, Done | RetryLater | Dead):
        return _outcome(job.id, resolved, _Recorder(reg), None)
    fn, lifted, newest = resolved
    rec = _Recorder(reg, job.id)
    ctx = Context(
        job_id=job.id, type=job.type, version=newest, queue=job.queue, attempt=job.attempt,
        max_attempts=job.max_attempts, token=job.token, deadline=time.time() + fn.timeout_s,
        idempotency_key=job.idem_key or None, resource_key=job.resource_key or None,
        _logger=logging.LoggerAdapter(joblog, {"job_id": job.id, "type": job.type, "attempt": job.attempt}),
        _checkpoint=ctx_overrides.get("checkpoint"), _hooks=_InlineHooks(rec),
        _flags=Flags(lock_lost=bool(ctx_overrides.get("lock_lost")),
                     cancelled=bool(ctx_overrides.get("cancelled"))),
        _max_bytes=max_result,
    )
    rec.steps = [dict(e) for e in ctx_overrides.get("steps") or ()]
    ctx._journal = journal.Journal(job.id, lambda: list(rec.steps), rec.record_step, max_step, inline=True,
                                   signals=dict(ctx_overrides.get("signals") or {}),
                                   events=dict(ctx_overrides.get("events") or {}))
    outcome, _ = run_handler(fn, lifted, job, ctx, None, lambda body: body(), max_result)
    return _outcome(job.id, outcome, rec, lifted)


def _outcome(job_id: str, o: Done | RetryLater | Dead | Suspended, rec: _Recorder, payload: Any) -> Outcome:
    recorded: dict[str, Any] = {"enqueued": tuple(rec.enqueued), "checkpoints": tuple(rec.checkpoints),
                                "progress": tuple(rec.progress), "steps": tuple(rec.steps), "payload": payload}
    if isinstance(o, Done):
        return Outcome("done", job_id, result=codec.loads(o.result) if o.result else None, **recorded)
    if isinstance(o, RetryLater):
        return Outcome("retry", job_id, error=o.error, delay=o.delay_s, **recorded)
    if isinstance(o, Suspended):  # not reached inline (a sleep returns at once)
        return Outcome("sleeping", job_id, **recorded)
    return Outcome("dead", job_id, error=o.error, reason=o.reason, **recorded)



_BATCH_OVERRIDES = {"attempt", "max_attempts", "cancelled", "job_id"}


def _run_batch(fn: Function, reg: Registry, payloads: Any, version: int | None, max_result: int,
               overrides: dict[str, Any]) -> list[Outcome]:
    """run_inline of a BATCH function: a list of payloads in, one Outcome per payload out."""
    if not isinstance(payloads, list | tuple):
        raise TypeError(f"run_inline({fn.name!r}, ...): {fn.name} has BATCH, so it takes a list of payloads "
                        f"(one per job), not {type(payloads).__name__}; its answer is a list of Outcomes")
    unknown = set(overrides) - _BATCH_OVERRIDES
    if unknown:
        raise TypeError(f"run_inline: ctx override(s) {sorted(unknown)} are not a batch's; known for a BATCH "
                        f"function: {sorted(_BATCH_OVERRIDES)}")
    assert fn.batch is not None
    now_ms = int(time.time() * 1000)
    base = str(overrides.get("job_id") or uuid.uuid4().hex)
    jobs = [Claimed(
        id=f"{base}.{i}", token=uuid.uuid4().hex, attempt=int(overrides.get("attempt", 1)), type=fn.name,
        version_raw=str(version if version is not None else fn.versions.newest), payload_raw=codec.dumps(p),
        max_attempts=int(overrides.get("max_attempts", fn.max_attempts)),
        idem_key=_render(fn.idempotency_key, p), resource_key="", ready_ms=now_ms, created_ms=now_ms,
        checkpoint_raw="", queue=fn.queue, claimed_ms=now_ms) for i, p in enumerate(payloads)]
    out: list[Outcome | None] = [None] * len(jobs)
    groups: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for i, job in enumerate(jobs):
        resolved = resolve(job, reg, 0.0, now_ms)
        if isinstance(resolved, Done | RetryLater | Dead):
            out[i] = _outcome(job.id, resolved, _Recorder(reg), None)
        else:
            groups.setdefault(batching.key_of(fn, resolved[1]), []).append((i, resolved[1]))
    flags = Flags(cancelled=bool(overrides.get("cancelled")))
    for members in groups.values():
        for at in range(0, len(members), fn.batch.size):
            chunk = members[at:at + fn.batch.size]
            claimed = [jobs[i] for i, _ in chunk]
            ctx = batching.BatchContext(
                fn.name, fn.versions.newest, fn.queue, batching.jobs_of(claimed, [flags] * len(claimed)),
                fn.timeout_s, logging.LoggerAdapter(joblog, {"type": fn.name, "batch": len(claimed)}),
                extend=lambda: True)
            got, _ = batching.run(fn, [p for _, p in chunk], claimed, ctx, None, lambda body: body(), max_result)
            for (i, p), o in zip(chunk, got, strict=True):
                out[i] = _outcome(jobs[i].id, o, _Recorder(reg), p)
    return [o for o in out if o is not None]
