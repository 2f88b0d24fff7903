"""A warm child process that runs handlers for one executor slot of a worker
(``ISOLATION = "process"``); started by isolation.py as ``python -m runner.worker.child``.

The child loads the functions once at start (so a job pays no import), then takes jobs
from its parent over a socket (channel.py), one batch at a time: the jobs a worker
claimed ahead go to a child together, and the child runs them one after another,
answering each one's outcome as it ends (never at the batch's end). For each it
validates and upgrades the payload and runs the handler. It never talks to Redis:
``ctx.save_checkpoint`` and ``ctx.extend_lease`` are messages to the parent, which holds
the lease.

Each outcome names the job the child starts next, taken off its queue before the
outcome goes: the parent always knows which job runs (its TIMEOUT is timed from that
outcome, and its attempt counts from there), and which wait unstarted. Those the parent
recalls (a stop, or a job running long ahead of them) are handed back unstarted; one
cancelled while it waited is left out, never started ("skipped"), as soon as the reader
hears of the cancel.

Limits it applies to itself, per job: TIMEOUT as a SIGALRM that raises JobTimeout in the
handler (the parent kills the child when a C call never lets it run), and MEMORY_MB as
RLIMIT_DATA above what the warm child already uses, while the handler runs (an allocation
past it fails, and the attempt fails as "memory limit"; encoding the result is not the
handler's). A job that ran past TIMEOUT, or whose handler left threads (as the OS counts
them) or processes running, ends with "reuse": false, and nothing more starts here: the
parent kills this child rather than run another job beside what still runs, and hands
the jobs still waiting back. What the handler left exited is reaped at the job's end (this
child is a subreaper: orphans of its tools come here). Every ctx call carries its job's
claim token and is refused once that job ended.
A reader thread takes the parent's messages, also while a handler runs, and exits the
process at once when the parent is gone. SIGTERM is the worker's to act on (a stop that
signals every process must not kill a running handler before its grace period): the
entry point the worker runs (isolation.CHILD_MAIN) says so before any import.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import itertools
import json
import logging
import os
import queue
import resource
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from runner import config as config_mod
from runner.catalog import registry as registry_mod
from runner.catalog.registry import Registry
from runner.client import Enqueued
from runner.client.enqueuing import checked_json
from runner.config import RedisConfig
from runner.errors import JobTimeout, RunnerError, StaleLease, raise_refusal
from runner.observe import tracing
from runner.observe.logs import flush_held
from runner.observe.logs import setup as setup_logs
from runner.store import codec, session
from runner.worker import affinity, batching, joblog
from runner.worker.channel import Channel
from runner.worker.context import Context, Flags, Hooks, for_job
from runner.worker.execute import Claimed, Dead, Done, RetryLater, resolve, run, to_message
from runner.worker.isolation import CODE_ENV, default_signals_after_fork, read_code
from runner.worker.joblog import Capture, JobLogger, batch_loggers
from runner.worker.journal import MAX_STEP_BYTES, Journal
from runner.worker.spill import Spill

log = logging.getLogger("runner.job")


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        # A subreaper: what a handler daemonizes (setsid, a double fork) stays under this
        # child while it lives, and goes to the worker (isolation.reap_adopted) at its end.
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def data_bytes() -> int:
    """The process's data segment (heap and private mappings), as RLIMIT_DATA counts it."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    return 0


class MemoryCap:
    """MEMORY_MB: RLIMIT_DATA's soft limit, set MEMORY_MB above what the child uses as a
    handler starts (``cap``) and put back as it ends (``uncap``). Runner's own work while
    the handler runs is not the handler's: entered (``with cap:``) around a message's
    encoding (not its sending), around reading and acting on the worker's (the reply to a
    ctx call) and around a ctx call's checks, the limit is put back for that while and the
    cap set again after. A handler that caught the MemoryError at its cap and then called
    ``ctx.extend_lease`` crashed the child with SIGSEGV in the message's encoding (orjson's,
    which does not survive a failed allocation), an attempt that read "executor crashed".

    Other threads of the handler may allocate past the cap in that while, so what comes
    at any time from any thread is not in it: a log line, a print and their sending to the
    worker stay under the cap, with encoders that raise MemoryError there (Child.log_sink,
    joblog.echoed); so do the worker's asks for them. A logging thread lifted the cap so
    often that another thread held 92-162 MB under a cap of 64.

    A count, not a lock held across the work: the reader thread and the handler's
    threads may each be in it at once, and the cap comes back when the last one leaves.
    A JobTimeout raised in here can leave the count off, which lifts the cap for the rest
    of the child's life; a job past its TIMEOUT retires its child anyway."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._capped: tuple[int, int] | None = None  # the limits while the handler runs
        self._saved: tuple[int, int] = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
        self._inside = 0  # runner's own work under way, uncapped

    def cap(self, mb: float) -> None:
        with self._lock:
            self._saved = resource.getrlimit(resource.RLIMIT_DATA)
            self._capped = (data_bytes() + int(mb * 2**20), self._saved[1])
            if not self._inside:
                resource.setrlimit(resource.RLIMIT_DATA, self._capped)

    def uncap(self) -> None:
        with self._lock:
            if self._capped is not None:
                self._capped = None
                if not self._inside:
                    resource.setrlimit(resource.RLIMIT_DATA, self._saved)

    @property
    def capped(self) -> bool:
        """Whether a handler runs under the cap (lifted for runner's own work or not)."""
        return self._capped is not None

    def __enter__(self) -> None:
        with self._lock:
            self._inside += 1
            if self._inside == 1 and self._capped is not None:
                resource.setrlimit(resource.RLIMIT_DATA, self._saved)

    def __exit__(self, *_exc: object) -> None:
        with self._lock:
            self._inside -= 1
            if not self._inside and self._capped is not None:
                resource.setrlimit(resource.RLIMIT_DATA, self._capped)


_RUSAGE = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)
# A log message's JSON under MEMORY_MB (Child.log_sink): the lines are text already.
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def rss_mb() -> float:
    """The child's peak resident set: one system call (reading /proc was a third of a
    no-op job's time in the child), at each batch's end. A peak over max_rss_mb recycles
    the child, which is what a growing child needs; a spike does too, which costs only a
    restart."""
    # (Linux's ru_maxrss is the whole process's peak even for RUSAGE_THREAD, which is
    # cheaper: it does not add up every thread's times.)
    peak = resource.getrusage(_RUSAGE).ru_maxrss
    return peak / 1024 if sys.platform != "darwin" else peak / 2**20  # KiB on Linux, bytes on macOS


