"""The warm child process of one executor slot (isolation.py's ChildProcess), fed a batch
of claimed jobs at a time and watched until each has its outcome.

A job's hand-off to a child costs two wake-ups of another process and a few system
calls, more than a short handler's own work. So when a queue's jobs are quick and the
worker has claimed some ahead, one message takes several to the child (``room``: about
BATCH_BUDGET_S of work at the function's recent pace, a fair share of what waits, at most
BATCH_MAX), which runs them one after another. Each outcome comes back as its job ends,
and is settled at once: no outcome waits for its batch. Only the batch's first job may
have spent its attempt at the claim; the others were claimed ahead and spend theirs when
the child starts them, which its previous job's outcome says ("next", child.py).

What holds for a job alone holds in a batch:

- TIMEOUT is timed per job from its start; past it plus the grace the child is killed,
  the job fails as a timeout, and the jobs still waiting go back unspent (Release);
- a child that dies fails only the job it was running ("executor crashed"); the jobs
  waiting behind it go back unspent;
- a job that runs longer than RECALL_AFTER_S, or a stop, recalls the jobs waiting behind
  it: the child hands back those it has not started, and they go back unspent (to the
  front of the queue, where any worker's next claim takes them);
- a cancel of a job that waits in a child leaves it out, never started, as soon as the
  child hears of it (the flag, TELL_EVERY_S): it goes back at once, which ends it
  cancelled, not when the child reaches it (child.py);
- a child whose job ran past TIMEOUT or left threads or processes running starts nothing
  more and is killed; children are recycled between batches (a child that ran its queue
  dry gets the jobs claimed meanwhile in the same batch, unless it is due for recycling) (a batch never holds more
  jobs than the child has left before ``max_jobs_per_child``).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from runner.catalog.registry import Function
from runner.config import Config, QueueConfig
from runner.errors import JobTimeout, RunnerError, StaleLease, refusal_record
from runner.store.connection import UNAVAILABLE, unreachable
from runner.worker.context import Flags
from runner.worker.execute import CANCELLED, Claimed, Dead, Outcome, failure, from_message
from runner.worker.isolation import EXITED, ChildProcess, ExecutorCrashed, Superseded, describe_exit
from runner.worker.ledger import Release, Run

log = logging.getLogger("runner.worker")

BATCH_MAX = 16  # jobs in one message to a child
# A job that runs this long hands back the jobs waiting behind it in its child when
# another executor of the queue has nothing to run; one that runs RECALL_LATE_S, whatever
# the others do: a batch is made for quick jobs, and one that turned out slow must not
# hold the others. (Not at once: on a loaded host a quick job can wait tens of
# milliseconds for a core, and jobs handed back cost a release and a claim.)
RECALL_AFTER_S = 0.05
RECALL_LATE_S = 1.0
RECALL_LOOK_S = 0.01  # between the two, how often an idle executor is looked for
# A batch's child that runs its queue dry while jobs claimed ahead wait is sent them in
# the same batch (_Watch._fill_now), up to this many jobs in all: what a batch sends is
# held by it until it ends.
FILL_MAX = 256
# A batch holds about this much work at its function's recent pace: a job that waits
# behind others in a child waits about this long (no longer than the recall would let it
# wait behind one slow job). A fair share of what waits bounds it too, so in a drain it
# waits no longer than in the inbox. The pace is the handler's wall time, waits for a
# core and for the handler's own round trips included: at 5 ms, a handler that makes one
# Redis call on a busy 2-core host (2 to 6 ms each) went alone, one message and one
# wake-up of the child per job.
BATCH_BUDGET_S = RECALL_AFTER_S
# While jobs wait behind the running one, the watch reads the child's outcomes at most
# this often (each is settled in the settler's next batch, which waits a little longer).
LINGER_S = 0.001
HANDOFF_S = 0.0001  # a job's cost in its child besides its handler, about (for room())
PACE_WEIGHT = 0.2  # of the newest job in a function's pace (an exponential average)
# How often a batch's flags (a cancel, a lost lock) are looked at to tell its child: they
# change rarely, and looking at every job's after every message cost more than the rest.
TELL_EVERY_S = 0.02
# A job running longer than this is asked for its log lines this often (a quick job's go
# with its outcome, at no extra message).
ASK_LOGS_EVERY_S = 0.5


class Feed(Protocol):
    """What a slot asks of its executor around one job."""

    job: Claimed
    run: Run  # (held: its claim waits for the child, see hold.lua)
    fn: Function
    flags: Flags  # lock_lost and cancelled, as the handler should see them

    def hold(self) -> bool:
        """The child is not ready: the claim waits unspent (True: held)."""

    def stop(self, held: bool) -> bool:
        """Give the job back while it waits for its child (a stop; a cancel once held)."""

    def start(self, ahead: Sequence[Feed] = ()) -> list[bool]:
        """This job and those sent with it (``ahead``) may go to the child, each claim's
        wait for it ended first (one round trip); per job, this one first, False: hand it
        back instead."""

    def started(self, pid: int, charge: bool = True) -> None:
        """This child (pid) has the job; ``charge``: its handler starts now (else the
        child says when: charge)."""

    def charge(self) -> None:
        """The handler starts: the attempt counts from here."""

    def rpc(self, msg: dict[str, Any]) -> Any:
        """A ctx call of the handler."""

    def finish(self, outcome: Outcome | Release, run_s: float) -> None:
        """The job's end: its outcome, or a Release when its handler never got it."""


