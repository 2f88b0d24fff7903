"""`runner dev`: the web app, workers for every queue and the scheduler in one process
around one Runtime, a file watcher that hot-reloads, and an embedded Redis when none
answers.

Start order (stop is the reverse): Redis first, since everything talks to it; then the
Runtime; the web app (so requests are taken while workers start); the workers with
their scheduler; the watcher last, so no reload races a half-started process. On stop
the web app goes first (no new work), the workers finish running jobs within the grace
period and hand the rest back, then Redis goes down.

Reload rules (functions/, schemas/, runner.toml):

- A reload builds a new registry snapshot and swaps ``runtime.registry``: the web app
  reads it per request and each job takes one reference when it starts, so running jobs
  finish on the code they started with and no job is lost or run twice.
- A broken file (syntax error, bad option, invalid schema) is logged with path and line;
  its function keeps its last good version and everything else keeps serving.
- A new file is a new job type at once, for the API too.
- A deleted file stops accepting jobs (404). Its queued jobs are not run on code that no
  longer exists: a worker hands each back to wait, attempt not counted, as it does for a
  type it does not know in a rolling deploy (up to `[worker] unknown_grace`, then dead as
  "unknown type"). When a function of that name comes back (same session or a later
  `runner dev`), its waiting jobs are made due at once, and jobs it left dead as "unknown
  type" are requeued.
- runner.toml: reloaded and checked; a broken one is logged and the last good one stays.
  Changed queues or worker settings restart the workers gracefully (new workers start
  first, the old ones finish their running jobs). Switching Redis needs a restart.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue as stdqueue
import signal
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from runner import config as config_mod
from runner.config import Config
from runner.dev.watcher import Watcher
from runner.errors import ConfigError, RunnerError
from runner.store.connection import UNAVAILABLE, connect, ping, redact
from runner.store.embedded import ProjectServer
from runner.store.guard import warn_redis_settings
from runner.worker.stops import CAUGHT, Stops

log = logging.getLogger("runner.dev")

REQUEUE_RECHECK_S = 2.0  # a job claimed just before a function came back is buried just after


def reachable(cfg: Config) -> bool:
    try:
        client = connect(cfg.redis, socket_connect_timeout=0.5, socket_timeout=1.0)
    except ConfigError:
        return False
    try:
        return ping(client)
    except UNAVAILABLE:
        return False
    except Exception:  # e.g. a password Redis refuses: not usable either
        return False
    finally:
        client.close()


class Dev:
    """The `runner dev` supervisor: start, watch and reload, stop."""

    def __init__(self, cfg: Config, config_path: str | None, host: str = "127.0.0.1", port: int = 8000,
                 force_embedded: bool = False) -> None:
        self.cfg = cfg
        self.config_path = config_path
        self.config_file = Path(cfg.source).resolve()
        self.host = host
        self.port = port
        self.force_embedded = force_embedded
        # The Redis settings as written (dev may have swapped in the embedded server's URL).
        self._configured_redis = (cfg.redis.url, cfg.redis.prefix)
        self.embedded: ProjectServer | None = None
        self.rt: Any = None
        self.web: Any = None
        self.worker: Any = None
        self.watcher: Watcher | None = None
        self.changes: stdqueue.Queue[set[Path] | None] = stdqueue.Queue()
        self.stopping = threading.Event()
        self.stops = Stops()
        self.parked: stdqueue.Queue[set[str] | None] = stdqueue.Queue()
        self._requeuer = threading.Thread(target=self._requeue_loop, name="requeue-parked", daemon=True)
        # What the last load saw, to catch changes made before the watcher was up.
        self._loaded_files: dict[Path, int] = {}

    # --- lifecycle -------------------------------------------------------------------

    def run(self) -> int:
        from runner.observe.logs import setup

        setup(self.cfg.log, force_format="text")
        logging.getLogger("watchfiles").setLevel(logging.WARNING)  # we log each reload ourselves
        for sig in CAUGHT:
            signal.signal(sig, self._on_signal)
        code = 0
        try:
            self.start()
            self._loop()
        except (RunnerError, OSError) as exc:
            log.error("runner dev: %s", exc)
            code = 2
        finally:
            self.stop()
        return code

    def _on_signal(self, signum: int, _frame: Any) -> None:
        # SIGTERM stays graceful however often it comes; a second Ctrl-C or SIGQUIT does
        # not wait (stops.py).
        if self.stops.at_once(signum):
            log.warning("%s: exiting now; running jobs go back to their queue when their lease lapses",
                        signal.Signals(signum).name)
            if self.embedded is not None:
                self.embedded.stop(kill=False)
            os._exit(130)
        log.info(self.stops.words(signum, self.cfg.worker.grace_period_s))
        self.stopping.set()
        self.changes.put(None)

    def start(self) -> None:
        from runner.runtime import Runtime
        from runner.web import create_app
        from runner.web.server import DevServer
        from runner.worker.worker import Worker

        url = self._choose_redis()
        cfg = self.cfg
        self.cfg = cfg = self._dev_config(cfg, url)
        for d in (cfg.functions_dir, cfg.schemas_dir):
            d.mkdir(parents=True, exist_ok=True)
        _fresh_bytecode()
        self._loaded_files = self._files()
        self.rt = Runtime.create(cfg)
        warn_redis_settings(self.rt.redis, cfg.redis.wait_replicas)
        self._report(None, self.rt.registry)
        try:
            self.web = DevServer(create_app(self.rt), self.host, self.port)
        except OSError as exc:
            raise RunnerError(f"cannot serve on {self.host}:{self.port} ({exc.strerror}); "
                              "pick another with --port or $PORT") from None
        self.web.start()
        self.worker = Worker(self.rt, list(cfg.queues))
        self.worker.start()
        self.watcher = Watcher(cfg, self.config_file, self.changes)
        self.watcher.start()
        # Changes made between the first load and now were seen by no watcher.
        missed = self._missed()
        if missed:
            self.changes.put(missed)
        self._requeuer.start()
        self._requeue_parked(set(self.rt.registry.functions))
        log.info("serving http://%s:%d (dashboard at /) ; watching %s, %s and %s",
                 self.host, self.web.port, _rel(cfg.functions_dir), _rel(cfg.schemas_dir),
                 _rel(self.config_file))

    def _choose_redis(self) -> str:
        """The URL dev runs on: the configured server when one is configured and answers,
        else the embedded one. Nothing configured means embedded even when something
        answers on the default port: that is some other app's server as often as not."""
        cfg = self.cfg
        origin = cfg.redis_origin()
        if self.force_embedded:
            log.info("--embedded: starting the embedded Redis")
        elif not cfg.redis.configured:
            log.info("no Redis configured (REDIS_URL, or [redis] url in runner.toml): starting the embedded one")
            if reachable(cfg):
                log.info("(a Redis answers at %s: set REDIS_URL or [redis] url to use it instead)",
                         redact(cfg.redis.url))
        elif not reachable(cfg):
            log.warning("no Redis answers at %s (from %s): starting the embedded one instead",
                        redact(cfg.redis.url), origin)
        else:
            self._announce_shared(cfg, origin)
            return cfg.redis.url
        server = ProjectServer(cfg)
        url = server.start()
        self.embedded = server
        log.info("embedded Redis %s (data in %s); the `runner` commands of this project use it while "
                 "dev runs", url, _rel(server.data_dir))
        return url

    def _announce_shared(self, cfg: Config, origin: str) -> None:
        """Say loudly which server dev is about to share, and what is in it already."""
        from runner.store.guard import holdings

        log.warning("using the Redis at %s (from %s): a server that runner dev did not start, which other "
                    "apps may share", redact(cfg.redis.url), origin)
        client = connect(cfg.redis, socket_connect_timeout=2, socket_timeout=5)
        try:
            held = holdings(client, cfg.redis.prefix)
        except Exception as exc:  # ACLs may refuse SCAN or INFO: say so, and go on
            log.warning("cannot tell what it holds: %s", exc)
        else:
            prefix = cfg.redis.prefix
            if held.under_prefix:
                what = (f"{held.under_prefix}{'+' if held.capped else ''} key(s) under the prefix {prefix!r} "
                        "already (jobs of an earlier session, or of another app with the same prefix: "
                        "[redis] prefix keeps apps apart)")
            else:
                what = f"no key under the prefix {prefix!r} yet"
            log.warning("it is %s and holds %s, and %d key(s) in all", held.software, what, held.total)
        finally:
            client.close()
        log.warning("for a private server instead: runner dev --embedded (its data under %s)",
                    _rel(ProjectServer(cfg).data_dir))

    def stop(self) -> None:
        for part, name in ((self.watcher, "watcher"), (self.web, "web")):
            if part is not None:
                with _logged(f"stopping {name}"):
                    part.stop()
        self.watcher = self.web = None
        self.stopping.set()
        if self._requeuer.is_alive():
            self.parked.put(None)
            self._requeuer.join(timeout=5)
        if self.worker is not None:
            with _logged("stopping the workers"):
                self.worker.stop(self.cfg.worker.grace_period_s)
            self.worker = None
        if self.rt is not None:
            self.rt.close()
            self.rt = None
        if self.embedded is not None:
            self.embedded.stop()
            self.embedded = None
            log.info("embedded Redis stopped")
        log.info("runner dev stopped")

    def _dev_config(self, cfg: Config, url: str) -> Config:
        """The config as dev runs it: the Redis actually in use, and no API token needed
        unless one is usable (RUNNER_API_TOKEN, or [api.tokens] with its secret at hand)."""
        cfg = replace(cfg, redis=replace(cfg.redis, url=url))
        if cfg.api.auth and all(t.digest is None for t in cfg.api.tokens):
            cfg = replace(cfg, api=replace(cfg.api, auth=False))
        return cfg

    # --- reloading -------------------------------------------------------------------

    def _loop(self) -> None:
        while not self.stopping.is_set():
            batch = self.changes.get()
            if batch is None:
                break
            # Coalesce whatever else is already queued into one reload.
            while True:
                try:
                    more = self.changes.get_nowait()
                except stdqueue.Empty:
                    break
                if more is None:
                    return
                batch |= more
            if batch:
                with _logged("reload"):
                    self.apply(batch)

    def _files(self) -> dict[Path, int]:
        """Every watched file with its mtime (ns), and the folders (a deletion shows there)."""
        cfg = self.cfg
        found = [*cfg.functions_dir.glob("*.py"), *cfg.schemas_dir.rglob("*.json"), self.config_file,
                 cfg.functions_dir, cfg.schemas_dir, *(p for p in cfg.schemas_dir.iterdir() if p.is_dir())]
        out = {}
        for p in found:
            with contextlib.suppress(OSError):
                out[p] = p.stat().st_mtime_ns
        return out

    def _missed(self) -> set[Path]:
        """Files changed since the last load."""
        now = self._files()
        before = self._loaded_files
        changed = {p for p in now.keys() | before.keys() if now.get(p) != before.get(p)}
        if changed:
            log.info("catching up on %d change(s) made while starting", len(changed))
        return changed

    def apply(self, paths: Iterable[Path]) -> None:
        paths = set(paths)
        t0 = time.perf_counter()
        old = self.rt.registry
        if any(p.resolve() == self.config_file for p in paths) and not self._reload_config():
            return
        self._loaded_files = self._files()
        new = self.rt.reload()
        ms = (time.perf_counter() - t0) * 1000
        changed = sorted(_rel(p) for p in paths if p.resolve() != self.config_file)
        log.info("reloaded in %.0f ms (%s): %d function(s)%s", ms, ", ".join(changed) or "runner.toml",
                 len(new.functions), f", {len(new.errors)} not loaded" if new.errors else "")
        self._report(old, new)
        back = set(new.functions) - set(old.functions)
        if back:
            self._requeue_parked(back)

    def _reload_config(self) -> bool:
        from runner.runtime import layout
        from runner.worker.worker import Worker

        try:
            fresh = config_mod.load(self.config_path)
        except ConfigError as exc:
            log.error("runner.toml not reloaded, the last good one stays: %s", exc)
            return False
        current = self.cfg
        if (fresh.redis.url, fresh.redis.prefix) != self._configured_redis:
            log.warning("the Redis settings changed: restart `runner dev` to switch; still using %s",
                        redact(current.redis.url))
        fresh = replace(self._dev_config(fresh, current.redis.url), redis=current.redis)
        self.cfg = fresh
        self.rt.config = fresh
        # Keys of dropped queues stay until their runners have stopped.
        keys, parts = layout(fresh)
        self.rt.keys, self.rt.parts = {**self.rt.keys, **keys}, {**self.rt.parts, **parts}
        self.rt.discover(record=True)
        if fresh.queues != current.queues or fresh.worker != current.worker \
                or fresh.retention != current.retention:
            log.info("queues or worker settings changed: restarting the workers (%s)",
                     ", ".join(fresh.queues))
            old = self.worker
            self.worker = Worker(self.rt, list(fresh.queues))
            self.worker.start()

            def retire() -> None:
                old.stop(current.worker.grace_period_s)
                self.rt.keys, self.rt.parts = layout(self.cfg)
                self.rt.discover(record=True)

            threading.Thread(target=retire, name="retire-workers", daemon=True).start()
        else:
            log.info("runner.toml reloaded")
        return True

    def _report(self, old: Any, new: Any) -> None:
        """Log what a reload changed: each new or different error with path and line, fixes,
        removed functions, new warnings."""
        old_errors = {} if old is None else {p: str(e) for p, e in old.errors.items()}
        for path, err in new.errors.items():
            if old_errors.get(path) != str(err):
                stem = Path(path).stem
                kept = " (its last good version keeps running)" if old is not None and \
                    stem in new.functions else ""
                log.error("not loaded: %s%s", err.shown(), kept)
        for path in old_errors.keys() - new.errors.keys():
            log.info("fixed: %s", _rel(Path(path)))
        if old is not None:
            for name in sorted(set(old.functions) - set(new.functions)):
                log.warning("function %s removed: new jobs are refused; queued ones are parked in the "
                            "dead-letter list (reason \"unknown type\") until it comes back", name)
            for name in sorted(set(new.functions) - set(old.functions)):
                log.info("function %s added (queue %s)", name, new.functions[name].queue)
        seen = set(() if old is None else old.warnings)
        for w in new.warnings:
            if w not in seen:
                log.warning("%s", w)

    def _requeue_parked(self, names: set[str]) -> None:
        """Ask the requeuer to bring back the parked jobs of functions that (re)appeared."""
        if names:
            self.parked.put(set(names))

    def _requeue_loop(self) -> None:
        """Requeue dead jobs parked as "unknown type" whose function is loaded again; off
        the reload path, as a long backlog takes a while. A second pass a little later
        catches jobs a worker claimed just before the reload and buried just after it."""
        while True:
            names = self.parked.get()
            if names is None:
                return
            self._requeue_pass(names)
            if self.stopping.wait(REQUEUE_RECHECK_S):
                return
            self._requeue_pass(names)

    def _requeue_pass(self, names: set[str]) -> None:
        from runner.client import Client
        from runner.store import census

        client = Client(self.rt)
        n = 0
        try:
            for k in [k for parts in self.rt.parts.values() for k in parts]:
                queue = k.queue
                for state, job_id, (type_, reason) in census.scan(self.rt.redis, k, ("type", "reason"),
                                                            ("scheduled", "dead")):
                    if self.stopping.is_set():
                        return
                    if type_ not in names:
                        continue
                    if state == "scheduled":
                        # Handed back while its function was away: due now (XX: only if
                        # it is still waiting there; promote moves it on).
                        n += census.due_now(self.rt.redis, k, job_id)
                    elif reason == "unknown type":
                        try:
                            client.requeue(queue, job_id)
                            n += 1
                        except RunnerError as exc:
                            log.warning("parked job %s stays dead: %s", job_id, exc)
        except UNAVAILABLE as exc:
            log.warning("cannot requeue parked jobs now: %s", exc)
        finally:
            if n:
                log.info("requeued %d parked job(s) of %s", n, ", ".join(sorted(names)))


def _fresh_bytecode() -> None:
    """Function files must be compiled from their source on every reload: a cached .pyc
    is keyed by the source's mtime in whole seconds and its size, so two saves within a
    second that keep the size would load the old code. Everything imported after this
    point looks for bytecode in a folder that does not exist and writes none."""
    sys.dont_write_bytecode = True
    sys.pycache_prefix = str(Path("/nonexistent-runner-dev-pycache") / str(os.getpid()))


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


@contextlib.contextmanager
def _logged(what: str) -> Any:
    """One failure in a step of dev is logged with its traceback, not fatal."""
    try:
        yield
    except Exception:
        log.exception("%s failed", what)
