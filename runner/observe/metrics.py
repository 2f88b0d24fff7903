"""Names of the cluster-wide counters kept in each queue's stats hash, and the histogram
buckets. The worker adds them to the scripts it already calls (no extra round trip);
/metrics, `runner stats` and the dashboard read the same hash.

    enqueued|<type>            accepted jobs
    succeeded|<type>           done by a handler
    retried|<type>             transient failures scheduled for another attempt
    dead|<type>                buried (any reason)
    duplicates|<type>          done without running: the idempotency key had completed
    deduplicated|<type>        enqueues answered with the key's existing job
    deferred|<type>            claims held back by a full limit (resource or CONCURRENCY)
    paused|<type>              claims held back by the function's pause
    ratelimited|<type>         claims held back by RATE_LIMIT (scheduled for their token)
    lost|<type>                lapsed leases put back to ready
    expired|<type>             jobs buried unrun: not started within the function's MAX_AGE
    followups|<type>           follow-ups (ctx.enqueue, ON_SUCCESS, ON_FAILURE) this function's
                               jobs wrote, counted in the step that settled them
    relayed|<type>             jobs of this function placed from another queue's outbox
    groups_completed           (per queue) groups whose last member settled here: then-jobs written
    lat|<type>|<le_ms>         ready-to-start latency of every run (done, retried or dead),
                               per bucket (not cumulative)
    lat_sum|<type>             sum of those latencies, ms
    run|<type>|<le_ms>         handler run time, per bucket
    run_sum|<type>             sum of run times, ms
"""

from __future__ import annotations

import bisect

BUCKETS_MS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)


_LABELS = (*map(str, BUCKETS_MS), "inf")  # made once: two per settled job


def bucket(ms: float) -> str:
    return _LABELS[bisect.bisect_left(BUCKETS_MS, ms)]


def timing_fields(type_: str, latency_ms: float, run_ms: float) -> str:
    lat = max(0, int(latency_ms))
    run = max(0, int(run_ms))
    return (
        f"lat|{type_}|{bucket(lat)} lat_sum|{type_}={lat} "
        f"run|{type_}|{bucket(run)} run_sum|{type_}={run}"
    )