# The ctx method behind each call to the worker, for errors.
CALL_NAMES = {"checkpoint": "ctx.save_checkpoint()", "extend": "ctx.extend_lease()", "enqueue": "ctx.enqueue()",
              "invoke": "ctx.invoke()", "step": "ctx.step()",
              "group_page": "ctx.group_outcomes()"}


class Child:
    def __init__(self, channel: Channel, registry: Registry, signals: Signals | None = None,
                 spill: Spill | None = None) -> None:
        self.channel = channel
        self.spill = spill  # where lines held back in a flood go too (spill.py)
        # MEMORY_MB caps the handler, not the channel's work for it (MemoryCap).
        self.memory = MemoryCap()
        channel.own_work = self.memory
        self.registry = registry
        self.signals = signals or Signals()  # (main thread only)
        self.fds = Descriptors()  # (after the functions' imports: what they set stays)
        self.send_lock = threading.Lock()
        # Each ctx call that waits for the worker's answer, by its request id: the handler's
        # threads may call at once, and the answers come in the worker's order (ask).
        self.asks = itertools.count(1)
        self.waiting: dict[int, queue.SimpleQueue[dict[str, Any]]] = {}
        self.wake: queue.SimpleQueue[str] = queue.SimpleQueue()  # "run" or "exit", from the reader
        # Jobs sent ahead of the one running, not started; the reader hands them back at a
        # recall. ``lock`` keeps a job from being both started and handed back.
        self.lock = threading.Lock()
        # (the job's fields, its batch's message, whether it is the batch's first)
        self.pending: collections.deque[tuple[list[Any], dict[str, Any], bool]] = collections.deque()
        self.flags_of: dict[str, Flags] = {}  # by claim token: the flags of each job sent here
        # The tokens of jobs lost unstarted before: each one's start is asked of the parent
        # before its handler runs (its claim stays held until then, see run_one).
        self.confirm: set[str] = set()
        self.spent = False  # a job left something running: the parent kills this child
        self.jobs = 0
        self.token = ""  # the claim token of the job running now ("" between jobs)
        self.logger: JobLogger | None = None  # the running job's, when it keeps a log
        # The OS threads (ids) of the child's own (main, the reader) and of its imports, less
        # those that ended since: a thread not among them after a job is the handler's.
        self.threads: set[str] = set()
        self.batches: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()  # BATCH calls sent here
        self.main = threading.main_thread().ident or 0  # (the thread handlers run in)
        # This child's own process: one its handler forked shares the channel but not the
        # thread that reads the worker's answers (ask).
        self.pid = os.getpid()

    def threads_left(self) -> int:
        """OS threads the handler left running (``_thread`` and C extensions' threads too,
        which ``threading`` does not count). Told by their ids, not counted: a thread
        started at import that ended meanwhile must not hide one the handler left. A
        thread just joined may take a moment more to leave /proc."""
        left = self._new_threads()
        if not left:
            return 0
        deadline = time.monotonic() + 0.1
        while (left := self._new_threads()) and time.monotonic() < deadline:
            time.sleep(0.002)
        return len(left)

    def _new_threads(self) -> set[str]:
        """The threads alive now that were not before the job (those of the child's own
        that ended are forgotten, so an id the kernel gives again is seen as new)."""
        now = _tasks()
        self.threads &= now
        return now - self.threads

    def processes_left(self) -> int:
        """Processes the handler left running, its own or adopted (this child is their
        subreaper); those that exited are reaped here, so none stays a zombie. Called only
        with no thread of the handler's left: then no Popen.wait() can still want them.
        What still runs is killed here, while it is still this child's to find: a tool in
        a session of its own (``setsid``) escapes the group kill that follows.

        The common case costs one system call: this child has no process of its own (its
        sentry is the worker's), so with none left waitpid says there is no child at all."""
        try:
            os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return 0
        left = self._reap()
        if left:
            for _ in range(16):
                todo = _children()
                if not todo:
                    break
                while todo:  # descendants first found, then killed (each may have its own)
                    pid = todo.pop()
                    todo += _children(pid)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                for pid in _children():
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, 0)
        return left

    @staticmethod
    def _reap() -> int:
        """Reap the handler's exited processes; how many still run."""
        left = 0
        for pid in _children():
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    left += 1
            except ChildProcessError:
                pass
        return left

    def send(self, msg: dict[str, Any]) -> None:
        with self.send_lock:
            self.channel.send(msg)

    def rpc(self, token: str, call: str, **args: Any) -> bool:
        return bool(self.ask(token, call, **args).get("ok"))

    def ask(self, token: str, call: str, **args: Any) -> dict[str, Any]:
        """The parent's answer to one call of the job holding claim ``token``; what failed
        there (Redis away) raises here. A call of a job that has ended (a thread its
        handler left) is refused here, never sent: it would land on the next job."""
        if token != self.token:
            raise RunnerError("this job has ended: a thread its handler left running cannot use its ctx")
        if os.getpid() != self.pid:
            # The answer would go to this child's reader, not to the fork: it waited for it
            # until its job's TIMEOUT (and the answer fell to the handler's next call).
            raise RunnerError(
                f"{CALL_NAMES.get(call, 'a ctx call that waits for the worker')} cannot be made from a process "
                "the handler forked "
                "(os.fork, a fork Pool) under ISOLATION = \"process\": only the handler's own process gets "
                "the worker's answers; make the call there (ctx.logger and ctx.progress work from a fork)")
        # Its own request id and waiter: a handler's pool calling ctx from several threads
        # at once took each other's answers off one shared queue (an enqueue answered with
        # another's job, or with a checkpoint's ``ok``). The reader hands each reply to the
        # waiter of the id it carries (_take). (Dict stores and pops are atomic, and
        # itertools.count's next: no lock.)
        rid = next(self.asks)
        waiter: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self.waiting[rid] = waiter
        try:
            self.send({"op": "rpc", "call": call, "token": token, "rid": rid, **args})
            reply = waiter.get()
        finally:
            self.waiting.pop(rid, None)
        if isinstance(reply.get("failed"), dict):
            raise_refusal(reply["failed"])
        return reply

    def fenced(self, token: str, call: str, **args: Any) -> bool:
        """ctx.save_checkpoint and ctx.extend_lease: False (refused, as for a lost lease)
        once the job has ended."""
        if token != self.token:
            return False
        return self.rpc(token, call, **args)

    def still_held(self, token: str, flags: Flags, lease_s: float) -> bool:
        """The lease looks lapsed here: ask the parent to renew it, fenced by the claim
        token (it succeeds only while no other run took the job)."""
        asked = time.monotonic()
        if not self.fenced(token, "extend"):
            return False
        flags.lease_until = asked + lease_s
        return True

    def progress(self, token: str, value: Any) -> None:
        if token == self.token:
            self.send({"op": "progress", "value": value, "token": token})

    def enqueue(self, token: str, type_: str, payload: Any, **options: Any) -> Enqueued:
        """A follow-up job, enqueued by the parent (this process never talks to Redis)."""
        with self.memory:  # (runner's own work: MemoryCap)
            checked_json(type_, options.get("version") or 0, payload)  # (the channel writes NaN as null)
        value = self.ask(token, "enqueue", type=type_, payload=payload, options=options).get("value") or {}
        if "error" in value:
            raise_refusal(value)
        return Enqueued(**value)

    def record_step(self, token: str, position: int, body: str) -> tuple[int, int]:
        """A durable step's entry, recorded by the parent (fenced there by the claim)."""
        if token != self.token:
            return -1, 0
        self._send_logs(token)  # ahead of the step: the parent writes them before it (executors._record_step)
        value = self.ask(token, "step", position=position, data=body).get("value") or {}
        return int(value.get("code", -1)), int(value.get("n", 0))

    def take_signal(self, token: str, position: int, name: str, head: str, until: int | None) -> tuple[int, str]:
        """A wait's signal, read by the parent (fenced there by the claim)."""
        if token != self.token:
            return -1, ""
        value = self.ask(token, "wait", position=position, name=name, head=head, until=until).get("value") or {}
        return int(value.get("code", -1)), str(value.get("body") or "")

    def start_child(self, token: str, child: str, type_: str, payload: Any, options: dict[str, Any]) -> str:
        """ctx.invoke's child, validated and held by the parent (written with the suspension)."""
        with self.memory:  # (runner's own work: MemoryCap)
            checked_json(type_, options.get("version") or 0, payload)  # (the channel writes NaN as null)
        value = self.ask(token, "invoke", child=child, type=type_, payload=payload, options=options).get("value") or {}
        if "error" in value:
            raise_refusal(value)
        return str(value.get("id") or child)

    def group_outcomes(self, token: str, group_id: str) -> Iterator[Any]:
        """A group's outcomes, read by the parent a page at a time (one page a message)."""
        start = 1
        while start:
            value = self.ask(token, "group_page", group=group_id, start=start).get("value") or {}
            if "error" in value:
                raise RunnerError(str(value["error"]))
            yield from value.get("outcomes") or ()
            start = int(value.get("next") or 0)

    def read_loop(self) -> None:
        """The parent's messages, also while a handler runs; EOF means the parent is gone."""
        while True:
            try:
                msg = self.channel.recv()
            except (EOFError, OSError, ValueError):
                os._exit(0)
            if msg.get("op") == "logs":  # the running handler's lines so far (none: no answer)
                # (Not lifting MEMORY_MB: the send keeps under it, log_sink; at the cap the
                # lines wait for the next ask.)
                with contextlib.suppress(MemoryError):
                    self._send_logs(str(msg.get("token")))
                continue
            with self.memory:  # (runner's own work, not under the handler's MEMORY_MB)
                self._take(msg)

    def _take(self, msg: dict[str, Any]) -> None:
        """Act on one message of the parent's (the reader thread)."""
        op = msg.get("op")
        if op == "flag":
            token = str(msg.get("token"))
            flags = self.flags_of.get(token)
            if flags is not None:  # (a job that has ended: nothing to tell)
                flags.lock_lost = bool(msg.get("lock_lost", flags.lock_lost))
                flags.cancelled = bool(msg.get("cancelled", flags.cancelled))
                flags.lease_until = float(msg.get("lease_until", flags.lease_until))
                if flags.cancelled:
                    self._drop(token)
        elif op == "reply":
            waiter = self.waiting.get(int(msg.get("rid") or 0))
            if waiter is not None:  # (none: a call whose send failed, which raised there)
                waiter.put(msg)
        elif op in ("run", "more"):
            # "more" tops the queue up while a batch runs: none of its jobs was counted
            # started at the send (a "run" batch's first was).
            with self.lock:
                self.confirm.update(msg.get("confirm") or ())
                for i, job in enumerate(msg["jobs"]):
                    self.flags_of[job[1]] = Flags()
                    self.pending.append((job, msg, i == 0 and op == "run"))
            self.wake.put("run")
        elif op == "recall":
            # The jobs sent ahead and not started go back to the parent (a stop, or the
            # job running now is taking long); what started stays this child's, and so
            # does a batch's first, which its parent counts as started from the send
            # (this thread may see it before the main thread takes it).
            with self.lock:
                tokens = [job[1] for job, _, first in self.pending if not first]
                kept = [entry for entry in self.pending if entry[2]]
                self.pending.clear()
                self.pending.extend(kept)
                for t in tokens:
                    self.flags_of.pop(t, None)
                    self.confirm.discard(t)
            self.send({"op": "recalled", "tokens": tokens})
        elif op == "batch":  # one handle_batch call over its jobs (executors._batch_in_child)
            with self.lock:  # (a "flag" may follow at once: the call's ctx sees it from its start)
                for job in msg["jobs"]:
                    self.flags_of[job[1]] = Flags()
            self.batches.put(msg)
            self.wake.put("batch")
        elif op == "exit":
            self.wake.put("exit")

    def _drop(self, token: str) -> None:
        """A job cancelled while it waits here is left out now, not when its turn comes:
        its worker ends it cancelled at once, and its cancel answers at once, rather than
        after the job ahead (or the recall). Taken out under the lock _next starts jobs
        with, so the job is either started or left out, never both; a batch's first is
        never left out (_next)."""
        with self.lock:
            for i, (job, _, first) in enumerate(self.pending):
                if job[1] == token:
                    if first:
                        return
                    del self.pending[i]
                    self.flags_of.pop(token, None)
                    self.confirm.discard(token)
                    break
            else:
                return
        self.send({"op": "skipped", "tokens": [token]})

    def _send_logs(self, token: str) -> None:
        """The running job's lines so far, taken and sent under the send lock: they reach
        the worker before the job's outcome, never after it (where they would be dropped)."""
        logger = self.logger
        if logger is None or self.token != token:
            return
        logger.flush(self.log_sink(token))  # (under the send lock: logger.sink_lock)

    def log_sink(self, token: str) -> Callable[[list[str], list[str], int], None]:
        """Where a job's lines and chunks go to the worker as it runs (JobLogger.sink).

        Under MEMORY_MB the cap stays while they are sent (MemoryCap lifts it for runner's
        other work): a line comes at any time, from any thread of the handler, and a
        logging thread lifted it so often that another thread of the same handler held
        92-162 MB under a cap of 64. The stdlib's encoder, unlike orjson (which crashes
        the child with SIGSEGV), raises MemoryError when the handler left no room; the
        lines then stay for a later send (JobLogger.flush)."""
        memory, channel = self.memory, self.channel

        def sink(lines: list[str], chunks: list[str], dropped: int) -> None:
            msg = {"op": "log", "token": token, "lines": lines, "chunks": chunks, "dropped": dropped}
            if memory.capped:
                channel.send_encoded(_dumps(msg).encode())
            else:
                channel.send(msg)

        return sink

    def _next(self, skipped: list[str]) -> tuple[list[Any], dict[str, Any], bool] | None:
        """The next job sent ahead, taken to start now (so no recall can take it back);
        those cancelled while they waited are left out, never started, into ``skipped``
        (not a batch's first: its parent counted it started when it sent it)."""
        with self.lock:
            while self.pending and not self.spent:
                job, msg, first = self.pending.popleft()
                flags = self.flags_of.get(job[1])
                if flags is not None and flags.cancelled and not first:
                    del self.flags_of[job[1]]
                    self.confirm.discard(job[1])
                    skipped.append(job[1])
                    continue
                self.token = job[1]
                return job, msg, first
            return None

    def serve(self) -> None:
        threading.Thread(target=self.read_loop, name="parent", daemon=True).start()
        self.threads = _tasks()
        self.send({"op": "ready", "pid": os.getpid()})
        while (woken := self.wake.get()) != "exit":
            if woken == "batch":
                self.run_batch(self.batches.get())
                continue
            # The first job of a batch starts as soon as it comes: its parent counted its
            # attempt from the send. Each outcome names the job started after it ("next"),
            # taken before the outcome goes, so the parent knows which job runs at any time
            # and counts each one's attempt from its own start.
            skipped: list[str] = []
            nxt = self._next(skipped)
            if nxt is not None and not nxt[2]:
                # Jobs that topped the queue up after the last outcome went (it named no
                # next): the parent learns of this one's start here.
                self.send({"op": "started", "token": nxt[0][1], **({"skipped": skipped} if skipped else {})})
                skipped = []
            while nxt is not None:
                job, msg, first = nxt
                out = self.run_one(job, msg, first)
                self.jobs += 1
                self.flags_of.pop(job[1], None)
                with self.lock:
                    self.token = ""
                # A job past its TIMEOUT, or a handler that left threads or processes
                # running: what still runs would go on beside the next job (a retry beside
                # its own first attempt's tool), so this child is not used again.
                left = self.threads_left()
                procs = self.processes_left() if not left else 0
                why = "its job ran past TIMEOUT" if _alarmed else \
                    f"its handler left {left} thread(s) running" if left > 0 else \
                    f"its handler left {procs} process(es) running" if procs > 0 else ""
                if why:
                    self.spent = True  # nothing more starts here
                skipped = []
                nxt = self._next(skipped)
                # (The peak RSS only at a batch's end, where the parent recycles children.)
                self.send({"op": "outcome", "token": job[1], **out,
                           **({"next": nxt[0][1]} if nxt is not None else {"rss_mb": round(rss_mb(), 1)}),
                           **({"skipped": skipped} if skipped else {}),
                           **({"reuse": False, "why": why} if why else {})})
            if skipped:  # cancelled while they waited, and nothing ran after them
                self.send({"op": "skipped", "tokens": skipped})
        # The last TIMEOUT's timer, left to run out (_on_alarm), stopped: at the
        # interpreter's exit SIGALRM is back at its default action, which kills.
        signal.setitimer(signal.ITIMER_REAL, 0)

    def run_batch(self, msg: dict[str, Any]) -> None:
        """One handle_batch call over the jobs of ``msg`` (one function, payloads upgraded to
        its newest version, one key: the parent grouped them); every item's outcome goes
        back in one message. TIMEOUT bounds the whole call (SIGALRM, as for one job)."""
        global _alarmed
        _alarmed = False
        started = time.perf_counter()
        jobs = [Claimed.from_row(row) for row in msg["jobs"]]
        outcomes: list[Any] = [None] * len(jobs)
        live: list[int] = []
        payloads: list[dict[str, Any]] = []
        fn = None
        if "skew_ms" in msg:  # (its lines carry the server's time; this host's clock is the worker's)
            joblog.set_skew(int(msg["skew_ms"]))
        for i, job in enumerate(jobs):
            resolved = resolve(job, self.registry, float(msg.get("unknown_grace_s", 0)), int(msg.get("now_ms", 0)))
            if isinstance(resolved, Done | RetryLater | Dead):
                outcomes[i] = resolved
            elif fn is not None and resolved[0] is not fn:  # (never: the parent groups by function)
                outcomes[i] = Dead("malformed record", {"type": "InvalidJob", "message": "not of its batch's "
                                   "function"}, refund=True)
            else:
                fn = resolved[0]
                live.append(i)
                payloads.append(resolved[1])
        if fn is None or not live:
            self.signals.put_back()  # (a payload validator of the function's ran)
        run_s = 0.0
        kept: list[list[str]] = [[] for _ in jobs]  # each job's log lines, for its worker to settle with it
        dropped = [0 for _ in jobs]  # and how many its flood lost here (its marker counts them)
        if fn is not None and live:
            claimed = [jobs[i] for i in live]
            with self.lock:  # (told by the parent: a lost lock, a cancel; see _take)
                flags = [self.flags_of.get(j.token) or Flags() for j in claimed]
            bounds = tuple(msg.get("log_bounds") or (0, 0))
            members, shared = batch_loggers(log, fn.name, [(j.id, j.attempt) for j in claimed],
                                            (int(bounds[0]), int(bounds[1])))
            ctx = batching.BatchContext(fn.name, fn.versions.newest, claimed[0].queue,
                                        batching.jobs_of(claimed, flags, members), fn.timeout_s, shared,
                                        extend=lambda: self.fenced(claimed[0].token, "extend"))
            timeout_s, memory_mb = fn.timeout_s, fn.memory_mb

            def guard(body: Any) -> Any:
                global _timing
                # The members' attempts count from here, not from the send (as a single
                # job's do from its "began"): the parent marks their start when it reads this.
                self.send({"op": "began"})
                if memory_mb:
                    self.memory.cap(memory_mb)
                signal.setitimer(signal.ITIMER_REAL, max(0.001, timeout_s))
                _timing = True  # (the timer is left to run out, as a single job's: _on_alarm)
                try:
                    return body()
                finally:
                    _timing = False
                    self.signals.put_back()  # before the results' encoding (Signals)
                    self.fds.put_back()
                    self.memory.uncap()

            max_result = int(msg.get("max_result_bytes") or config_mod.MAX_RESULT_BYTES)
            with self.lock:
                self.token = claimed[0].token  # the batch's calls go as its first job's
            got, run_s = batching.run(fn, payloads, claimed, ctx, None, guard, max_result)
            with self.lock:
                self.token = ""
            for i, o in zip(live, got, strict=True):
                outcomes[i] = o
            for at, i in enumerate(live):
                m = members.made(at)
                if m is None:  # (nothing was logged for it: no logger was made)
                    continue
                m.echo_end()  # (how many of its lines, and the batch's, its flood kept from the output)
                kept[i], dropped[i] = m.buf.take_counted() if m.buf is not None else ([], 0)
            flush_held()  # (its lines echoed to this child's output, ahead of its end)
        with self.lock:
            for job in jobs:
                self.flags_of.pop(job.token, None)
        self.jobs += len(jobs)
        left = self.threads_left()
        procs = self.processes_left() if not left else 0
        why = "its batch ran past TIMEOUT" if _alarmed else \
            f"its handler left {left} thread(s) running" if left > 0 else \
            f"its handler left {procs} process(es) running" if procs > 0 else ""
        if why:
            self.spent = True
        self.send({"op": "batch_outcomes", "outcomes": [to_message(o) for o in outcomes],
                   **({"logs": kept, "logs_dropped": dropped} if any(kept) else {}),
                   "run_s": run_s or time.perf_counter() - started, "rss_mb": round(rss_mb(), 1),
                   **({"reuse": False, "why": why} if why else {})})

    def journal_for(self, job: Claimed, flags: Flags, lease_s: float, max_step_bytes: int, owner: int) -> Journal:
        """A run's step log, built at its first durable call (or at its start, for a job
        with steps to replay); ``owner``: the handler's thread."""
        token = job.token
        return Journal(
            job.id, lambda: [] if job.steps == 0 else list((self.ask(token, "steps").get("value") or {})
                                                           .get("entries") or []),
            lambda pos, body: self.record_step(token, pos, body),
            max_step_bytes, clock0=(job.claimed_ms, job.received),
            take=lambda pos, name, head, until: self.take_signal(token, pos, name, head, until),
            start_child=lambda child, type_, payload, options: self.start_child(token, child, type_, payload,
                                                                                options),
            collect=lambda child, signal: bool((self.ask(token, "collect", child=child, signal=signal).get("value")
                                                or {}).get("found")),
            listen=lambda name, match, pos, on: int((self.ask(token, "listen", name=name, match=match, position=pos,
                                                              on=on).get("value") or {}).get("code", -9)),
            held=lambda: not lease_s or flags.lease_held(job.received, lease_s) or self.still_held(token, flags,
                                                                                                  lease_s),
            timed_out=lambda: _alarmed, replay_to=job.steps, owner=owner, own_work=self.memory)

    def run_one(self, row: list[Any], msg: dict[str, Any], first: bool = False) -> dict[str, Any]:
        """One job's run and its outcome. A batch's ``first`` says when its handler starts
        ("began"; the parent counts its attempt from there, not from the send: a fresh
        child's first job validates and builds its context for up to a second before). The
        others' start goes with the previous job's outcome ("next"). A job lost unstarted
        before asks the parent for its start first ("start"): its claim is held until that
        lands, so a worker lost while it waited here charges it nothing."""
        global _alarmed
        _alarmed = False
        job = Claimed.from_row(row)
        with self.lock:
            confirm = job.token in self.confirm
            self.confirm.discard(job.token)
        self.logger = None  # (one the job before made as it ended is not this one's)
        if "skew_ms" in msg:  # (its lines carry the server's time; this host's clock is the worker's)
            joblog.set_skew(int(msg["skew_ms"]))
        resolved = resolve(job, self.registry, float(msg.get("unknown_grace_s", 0)), int(msg.get("now_ms", 0)))
        if isinstance(resolved, Done | RetryLater | Dead):
            self.signals.put_back()  # (a payload validator of the function's ran)
            if first:
                self.send({"op": "began", "token": job.token})
            return {"outcome": to_message(resolved), "run_s": 0.0}
        fn, payload, version = resolved
        max_result = int(msg.get("max_result_bytes") or config_mod.MAX_RESULT_BYTES)
        token = job.token
        flags = self.flags_of.get(token) or Flags()
        lease_s = float(msg.get("lease_s") or 0)
        ctx = for_job(job, version, fn.timeout_s,
                      _ChildHooks(self, job, flags, lease_s, int(msg.get("max_step_bytes") or MAX_STEP_BYTES),
                                  self.main, tuple(msg.get("log_bounds") or (0, 0))),
                      flags, max_result)
        ctx._own = self.memory
        if job.steps > 0:  # a replay: ctx.logger, whenever made, stays quiet through it
            ctx._durable()
        traceparent = msg.get("traceparent")

        def logger() -> JobLogger:
            made = ctx.logger
            assert isinstance(made, JobLogger)
            return made

        def guard(body: Any) -> Any:
            global _timing
            if confirm:
                started = self.ask(token, "start")
                if not started.get("ok"):
                    raise StaleLease(f"job {job.id}: its lease was lost before its handler started")
                if (started.get("value") or {}).get("cancelled"):
                    flags.cancelled = True
            if first:
                self.send({"op": "began", "token": token})
            # MEMORY_MB caps the handler only: the result's encoding after it (and the
            # outcome's message) is runner's own work, and failing there read as a crash;
            # so are the messages of its ctx calls while it runs (MemoryCap).
            if fn.memory_mb:
                self.memory.cap(fn.memory_mb)
            # What the handler writes to sys.stdout and sys.stderr goes to its job's log
            # (its logger made at the first line). Writes to the file descriptors
            # themselves, by C code or a tool the handler starts, still go to the worker's
            # output.
            saved = sys.stdout, sys.stderr
            out, err = Capture(logger, "stdout", saved[0]), Capture(logger, "stderr", saved[1])
            sys.stdout, sys.stderr = out, err
            # TIMEOUT: one timer call a job. It is not stopped as the handler returns (a
            # second call): the alarm raises only while a handler runs (_timing), and the
            # next job's start sets the timer again.
            signal.setitimer(signal.ITIMER_REAL, max(0.001, fn.timeout_s))
            _timing = True
            try:
                try:
                    if traceparent:  # (traced: the worker's run span is the current span of the handler's own)
                        with tracing.within(traceparent):
                            return body()
                    return body()
                finally:
                    # The child's own signal settings back as the handler returns or
                    # raises, before runner's code after it (the result's encoding, a
                    # failure's traceback): a stop's SIGTERM there is the worker's.
                    self.signals.put_back()
                    self.fds.put_back()  # (before the run's last lines are echoed)
            finally:
                _timing = False
                sys.stdout, sys.stderr = saved
                out.finish()
                err.finish()
                self.memory.uncap()

        outcome, run_s = run(fn, payload, job, ctx, None, guard, max_result)
        if fn.memory_mb and isinstance(outcome, RetryLater | Dead) and outcome.error \
                and outcome.error.get("type") == "MemoryError":
            err = {**outcome.error, "type": "MemoryLimit",
                   "message": f"memory limit: the handler went over MEMORY_MB = {fn.memory_mb:g}"}
            outcome = RetryLater(outcome.delay_s, err) if isinstance(outcome, RetryLater) else \
                Dead(outcome.reason, err, outcome.refund)
        self.logger = None
        kept: list[str] = []
        dropped = 0  # lines its flood lost here, ahead of kept (the worker's marker counts them)
        streamed: list[str] = []
        made = ctx._logger  # (None: the handler never logged, so there is nothing to send)
        if isinstance(made, JobLogger):
            made.echo_end()
            kept, dropped = made.buf.take_counted() if made.buf is not None else ([], 0)
            if self.spill is not None:
                self.spill.clear()  # (they go with the outcome: never read back for another job)
            streamed = made.chunks.take() if made.chunks is not None else []
            flush_held()  # (its lines echoed to this child's output, ahead of its end)
        return {"outcome": to_message(outcome), "run_s": run_s,
                **({"log": kept, "log_dropped": dropped} if kept or dropped else {}),
                **({"stream": streamed} if streamed else {})}

    def _logger_made(self, ctx: Any, logger: JobLogger) -> None:
        """The running job's ctx.logger, made at its first use (from any of the handler's
        threads): its lines reach the worker while the handler runs, taken and sent under
        the send lock, as _send_logs does."""
        logger.sink = self.log_sink(ctx.token)
        logger.limits = self.memory
        logger.sink_lock = self.send_lock
        if ctx._journal is not None and ctx._journal.replay_to > 0:
            logger.replaying = ctx._journal.replaying
        with self.lock:
            if self.token != ctx.token:  # (a thread of a job that has ended: its lines are no other job's)
                return
            if self.spill is not None:
                self.spill.clear()  # (the job before's lines went with its outcome)
                logger.spill = self.spill
            self.logger = logger


