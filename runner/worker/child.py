"""A warm child process that runs handlers for one executor slot of a worker
(``ISOLATION = "process"``); started by isolation.py as ``python -m runner.worker.child``.

The child loads the functions once at start (so a job pays no import), then takes one job
at a time from its parent over a socket: it validates and upgrades the payload, runs the
handler and answers the outcome. It never talks to Redis: ``ctx.save_checkpoint`` and
``ctx.extend_lease`` are messages to the parent, which holds the lease. Messages are
length-framed JSON (multiprocessing's Connection bytes, never its pickles).

Limits it applies to itself, per job: TIMEOUT as a SIGALRM that raises JobTimeout in the
handler (the parent kills the child when a C call never lets it run), and MEMORY_MB as
RLIMIT_DATA above what the warm child already uses (an allocation past it fails, and the
attempt fails as "memory limit"). A reader thread takes the parent's messages while the
handler runs, and exits the process at once when the parent is gone.
"""

from __future__ import annotations

import ctypes
import logging
import os
import queue
import resource
import signal
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any

from runner import config as config_mod
from runner.catalog import registry as registry_mod
from runner.catalog.registry import Registry
from runner.client import Enqueued
from runner.errors import JobTimeout, RunnerError, raise_refusal
from runner.observe.logs import setup as setup_logs
from runner.store import codec
from runner.worker import affinity
from runner.worker.context import Flags, for_job
from runner.worker.execute import Claimed, Dead, Done, RetryLater, resolve, run, to_message

log = logging.getLogger("runner.job")


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def data_bytes() -> int:
    """The process's data segment (heap and private mappings), as RLIMIT_DATA counts it."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    return 0


def rss_mb() -> float:
    """The child's peak resident set: one system call a job (reading /proc was a third of
    a no-op job's time in the child). A peak over max_rss_mb recycles the child, which is
    what a growing child needs; a spike does too, which costs only a restart."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 if sys.platform != "darwin" else peak / 2**20  # KiB on Linux, bytes on macOS


