"""OpenTelemetry spans for a job's life (``pip install 'runner-redis[otel]'``): enqueue
(the producer's, whose W3C traceparent travels in the job), wait (from ready to start),
run (a child of the enqueue and linked to it, with the job's id, type, attempt, queue and
outcome) and settle (the write of the outcome, a child of the run). A handler's own spans
are the run's children, in a thread and in a child process alike (``within``: the child
gets the run's traceparent with its job).

Jobs that jobs make stay in the producer's trace: a ``ctx.enqueue`` follow-up's enqueue
span is a child of the run that asked for it, an ON_SUCCESS/ON_FAILURE destination's of
the run that settled (``enqueue_under``), and a group's members and then-job carry the
trace of the group's one enqueue span. The then-job has many parents: its run stays the
group's enqueue span's child and links to the runs of the members (the first 127, a bound
kept by the group's record: lua/includes/groups.lua, group_settle), each recorded as it settled.
A BATCH function's call is one span (``batch_span``) of a trace of its own, linked to each
member's producer; each member's settle span is its child.

Off and free without the extra: every entry point checks one module constant and
returns. With the API installed but no SDK configured (no tracer provider set), it stays
off too, so a worker reads no trace contexts it would only drop.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

try:
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the extra is not installed: tracing is off
    trace = None  # type: ignore[assignment]
    TraceContextTextMapPropagator = None  # type: ignore[assignment,misc]

INSTRUMENTATION = "runner"
_PROPAGATOR: Any = TraceContextTextMapPropagator() if TraceContextTextMapPropagator is not None else None


def installed() -> bool:
    return trace is not None


# Read once: the API loads a provider named in the environment at its first look-up.
_PROVIDER_FROM_ENV = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ
_MISSING = object()


def enabled() -> bool:
    """A tracer provider is configured (the SDK's, or any other than the API's default).

    Asked for every job and every enqueue. While none is set, ``get_tracer_provider()``
    looks the environment up on each call, a cost per job with the extra installed and
    tracing off; the API sets its global provider at most once, so an unset one is read
    directly and the full check runs only once a provider may exist."""
    if trace is None:
        return False
    if getattr(trace, "_TRACER_PROVIDER", _MISSING) is None and not _PROVIDER_FROM_ENV:
        return False
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def flush(timeout_s: float) -> None:
    """Send the spans the provider still holds (a batch processor's queue), waiting
    ``timeout_s`` at most: a stopping process does so before its exit hooks, as one of
    them may block and keep the provider's own shutdown hook from running."""
    if not enabled():
        return
    force_flush = getattr(trace.get_tracer_provider(), "force_flush", None)
    if callable(force_flush):
        force_flush(int(timeout_s * 1000))


def _tracer() -> Any:
    return trace.get_tracer(INSTRUMENTATION)


def current_traceparent() -> str | None:
    """The W3C traceparent of the current span, to travel with a job."""
    if not enabled():
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent")


@contextlib.contextmanager
def enqueue_span(type_: str) -> Iterator[Any]:
    """The producer's span around validating and sending one job (None when off)."""
    if not enabled():
        yield None
        return
    attrs = {"messaging.system": "runner", "messaging.operation.type": "send", "runner.job.type": type_}
    with _tracer().start_as_current_span(f"enqueue {type_}", kind=trace.SpanKind.PRODUCER,
                                         attributes=attrs) as span:
        yield span


@contextlib.contextmanager
def enqueue_under(parent: Any, type_: str) -> Iterator[str | None]:
    """The enqueue span of a job the runner writes for another job: an ON_SUCCESS or
    ON_FAILURE destination (``parent``: the run's span context) or a lost job's ON_FAILURE
    (``parent``: its traceparent). Yields the traceparent the new job carries, so its wait
    and run spans stay in the trace; None when off or with no parent."""
    if not parent or not enabled():
        yield None
        return
    if isinstance(parent, str):
        ctx = _PROPAGATOR.extract({"traceparent": parent})
    else:
        ctx = trace.set_span_in_context(trace.NonRecordingSpan(parent))
    attrs = {"messaging.system": "runner", "messaging.operation.type": "send", "runner.job.type": type_}
    with _tracer().start_as_current_span(f"enqueue {type_}", context=ctx, kind=trace.SpanKind.PRODUCER,
                                         attributes=attrs):
        yield current_traceparent()


def annotate(span: Any, **attrs: Any) -> None:
    """Add ``runner.job.<name>`` attributes to a span (a no-op for None)."""
    if span is not None:
        for name, value in attrs.items():
            if value is not None:
                span.set_attribute(f"runner.job.{name}" if name != "queue" else "messaging.destination.name", value)


def _span_context(traceparent: str) -> Any:
    """The span context a W3C traceparent names (None for an unreadable one)."""
    ctx = trace.get_current_span(_PROPAGATOR.extract({"traceparent": traceparent})).get_span_context()
    return ctx if ctx.is_valid else None


def traceparent_of(span_context: Any) -> str:
    """A span context as a W3C traceparent ('' for None): what a group's record keeps
    of a member's run, for the then-job's run to link to."""
    if span_context is None or trace is None or not span_context.is_valid:
        return ""
    return f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-{int(span_context.trace_flags):02x}"


@contextlib.contextmanager
def run_span(traceparent: str, job_id: str, type_: str, attempt: int, queue: str,
             ready_ms: int, also: Sequence[str] = ()) -> Iterator[Any]:
    """The worker's span around one run of a handler, made current so that the handler's
    own spans nest under it; preceded by a wait span from ``ready_ms`` to now. It links to
    its producer and to the spans ``also`` names (traceparents: a then-job's members' runs)."""
    if not enabled():
        yield None
        return
    parent = _PROPAGATOR.extract({"traceparent": traceparent}) if traceparent else None
    producer = trace.get_current_span(parent).get_span_context() if parent is not None else None
    links = [trace.Link(producer)] if producer is not None and producer.is_valid else []
    links += [trace.Link(c) for c in map(_span_context, also) if c is not None]
    attrs = {"messaging.system": "runner", "messaging.destination.name": queue,
             "runner.job.id": job_id, "runner.job.type": type_, "runner.job.attempt": attempt}
    tracer = _tracer()
    if ready_ms > 0:
        wait = tracer.start_span(f"wait {type_}", context=parent, attributes=attrs, links=links,
                                 start_time=ready_ms * 1_000_000)
        wait.end()
    with tracer.start_as_current_span(f"run {type_}", context=parent, kind=trace.SpanKind.CONSUMER,
                                      attributes=attrs, links=links, record_exception=False,
                                      set_status_on_exception=False) as span:
        yield span


@contextlib.contextmanager
def batch_span(type_: str, queue: str, members: Sequence[tuple[str, str]]) -> Iterator[Any]:
    """The worker's span around one handle_batch call, made current so that the handler's
    own spans nest under it. A batch has many producers: the span starts a trace of its
    own and links to each member's producer (``members``: (job id, traceparent); the
    first 127, the SDK keeping 128 links by default); each member's settle span is its
    child."""
    if not enabled():
        yield None
        return
    links = [trace.Link(c) for c in (_span_context(tp) for _, tp in members if tp) if c is not None][:127]
    attrs = {"messaging.system": "runner", "messaging.destination.name": queue, "runner.job.type": type_,
             "messaging.batch.message_count": len(members), "runner.job.ids": [i for i, _ in members][:127]}
    with _tracer().start_as_current_span(f"batch {type_}", context=trace.set_span_in_context(trace.INVALID_SPAN),
                                         kind=trace.SpanKind.CONSUMER, attributes=attrs, links=links,
                                         record_exception=False, set_status_on_exception=False) as span:
        yield span


@contextlib.contextmanager
def within(traceparent: str | None) -> Iterator[None]:
    """Make the span ``traceparent`` names current meanwhile: a run span that another
    process records (the worker's, around a handler in a child process), so that the
    handler's own spans there, a ``client.emit`` among them, nest under it as they do
    in a thread. A no-op when off or with none."""
    if not traceparent or not enabled():
        yield
        return
    from opentelemetry import context

    token = context.attach(_PROPAGATOR.extract({"traceparent": traceparent}))
    try:
        yield
    finally:
        context.detach(token)


def outcome(span: Any, outcome_: str, error: dict[str, Any] | None = None) -> None:
    """Record how a run ended: "done", "retry", "dead" (with the error that caused it) or
    "cancelled" (asked for, so no error)."""
    if span is None:
        return
    span.set_attribute("runner.job.outcome", outcome_)
    if error and outcome_ not in ("done", "cancelled"):
        span.set_status(trace.Status(trace.StatusCode.ERROR, f"{error.get('type')}: {error.get('message')}"))


def context_of(span: Any) -> Any:
    """What a later span needs to be this span's child (None when off)."""
    return span.get_span_context() if span is not None else None


@contextlib.contextmanager
def settle_spans(items: Sequence[tuple[Any, str, str]]) -> Iterator[None]:
    """One span per (run span context, job id, outcome) around writing a batch of outcomes."""
    traced = [i for i in items if i[0] is not None]
    if not traced or not enabled():
        yield
        return
    tracer = _tracer()
    spans = [tracer.start_span("settle", context=trace.set_span_in_context(trace.NonRecordingSpan(ctx)),
                               attributes={"runner.job.id": job_id, "runner.job.outcome": name})
             for ctx, job_id, name in traced]
    try:
        yield
    finally:
        for s in spans:
            s.end()
