"""`runner dev`: the web app, workers and scheduler in one process, an embedded Redis
when none answers, and hot reload of functions/, schemas/ and runner.toml.

May import every layer below it (store, catalog, worker, web, observe); nothing imports
it but the CLI.
"""