class Slot:
    """The child of one executor slot: started when first needed (or warmed at start),
    replaced when it died, was killed or is due for recycling."""

    def __init__(self, queue: QueueConfig, config: Config, timeout_grace_s: float,
                 code: Callable[[int], int] = lambda generation: -1) -> None:
        self.q = queue
        self.config = config  # the worker's: its children's (isolation.child_env)
        self.code = code  # a generation's function files, for its children (Generations.code)
        self.grace_s = timeout_grace_s
        self.child: ChildProcess | None = None
        # The start's background warm-up and the slot's first job may both find no child:
        # one of them starts it, the other uses it (two would leak one).
        self._starting = threading.Lock()
        self.failures = 0  # children in a row that died before their handler got a job
        self._pause_until = 0.0  # no new child before then (after such deaths)
        self.pace: dict[str, float] = {}  # seconds each function's handler took here, lately
        # Clear while a batch runs here (run): set once each of its jobs has its outcome or
        # went back, which the worker's stop waits for after killing the child.
        self._idle = threading.Event()
        self._idle.set()
        # Set by the worker's stop before it kills the child: the job the child ran then
        # goes back unspent ("interrupted"), not as a crash.
        self.stopped = False
        # Told True when jobs come to wait in the child's queue behind its running one, and
        # False when none waits there any more: they still wait for a start, so the fetcher
        # counts them as waiting (Ledger.backlog) and claims in batches, not the few jobs
        # each top-up left room for.
        self.backlog: Callable[[bool], None] = lambda queued: None

    def _failed_start(self, exc: BaseException) -> None:
        self.failures += 1
        if self.failures == 1:
            log.warning("%s: a child process was lost before its handler got the job (%s); the job goes back "
                        "unspent", self.q.name, exc)
            return
        pause = min(30.0, 0.5 * 2 ** (self.failures - 2))
        log.error("%s: %d child processes in a row were lost before their handler got a job (last: %s); "
                  "their jobs went back unspent. Check the worker's memory and the functions' imports "
                  "(`runner check`); starting the next one in %g s", self.q.name, self.failures, exc, pause)
        self._pause_until = time.monotonic() + pause

    def _paused(self, stop: Callable[[], bool]) -> bool:
        """Wait out the pause after children lost at start (the job's claim is held
        meanwhile); True when ``stop`` says to give up first."""
        while time.monotonic() < self._pause_until:
            if stop():
                return True
            time.sleep(min(0.1, max(0.0, self._pause_until - time.monotonic())))
        return False

    def ready(self, generation: int) -> bool:
        """Its child is known ready for a job of this generation (a hint, read unlocked)."""
        child = self.child
        return child is not None and child.ready and child.generation == generation

    def room(self, fn: Function, generation: int) -> int:
        """How many jobs of ``fn`` a batch may hold now: about BATCH_BUDGET_S of work at the
        pace its jobs kept here lately, within what the child has left before its
        recycling; 1 while the child is not ready or the pace is not known yet."""
        child = self.child
        pace = self.pace.get(fn.name)
        if pace is None or child is None or not child.ready or child.generation != generation:
            return 1
        return max(1, min(BATCH_MAX, int(BATCH_BUDGET_S / (pace + HANDOFF_S)),
                          self.q.max_jobs_per_child - child.jobs))

    def warm(self, generation: int) -> None:
        with self._starting:
            if self.child is None or not self.child.alive() or self.child.generation != generation:
                self.replace(generation)

    def replace(self, generation: int) -> None:
        code = self.code(generation)  # (Superseded before the child in place is retired)
        if self.child is not None:
            if self.child.alive():
                self.child.retire()
            else:
                self.child.end()
            self.child = None
        self.child = ChildProcess(self.config, generation, code)

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

    def settled(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the batch running here, if any, to end (every job
        of it settled or handed back, on the outcomes queue); whether it did."""
        return self._idle.wait(timeout_s)

    def run(self, feeds: Sequence[Feed], generation: int, extra: dict[str, Any], stopping: Callable[[], bool],
            starving: Callable[[], bool] = bool, recalled: Callable[[], None] = lambda: None,
            more: Callable[[int], Sequence[Feed]] = lambda n: ()) -> None:
        """Run ``feeds``' jobs in this slot's child, in order, each finished as its outcome
        comes (Feed.finish). Every way the child can fail becomes the outcome of the job
        its handler had; a job whose handler never got it is handed back unspent
        (Release). ``stopping`` says the worker stops and ``starving`` that another
        executor has nothing to run (the jobs waiting are recalled: see RECALL_AFTER_S);
        ``recalled`` is told when they are. ``more(n)`` gives up to n more jobs claimed
        ahead to top the child's queue up before it runs dry (none once it is stopping or
        recalling). The slot is ready for the next batch."""
        self._idle.clear()
        try:
            self._run(feeds, generation, extra, stopping, starving, recalled, more)
        finally:
            self._idle.set()

    def _run(self, feeds: Sequence[Feed], generation: int, extra: dict[str, Any], stopping: Callable[[], bool],
             starving: Callable[[], bool], recalled: Callable[[], None],
             more: Callable[[int], Sequence[Feed]]) -> None:
        first = feeds[0]
        try:
            child = self.child
            if child is None or child.generation != generation or not child.alive() or not child.poll_ready():
                # Seconds of an interpreter's start and the functions' imports (and the
                # old child's retirement before them): the job must not spend its attempt
                # on that wait, so its claim is held first (a worker killed in the wait
                # would charge "worker lost" to a job whose handler never ran).
                held = first.hold()
                if self._paused(lambda: first.stop(held)):
                    return _release(feeds)
                try:
                    self.warm(generation)
                except Superseded:  # reloaded twice since the jobs were taken: back, for the code of now
                    return _release(feeds)
                child = self.child
                assert child is not None
                if not child.wait_ready(stop=lambda: first.stop(held)):
                    return _release(feeds)
            go = first.start(feeds[1:])
            if not go[0]:  # its lease lost in the wait
                return _release(feeds)
            _release([f for f, ok in zip(feeds, go, strict=True) if not ok])
            feeds = [f for f, ok in zip(feeds, go, strict=True) if ok]
            child.send({"op": "run", "jobs": [f.job.as_row() for f in feeds], **_confirm(feeds), **extra})
        except (ExecutorCrashed, OSError) as exc:
            # The child died (or never started) before its handler got the job: a stop's
            # SIGTERM reaching it while it imports, the OOM killer, its start timeout. The
            # jobs go back unspent; a child that keeps dying at start is this worker's
            # problem, said loudly, and the slot backs off before the next one.
            self.kill()
            self._failed_start(exc)
            return _release(feeds)
        self.failures = 0
        # Its attempt counts when the child says its handler starts ("began"): a fresh
        # child validates the payload and builds the context first, which took a second.
        first.started(child.pid, charge=False)
        watch = _Watch(self, child, feeds, generation, extra, stopping, starving, recalled, more)
        try:
            watch.run()
        finally:
            if watch.queued:
                self.backlog(False)

    def recycle(self, child: ChildProcess, generation: int) -> None:
        """Between batches: a child past ``max_jobs_per_child`` or ``max_rss_mb`` is
        replaced."""
        if child.jobs >= self.q.max_jobs_per_child or child.rss_mb > self.q.max_rss_mb:
            log.info("recycling the child process %d after %d job(s) at %.0f MB", child.pid,
                     child.jobs, child.rss_mb)
            with contextlib.suppress(Superseded):  # (the next job starts one of the code of now)
                self.replace(generation)


def _confirm(feeds: Sequence[Feed]) -> dict[str, Any]:
    """The jobs whose start the child must ask for before their handlers run (lost
    unstarted before: their claims stay held until then, Run.confirm)."""
    tokens = [f.job.token for f in feeds if f.run.confirm]
    return {"confirm": tokens} if tokens else {}


def _release(feeds: Sequence[Feed]) -> None:
    for f in feeds:
        f.finish(Release(), 0.0)


class _Watch:
    """One batch in its child: the job running (``current``) and those waiting behind it,
    until each has its outcome or went back."""

    def __init__(self, slot: Slot, child: ChildProcess, feeds: Sequence[Feed], generation: int, extra: dict[str, Any],
                 stopping: Callable[[], bool], starving: Callable[[], bool], recalled: Callable[[], None],
                 more: Callable[[int], Sequence[Feed]]) -> None:
        self.slot = slot
        self.more = more
        self.extra = extra
        self.stalled = 0.0  # since when nothing runs while jobs wait (0: not so)
        self.child = child
        self.generation = generation
        self.stopping = stopping
        self.starving = starving
        self.recalled = recalled
        self.by_token = {f.job.token: f for f in feeds}
        self.current: Feed | None = feeds[0]
        self.waiting: collections.deque[Feed] = collections.deque(feeds[1:])
        self.began = time.monotonic()
        self.deadline = self.began + feeds[0].fn.timeout_s + slot.grace_s
        self.cancel_seen = 0.0  # when the running job's cancel was first seen (0: not yet)
        self.lost_seen = 0.0  # when the running job's lease was first seen lost with its slot (0: not yet)
        self.recall_sent = 0.0  # when the jobs waiting were recalled (0: not yet)
        self.told: dict[str, tuple[bool, bool, float]] = {}  # the flags each job's child was told last
        self.next_tell = 0.0  # when the flags are looked at again (a cancel takes up to TELL_EVERY_S)
        self.asked_logs = 0.0  # when the running job's log lines were last asked for
        self.sent = len(feeds)  # jobs sent to the child in this batch (FILL_MAX)
        self.last: Feed | None = None  # the job that ended last
        self.queued = False  # jobs wait in the child's queue, as the slot's backlog was last told

    def run(self) -> None:
        child = self.child
        while True:
            try:
                while (msg := child.channel.next()) is not None:
                    if not self._on(msg):
                        return
            except (ValueError, KeyError) as exc:  # a message not of this protocol: never trust the child again
                return self._lost(f"sent a message runner cannot read ({exc})")
            if self.current is None and not self.waiting:
                if self._fill_now():
                    continue
                self.slot.recycle(child, self.generation)
                return
            if self.current is not None and len(self.waiting) <= 1 and not self.recall_sent:
                self._top_up()
            if bool(self.waiting) is not self.queued:  # (before the wait: the fetcher may claim meanwhile)
                self.queued = not self.queued
                self.slot.backlog(self.queued)
            now = time.monotonic()
            wait = self._enforce(now)
            if wait is None:
                return
            if self.waiting and wait > LINGER_S:
                # More outcomes are on their way: read them together, rather than wake for
                # each (a wake-up costs more than a quick job's hand-off).
                time.sleep(LINGER_S)
                wait -= LINGER_S
            try:
                seen = child.wait(wait)
                if seen == EXITED:
                    raise EOFError
                if seen:
                    child.channel.fill()
            except (EOFError, OSError):
                return self._lost("")

    def _killed(self, outcome: Outcome, now: float) -> None:
        """The running job's child is killed and the job ends with ``outcome``; the jobs
        waiting behind it go back (the batch has ended here: None for _enforce)."""
        current = self.current
        assert current is not None
        self.slot.kill()
        current.finish(outcome, now - self.began)
        _release(list(self.waiting))

    def _enforce(self, now: float) -> float | None:
        """TIMEOUT, an unheeded cancel, a recall and the flags the child must know; how
        long to wait for the next message, or None when the batch has ended here."""
        current, waiting = self.current, self.waiting
        if current is not None:
            if now >= self.deadline:
                timeout = JobTimeout(f"ran past TIMEOUT {current.fn.timeout_s:g} s; its child process was killed "
                                     f"{self.slot.grace_s:g} s later")
                self._killed(failure(current.fn, current.job, timeout), now)
                return None
            if current.run.lost and current.flags.lock_lost:
                # Its lease was reclaimed and its resource or concurrency slot released
                # with it: another job of the resource, or its own retry, may run now, and
                # nothing it does counts any more (its outcome is refused). The handler
                # sees ctx.lock_lost (told below); one that does not stop within the grace
                # is killed rather than run on beside them, as for a cancel.
                self.lost_seen = self.lost_seen or now
                if now - self.lost_seen > self.slot.grace_s:
                    log.warning("job %s: its lease and its resource or concurrency slot were lost; its child "
                                "process %d is killed", current.job.id, self.child.pid,
                                extra={"job_id": current.job.id})
                    lost = StaleLease(f"job {current.job.id}: lease lost (reclaimed elsewhere) while its handler "
                                      f"ran; its child process was killed {self.slot.grace_s:g} s later")
                    self._killed(failure(current.fn, current.job, lost), now)
                    return None
            if current.flags.cancelled:
                # Asked to stop: a handler that does not within the grace is killed, and the
                # job ends cancelled as if it had stopped.
                self.cancel_seen = self.cancel_seen or now
                if now - self.cancel_seen > self.slot.grace_s:
                    self._killed(Dead(reason=CANCELLED, error={"type": "Cancelled", "message": "cancelled; "
                                             f"its child process was killed {self.slot.grace_s:g} s later"},
                                             refund=False), now)
                    return None
        elif waiting:
            # Nothing runs, yet jobs wait: the child handed them back, or it started one of
            # those that topped its queue up just after its last outcome (either answer is
            # on its way). Not answered within the grace, it is out of step: killed.
            self.stalled = self.stalled or now
            if now - self.stalled > self.slot.grace_s:
                log.warning("the child process %d did not start the jobs sent to it; they go back", self.child.pid)
                self.slot.kill()
                _release(list(waiting))
                return None
        if waiting and not self.recall_sent and (self.stopping() or now - self.began > RECALL_LATE_S or (
                now - self.began > RECALL_AFTER_S and self.starving())):
            self.recall_sent = now
            self.recalled()
            with contextlib.suppress(OSError):
                self.child.send({"op": "recall"})
        if now >= self.next_tell:
            self.next_tell = now + TELL_EVERY_S
            self._tell()
        if current is not None and now - max(self.began, self.asked_logs) >= ASK_LOGS_EVERY_S:
            # A handler running a while: its log lines so far, for whoever follows the job.
            self.asked_logs = now
            with contextlib.suppress(OSError):
                self.child.send({"op": "logs", "token": current.job.token})
        wait = 0.1 if current is None else min(0.1, self.deadline - now)
        if waiting and not self.recall_sent:
            # Past RECALL_AFTER_S the recall waits for an idle executor (looked at every
            # RECALL_LOOK_S) or RECALL_LATE_S: a wait of 0 there spun, most of a core for
            # most of a second per slow job.
            due = self.began + RECALL_AFTER_S
            wait = min(wait, due - now if now < due else min(RECALL_LOOK_S, self.began + RECALL_LATE_S - now))
        return max(0.0, wait)

    def _tell(self) -> None:
        """Send the flags that changed (a cancel, a lost lock) to the child: the running
        job's handler sees them, and a job waiting there is left out if cancelled."""
        for f in (self.current, *self.waiting):
            if f is None:
                continue
            now = (f.flags.lock_lost, f.flags.cancelled, f.flags.lease_until)
            if now != self.told.get(f.job.token, (False, False, 0.0)):
                self.told[f.job.token] = now
                with contextlib.suppress(OSError):
                    self.child.send({"op": "flag", "token": f.job.token, "lock_lost": now[0], "cancelled": now[1],
                                     "lease_until": now[2]})

    def _on(self, msg: dict[str, Any]) -> bool:
        """One message of the child's; False when the batch has ended here."""
        op = msg.get("op")
        current = self.current
        if op == "outcome":
            if current is None or msg["token"] != current.job.token:
                raise ValueError(f"an outcome of {msg['token']!r}, which is not running")
            return self._ended(current, msg)
        if op in ("recalled", "skipped"):
            for token in msg["tokens"]:
                self._back(token, op == "skipped")
            return True
        if op == "began":  # a batch's first job: its handler starts now
            if current is not None and msg.get("token") == current.job.token:
                current.charge()
            return True
        if op == "started":  # one that topped the queue up, started after the last outcome
            if current is not None:
                raise ValueError(f"{msg['token']!r} started while {current.job.token!r} runs")
            for token in msg.get("skipped") or ():
                self._back(token, True)
            self._start(self.by_token[msg["token"]], time.monotonic())
            return True
        if current is None or msg.get("token") != current.job.token:
            # A call from a thread of an earlier job (the child fences its own: this is
            # the second line): never applied to another.
            if op == "rpc":
                with contextlib.suppress(OSError):
                    self.child.send({"op": "reply", "rid": msg.get("rid"), "ok": False, "value": None})
        elif op == "progress":  # no reply: the child does not wait for it
            current.rpc({"call": "progress", "value": msg.get("value")})
        elif op == "log":  # the handler's lines so far (no reply), sent on with the renewal
            current.rpc({"call": "log", "lines": msg.get("lines"), "chunks": msg.get("chunks"),
                         "dropped": msg.get("dropped")})
        elif op == "rpc":
            with contextlib.suppress(OSError):
                self.child.send(_answer(current, msg))
        return True

    def _back(self, token: str, skipped: bool = False) -> None:
        """A job the child handed back (or left out, ``skipped``: cancelled) unstarted."""
        f = self.by_token[token]
        if f in self.waiting:
            self.waiting.remove(f)
            if skipped:
                log.info("job %s: cancelled while it waited in its child process; never started", f.job.id,
                         extra={"job_id": f.job.id})
            f.finish(Release(), 0.0)

    def _ended(self, current: Feed, msg: dict[str, Any]) -> bool:
        child, slot = self.child, self.slot
        now = time.monotonic()
        # The handler's own time, as the child measured it: the time between outcomes
        # here also holds this thread's waits for a core (and its lingering), which on a
        # loaded host made every job look slow and every batch small.
        took = float(msg.get("run_s") or 0.0)
        name = current.fn.name
        pace = slot.pace.get(name)
        slot.pace[name] = took if pace is None else pace + PACE_WEIGHT * (took - pace)
        child.jobs += 1
        if "rss_mb" in msg:  # (at a batch's end)
            child.rss_mb = float(msg["rss_mb"])
        for token in msg.get("skipped") or ():
            self._back(token, True)
        nxt = msg.get("next")
        self.current, self.last = None, current
        current.charge()  # (said already with "began", unless its child got no further)
        if msg.get("log") or msg.get("stream") or msg.get("log_dropped"):  # sent with its settlement
            current.rpc({"call": "log", "lines": msg.get("log"), "chunks": msg.get("stream"),
                         "dropped": msg.get("log_dropped")})
        current.finish(from_message(msg["outcome"]), float(msg.get("run_s") or 0.0))
        if nxt:  # taken off the child's queue before this outcome went: running now
            self._start(self.by_token[nxt], now)
        if msg.get("reuse") is False:
            # Its job timed out, or its handler left threads running: they would go on
            # beside the next job (and write into it). The child goes, with its group, and
            # the jobs it did not start go back.
            log.info("replacing the child process %d: %s", child.pid, msg.get("why") or "not reusable")
            slot.kill()
            _release(list(self.waiting))
            return False
        return True

    def _start(self, f: Feed, now: float) -> None:
        self.waiting.remove(f)
        self.current, self.began, self.stalled = f, now, 0.0
        self.deadline = now + f.fn.timeout_s + self.slot.grace_s
        self.cancel_seen = self.lost_seen = 0.0  # (its own grace: not from the job before's)
        f.started(self.child.pid)

    def _top_up(self) -> None:
        """Send the child more jobs claimed ahead while it still has one to run, so it
        never waits for the next batch's round trip."""
        current = self.current
        assert current is not None
        n = self.slot.room(current.fn, self.generation) - 1 - len(self.waiting)
        if n > 0 and not self.stopping():
            self._send_more(n)

    def _fill_now(self) -> bool:
        """The child ran its queue dry, and jobs claimed ahead came meanwhile (a top-up
        found none while its last job ran): they go to it now, in this batch, rather than
        after the batch's end, a gathering and a new batch's message, while the child
        waits. Not once stopping or recalling, nor to a child due for recycling, nor past
        FILL_MAX jobs in one batch (a batch's jobs are held by it until its end)."""
        last, child, q = self.last, self.child, self.slot.q
        if last is None or self.recall_sent or self.sent >= FILL_MAX or self.stopping() \
                or child.jobs >= q.max_jobs_per_child or child.rss_mb > q.max_rss_mb:
            return False
        if not self._send_more(self.slot.room(last.fn, self.generation)):
            return False
        # Timed as a batch of its own: the child says which job it starts ("started").
        self.began, self.stalled = time.monotonic(), 0.0
        return True

    def _send_more(self, n: int) -> bool:
        """Up to ``n`` more jobs claimed ahead to the child's queue; whether any went."""
        feeds = self.more(n)
        if not feeds:
            return False
        # Each claim's wait ends before its child gets it (a job whose lease was lost
        # meanwhile goes back instead).
        go = feeds[0].start(feeds[1:])
        _release([f for f, ok in zip(feeds, go, strict=True) if not ok])
        feeds = [f for f, ok in zip(feeds, go, strict=True) if ok]
        if not feeds:
            return False
        for f in feeds:
            self.by_token[f.job.token] = f
            self.waiting.append(f)
        self.sent += len(feeds)
        # (A child gone meanwhile: the next wait finds out, and these go back with the rest.)
        with contextlib.suppress(OSError):
            self.child.send({"op": "more", "jobs": [f.job.as_row() for f in feeds], **_confirm(feeds), **self.extra})
        return True

    def _lost(self, why: str) -> None:
        """The child died, or broke the protocol (``why``): the running job fails as an
        executor crash, the others go back."""
        slot, child = self.slot, self.child
        if why:
            log.error("the child process %d %s; it is killed", child.pid, why)
        slot.child = None
        if why:
            child.kill()
            code = child.proc.wait()
        else:
            code = child.end()
        current = self.current
        if current is not None and not why and slot.stopped:
            # The worker's stop killed it past its grace period: the job goes back
            # unspent, as the stop hands back each job it saw running (this one the child
            # may have started just after it looked).
            current.finish(Release("now", "interrupted"), time.monotonic() - self.began)
        elif current is not None:
            lines, lost = child.held  # held back in a flood when it died: the last ones (spill.py)
            if lines or lost:
                current.rpc({"call": "log", "lines": lines, "chunks": [], "dropped": lost})
            crash = ExecutorCrashed(f"executor crashed: the child process running the handler "
                                    f"{why or describe_exit(code)}")
            current.finish(failure(current.fn, current.job, crash), time.monotonic() - self.began)
        _release(list(self.waiting))


def _answer(feed: Feed, msg: dict[str, Any]) -> dict[str, Any]:
    """The reply to a handler's call (the child waits for one, whatever happened)."""
    rid = msg.get("rid")  # (the child matches each reply to its call by it: Child.ask)
    try:
        answer = feed.rpc(msg)
        return {"op": "reply", "rid": rid, "ok": bool(answer), "value": answer if isinstance(answer, dict) else None}
    except Exception as exc:
        # Redis away mid-call (or a bug): the handler hears it, as a thread's would, and
        # the child stays in step. Left without a reply, it blocked on, and the next job's
        # outcome was taken for this one's.
        return {"op": "reply", "rid": rid, "ok": False, "value": None, "failed": refusal_record(
            unreachable(exc) if isinstance(exc, UNAVAILABLE)
            else exc if isinstance(exc, RunnerError) else RunnerError(f"{type(exc).__name__}: {exc}"))}
