"""The long-running commands: `runner worker`, `runner web` and `runner dev`."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

import click

from runner import config as config_mod
from runner.cli.root import (
    EXIT_CONFIG,
    RedisCommand,
    build_runtime,
    cli,
    fail,
    load_config,
    target,
    target_config,
)
from runner.cli.target import Target
from runner.errors import (
    ConfigError,
    likely,
)


def guard(where: Target, client: Any, wait_replicas: int = 0) -> None:
    """At the start of a process: which Redis it talks to, and the Redis guard's warnings."""
    import logging

    from runner.store.guard import warn_redis_settings

    log = logging.getLogger("runner")
    log.info("Redis at %s (%s), prefix %s", where.url, where.source, where.prefix)
    if where.note:
        log.warning("%s", where.note.strip("()"))
    warn_redis_settings(client, wait_replicas)


@cli.command(cls=RedisCommand, follow_dev=False)
@click.option("--queue", "-q", "queues", multiple=True, help="Queue(s) to serve (default: all).")
@click.pass_context
def worker(ctx: click.Context, queues: tuple[str, ...]) -> None:
    """Run a production worker (the scheduler runs inside it)."""
    import logging

    from runner.observe.logs import ordered_output, setup
    from runner.worker.worker import Worker

    ordered_output()  # (before the functions load: a handler of theirs writes after held lines)
    rt = build_runtime(ctx.obj["config"], retry=True)  # (a cluster with no node up: waited out)
    setup(rt.config.log)
    names = list(queues) or list(rt.config.queues)
    for q in names:
        if q not in rt.config.queues:
            close = likely(q, list(rt.config.queues))
            hint = f"; did you mean {close}?" if close else ""
            fail(f"configuration error: no queue {q!r} in {rt.config.source}{hint} "
                 f"(have: {', '.join(rt.config.queues)})", EXIT_CONFIG)
    for err in rt.registry.errors.values():
        logging.getLogger("runner").error("function not loaded: %s", err)
    guard(target(ctx), rt.redis, rt.config.redis.wait_replicas)
    Worker(rt, names).run()
    _exit_past_handler_threads(0)


EXIT_HOOKS_S = 3.0  # the longest a stopped worker waits for its exit hooks

# The names of runner's own pool threads (idle by now, harmless): not a handler's to name.
_OWN_THREADS = ("runner", "ticker-send", "scheduler-aside", "scheduler-pass", "redis-send")


def _exit_past_handler_threads(code: int) -> None:
    """The worker (or `runner dev`) has stopped: every job settled or handed back, its
    own threads ended. A thread-isolated handler may have left threads running (one that
    is not a daemon, a long task on a module-level ThreadPoolExecutor); Python's exit
    would wait for them, and the process would stay up until the platform's SIGKILL,
    deaf to SIGTERM. So the spans of its jobs are sent, the exit hooks run (each step
    bounded), the log handlers are flushed, and the process ends, naming the threads it
    did not wait for."""
    import atexit
    import logging
    import threading
    from concurrent.futures import thread as pool_threads

    joined = set(getattr(pool_threads, "_threads_queues", {}))  # (what the exit would wait for)
    left = [t.name for t in threading.enumerate()
            if t is not threading.main_thread() and t.is_alive() and (not t.daemon or t in joined)
            and not t.name.startswith(_OWN_THREADS)]
    if left:
        logging.getLogger("runner.worker").warning(
            "stopped; %d thread(s) a handler started still running (%s): exiting without them",
            len(left), ", ".join(left[:5]) + (" ..." if len(left) > 5 else ""))
    # What runner promised is sent first: the spans of the jobs it ran. The exit hooks run
    # last-registered first on one thread, so a handler's that blocks would keep the
    # tracing provider's own (registered at start) from running.
    from runner.observe import tracing

    sent = threading.Thread(target=tracing.flush, args=(EXIT_HOOKS_S,), name="runner-exit-spans", daemon=True)
    sent.start()
    sent.join(EXIT_HOOKS_S)
    # The exit hooks on a thread, waited for EXIT_HOOKS_S at most: a handler's module may
    # have registered one that waits for its own work (a pool's shutdown, multiprocessing
    # joining its children), which would hold the exit as its threads did.
    hooks = threading.Thread(target=atexit._run_exitfuncs, name="runner-exit-hooks", daemon=True)
    hooks.start()
    hooks.join(EXIT_HOOKS_S)
    if hooks.is_alive():  # (a hook blocks: the log handlers' flush, registered first, has not run)
        for ref in list(getattr(logging, "_handlerList", ())):
            handler = ref()
            if handler is not None:
                with contextlib.suppress(Exception):
                    handler.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


@cli.command(cls=RedisCommand, follow_dev=False)
@click.option("--host", default="0.0.0.0", show_default=True)
@click.option("--port", envvar="PORT", type=int, default=8000, show_default=True, help="Also $PORT.")
@click.option("--workers", envvar="WEB_CONCURRENCY", type=int, default=2, show_default=True,
              help="gunicorn worker processes; also $WEB_CONCURRENCY.")
@click.option("--threads", envvar="RUNNER_WEB_THREADS", type=int, default=8, show_default=True,
              help="Threads per worker process for what blocks (Redis reads, dead-letter "
              "operations, batches; enqueues need none); also $RUNNER_WEB_THREADS.")
@click.pass_context
def web(ctx: click.Context, host: str, port: int, workers: int, threads: int) -> None:
    """Run the production web server (gunicorn, uvicorn workers) for the HTTP API and dashboard."""
    from runner.observe.logs import setup
    from runner.store.connection import connect
    from runner.web.server import serve

    cfg, where = target_config(ctx.obj["config"], client_only=False)
    if cfg.api.auth and not cfg.api.tokens:
        fail("refusing to serve the API without a token: set RUNNER_API_TOKEN, add [api.tokens.NAME] "
             f"(`runner token new`), or switch auth off explicitly with `[api] auth = false` in {cfg.source}",
             EXIT_CONFIG)
    if cfg.api.auth and (unset := config_mod.unset_secrets(cfg)):
        fail("configuration error: " + "; ".join(unset), EXIT_CONFIG)
    setup(cfg.log)
    try:
        # A connection of its own, closed before gunicorn forks its workers.
        client = connect(cfg.redis, socket_connect_timeout=2, socket_timeout=5)
    except ConfigError as exc:
        fail(f"configuration error: {exc}", EXIT_CONFIG)
    try:
        guard(where, client, cfg.redis.wait_replicas)
    finally:
        client.close()
    try:
        serve(cfg, host=host, port=port, workers=max(1, workers), threads=max(1, threads))
    except ConfigError as exc:  # the port is taken
        fail(str(exc), EXIT_CONFIG)


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", envvar="PORT", type=int, default=8000, show_default=True, help="Also $PORT.")
@click.option("--embedded", is_flag=True,
              help="Use a private embedded Redis (data under .runner/redis) even when REDIS_URL or "
              "runner.toml names a server that answers.")
@click.pass_context
def dev(ctx: click.Context, host: str, port: int, embedded: bool) -> None:
    """Web + workers for every queue + scheduler, with hot reload.

    Redis: the server REDIS_URL or [redis] url in runner.toml names, when it answers (dev
    then says whose it is and what it holds); otherwise, or with --embedded, the Valkey
    server that came with `pip install`, private to this project. While dev runs it, the
    project's other `runner` commands talk to it."""
    from runner.dev.supervisor import Dev

    cfg = load_config(ctx.obj["config"])
    code = Dev(cfg, ctx.obj["config"], host=host, port=port, force_embedded=embedded).run()
    _exit_past_handler_threads(code)
