"""Batches of jobs sent to one child process (slot.py, child.py): what holds for a job
alone holds for each job of a batch. The first half drives a slot directly, with a real
child process and real handlers, so each batch is exactly the one named; the second
drains a real worker whose jobs go to its children in batches.

- A child that dies mid-batch fails only the job it was running; the jobs sent behind it
  go back unstarted (never run, no attempt spent).
- A job's TIMEOUT is timed from its own start, not from its batch's; when it kills the
  child, the jobs waiting behind it go back unstarted.
- A stop, or a job that runs long while another executor has nothing to do, recalls the
  jobs waiting behind it: they go back at once, unstarted, and the running one finishes.
- A job cancelled while it waits in a child is left out, never started, and handed back
  at once (not when its turn comes), so its cancel answers at once; started or left out,
  never both.
- A job that leaves a thread running ends its child's batch: the rest go back.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from crashkit import wait_final

from runner import JobEnded
from runner.catalog.registry import Function
from runner.client import Enqueued, Request
from runner.worker import slot as slot_mod
from runner.worker.context import Flags
from runner.worker.execute import Claimed, Done, Outcome, RetryLater
from runner.worker.ledger import Release, Run
from runner.worker.slot import RECALL_AFTER_S, Slot

from conftest import Project, wait_for

BATCHED = '''
import os, signal, threading, time
QUEUE = "fast"
ISOLATION = "process"
TIMEOUT = 2

def handle(payload, ctx):
    with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id), "a") as f:
        f.write(f"{os.getpid()} {time.monotonic()}\\n")
    what = payload.get("do", "")
    if what == "exit":
        os._exit(3)
    if what == "deaf":  # TIMEOUT's alarm never reaches it: only the kill stops it
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])
        time.sleep(30)
    if what == "thread":
        threading.Thread(target=time.sleep, args=(5,), daemon=True).start()
    while payload.get("until") and not os.path.exists(payload["until"]):  # the test lets it end
        time.sleep(0.01)
    time.sleep(payload.get("s", 0))
    return {"pid": os.getpid()}
'''


class Fed:
    """A job as an executor feeds it to a slot, keeping what the slot tells it."""

    def __init__(self, project: Project, fn: Function, job_id: str, payload: dict[str, Any], first: bool) -> None:
        now = int(time.time() * 1000)
        self.job = Claimed(job_id, f"token-{job_id}", 1, fn.name, "1", json.dumps(payload), 3, "", "", now, now, "",
                           "fast", now, first)
        self.run = Run(self.job)
        self.fn = fn
        self.flags = Flags()
        self.project = project
        self.began = 0.0  # monotonic, when the slot said its child started it
        self.charged = 0.0  # monotonic, when its handler started (its attempt counts)
        self.outcome: Outcome | Release | None = None
        self.ended = 0.0

    def hold(self) -> bool:
        return False

    def stop(self, held: bool) -> bool:
        return False

    def start(self, ahead: Sequence[Fed] = ()) -> list[bool]:
        return [True] * (1 + len(ahead))

    def started(self, pid: int, charge: bool = True) -> None:
        self.began = time.monotonic()
        if charge:
            self.charge()

    def charge(self) -> None:
        self.charged = self.charged or time.monotonic()

    def rpc(self, msg: dict[str, Any]) -> Any:
        return True

    def finish(self, outcome: Outcome | Release, run_s: float) -> None:
        assert self.outcome is None, f"{self.job.id} finished twice: {self.outcome} then {outcome}"
        self.outcome, self.ended = outcome, time.monotonic()

    def runs(self) -> list[str]:
        return self.project.runs(self.job.id)


@pytest.fixture
def slot(project: Project, monkeypatch: pytest.MonkeyPatch) -> Any:
    project.add_function("batched", BATCHED)
    project.add_function("batched_long", BATCHED.replace("TIMEOUT = 2", "TIMEOUT = 15"))
    project.write_config(grace=1)
    for k, v in project.env.items():  # the child inherits this process's environment
        monkeypatch.setenv(k, v)
    cfg = project.config()
    s = Slot(cfg.queues["fast"], cfg, 1.0)
    s.warm(1)
    assert s.child is not None and s.child.wait_ready()
    yield s
    s.close()


def batch(project: Project, *payloads: dict[str, Any], fn_name: str = "batched") -> list[Fed]:
    fn = project.runtime.registry.functions[fn_name]
    return [Fed(project, fn, f"j{i}", p, i == 0) for i, p in enumerate(payloads)]


def test_a_child_dying_mid_batch_fails_only_its_running_job(project: Project, slot: Slot) -> None:
    """Three jobs in one message; the second kills its child: the first is done, the second
    fails as "executor crashed" with the exit code, and the third goes back unstarted
    (a Release: never run, its attempt not spent)."""
    feeds = batch(project, {}, {"do": "exit"}, {})
    slot.run(feeds, 1, {}, lambda: False)
    first, crashed, behind = feeds
    assert isinstance(first.outcome, Done), first.outcome
    assert isinstance(crashed.outcome, RetryLater) and "executor crashed" in crashed.outcome.error["message"] \
        and "exited with code 3" in crashed.outcome.error["message"], crashed.outcome
    assert isinstance(behind.outcome, Release) and behind.outcome.mode == "now", behind.outcome
    assert behind.runs() == [] and behind.began == 0.0
    assert first.runs()[0].split()[0] == crashed.runs()[0].split()[0]  # one child ran both
    assert slot.child is None  # the next job gets a new one


def test_a_timeout_is_timed_from_the_jobs_own_start(project: Project, slot: Slot) -> None:
    """A job that runs 0.8 s, then one that never heeds its TIMEOUT (2 s) in the same
    child, then a third: the second is killed about TIMEOUT + grace (3 s) after its own
    start, not after its batch's (which would leave it 2.2 s); it fails as a timeout, and
    the third goes back unstarted."""
    feeds = batch(project, {"s": 0.8}, {"do": "deaf"}, {})
    sent = time.monotonic()
    slot.run(feeds, 1, {}, lambda: False)
    first, deaf, behind = feeds
    assert isinstance(first.outcome, Done), first.outcome
    assert isinstance(deaf.outcome, RetryLater) and deaf.outcome.error["type"] == "JobTimeout", deaf.outcome
    assert deaf.began - sent >= 0.75
    assert deaf.ended - deaf.began >= 2.9, (deaf.began - sent, deaf.ended - deaf.began)
    assert isinstance(behind.outcome, Release) and behind.runs() == []
    assert slot.child is None


def test_a_stop_recalls_the_jobs_waiting_behind_the_running_one(project: Project, slot: Slot) -> None:
    """A stop while a 1.5 s job runs with two jobs behind it in its child: those two go
    back at once (well before RECALL_LATE_S), unstarted; the running one finishes."""
    feeds = batch(project, {"s": 1.5}, {}, {})
    stopping = False

    def stop_soon() -> bool:
        return stopping

    started = time.monotonic()
    t = threading.Thread(target=slot.run, args=(feeds, 1, {}, stop_soon))
    t.start()
    wait_for(lambda: feeds[0].runs(), timeout=10, what="the first job to start")
    stopping = True
    wait_for(lambda: all(f.outcome is not None for f in feeds[1:]), timeout=0.8, what="the jobs behind to go back")
    assert feeds[0].outcome is None  # still running
    t.join(timeout=10)
    assert isinstance(feeds[0].outcome, Done) and feeds[0].ended - started >= 1.5
    assert all(isinstance(f.outcome, Release) and not f.runs() for f in feeds[1:]), feeds
    assert slot.child is not None  # the child serves on


def test_a_job_whose_lease_is_lost_after_another_in_its_batch_gets_the_whole_grace(
        project: Project, slot: Slot) -> None:
    """Two jobs in one child whose leases were lost with their concurrency slots (a worker
    frozen past its leases): the first ends on its own within the grace (3 s here); the
    second, which does not, is killed a whole grace after its own start, not a grace after
    the first's lost lease was seen (which left it about 2.2 s)."""
    slot.grace_s = 3.0
    feeds = batch(project, {"s": 0.8}, {"s": 10}, fn_name="batched_long")
    for f in feeds:
        f.run.lost = True
        f.flags.lock_lost = True
    slot.run(feeds, 1, {}, lambda: False)
    first, second = feeds
    assert isinstance(first.outcome, Done), first.outcome
    assert isinstance(second.outcome, RetryLater) and second.outcome.error["type"] == "StaleLease", second.outcome
    assert second.ended - second.began >= slot.grace_s, (second.began, second.ended - second.began)
    assert slot.child is None


