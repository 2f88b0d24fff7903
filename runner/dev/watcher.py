"""The file watcher of `runner dev`: functions/, schemas/ and runner.toml, each batch
of changed paths handed to the supervisor's reload queue."""

from __future__ import annotations

import logging
import queue as stdqueue
import threading
import time
from collections.abc import Callable
from pathlib import Path

from runner.config import Config

log = logging.getLogger("runner.dev")


class Watcher:
    """Two watchfiles threads feeding one queue of changed paths: functions/ and schemas/
    recursively, and the config file's folder (not the file itself: an editor that saves
    by rename would end a watch on the file)."""

    def __init__(self, cfg: Config, config_file: Path, sink: stdqueue.Queue[set[Path] | None]) -> None:
        self.cfg = cfg
        self.config_file = config_file
        self.sink = sink
        self.stop_event = threading.Event()
        self._threads: list[threading.Thread] = []

    def _is_code(self, path: Path) -> bool:
        if "__pycache__" in path.parts or path.name.startswith("."):
            return False
        return (path.suffix == ".py" and path.is_relative_to(self.cfg.functions_dir)) or \
            (path.suffix == ".json" and path.is_relative_to(self.cfg.schemas_dir))

    def start(self, timeout_s: float = 10.0) -> None:
        """Start both watchers and return once their watches are in place."""
        code_dirs = [str(self.cfg.functions_dir), str(self.cfg.schemas_dir)]
        jobs = [(code_dirs, True, self._is_code),
                ([str(self.config_file.parent)], False, lambda p: p.name == self.config_file.name)]
        ready = [threading.Event() for _ in jobs]
        self._threads = [
            threading.Thread(target=self._run, name=f"watch-{i}", daemon=True, args=(*job, ev))
            for i, (job, ev) in enumerate(zip(jobs, ready, strict=True))
        ]
        for t in self._threads:
            t.start()
        deadline = time.monotonic() + timeout_s
        for ev in ready:
            if not ev.wait(max(0.0, deadline - time.monotonic())):
                log.warning("the file watcher is slow to start; changes may take a moment to show")

    def _run(self, paths: list[str], recursive: bool, keep: Callable[[Path], bool],
             ready: threading.Event) -> None:
        from watchfiles import watch

        # step: how long the folder must stay quiet before a batch is handed over, so an
        # editor's save (write, rename, chmod) lands in one batch. The first (empty) yield
        # on a timeout comes after the watches are in place: that is the ready signal.
        for changes in watch(*paths, recursive=recursive, stop_event=self.stop_event, debounce=1600,
                             step=50, rust_timeout=100, yield_on_timeout=True, raise_interrupt=False,
                             watch_filter=lambda _c, p: keep(Path(p))):
            ready.set()
            if changes:
                self.sink.put({Path(p) for _c, p in changes})

    def stop(self) -> None:
        self.stop_event.set()
        for t in self._threads:
            t.join(timeout=3)
