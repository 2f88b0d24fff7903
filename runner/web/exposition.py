"""GET /metrics: the cluster-wide figures in Prometheus text format.

A custom collector reads Redis on every scrape (figures.py) instead of keeping
process-global counters, so any web process answers for the whole cluster and a
restart loses nothing. Names (label ``queue``, and ``function`` where per function):

    runner_redis_up                              1 when Redis answered this scrape
    runner_queue_ready_jobs                      waiting in the ready list
    runner_queue_in_flight_jobs                  claimed, lease held
    runner_queue_lease_expired_jobs              in flight past their lease, not reclaimed yet
    runner_queue_scheduled_jobs                  delayed, retrying or deferred
    runner_queue_scheduled_due_jobs              scheduled and already due, not promoted yet
    runner_queue_{sleeping,waiting}_jobs         durable jobs at a sleep / at a wait
    runner_queue_dead_jobs                       in the dead-letter set
    runner_queue_oldest_ready_age_seconds        how long the next job to run has waited
    runner_partition_{ready,in_flight,scheduled,dead}_jobs   each partition of a queue of several
                                                 (labels queue, partition, tag, draining); the
                                                 runner_queue_* figures are their sums
    runner_partition_held                        1 while a partition's master has fewer replicas than
                                                 [redis] wait_replicas: none of its jobs runs (labels
                                                 queue, partition, tag; every partition read)
    runner_partition_unreachable                 1 for a partition this scrape left out (Redis Cluster: its
                                                 master stalled, down or refusing, given up past 2 s), else
                                                 0 (labels queue, partition, tag; every partition of every
                                                 queue). A queue with one left out has its gauges summed over
                                                 the others and no counter or histogram this scrape (a sum
                                                 short of a partition would read as a counter reset); one
                                                 with all left out has no series but this one
    runner_jobs_{enqueued,succeeded,retried,dead,cancelled,duplicates,deduplicated,deferred,paused,ratelimited,lost,expired,followups,relayed,abandoned}_total
    runner_jobs_{steps,replays,sleeps,waits,signals,invokes}_total   durable functions (docs/durable.md)
    runner_groups_completed_total                groups whose last member settled (then-job written), per queue
    runner_events_emitted_total                  events accepted, per home queue (docs/events.md)
    runner_events_jobs_total                     the jobs those events started, per home queue
    runner_jobs_stray_total                      ready ids dropped because their record was settled
    runner_corrupt_keys_total                    queue keys of another Redis type set aside (key)
    runner_stats_fields_left_out                 fields of the queue's stats hash this scrape did not
                                                 read: one too wide to read whole is read by the
                                                 names of the functions loaded (docs/observability.md)
    runner_job_latency_seconds                   histogram: ready to started (successful attempts)
    runner_job_run_seconds                       histogram: handler run time (successful attempts)
    runner_functions_loaded, runner_function_load_errors
    runner_schedule_ticks_fired_total            ticks that enqueued their job (label schedule, function)
    runner_schedule_ticks_skipped_total          ticks skipped, by reason: missed (MISSED) or overlap (OVERLAP)
    runner_schedule_manual_triggers_total        `runner schedules trigger`
    runner_schedule_late_seconds_total           how late the fired ticks were, summed (by the server clock)
    runner_schedule_last_late_seconds            how late the last fired tick was
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import falcon
import falcon.asgi
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import choose_encoder

from runner.observe.figures import (
    COUNTERS,
    MALFORMED,
    ByMaster,
    Histogram,
    QueueFigures,
    bounded_reads,
    cluster_scripts,
    read_queues,
)
from runner.runtime import Runtime
from runner.store import codec
from runner.store.connection import UNAVAILABLE
from runner.store.keys import QueueKeys
from runner.store.schedules import read_states
from runner.web.offload import Offload

log = logging.getLogger("runner.web")

_COUNTER_HELP = {
    "enqueued": "Jobs accepted.",
    "succeeded": "Jobs a handler finished.",
    "retried": "Failed attempts scheduled for another try.",
    "dead": "Jobs moved to the dead-letter set, for any reason.",
    "cancelled": "Jobs ended by a cancel (never dead-lettered): before they ran, or stopped while running.",
    "duplicates": "Jobs settled without running: their idempotency key had completed.",
    "deduplicated": "Enqueues answered with the existing job of their idempotency key.",
    "deferred": "Claims held back without spending an attempt: a full resource or CONCURRENCY limit.",
    "paused": "Claims held back without spending an attempt: the function is paused.",
    "ratelimited": "Claims held back without spending an attempt: no RATE_LIMIT token was due.",
    "lost": "Lapsed leases put back to ready (the worker died or stalled).",
    "expired": "Jobs buried because their function's MAX_AGE passed before they could run (again).",
    "followups": "Follow-up jobs (ctx.enqueue, ON_SUCCESS, ON_FAILURE) this function's jobs wrote as they settled.",
    "relayed": "Jobs of this function placed from another queue's outbox by the relay.",
    "abandoned": "Thread runs given up still running TIMEOUT plus the grace past their deadline "
                 "(stuck in a C call, or catching the timeout).",
    "steps": "Durable steps run and recorded (ctx.step).",
    "replays": "Durable runs that replayed a step log (a retry, a reclaim, a resume).",
    "sleeps": "Durable runs ended at a sleep (ctx.sleep, ctx.sleep_until).",
    "waits": "Durable runs ended at a wait for a signal (ctx.wait_for_signal).",
    "signals": "Signals delivered to jobs (POST /jobs/{id}/signals/{name}, client.signal, runner signal).",
    "invokes": "Child jobs written by ctx.invoke.",
}
_GAUGES = (
    ("ready", "runner_queue_ready_jobs", "Jobs waiting in the ready list."),
    ("processing", "runner_queue_in_flight_jobs", "Jobs claimed by a worker."),
    ("lease_expired", "runner_queue_lease_expired_jobs", "In-flight jobs past their lease, not reclaimed yet."),
    ("scheduled", "runner_queue_scheduled_jobs", "Delayed, retrying or deferred jobs."),
    ("scheduled_due", "runner_queue_scheduled_due_jobs", "Jobs of the scheduled set already due, not promoted yet "
     "(delayed and retrying ones, and sleeping or waiting durable jobs whose time has come)."),
    ("sleeping", "runner_queue_sleeping_jobs", "Durable jobs sleeping (ctx.sleep), not counted as scheduled."),
    ("waiting", "runner_queue_waiting_jobs", "Durable jobs waiting for a signal, an event or a child."),
    ("dead", "runner_queue_dead_jobs", "Jobs in the dead-letter set."),
    ("paused", "runner_queue_paused", "1 while the queue is paused (runner pause), else 0."),
)


def _label(fn: str) -> str:
    # "_malformed" cannot be a function: files starting with "_" are never loaded. A type
    # another producer wrote with bytes that are not UTF-8 shows them as U+FFFD.
    return "_malformed" if fn == MALFORMED else codec.shown_text(fn)


def _buckets(h: Histogram) -> list[tuple[str, float]]:
    return [("+Inf" if le == float("inf") else repr(le / 1000), float(n)) for le, n in h.cumulative()]


class RunnerCollector:
    """Reads ``runtime`` (and its current registry) on every collect."""

    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime

    def collect(self) -> Iterator[Metric]:
        rt = self.rt
        reg = rt.registry
        up = GaugeMetricFamily("runner_redis_up", "1 when Redis answered this scrape, else 0.")
        try:
            queues = read_queues(rt)
        except UNAVAILABLE as exc:
            log.warning("/metrics: Redis unreachable: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from self._queue_metrics(queues)
        yield from self._function_metrics(queues)
        yield from self._schedule_metrics(queues)
        loaded = GaugeMetricFamily("runner_functions_loaded", "Functions loaded by this web process.")
        loaded.add_metric([], len(reg.functions))
        yield loaded
        errors = GaugeMetricFamily("runner_function_load_errors", "Function files that failed to load.")
        errors.add_metric([], len(reg.errors))
        yield errors

    def _queue_metrics(self, every: list[QueueFigures]) -> Iterator[Metric]:
        # (a queue none of whose partitions was read has no figures to show, only its
        # partitions' runner_partition_unreachable; one read in part, no counters)
        queues = [q for q in every if not q.unread]
        whole = [q for q in queues if not q.left_out]
        for attr, name, doc in _GAUGES:
            g = GaugeMetricFamily(name, doc, labels=["queue"])
            for q in queues:
                g.add_metric([q.name], float(getattr(q, attr)))
            yield g
        age = GaugeMetricFamily("runner_queue_oldest_ready_age_seconds",
                                "Seconds the next job to run has waited (0 when none waits).", labels=["queue"])
        stray = CounterMetricFamily("runner_jobs_stray", "Ready ids dropped: their record was already settled.",
                                    labels=["queue"])
        groups = CounterMetricFamily("runner_groups_completed", "Groups whose last member settled in this queue "
                                     "(their then-job written).", labels=["queue"])
        emitted = CounterMetricFamily("runner_events_emitted", "Events accepted whose home is this queue "
                                      "(a duplicate emit is not counted).", labels=["queue"])
        started = CounterMetricFamily("runner_events_jobs", "Jobs started by the events whose home is this queue, "
                                      "in every queue they went to.", labels=["queue"])
        corrupt = CounterMetricFamily("runner_corrupt_keys", "Keys of the queue found holding another Redis type "
                                      "and set aside as <key>:corrupt (each time).", labels=["queue", "key"])
        left = GaugeMetricFamily("runner_stats_fields_left_out", "Fields of the queue's stats hash not read: a hash "
                                 "too wide to read whole is read by the names of the functions loaded.",
                                 labels=["queue"])
        for q in queues:
            left.add_metric([q.name], q.stats_left_out)
            age.add_metric([q.name], q.oldest_ready_age_s or 0.0)
        for q in whole:
            stray.add_metric([q.name], q.stray)
            for name, n in sorted(q.corrupt.items()):
                corrupt.add_metric([q.name, name], n)
            groups.add_metric([q.name], q.groups_completed)
            emitted.add_metric([q.name], q.events_emitted)
            started.add_metric([q.name], q.events_jobs)
        yield age
        yield stray
        yield corrupt
        yield left
        yield groups
        yield emitted
        yield started
        yield from self._partition_metrics(every)

    def _partition_metrics(self, queues: list[QueueFigures]) -> Iterator[Metric]:
        labels = ["queue", "partition", "tag", "draining"]
        for attr, name, doc in (("ready", "ready", "Jobs waiting in the partition's ready list."),
                                ("processing", "in_flight", "Jobs of the partition claimed by a worker."),
                                ("scheduled", "scheduled", "Delayed, retrying or deferred jobs of the partition."),
                                ("dead", "dead", "Jobs in the partition's dead-letter set.")):
            g = GaugeMetricFamily(f"runner_partition_{name}_jobs", doc, labels=labels)
            for q in queues:
                for p in q.partitions:
                    g.add_metric([q.name, str(p.partition), p.tag, "1" if p.draining else "0"],
                                 float(getattr(p, attr)))
            yield g
        held = GaugeMetricFamily("runner_partition_held", "1 while the partition's master has fewer replicas "
                                 "connected than [redis] wait_replicas: its claims are not confirmed, so none "
                                 "of its jobs runs, and enqueues to it are refused.",
                                 labels=["queue", "partition", "tag"])
        unreachable = GaugeMetricFamily("runner_partition_unreachable", "1 while the partition's master is "
                                        "left out of this scrape (Redis Cluster: stalled, down or refusing, "
                                        "given up past the reader's bound), else 0.",
                                        labels=["queue", "partition", "tag"])
        for q in queues:
            for partition, tag, is_held in q.holds:
                held.add_metric([q.name, str(partition), tag], 1.0 if is_held else 0.0)
            for partition, tag in sorted([*((p, t) for p, t, _ in q.holds), *q.left_out]):
                unreachable.add_metric([q.name, str(partition), tag], 1.0 if (partition, tag) in q.left_out else 0.0)
        yield held
        yield unreachable

    def _function_metrics(self, queues: list[QueueFigures]) -> Iterator[Metric]:
        labels = ["queue", "function"]
        counters = {c: CounterMetricFamily(f"runner_jobs_{c}", _COUNTER_HELP[c], labels=labels) for c in COUNTERS}
        latency = HistogramMetricFamily("runner_job_latency_seconds",
                                        "Time from ready (enqueued or due) to a worker starting it, "
                                        "of attempts that succeeded.", labels=labels)
        run = HistogramMetricFamily("runner_job_run_seconds", "Handler run time of attempts that succeeded.",
                                    labels=labels)
        for q in queues:
            if q.left_out or q.unread:  # (its sums short of a partition would read as a counter reset)
                continue
            for fn in sorted(q.functions.values(), key=lambda f: f.name):
                lv = [q.name, _label(fn.name)]
                for c in COUNTERS:
                    counters[c].add_metric(lv, fn.counters[c])
                latency.add_metric(lv, _buckets(fn.latency), fn.latency.sum_ms / 1000)
                run.add_metric(lv, _buckets(fn.run), fn.run.sum_ms / 1000)
        yield from counters.values()
        yield latency
        yield run


    def _schedule_metrics(self, queues: list[QueueFigures]) -> Iterator[Metric]:
        rt = self.rt
        # A schedule's state lives in its queue's home partition: none of one left out.
        away = {q.name for q in queues if (rt.keys[q.name].partition, rt.keys[q.name].tag) in q.left_out}
        scheds = [sc for sc in rt.registry.schedules() if sc.queue not in away]
        if not scheds:
            return
        wanted: dict[str, tuple[QueueKeys, list[str]]] = {}
        for sc in scheds:
            wanted.setdefault(sc.queue, (rt.keys[sc.queue], []))[1].append(sc.id)
        homes = [k for k, _ in wanted.values()]
        bound = cluster_scripts(rt)
        with bounded_reads(bound):  # (each master's states, as the figures: a master given up now is left out)
            got = ByMaster(bound, homes, "a read of the schedules").each(range(len(homes)), lambda idx: [
                read_states(rt.redis, {homes[i].queue: wanted[homes[i].queue] for i in idx}, rt.scripts)] * len(idx))
        states = {sid: st for one in got.values() for sid, st in one.items()}
        scheds = [sc for sc in scheds if sc.id in states]
        labels = ["schedule", "function"]
        fired = CounterMetricFamily("runner_schedule_ticks_fired", "Schedule ticks that enqueued their job.",
                                    labels=labels)
        skipped = CounterMetricFamily("runner_schedule_ticks_skipped", "Schedule ticks skipped: missed during "
                                      "a downtime (MISSED) or while the last job ran (OVERLAP).",
                                      labels=[*labels, "reason"])
        manual = CounterMetricFamily("runner_schedule_manual_triggers", "Ticks run by hand "
                                     "(runner schedules trigger).", labels=labels)
        late = CounterMetricFamily("runner_schedule_late_seconds", "How late fired ticks were enqueued, "
                                   "summed (server clock).", labels=labels)
        last = GaugeMetricFamily("runner_schedule_last_late_seconds", "How late the last fired tick was.",
                                 labels=labels)
        for sc in scheds:
            st = states[sc.id]
            lv = [sc.id, sc.function]
            fired.add_metric(lv, st.fired)
            skipped.add_metric([*lv, "missed"], st.missed)
            skipped.add_metric([*lv, "overlap"], st.overlapped)
            manual.add_metric(lv, st.manual)
            late.add_metric(lv, st.late_sum_ms / 1000)
            last.add_metric(lv, (st.late_ms or 0) / 1000)
        yield from (fired, skipped, manual, late, last)


class Metrics:
    """GET /metrics; OpenMetrics when the scraper asks for it, else the text format."""

    def __init__(self, runtime: Runtime, offload: Offload) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(RunnerCollector(runtime))
        self.offload = offload

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        encoder, content_type = choose_encoder(req.get_header("Accept") or "")
        resp.data = await self.offload(encoder, self.registry)  # the collector reads Redis
        resp.content_type = content_type
        resp.cache_control = ["no-store"]