def test_a_job_whose_child_the_stop_killed_goes_back_interrupted(project: Project, slot: Slot) -> None:
    """The worker's stop, past its grace period, kills a child while a job runs there (one
    it may have started after the stop looked which jobs ran): that job goes back unspent,
    "interrupted", not failed as an executor crash; the job behind it goes back too."""
    feeds = batch(project, {"s": 10}, {}, fn_name="batched_long")
    t = threading.Thread(target=slot.run, args=(feeds, 1, {}, lambda: False))
    t.start()
    wait_for(lambda: feeds[0].runs(), timeout=10, what="the first job to start")
    slot.stopped = True
    slot.kill()
    t.join(timeout=10)
    assert feeds[0].outcome == Release("now", "interrupted"), feeds[0].outcome
    assert feeds[1].outcome == Release() and not feeds[1].runs()
    assert slot.settled(0)


def test_a_slow_job_hands_back_the_jobs_behind_it_when_an_executor_is_idle(
        project: Project, slot: Slot) -> None:
    """A job that runs long (1 s) in a batch: once it has run RECALL_AFTER_S while another
    executor has nothing to run, the jobs behind it go back at once, unstarted."""
    feeds = batch(project, {"s": 1}, {}, {})
    slot.run(feeds, 1, {}, lambda: False, lambda: True)
    assert isinstance(feeds[0].outcome, Done)
    for f in feeds[1:]:
        assert isinstance(f.outcome, Release) and not f.runs(), f.outcome
        assert f.ended - feeds[0].began < 0.9, "handed back only at the slow job's end"
    assert RECALL_AFTER_S < 0.9


