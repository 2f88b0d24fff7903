"""Observability: structured logs (logs.py) and the names of the cluster-wide counters
and histogram buckets the scripts keep (metrics.py).

May import: runner.config, runner.errors, the store's codec and itself.
"""
