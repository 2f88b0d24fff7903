"""Process isolation, the worker's side: one warm child process per executor slot
(child.py), started by spawning a fresh interpreter (never a fork of this threaded
process), fed one job at a time, and killed when it must be.

The worker process holds the leases and never runs handler code for these jobs, so a
handler that holds the GIL, blocks in C, leaks memory or crashes its interpreter cannot
stop lease renewal or take other jobs down:

- past TIMEOUT plus ``[worker] timeout_grace`` the child is killed: the attempt fails as
  a timeout (JobTimeout), and the next job gets a new child;
- a child that dies (segfault, ``os._exit``, the OOM killer) fails only its job's attempt,
  "executor crashed" with the signal or exit code;
- children are replaced after ``max_jobs_per_child`` jobs, above ``max_rss_mb``, and when
  the functions were reloaded (`runner dev`), so new jobs run new code while a running
  job finishes on its own.

Each child leads a process group of its own, and a kill reaches the group: a tool the
handler ran (a shell, ffmpeg) stops with it. Should the worker itself die (SIGKILL, the
OOM killer), a sentry in the group kills it (child.py), so no tool runs on orphaned.
Children are started from one thread that lives as long as the worker: a child asks to be
killed when its parent dies (PR_SET_PDEATHSIG, child.py), and Linux sends that signal
when the *thread* that started it exits, so a child started by an executor thread that
was later abandoned died with it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runner.catalog.registry import Function
from runner.config import QueueConfig
from runner.errors import JobTimeout, RedisUnavailable, RunnerError, refusal_record
from runner.store import codec
from runner.store.connection import UNAVAILABLE
from runner.worker.execute import CANCELLED, Claimed, Dead, Outcome, failure, from_message

log = logging.getLogger("runner.worker")

START_TIMEOUT_S = 60.0  # a child imports the functions before it says it is ready


# The thread every child is started from (see the module docstring). Created at the
# first child, never shut down: its lifetime is the process's.
_spawner: concurrent.futures.ThreadPoolExecutor | None = None
_spawner_lock = threading.Lock()


def _spawn(args: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="runner-spawn")
    proc: subprocess.Popen[bytes] = _spawner.submit(lambda: subprocess.Popen(args, **kwargs)).result()
    return proc


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child and every process of its group (what the handler started). Only
    while the child is not reaped: until then its pid, the group's id, cannot be reused."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


class ExecutorCrashed(Exception):
    """The child process running the handler died."""


def describe_exit(code: int) -> str:
    """How a child ended, to follow "the child process ...": "was killed by SIGKILL",
    "exited with code 7"."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class ChildProcess:
    """One child and the socket to it."""

    def __init__(self, config_source: str, generation: int) -> None:
        # Here, not at the top: a worker whose functions all run in threads never needs it.
        from multiprocessing.connection import Connection

        parent, child = socket.socketpair()
        env = dict(os.environ)
        if Path(config_source).exists():
            env["RUNNER_CONFIG"] = str(Path(config_source).resolve())
        self.generation = generation
        self.jobs = 0
        self.rss_mb = 0.0
        # The child's sentry (child.py) reads sentry_r; this process alone holds the write
        # end (not inherited by any other child), so it closes when this process dies.
        sentry_r, self._sentry_w = os.pipe()
        try:
            self.proc = _spawn([sys.executable, "-m", "runner.worker.child", str(child.fileno()), str(sentry_r)],
                               pass_fds=(child.fileno(), sentry_r), env=env, stdin=subprocess.DEVNULL,
                               process_group=0)
        except BaseException:
            os.close(self._sentry_w)
            raise
        finally:
            child.close()
            os.close(sentry_r)
        self.sock = parent
        self.conn = Connection(os.dup(parent.fileno()))
        parent.close()
        self.ready = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        if self.ready:
            return
        if not self.conn.poll(timeout_s):
            self.kill()
            raise ExecutorCrashed(f"the child process did not start within {timeout_s:g} s")
        try:
            msg = codec.loads(self.conn.recv_bytes())
        except (EOFError, OSError):
            raise ExecutorCrashed(f"the child process {describe_exit(self.exit_code())} at start") from None
        if msg.get("op") != "ready":
            self.kill()
            raise ExecutorCrashed(f"the child process said {msg!r} at start")
        self.ready = True

    def send(self, msg: dict[str, Any]) -> None:
        self.conn.send_bytes(codec.dumpb(msg))

    def exit_code(self, timeout_s: float = 5.0) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(self.proc)
            return self.proc.wait()

    def kill(self) -> None:
        # Also once the child has exited (not yet reaped): what it started may still run.
        _kill_group(self.proc)
        self.proc.wait()
        self._close()

    def _close(self) -> None:
        self.conn.close()
        if self._sentry_w >= 0:  # after the child is reaped: its sentry has stopped or been told
            os.close(self._sentry_w)
            self._sentry_w = -1

    def retire(self) -> None:
        """Ask the child to exit once idle (it is)."""
        with contextlib.suppress(OSError):
            self.send({"op": "exit"})
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            _kill_group(self.proc)
            self.proc.wait()
        self._close()

    def alive(self) -> bool:
        return self.proc.poll() is None


