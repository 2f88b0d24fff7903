"""OpenTelemetry: the producer's trace context travels in the job, and the worker's
spans join the producer's trace (run is the enqueue's child and linked to it; wait and
settle too), recorded with the SDK's in-memory exporter. Without the extra, tracing is
off and the job carries nothing."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from runner.worker.worker import Worker

from conftest import REPO, Project, wait_for

sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def _provider() -> Iterator[None]:
    # The global provider can be set once per process: this module owns it, and puts the
    # API's unset state back after it, or later tests in this process would find tracing
    # on (the enqueue fast lane, for one, leaves traced requests to the route).
    from opentelemetry.util._once import Once

    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(provider)
    yield
    provider.shutdown()
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]


@pytest.fixture
def worker(project: Project) -> Iterator[Worker]:
    w = Worker(project.runtime, ["fast"])
    w.start()
    yield w
    w.stop(grace_s=5)


def _spans(name: str) -> list[sdk_trace.ReadableSpan]:
    return [s for s in EXPORTER.get_finished_spans() if s.name == name]


@pytest.mark.parametrize("fn,outcome", [("noop", "done"), ("perm", "dead")])
def test_spans_follow_a_job_from_enqueue_to_settle(project: Project, worker: Worker, fn: str,
                                                   outcome: str) -> None:
    EXPORTER.clear()
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("request") as request:
        job = project.client.enqueue(fn, {})
    assert project.client.get(job.id).as_dict()["traceparent"].split("-")[1] == \
        format(request.get_span_context().trace_id, "032x")
    wait_for(lambda: project.client.get(job.id).status in ("done", "dead"), timeout=15)
    wait_for(lambda: _spans("settle"), timeout=5, what="the settle span")

    (enq,) = _spans(f"enqueue {fn}")
    (run,) = _spans(f"run {fn}")
    (wait,) = _spans(f"wait {fn}")
    (settle,) = _spans("settle")
    trace_id = request.get_span_context().trace_id
    assert {s.context.trace_id for s in (enq, run, wait, settle)} == {trace_id}
    assert enq.parent is not None and enq.parent.span_id == request.get_span_context().span_id
    assert enq.kind == trace.SpanKind.PRODUCER and run.kind == trace.SpanKind.CONSUMER
    # run: a child of the enqueue, and linked to it.
    assert run.parent is not None and run.parent.span_id == enq.context.span_id
    assert [link.context.span_id for link in run.links] == [enq.context.span_id]
    assert wait.parent is not None and wait.parent.span_id == enq.context.span_id
    assert settle.parent is not None and settle.parent.span_id == run.context.span_id
    attrs = dict(run.attributes or {})
    assert attrs["runner.job.id"] == job.id and attrs["runner.job.type"] == fn
    assert attrs["runner.job.attempt"] == 1 and attrs["messaging.destination.name"] == "fast"
    assert attrs["runner.job.outcome"] == outcome
    assert dict(enq.attributes or {})["runner.job.id"] == job.id
    assert (run.status.status_code == trace.StatusCode.ERROR) == (outcome == "dead")


def test_without_the_extra_tracing_is_off_and_jobs_carry_nothing(project: Project) -> None:
    """With opentelemetry not importable, nothing traces and no meta is written."""
    code = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "from runner.observe import tracing\n"
        "assert not tracing.installed() and not tracing.enabled()\n"
        "from runner.client import Client\n"
        f"c = Client.from_config({str(project.root / 'runner.toml')!r})\n"
        "j = c.enqueue('noop', {})\n"
        "assert 'meta' not in c.get(j.id).fields, c.get(j.id).fields\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={**project.env, "PYTHONPATH": str(REPO)},
                   cwd=project.root, timeout=60)
