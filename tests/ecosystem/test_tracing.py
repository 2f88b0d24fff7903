"""OpenTelemetry: the producer's trace context travels in the job, and the worker's
spans join the producer's trace (run is the enqueue's child and linked to it; wait and
settle too), recorded with the SDK's in-memory exporter. Without the extra, tracing is
off and the job carries nothing."""

from __future__ import annotations

import json
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
    # The exporter is made here, not once at import: the teardown's shutdown stops it for
    # good, and a test runner may split this module, setting the fixture up twice.
    from opentelemetry.util._once import Once

    global EXPORTER
    EXPORTER = InMemorySpanExporter()
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


PARENT = '''
QUEUE = "fast"
ON_SUCCESS = "traced_dest"

def handle(payload, ctx):
    ctx.enqueue("noop", {"from": "parent"})
    return {"ok": True}
'''
DEST = '''
QUEUE = "fast"

def handle(payload, ctx):
    return None
'''


def _one(name: str) -> sdk_trace.ReadableSpan:
    (span,) = _spans(name)
    return span


def test_follow_ups_destinations_and_group_members_stay_in_the_producers_trace(project: Project) -> None:
    """A ctx.enqueue follow-up and an ON_SUCCESS destination each get an enqueue span, a
    child of the run that made them, and their wait and run spans hang under it; a
    group's members and its then-job carry the trace of the group's enqueue. One trace
    from the producer's request to the last run."""
    project.add_function("traced_parent", PARENT)
    project.add_function("traced_dest", DEST)
    w = Worker(project.runtime, ["fast"])
    w.start()
    try:
        EXPORTER.clear()
        tracer = trace.get_tracer("test")
        with tracer.start_as_current_span("request") as request:
            job = project.client.enqueue("traced_parent", {})
        wait_for(lambda: len(_spans("run noop")) == 1 and len(_spans("run traced_dest")) == 1, timeout=15,
                 what="the follow-up and the destination to run")
        trace_id = request.get_span_context().trace_id
        parent_run = _one("run traced_parent")
        assert dict(parent_run.attributes or {})["runner.job.id"] == job.id
        for fn in ("noop", "traced_dest"):
            enq, wait, run = _one(f"enqueue {fn}"), _one(f"wait {fn}"), _one(f"run {fn}")
            assert {s.context.trace_id for s in (enq, wait, run)} == {trace_id}, fn
            assert enq.parent is not None and enq.parent.span_id == parent_run.context.span_id, fn
            assert run.parent is not None and run.parent.span_id == enq.context.span_id, fn
            assert wait.parent is not None and wait.parent.span_id == enq.context.span_id, fn
            assert [link.context.span_id for link in run.links] == [enq.context.span_id], fn

        from runner.client import Request

        EXPORTER.clear()
        with tracer.start_as_current_span("request") as request:
            project.client.group([Request("noop", {"m": 1}), Request("noop", {"m": 2})], Request("noop", {}))
        wait_for(lambda: len(_spans("run noop")) == 3, timeout=15, what="the members and the then-job to run")
        group = _one("enqueue group")
        assert group.parent is not None and group.parent.span_id == request.get_span_context().span_id
        runs = _spans("run noop")
        assert {s.context.trace_id for s in runs} == {request.get_span_context().trace_id}
        assert {s.parent.span_id for s in runs if s.parent is not None} == {group.context.span_id}
    finally:
        w.stop(grace_s=5)