_task_dir = -1  # /proc/self/task, opened once (Linux)


def _tasks() -> set[str]:
    """This process's OS threads, by id. On Linux the entries of /proc/self/task, listed
    through a descriptor kept open (listing it by its path cost three times as much, a
    quarter of a no-op job's time in the child)."""
    global _task_dir
    if not sys.platform.startswith("linux"):
        return {str(t.ident) for t in threading.enumerate()}
    try:
        if _task_dir < 0:
            _task_dir = os.open("/proc/self/task", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        return set(os.listdir(_task_dir))
    except OSError:
        return set(os.listdir("/proc/self/task"))


def _children(pid: int | str = "self") -> list[int]:
    """A process's children (Linux; none known elsewhere)."""
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(x) for x in f.read().split()]
    return out


_alarmed = False  # the running job's TIMEOUT fired (its handler may have caught it)
_timing = False  # a handler runs under its TIMEOUT: an alarm now is its timeout


def _on_alarm(signum: int, frame: Any) -> None:
    """TIMEOUT. An alarm after its handler returned (the timer is left to run out rather
    than stopped: a system call a job) is no job's: runner's own code goes on."""
    global _alarmed
    if not _timing:
        return
    _alarmed = True
    raise JobTimeout("ran past its TIMEOUT")


def _on_stop(signum: int, frame: Any) -> None:
    """SIGTERM to every process at a stop (Heroku, systemd's KillMode=control-group,
    ``kill -TERM -- -pgid``) is the worker's to act on: it lets the running handler finish
    within its grace period and kills this child only after it. So is a terminal's Ctrl-C
    (SIGINT). A handler, not SIG_IGN: the tools a handler runs start with the default
    action again (exec resets it, and default_signals_after_fork does for a fork)."""


