"""OpenTelemetry spans for a job's life (``pip install runner[otel]``): enqueue (the
producer's, whose W3C traceparent travels in the job), wait (from ready to start), run
(a child of the enqueue and linked to it, with the job's id, type, attempt, queue and
outcome) and settle (the write of the outcome, a child of the run).

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


def annotate(span: Any, **attrs: Any) -> None:
    """Add ``runner.job.<name>`` attributes to a span (a no-op for None)."""
    if span is not None:
        for name, value in attrs.items():
            if value is not None:
                span.set_attribute(f"runner.job.{name}" if name != "queue" else "messaging.destination.name", value)


@contextlib.contextmanager
def run_span(traceparent: str, job_id: str, type_: str, attempt: int, queue: str,
             ready_ms: int) -> Iterator[Any]:
    """The worker's span around one run of a handler, made current so that the handler's
    own spans nest under it; preceded by a wait span from ``ready_ms`` to now."""
    if not enabled():
        yield None
        return
    parent = _PROPAGATOR.extract({"traceparent": traceparent}) if traceparent else None
    producer = trace.get_current_span(parent).get_span_context() if parent is not None else None
    links = [trace.Link(producer)] if producer is not None and producer.is_valid else []
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


def outcome(span: Any, outcome_: str, error: dict[str, Any] | None = None) -> None:
    """Record how a run ended: "done", "retry" or "dead" (with the error that caused it)."""
    if span is None:
        return
    span.set_attribute("runner.job.outcome", outcome_)
    if error and outcome_ != "done":
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