def test_a_groups_then_job_links_to_every_members_run(project: Project, worker: Worker) -> None:
    """The then-job has many parents: its run stays the group's enqueue span's child and
    links to each member's run (the first 127 of them, a bound on a big group)."""
    from runner.client import Request

    EXPORTER.clear()
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("request"):
        g = project.client.group([Request("noop", {"m": 1}), Request("perm", {"m": 2})], Request("noop", {}))

    def then_run() -> list[sdk_trace.ReadableSpan]:
        return [s for s in _spans("run noop") if dict(s.attributes or {})["runner.job.id"] == g.then_id]

    wait_for(then_run, timeout=15, what="the then-job to run")
    group = _one("enqueue group")
    (then,) = then_run()
    members = [s for s in _spans("run noop") + _spans("run perm") if s is not then]
    assert len(members) == 2
    assert then.parent is not None and then.parent.span_id == group.context.span_id
    linked = {link.context.span_id for link in then.links}
    assert linked == {group.context.span_id} | {m.context.span_id for m in members}
    assert {link.context.trace_id for link in then.links} == {group.context.trace_id}

    # A big group: the first 127 members' runs are linked, no more: with the producer's,
    # the 128 links the SDK keeps by default.
    EXPORTER.clear()
    g = project.client.group([Request("noop", {"m": i}) for i in range(130)], Request("noop", {}))
    wait_for(then_run, timeout=30, what="the big group's then-job to run")
    (then,) = then_run()
    runs = {s.context.span_id for s in _spans("run noop") if s is not then}
    assert len(runs) == 130
    member_links = [link for link in then.links if link.context.span_id in runs]
    assert len(member_links) == 127 == len(then.links) - 1


COOP = '''
import time

QUEUE = "fast"
TIMEOUT = 15

def handle(payload, ctx):
    while True:
        ctx.raise_if_cancelled()
        time.sleep(0.02)
'''


def test_a_cancelled_run_is_traced_as_cancelled_not_dead(project: Project) -> None:
    """A running job stopped by its cancel: its run span's outcome is "cancelled", not
    "dead", and the span is no error (the cancel was asked for), as its status, its
    counter and its log line say."""
    project.add_function("traced_coop", COOP)
    w = Worker(project.runtime, ["fast"])
    w.start()
    try:
        EXPORTER.clear()
        job = project.client.enqueue("traced_coop", {})
        wait_for(lambda: project.client.get(job.id).status == "processing", timeout=15,
                 what="the handler to start")
        assert project.client.cancel(job.id) == "requested"
        assert project.client.settle(job.id, 10).status == "cancelled"
        wait_for(lambda: _spans("run traced_coop"), timeout=5, what="the run span")
        (run,) = _spans("run traced_coop")
        assert dict(run.attributes or {})["runner.job.outcome"] == "cancelled"
        assert run.status.status_code != trace.StatusCode.ERROR
    finally:
        w.stop(grace_s=5)


SUBSCRIBER = '''
QUEUE = "fast"
TRIGGERS = ["traced.happened"]

def handle(payload, ctx):
    return None
'''


def test_an_emits_subscribers_stay_in_the_producers_trace(project: Project) -> None:
    """client.emit from a traced producer used to record no span, and each subscriber's
    wait and run spans started new root traces. An emit is one enqueue span, the
    producer's child, and every subscriber's run hangs under it, in the producer's trace."""
    project.add_function("sub_a", SUBSCRIBER)
    project.add_function("sub_b", SUBSCRIBER)
    w = Worker(project.runtime, ["fast"])
    w.start()
    try:
        EXPORTER.clear()
        tracer = trace.get_tracer("test")
        with tracer.start_as_current_span("request") as request:
            project.client.emit("traced.happened", {})
        wait_for(lambda: len(_spans("run sub_a")) == 1 and len(_spans("run sub_b")) == 1, timeout=15,
                 what="both subscribers to run")
        emit = _one("enqueue event traced.happened")
        assert emit.parent is not None and emit.parent.span_id == request.get_span_context().span_id
        trace_id = request.get_span_context().trace_id
        for fn in ("sub_a", "sub_b"):
            run, wait = _one(f"run {fn}"), _one(f"wait {fn}")
            assert {run.context.trace_id, wait.context.trace_id} == {trace_id}, fn
            assert run.parent is not None and run.parent.span_id == emit.context.span_id, fn
    finally:
        w.stop(grace_s=5)


BATCHED = '''
from opentelemetry import trace
QUEUE = "fast"
ISOLATION = "{isolation}"
BATCH = {{"size": 4, "wait": 0.3}}

def handle_batch(payloads, ctx):
    with trace.get_tracer("handler").start_as_current_span("inside"):
        return [p["n"] for p in payloads]
'''