def keep_signals_off_the_handler() -> None:
    """SIGTERM and SIGINT caught by a no-op (_on_stop) and their system calls restarted
    (SA_RESTART): a handler blocked in C code that does not retry an interrupted call
    (a read, a recv, a waitpid) goes on through a stop's signal, as under threads."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _on_stop)
        signal.siginterrupt(sig, False)


# What runner relies on in a child, and Python's own start-up settings of a signal a
# handler may change: a stop's SIGTERM and SIGINT (the grace period), SIGALRM (TIMEOUT),
# SIGCHLD at its default (a tool's exit status: SIG_IGN makes every later waitpid fail and
# subprocess report 0, and exec passes SIG_IGN on), SIGPIPE and SIGXFSZ ignored (an error,
# not the child's death).
_OWN: tuple[tuple[signal.Signals, Any], ...] = (
    (signal.SIGTERM, _on_stop), (signal.SIGINT, _on_stop), (signal.SIGALRM, _on_alarm),
    (signal.SIGCHLD, signal.SIG_DFL), (signal.SIGPIPE, signal.SIG_IGN), (signal.SIGXFSZ, signal.SIG_IGN))


try:  # signal.getsignal without its enum look-up, which raises and catches a ValueError for
    # a handler that is a function (5 times the cost of the call); and pthread_sigmask
    # without making an enum of each signal of the mask it answers (read by no one here)
    from _signal import getsignal as _getsignal
    from _signal import pthread_sigmask as _sigmask
except ImportError:  # pragma: no cover
    _getsignal = signal.getsignal
    _sigmask = signal.pthread_sigmask


class _ChildHooks(Hooks):
    """A child's run's ctx calls (context.Hooks), each a message to the parent fenced by
    the run's claim token: one object per run, where closures were one per call."""

    __slots__ = ("child", "flags", "job", "lease_s", "log_bounds", "max_step_bytes", "owner")

    def __init__(self, child: Child, job: Claimed, flags: Flags, lease_s: float, max_step_bytes: int, owner: int,
                 log_bounds: tuple[int, ...]) -> None:
        self.child, self.job, self.flags, self.lease_s = child, job, flags, lease_s
        self.max_step_bytes, self.owner, self.log_bounds = max_step_bytes, owner, log_bounds

    def save(self, body: str) -> bool:
        return self.child.fenced(self.job.token, "checkpoint", data=body)

    def extend(self) -> bool:
        return self.child.fenced(self.job.token, "extend")

    def progress(self, ctx: Context, value: Any) -> None:
        self.child.progress(self.job.token, value)

    def enqueue(self, type_: str, payload: Any, **options: Any) -> Enqueued:
        return self.child.enqueue(self.job.token, type_, payload, **options)

    def group(self, group_id: str) -> Iterator[Any]:
        return self.child.group_outcomes(self.job.token, group_id)

    def logger(self, ctx: Context) -> JobLogger:
        job = self.job
        made = JobLogger(log, {"job_id": job.id, "type": job.type, "attempt": job.attempt}, *self.log_bounds)
        self.child._logger_made(ctx, made)
        return made

    def journal(self, ctx: Context) -> Journal:
        return self.child.journal_for(self.job, self.flags, self.lease_s, self.max_step_bytes, self.owner)


