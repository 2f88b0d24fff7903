"""The catalog: functions/ and schemas/ turned into an immutable snapshot.

Owns loading function files (registry.py) and their options, one table row each
(options.py), compiled schemas and the upgrade chain (schemas.py) with the keywords
evaluated within a time bound (keywords.py), the errors of an invalid payload listed at a
bounded cost (listing.py), the cache of schemas that passed their check (checked.py), key
templates (templates.py), `runner new` (scaffold.py) and the checks of `runner check` that
need no Redis (checks.py).

May import: runner.config, runner.errors and itself. Never talks to Redis: it imports
nothing from the store, the worker, the web app, the CLI or dev.
"""
