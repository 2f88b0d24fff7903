"""Observability: structured logs (logs.py), the names of the cluster-wide counters
and histogram buckets the scripts keep (metrics.py), and reading those figures back for
/metrics, GET /queues, the dashboard and `runner stats` (figures.py, through the Redis
client of the runtime it is handed).

May import: runner.config, runner.errors, the store's codec and its plain reads (stats.py),
and itself.
"""