class Signals:
    """The child's own signal settings, put back as every handler returns or raises,
    before runner's own code after it (the result's encoding, the outcome's message) and
    before the next job starts: a stop's SIGTERM there is the worker's to act on, never a
    SIGTERM handler the job left (``sys.exit`` in the child: a finished job lost).

    A handler runs in the child's main thread, so it can change what every later job in
    this child gets: a SIGTERM handler of its own (``sys.exit`` on SIGTERM, Scrapy's
    CrawlerProcess) or asyncio's ``add_signal_handler`` then ``remove_signal_handler``
    (which leaves SIG_DFL) makes a stop kill the next job at once; a SIGALRM handler left
    behind swallows the next job's JobTimeout; SIGCHLD at SIG_IGN makes a later job's
    failing tool report exit 0.

    Restored, not the child retired (as one whose job left a thread is): a handler that
    sets its signals on every run (Scrapy's does, and so does any that uses asyncio's
    signal handlers) would otherwise cost a child start, seconds of imports, per job; and
    what runner relies on is this short list, put back whole: each signal's action (with
    SA_RESTART for SIGTERM and SIGINT, set again every time), the main thread's signal
    mask, the interval timers and the wakeup fd. The check reads Python's record of each
    action (its getsignal), so a job that changed nothing costs seven system calls (10 to
    20 µs on a busy 2-core machine); an action set from C code past Python's signal module
    is not seen. Other
    signals (SIGUSR1, SIGHUP, ...) are the handler's own: runner does not use them."""

    def __init__(self) -> None:
        keep_signals_off_the_handler()
        for sig, action in _OWN[2:]:
            signal.signal(sig, action)
        self.mask = signal.pthread_sigmask(signal.SIG_BLOCK, ())

    def put_back(self) -> None:
        for sig, action in _OWN:
            # (!=, not "is not": SIG_DFL and SIG_IGN read back as plain ints, never the
            # enum members, and were set again, a system call each, after every job)
            if _getsignal(sig) != action:
                signal.signal(sig, action)
        # SA_RESTART every time: Python's record does not show it, and a handler that put
        # back the action it found (``old = signal.signal(SIGTERM, h)`` ...
        # ``signal.signal(SIGTERM, old)``) left it off (signal.signal never sets it).
        signal.siginterrupt(signal.SIGTERM, False)
        signal.siginterrupt(signal.SIGINT, False)
        _sigmask(signal.SIG_SETMASK, self.mask)
        # (ITIMER_REAL is TIMEOUT's, set again as each handler starts.) A profiler's timers
        # left running would send SIGVTALRM or SIGPROF, whose default action kills.
        for timer in (signal.ITIMER_VIRTUAL, signal.ITIMER_PROF):
            if signal.getitimer(timer) != (0.0, 0.0):
                signal.setitimer(timer, 0)
        # An event loop's wakeup fd left set after the loop closed would get a byte per
        # signal in whatever later takes that number (the socket to the worker).
        signal.set_wakeup_fd(-1)


