"""The catalog: functions/ and schemas/ turned into an immutable snapshot.

Owns loading function files and their options (registry.py), compiled schemas and the
upgrade chain (schemas.py) with the cache of schemas that passed their check
(checked.py), key templates (templates.py), `runner new` (scaffold.py) and the checks
of `runner check` that need no Redis (checks.py).

May import: runner.config, runner.errors and itself. Never talks to Redis: it imports
nothing from the store, the worker, the web app, the CLI or dev.
"""