class Child:
    def __init__(self, conn: Connection, registry: Registry) -> None:
        self.conn = conn
        self.registry = registry
        self.send_lock = threading.Lock()
        self.replies: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self.flags = Flags()
        self.jobs = 0

    def send(self, msg: dict[str, Any]) -> None:
        data = codec.dumpb(msg)
        with self.send_lock:
            self.conn.send_bytes(data)

    def rpc(self, call: str, **args: Any) -> bool:
        return bool(self.ask(call, **args).get("ok"))

    def ask(self, call: str, **args: Any) -> dict[str, Any]:
        """The parent's answer to one call; what failed there (Redis away) raises here."""
        self.send({"op": "rpc", "call": call, **args})
        reply = self.replies.get()
        if isinstance(reply.get("failed"), dict):
            raise_refusal(reply["failed"])
        return reply

    def enqueue(self, type_: str, payload: Any, **options: Any) -> Enqueued:
        """A follow-up job, enqueued by the parent (this process never talks to Redis)."""
        value = self.ask("enqueue", type=type_, payload=payload, options=options).get("value") or {}
        if "error" in value:
            raise_refusal(value)
        return Enqueued(**value)

    def group_outcomes(self, group_id: str) -> list[Any]:
        """A group's outcomes, read by the parent."""
        value = self.ask("group_outcomes", group=group_id).get("value") or {}
        if "error" in value:
            raise RunnerError(str(value["error"]))
        return list(value.get("outcomes") or [])

    def read_loop(self) -> None:
        """The parent's messages while a handler runs; EOF means the parent is gone."""
        while True:
            try:
                msg = codec.loads(self.conn.recv_bytes())
            except (EOFError, OSError):
                os._exit(0)
            op = msg.get("op")
            if op == "flag":
                self.flags.lock_lost = bool(msg.get("lock_lost", self.flags.lock_lost))
                self.flags.cancelled = bool(msg.get("cancelled", self.flags.cancelled))
            elif op == "reply":
                self.replies.put(msg)
            else:
                self.jobs_in.put(msg)

    def serve(self) -> None:
        self.jobs_in: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        threading.Thread(target=self.read_loop, name="parent", daemon=True).start()
        self.send({"op": "ready", "pid": os.getpid()})
        while True:
            msg = self.jobs_in.get()
            if msg.get("op") == "exit":
                return
            if msg.get("op") == "run":
                out = self.run_one(msg)
                self.jobs += 1
                self.send({"op": "outcome", **out, "rss_mb": round(rss_mb(), 1)})

    def run_one(self, msg: dict[str, Any]) -> dict[str, Any]:
        job = Claimed(**msg["job"])
        resolved = resolve(job, self.registry, float(msg.get("unknown_grace_s", 0)), int(msg.get("now_ms", 0)))
        if isinstance(resolved, Done | RetryLater | Dead):
            return {"outcome": to_message(resolved), "run_s": 0.0}
        fn, payload, version = resolved
        max_result = int(msg.get("max_result_bytes") or config_mod.MAX_RESULT_BYTES)
        self.flags = Flags()
        ctx = for_job(
            job, version, fn.timeout_s, log,
            _save=lambda body: self.rpc("checkpoint", data=body),
            _extend=lambda: self.rpc("extend"),
            _flags=self.flags,
            _progress=lambda value: self.send({"op": "progress", "value": value}),
            _enqueue=self.enqueue,
            _group=self.group_outcomes,
            _max_bytes=max_result,
        )
        limit = resource.getrlimit(resource.RLIMIT_DATA)
        if fn.memory_mb:
            resource.setrlimit(resource.RLIMIT_DATA, (data_bytes() + int(fn.memory_mb * 2**20), limit[1]))

        def guard(body: Any) -> Any:
            signal.setitimer(signal.ITIMER_REAL, max(0.001, fn.timeout_s))
            try:
                return body()
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)

        try:
            outcome, run_s = run(fn, payload, job, ctx, None, guard, max_result)
        finally:
            resource.setrlimit(resource.RLIMIT_DATA, limit)
        if fn.memory_mb and isinstance(outcome, RetryLater | Dead) and outcome.error \
                and outcome.error.get("type") == "MemoryError":
            err = {**outcome.error, "type": "MemoryLimit",
                   "message": f"memory limit: the handler went over MEMORY_MB = {fn.memory_mb:g}"}
            outcome = RetryLater(outcome.delay_s, err) if isinstance(outcome, RetryLater) else \
                Dead(outcome.reason, err, outcome.refund)
        return {"outcome": to_message(outcome), "run_s": run_s}


def _on_alarm(signum: int, frame: Any) -> None:
    raise JobTimeout("ran past its TIMEOUT")


SENTRY_SHELL = "/bin/sh"


def _guard_group(fd: int, shell: str = SENTRY_SHELL) -> subprocess.Popen[bytes] | None:
    """A sentry in this child's process group that kills the group when the worker dies.

    The death signal (``_die_with_parent``) stops this process, not the tools a handler
    started: they would run on orphaned while the job is reclaimed and run again. The
    sentry, a shell that reads a pipe whose only write end the worker holds, wakes at EOF
    (the worker gone, however it died) and SIGKILLs the group it belongs to; being a
    member, it keeps the group's id from being reused by anyone else meanwhile. Without a
    shell to run (a minimal image) the child still serves, unguarded, and says so."""
    try:
        return subprocess.Popen([shell, "-c", "read x; kill -KILL 0"], stdin=fd,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError as exc:
        log.warning("no sentry for this child process (%s: %s): should the worker be killed, tools a handler "
                    "started keep running", shell, exc)
        return None
    finally:
        os.close(fd)


def main() -> None:
    _die_with_parent()
    affinity.restore_original()  # the worker keeps to one core; its children spread out
    fd = int(sys.argv[1])
    if os.getppid() == 1:  # the worker died before the death signal was armed
        os._exit(0)
    cfg = config_mod.load(os.environ.get("RUNNER_CONFIG") or None)
    setup_logs(cfg.log)
    sentry = _guard_group(int(sys.argv[2])) if len(sys.argv) > 2 else None
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the worker's to handle
    conn = Connection(fd)
    Child(conn, registry_mod.load(cfg)).serve()
    if sentry is not None:  # retired: what a handler left running in the background stays
        sentry.kill()
        sentry.wait()


if __name__ == "__main__":
    main()