class Descriptors:
    """The child's fd 0, 1 and 2 (its stdin, and the worker's output, where its echoed
    lines go), put back as every handler returns or raises: a handler that dup2s over
    them (silencing a chatty C library) or closes them would otherwise take every later
    job's echo in this child with it, silently. A job that changed none costs three
    fstat calls: each is compared with a duplicate kept since the child's start."""

    def __init__(self) -> None:
        self.kept: list[tuple[int, int, tuple[int, int]]] = []  # (fd, its duplicate, (device, inode))
        for fd in (0, 1, 2):
            try:
                st = os.fstat(fd)
                self.kept.append((fd, os.dup(fd), (st.st_dev, st.st_ino)))  # (the duplicate: close-on-exec)
            except OSError:  # (not open at the start: left to the handler)
                continue

    def put_back(self) -> None:
        for fd, dup, ident in self.kept:
            try:
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) == ident:
                    continue
            except OSError:  # closed
                pass
            with contextlib.suppress(OSError):
                os.dup2(dup, fd)  # (inheritable, as it was: the handler's tools get it)


def main() -> None:
    _die_with_parent()
    affinity.restore_original()  # the worker keeps to one core; its children spread out
    fd = int(sys.argv[1])
    os.set_inheritable(fd, False)  # never in a handler's tools: the parent reads its EOF as this child's end
    # The worker died before the death signal was armed: this child has another parent
    # now (init, or a subreaper). Not "the parent is 1": a worker that is PID 1 itself (a
    # container's exec-form command) is this child's parent, alive.
    if str(os.getppid()) != os.environ.get("RUNNER_CHILD_OF", str(os.getppid())):
        os._exit(0)
    channel = Channel(socket.socket(fileno=fd))
    try:
        worker = channel.recv()  # isolation.worker_message
    except (EOFError, OSError):
        os._exit(0)  # its worker is gone already
    session.host(worker["source"], RedisConfig(**worker["redis"]))
    cfg = config_mod.load(os.environ.get("RUNNER_CONFIG") or None)
    setup_logs(cfg.log, hold=False)  # (each echoed line written before the handler goes on)
    signals = Signals()
    default_signals_after_fork()
    spill = None
    if len(sys.argv) > 2:  # the worker's shared memory for held lines (spill.py)
        os.set_inheritable(int(sys.argv[2]), False)
        spill = Spill(int(sys.argv[2]))
    # The function files as the worker loaded them, not as they are on disk now.
    code = os.environ.pop(CODE_ENV, "")
    sources = read_code(int(code)) if code else None
    reg = registry_mod.load(cfg, payload_check=codec.payload_problem, sources=sources)
    child = Child(channel, reg, signals, spill)
    child.serve()


if __name__ == "__main__":
    main()