def test_the_watch_sleeps_while_a_slow_job_runs_with_jobs_behind_it(project: Project, slot: Slot) -> None:
    """A 3 s job with one behind it in its child, no executor idle (no early recall): the
    thread watching the batch sleeps while the handler runs, also between RECALL_AFTER_S
    and RECALL_LATE_S (it spun there, most of a core for most of a second, waiting for a
    recall it could not yet send); the job behind still goes back at RECALL_LATE_S."""
    feeds = batch(project, {"s": 3}, {}, fn_name="batched_long")
    cpu = time.thread_time()
    slot.run(feeds, 1, {}, lambda: False, lambda: False)
    used = time.thread_time() - cpu
    assert isinstance(feeds[0].outcome, Done), feeds[0].outcome
    assert isinstance(feeds[1].outcome, Release) and not feeds[1].runs(), feeds[1].outcome
    assert feeds[1].ended - feeds[0].began < 2.5, "handed back only at the slow job's end"
    assert used < 0.05, f"the watch used {used:.3f} s of CPU over a 3 s handler"


def test_a_job_cancelled_while_it_waits_in_a_child_never_starts(project: Project, slot: Slot) -> None:
    """A cancel of the second job while the first (0.5 s) runs: the second is left out,
    never started (handed back, which ends it cancelled), and the third runs."""
    feeds = batch(project, {"s": 0.5}, {}, {})

    def cancel_soon() -> bool:
        if feeds[0].runs():
            feeds[1].flags.cancelled = True
        return False

    slot.run(feeds, 1, {}, cancel_soon)
    assert isinstance(feeds[0].outcome, Done) and isinstance(feeds[2].outcome, Done)
    assert isinstance(feeds[1].outcome, Release) and not feeds[1].runs() and feeds[1].began == 0.0