class Slot:
    """The child of one executor slot: started when first needed (or warmed at start),
    replaced when it died, was killed or is due for recycling."""

    def __init__(self, queue: QueueConfig, config_source: str, timeout_grace_s: float) -> None:
        self.q = queue
        self.config_source = config_source
        self.grace_s = timeout_grace_s
        self.child: ChildProcess | None = None
        # The start's background warm-up and the slot's first job may both find no child:
        # one of them starts it, the other uses it (two would leak one).
        self._starting = threading.Lock()

    def warm(self, generation: int) -> None:
        with self._starting:
            if self.child is None or not self.child.alive() or self.child.generation != generation:
                self.replace(generation)

    def replace(self, generation: int) -> None:
        if self.child is not None:
            if self.child.alive():
                self.child.retire()
            self.child = None
        self.child = ChildProcess(self.config_source, generation)

    def close(self) -> None:
        if self.child is not None:
            if self.child.ready:
                self.child.retire()
            else:
                self.child.kill()
            self.child = None

    def kill(self) -> None:
        if self.child is not None:
            self.child.kill()
            self.child = None

    def run(self, job: Claimed, fn: Function, generation: int, extra: dict[str, Any],
            on_started: Callable[[int], None], on_rpc: Callable[[dict[str, Any]], Any],
            flags: Callable[[], dict[str, Any]]) -> tuple[Outcome, float]:
        """Run one job in this slot's child; returns (outcome, run seconds). Every way the
        child can fail becomes the attempt's outcome; the slot is ready for the next job."""
        self.warm(generation)
        child = self.child
        assert child is not None
        started = time.perf_counter()
        try:
            child.wait_ready()
            on_started(child.pid)
            child.send({"op": "run", "job": job.as_message(), **extra})
        except (ExecutorCrashed, OSError) as exc:
            self.kill()
            return failure(fn, job, ExecutorCrashed(f"executor crashed: {exc}")), time.perf_counter() - started
        deadline = time.monotonic() + fn.timeout_s + self.grace_s
        sent: dict[str, Any] = {}
        cancel_seen: float | None = None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                timeout = JobTimeout(f"ran past TIMEOUT {fn.timeout_s:g} s; its child process was killed "
                                     f"{self.grace_s:g} s later")
                return failure(fn, job, timeout), time.perf_counter() - started
            now_flags = flags()
            if now_flags.get("cancelled"):
                # Asked to stop: a handler that does not within the grace is killed, and the
                # job ends cancelled as if it had stopped.
                cancel_seen = cancel_seen or time.monotonic()
                if time.monotonic() - cancel_seen > self.grace_s:
                    self.kill()
                    return (Dead(reason=CANCELLED, error={"type": "Cancelled", "message": "cancelled; its "
                                 f"child process was killed {self.grace_s:g} s later"}, refund=False),
                            time.perf_counter() - started)
            if now_flags != sent:
                with contextlib.suppress(OSError):
                    child.send({"op": "flag", **now_flags})
                sent = now_flags
            try:
                if not child.conn.poll(min(left, 0.1)):
                    continue
                msg = codec.loads(child.conn.recv_bytes())
            except (EOFError, OSError):
                code = child.exit_code()
                self.child = None
                crash = ExecutorCrashed(f"executor crashed: the child process running the handler "
                                        f"{describe_exit(code)}")
                return failure(fn, job, crash), time.perf_counter() - started
            op = msg.get("op")
            if op == "progress":  # no reply: the child does not wait for it
                on_rpc({"call": "progress", "value": msg.get("value")})
            elif op == "rpc":
                try:
                    answer = on_rpc(msg)
                    reply: dict[str, Any] = {"op": "reply", "ok": bool(answer),
                                             "value": answer if isinstance(answer, dict) else None}
                except Exception as exc:  # whatever happened, the child waits for a reply
                    # Redis away mid-call (or a bug): the handler hears it, as a thread's would,
                    # and the child stays in step. Left without a reply, it blocked on, and the
                    # next job's outcome was taken for this one's.
                    reply = {"op": "reply", "ok": False, "value": None, "failed": refusal_record(
                        RedisUnavailable(f"Redis is unreachable: {exc}") if isinstance(exc, UNAVAILABLE)
                        else exc if isinstance(exc, RunnerError) else RunnerError(f"{type(exc).__name__}: {exc}"))}
                with contextlib.suppress(OSError):
                    child.send(reply)
            elif op == "outcome":
                child.jobs += 1
                child.rss_mb = float(msg.get("rss_mb") or 0)
                if child.jobs >= self.q.max_jobs_per_child or child.rss_mb > self.q.max_rss_mb:
                    log.info("recycling the child process %d after %d job(s) at %.0f MB", child.pid,
                             child.jobs, child.rss_mb)
                    self.replace(generation)
                return from_message(msg["outcome"]), float(msg.get("run_s") or 0.0)