EMITTER = '''
import __main__, json
from runner.client import Client
QUEUE = "fast"
ISOLATION = "{isolation}"

if getattr(getattr(__main__, "__spec__", None), "name", "") == "runner.worker.child":
    # A child process is an interpreter of its own: its spans go to a file the test reads.
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class ToFile(SpanExporter):
        def export(self, spans):
            with open({spans!r}, "a") as f:
                for s in spans:
                    f.write(json.dumps({{"name": s.name, "trace_id": s.context.trace_id, "span_id": s.context.span_id,
                                        "parent": s.parent.span_id if s.parent else None}}) + "\\n")
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(ToFile()))
    trace.set_tracer_provider(provider)


def handle(payload, ctx):
    with Client.from_config({config!r}) as client:
        client.emit("traced.emitted", {{}})
    return None
'''


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_batch_call_is_one_span_linked_to_each_jobs_trace(project: Project, isolation: str) -> None:
    """A handle_batch call is one span, linked to the enqueue span of each member (each in
    its producer's trace); each member's settle span is the batch span's child, and under
    thread isolation the handler's own spans nest under it."""
    project.write_config(concurrency=2)
    project.add_function("traced_batch", BATCHED.format(isolation=isolation))
    EXPORTER.clear()
    tracer = trace.get_tracer("test")
    ids, enqueues = [], []
    for n in range(4):
        with tracer.start_as_current_span(f"request {n}") as request:
            ids.append(project.client.enqueue("traced_batch", {"n": n}).id)
        enqueues.append(request.get_span_context().trace_id)
    w = Worker(project.runtime, ["fast"])
    w.start()
    try:
        wait_for(lambda: all(project.client.get(i).status == "done" for i in ids), timeout=30,
                 what="the batch's jobs done")
        wait_for(lambda: len(_spans("settle")) >= 4, timeout=5, what="the settle spans")
    finally:
        w.stop(grace_s=5)
    batches = _spans("batch traced_batch")
    assert batches and not _spans("run traced_batch")
    by_id = {s.context.span_id: s for s in batches}
    linked = {link.context.trace_id for b in batches for link in b.links}
    assert linked == set(enqueues)  # every member's producer's trace, linked
    enq = {s.context.span_id for s in _spans("enqueue traced_batch")}
    assert {link.context.span_id for b in batches for link in b.links} == enq
    assert sum(len(dict(b.attributes or {})["runner.job.ids"]) for b in batches) == 4
    settles = [s for s in _spans("settle") if dict(s.attributes or {})["runner.job.id"] in ids]
    assert len(settles) == 4 and all(s.parent is not None and s.parent.span_id in by_id for s in settles)
    if isolation == "thread":
        inside = _spans("inside")
        assert inside and all(s.parent is not None and s.parent.span_id in by_id for s in inside)


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_an_emit_from_a_handler_is_a_span_of_its_jobs_run(project: Project, isolation: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A handler's client.emit is one enqueue span, a child of the job's run span, in
    both isolations. In a child process it used to start a trace of its own: the run span
    is the worker's, and nothing made it the handler's current span there."""
    # The handler's own Client.from_config() reads this process's environment (a thread
    # handler runs here): the project's server, as a deployment's REDIS_URL names it.
    monkeypatch.setenv("REDIS_URL", project.server.url)
    spans_file = project.root / "child-spans.jsonl"
    project.write_config(concurrency=1)  # one job: one child under process isolation, not eight
    project.add_function("emitter", EMITTER.format(isolation=isolation, spans=str(spans_file),
                                                   config=str(project.root / "runner.toml")))
    w = Worker(project.runtime, ["fast"])
    w.start()
    try:
        EXPORTER.clear()
        tracer = trace.get_tracer("test")
        with tracer.start_as_current_span("request"):
            job = project.client.enqueue("emitter", {})
        assert project.client.wait(job.id, timeout_s=30).status == "done"
        run = _one("run emitter")
        if isolation == "thread":
            emit = _one("enqueue event traced.emitted")
            got = (emit.context.trace_id, emit.parent.span_id if emit.parent else None)
        else:
            lines = [json.loads(x) for x in spans_file.read_text().splitlines()]
            (emitted,) = [x for x in lines if x["name"] == "enqueue event traced.emitted"]
            got = (emitted["trace_id"], emitted["parent"])
        assert got == (run.context.trace_id, run.context.span_id)
    finally:
        w.stop(grace_s=5)