def test_a_job_cancelled_while_it_waits_in_a_child_goes_back_while_the_one_ahead_runs(
        project: Project, slot: Slot, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job ahead runs until the test lets it end, and no recall comes (RECALL_LATE_S
    out of the way): the cancelled job behind it is handed back (never started) while the
    one ahead still runs, not when the child reaches it; the one after it still runs."""
    monkeypatch.setattr(slot_mod, "RECALL_LATE_S", 600.0)
    go = project.root / "go"
    feeds = batch(project, {"until": str(go)}, {}, {}, fn_name="batched_long")
    runner = threading.Thread(target=slot.run, args=(feeds, 1, {}, lambda: False), daemon=True)
    runner.start()
    try:
        wait_for(lambda: feeds[0].runs(), timeout=20, what="the job ahead to start")
        feeds[1].flags.cancelled = True
        wait_for(lambda: feeds[1].outcome is not None, timeout=10,
                 what="the cancelled job to be handed back while the one ahead runs")
        assert feeds[0].outcome is None and feeds[2].outcome is None
    finally:
        go.touch()
        runner.join(30)
    assert not runner.is_alive()
    assert isinstance(feeds[0].outcome, Done) and isinstance(feeds[2].outcome, Done)
    assert isinstance(feeds[1].outcome, Release) and not feeds[1].runs() and feeds[1].began == 0.0


def test_a_job_that_leaves_a_thread_ends_its_childs_batch(project: Project, slot: Slot) -> None:
    """A handler that leaves a thread running: its job is done, the child is not used
    again (the thread would run beside the next job), and the job behind it goes back."""
    feeds = batch(project, {"do": "thread"}, {})
    slot.run(feeds, 1, {}, lambda: False)
    assert isinstance(feeds[0].outcome, Done)
    assert isinstance(feeds[1].outcome, Release) and not feeds[1].runs()
    assert slot.child is None


def test_each_outcome_is_settled_as_its_job_ends(project: Project, slot: Slot) -> None:
    """A quick job ahead of a 1 s one: its outcome comes at once, not at its batch's end."""
    feeds = batch(project, {}, {"s": 1})
    slot.run(feeds, 1, {}, lambda: False)
    quick, slow = feeds
    assert isinstance(quick.outcome, Done) and isinstance(slow.outcome, Done)
    assert slow.ended - quick.ended >= 0.9


def test_a_batch_never_runs_a_child_past_max_jobs_per_child(project: Project, slot: Slot) -> None:
    """room() holds a batch to what the child has left before its recycling."""
    fn = project.runtime.registry.functions["batched"]
    slot.pace[fn.name] = 1e-5  # quick: the budget alone would allow BATCH_MAX
    assert slot.child is not None
    slot.child.jobs = slot.q.max_jobs_per_child - 3
    assert slot.room(fn, 1) == 3


def test_jobs_that_take_a_few_milliseconds_still_go_to_a_child_several_at_a_time(project: Project,
                                                                                  slot: Slot) -> None:
    """A handler's pace is its wall time, waits included: one Redis round trip on a busy
    2-core host took 2 to 6 ms. Such jobs still go to a child several in a message (each
    waits behind the others no longer than the recall would let it wait behind one slow
    job), not one message and one wake-up of the child per job; a slow function's go
    alone."""
    fn = project.runtime.registry.functions["batched"]
    slot.pace[fn.name] = 0.004
    assert slot.room(fn, 1) >= 8
    slot.pace[fn.name] = RECALL_AFTER_S
    assert slot.room(fn, 1) == 1


def test_jobs_that_top_a_childs_queue_up_run_each_from_its_own_start(project: Project, slot: Slot) -> None:
    """While the last job of a batch runs, more jobs claimed ahead join the child's queue
    (one message, none counted started at the send): each starts as the one before ends,
    its start known from that outcome, and each is settled as it ends."""
    feeds = batch(project, {"s": 0.3})
    extra = batch(project, {}, {})
    for i, f in enumerate(extra):  # (ids of their own, both claimed ahead)
        f.job.id, f.job.token, f.job.started = f"k{i}", f"token-k{i}", False
    given: list[int] = []
    slot.pace["batched"] = 1e-4  # quick, as a drain of these would have learnt

    def more(n: int) -> list[Fed]:
        given.append(n)
        return extra if len(given) == 1 else []

    slot.run(feeds, 1, {}, lambda: False, more=more)
    assert given and given[0] >= 2, given
    assert all(isinstance(f.outcome, Done) for f in feeds + extra), [f.outcome for f in feeds + extra]
    assert feeds[0].ended <= extra[0].began <= extra[0].ended <= extra[1].began
    assert len({line.split()[0] for f in feeds + extra for line in f.runs()}) == 1  # one child ran all


def test_a_child_that_ran_its_queue_dry_gets_the_jobs_that_came_meanwhile_in_the_same_batch(
        project: Project, slot: Slot) -> None:
    """No job was claimed ahead while the batch's last job ran (its top-up found none);
    two came meanwhile: they go to the child as its last job ends, in the same batch (not
    after the batch's end and a new batch's message), each started and settled on its
    own, in the one child."""
    feeds = batch(project, {"s": 0.3})
    extra = batch(project, {}, {})
    for i, f in enumerate(extra):  # (ids of their own, both claimed ahead)
        f.job.id, f.job.token, f.job.started = f"k{i}", f"token-k{i}", False
    asked: list[bool] = []  # for each ask, whether the first job had ended
    slot.pace["batched"] = 1e-4

    def more(n: int) -> list[Fed]:
        ended = feeds[0].outcome is not None
        asked.append(ended)
        return extra if ended and asked.count(True) == 1 else []

    slot.run(feeds, 1, {}, lambda: False, more=more)
    assert False in asked and True in asked, asked
    assert all(isinstance(f.outcome, Done) for f in feeds + extra), [f.outcome for f in feeds + extra]
    assert feeds[0].ended <= extra[0].began <= extra[0].ended <= extra[1].began
    assert len({line.split()[0] for f in feeds + extra for line in f.runs()}) == 1  # one child ran all


def test_a_child_idle_when_more_jobs_come_says_when_it_starts_one(project: Project, slot: Slot) -> None:
    """The race a top-up may lose: the child's last outcome already named no next job when
    more arrive. The child then says "started" before the job's outcome, so its parent
    counts the job from there (the protocol, driven by hand)."""
    child = slot.child
    assert child is not None
    first, late = batch(project, {}, {})
    child.send({"op": "run", "jobs": [first.job.as_row()]})
    began = child.channel.recv()  # a batch's first says when its handler starts
    assert began == {"op": "began", "token": first.job.token}, began
    out = child.channel.recv()
    assert out["op"] == "outcome" and out["token"] == first.job.token and "next" not in out, out
    child.send({"op": "more", "jobs": [late.job.as_row()]})
    said = [child.channel.recv(), child.channel.recv()]
    assert [m["op"] for m in said] == ["started", "outcome"], said
    assert said[0]["token"] == said[1]["token"] == late.job.token


# --- a real worker ------------------------------------------------------------------

def test_a_drain_with_crashes_and_timeouts_in_its_batches_spends_no_attempt_unrun(project: Project) -> None:
    """A process-isolated drain with prefetch, so jobs go to children in batches, with a
    crashing and a deaf (TIMEOUT-ignoring) job among 150 quick ones: every quick job is
    done at its first attempt and ran once (one behind a crash or a timeout went back
    unspent), the crashing job failed as "executor crashed" and the deaf one as a
    timeout."""
    project.add_function("batched", BATCHED.replace("TIMEOUT = 2", "TIMEOUT = 1\nMAX_ATTEMPTS = 1"))
    project.write_config(vt=5, grace=1, concurrency=2, prefetch=16, max_attempts=1)
    payloads: list[dict[str, Any]] = [{} for _ in range(150)]
    payloads[60] = {"do": "exit"}
    payloads[110] = {"do": "deaf"}
    made = project.client.enqueue_many([Request("batched", p) for p in payloads])
    ids = [e.id for e in made if isinstance(e, Enqueued)]
    project.spawn_worker("fast")
    final = wait_final(project, ids, timeout=120)
    for i, job_id in enumerate(ids):
        f = final[job_id]
        if i == 60:
            assert f["status"] == "dead" and "executor crashed" in json.dumps(f), f
        elif i == 110:
            assert f["status"] == "dead" and "JobTimeout" in json.dumps(f), f
        else:
            assert f["status"] == "done" and f["attempt"] == 1, (i, f)
            assert len(project.runs(job_id)) == 1, (i, project.runs(job_id))
    log = "".join(p.read_text() for p in Path(project.root).glob("worker-*.log"))
    assert "Traceback" not in log, log[-3000:]



def _final(project: Project, ids: Sequence[str], timeout: float = 60.0) -> dict[str, str]:
    """Each job's status once every one has ended (done, dead or cancelled)."""
    out: dict[str, str] = {}

    def ended() -> bool:
        for job_id in ids:
            if job_id not in out:
                st = project.client.get(job_id).status
                if st in ("done", "dead", "cancelled"):
                    out[job_id] = st
        return len(out) == len(ids)

    wait_for(ended, timeout=timeout, interval=0.05, what="every job to end")
    return out


def test_a_cancel_of_a_job_waiting_in_a_childs_queue_answers_while_the_job_ahead_runs(project: Project) -> None:
    """A worker's child is handed a batch: a job that runs until the test lets it end, then
    15 quick ones. A cancel of one of those answers "cancelled" while the job ahead still
    runs, before the recall (RECALL_LATE_S) hands the others back: as it answers, every
    job behind the running one still holds the claim it went to the child with. The
    cancelled job never runs; the others run once each."""
    project.add_function("batched", BATCHED.replace("TIMEOUT = 2", "TIMEOUT = 30"))
    project.write_config(vt=10, grace=1, concurrency=1, prefetch=32)
    client, r, k = project.client, project.runtime.redis, project.keys()
    project.spawn_worker("fast")
    warm = [e.id for e in client.enqueue_many([Request("batched", {}) for _ in range(40)]) if isinstance(e, Enqueued)]
    assert set(_final(project, warm).values()) == {"done"}  # the child's pace is known: a batch holds 16
    go = project.root / "go"
    made = client.enqueue_many([Request("batched", {"until": str(go)})] + [Request("batched", {}) for _ in range(15)])
    ids = [e.id for e in made if isinstance(e, Enqueued)]
    target, behind = ids[8], ids[1:8] + ids[9:]
    try:
        wait_for(lambda: project.runs(ids[0]), timeout=20, what="the job ahead to start")
        wait_for(lambda: all(r.hget(k.claims, i) for i in ids), timeout=10, what="every job's claim")
        claims = {i: r.hget(k.claims, i).split()[0] for i in behind}
        answer = client.cancel(target)
        now = {i: (r.hget(k.claims, i) or " ").split()[0] for i in behind}
        assert not project.runs(target)
    finally:
        go.touch()
    assert answer == "cancelled"
    assert now == claims, "the cancel answered only once the jobs behind the running one were handed back"
    final = _final(project, ids)
    assert final[target] == "cancelled" and not project.runs(target)
    for i in ids:
        if i != target:
            assert final[i] == "done" and len(project.runs(i)) == 1, (i, final[i], project.runs(i))


def test_cancels_timed_around_starts_in_children_never_cancel_a_job_that_ran(project: Project) -> None:
    """Quick jobs drained through two children in batches while two threads keep
    cancelling jobs claimed ahead (in the worker's inbox or waiting in a child's queue,
    the next to start among them): whether a child starts a job or leaves it out is
    decided once. No job both ran and ended cancelled, an answer "cancelled" means it
    never ran, and every other job ran once and is done."""
    project.add_function("batched", BATCHED)
    project.write_config(vt=10, grace=1, concurrency=2, prefetch=16)
    client, r, k = project.client, project.runtime.redis, project.keys()
    project.spawn_worker("fast")
    ran_and_cancelled: list[str] = []
    lock = threading.Lock()
    for round_ in range(3):
        made = client.enqueue_many([Request("batched", {"s": 0.003}) for _ in range(300)])
        ids = [e.id for e in made if isinstance(e, Enqueued)]
        mine = set(ids)
        answers: dict[str, str] = {}

        def cancel(seed: int, answers: dict[str, str] = answers, mine: set[str] = mine) -> None:
            rng = random.Random(seed)
            idle_since = time.monotonic()
            while len(answers) < 100 and time.monotonic() - idle_since < 1.0:
                ahead = [i for i, c in r.hgetall(k.claims).items() if i in mine and "p" in c.split()[3]]
                with lock:
                    ahead = [i for i in ahead if i not in answers]
                    job_id = rng.choice(ahead) if ahead else None
                    if job_id is not None:
                        answers[job_id] = "asked"
                if job_id is None:
                    time.sleep(0.001)
                    continue
                idle_since = time.monotonic()
                try:
                    answers[job_id] = client.cancel(job_id)
                except JobEnded:
                    answers[job_id] = "ended"

        threads = [threading.Thread(target=cancel, args=(round_ * 2 + i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        final = _final(project, ids, timeout=120)
        for job_id in ids:
            runs = project.runs(job_id)
            if final[job_id] == "cancelled" and runs:
                ran_and_cancelled.append(job_id)
            if answers.get(job_id) == "cancelled":
                assert final[job_id] == "cancelled" and not runs, (job_id, final[job_id], runs)
            if final[job_id] != "cancelled":
                assert final[job_id] == "done" and len(runs) == 1, (job_id, final[job_id], runs)
    assert ran_and_cancelled == []
    log = "".join(p.read_text() for p in Path(project.root).glob("worker-*.log"))
    assert "Traceback" not in log, log[-3000:]
    assert "cancelled while it waited in its child process" in log, "no cancel met a job waiting in a child"
