"""The store: the only code that talks to Redis.

Owns every key string (keys.py), the atomic transitions (lua/*.lua, one per file), their
texts as sent (sources.py) and typed callers (scripts.py), the one place a script meets a
connection (transport.py: kept connections, NOSCRIPT reloads, Cluster routing, WAIT; its
waits on a master count the time the process ran, runclock.py), the
job record's fields and how a reader sees them (records.py), the JSON codec (codec.py),
clients for a single server, Cluster and Sentinel (connection.py), the plain connection of
the one-shot reading commands, which imports no redis-py (link.py), and its twin on an event loop for the web
process's enqueues (aiolink.py), group commit (combiner.py), waiting out
outages (outage.py), the Redis guard (guard.py), what waits in a queue (census.py), the
audit trail (audit.py), the embedded server (embedded.py), the session file of a running
`runner dev` (session.py), Redis URLs as text (urls.py), the plain reads of the queue
figures (stats.py), the lists follow-ups wait on (followups.py), a fetcher's wait for
news (bell.py), a durable function's step log and its bounds (steps.py), and which
masters of a Redis Cluster answer, for the operator's commands (shards.py). Every other
module reaches Redis through a named function here (tests/unit/test_store_owns_redis.py
holds it).

May import: runner.config, runner.errors and itself. Knows nothing of functions
(catalog), workers, the web app, the CLI or dev.
"""
