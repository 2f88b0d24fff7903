"""A warm child's signal settings are its own: what one job's handler changes (a SIGTERM
handler, asyncio's signal handlers, a SIGALRM handler, SIGCHLD ignored) does not carry
into the next job the same child runs. Real workers, real children; concurrency 1, so
the second job runs in the first one's child (each test checks the pid)."""

from __future__ import annotations

from pathlib import Path

from crashkit import rec, wait_final
from test_child_processes import sigterm_everything, spawn_leader

from conftest import Project, wait_for

SIGNALS = '''
import asyncio, ctypes, os, signal, subprocess, sys, threading, time
from runner import JobTimeout
QUEUE = "fast"
ISOLATION = "process"
TIMEOUT = {timeout}
MAX_ATTEMPTS = 1

def _note(ctx, line):
    with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id), "a") as f:
        f.write(line + "\\n")

async def _tidy():
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, lambda: None)
    await asyncio.sleep(0.01)
    loop.remove_signal_handler(signal.SIGTERM)  # (asyncio leaves SIG_DFL behind)

def _stop_while_encoding(ctx):
    """SIGTERM to the worker and to its child's group (a stop to every process) once the
    child's main thread is in runner's encoding of the result (the thread gets the GIL
    there: encoding 5 MB takes longer than Python's switch interval)."""
    main = threading.main_thread().ident
    def watch():
        for _ in range(20000):
            f, names = sys._current_frames().get(main), []
            while f is not None:
                names.append(f.f_code.co_name)
                f = f.f_back
            if "outcome_of" in names:
                _note(ctx, "stop")
                os.kill(os.getppid(), signal.SIGTERM)
                os.killpg(0, signal.SIGTERM)
                return
            time.sleep(0.0005)
    threading.Thread(target=watch).start()

def handle(payload, ctx):
    k = payload["k"]
    if k == "exit-on-term":  # the "flush and exit on SIGTERM" idiom
        signal.signal(signal.SIGTERM, lambda s, f: sys.exit(0))
    elif k == "exit-on-term-big":  # the same, and a result that takes a while to encode
        signal.signal(signal.SIGTERM, lambda s, f: sys.exit(0))
        _stop_while_encoding(ctx)
        return [{{"k": i, "v": [i, i + 1, "x" * 10]}} for i in range(120000)]
    elif k == "term-put-back":  # a tidy handler: SIGTERM's action saved, then put back
        old = signal.signal(signal.SIGTERM, lambda s, f: None)
        signal.signal(signal.SIGTERM, old)
    elif k == "c-read":  # C code blocked in read() on a pipe, which does not retry EINTR
        r, w = os.pipe()
        def writer():
            signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM, signal.SIGINT])
            go = os.path.join(os.environ["RECORD_DIR"], "go")
            while not os.path.exists(go):
                time.sleep(0.01)
            os.write(w, b"x")
        t = threading.Thread(target=writer)
        t.start()
        _note(ctx, f"start {{os.getpid()}}")
        libc = ctypes.CDLL(None, use_errno=True)
        n = libc.read(r, ctypes.create_string_buffer(1), 1)
        e = ctypes.get_errno()
        t.join()
        os.close(r)
        os.close(w)
        if n != 1:
            raise OSError(e, "read: " + os.strerror(e))
        return {{"pid": os.getpid()}}
    elif k == "asyncio":
        asyncio.run(_tidy())
    elif k == "alarm":  # a library's own signal.alarm timeout, its handler left behind
        signal.signal(signal.SIGALRM, lambda s, f: None)
    elif k == "ignore-children":  # the old "no zombies" idiom
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    elif k == "long":
        _note(ctx, f"start {{os.getpid()}}")
        time.sleep(payload["s"])
    elif k == "spin":
        _note(ctx, f"start {{os.getpid()}}")
        try:
            while True:
                sum(range(1000))
        except JobTimeout:
            _note(ctx, "JobTimeout")
            raise
    elif k == "tool":
        return {{"pid": os.getpid(), "code": subprocess.run(["sh", "-c", "exit 3"]).returncode}}
    return {{"pid": os.getpid()}}
'''


def _first(project: Project, kind: str, timeout: int = 20) -> int:
    """A worker (leading its own group) whose one child ran a job of ``kind``: the child's pid."""
    project.add_function("sig", SIGNALS.format(timeout=timeout))
    project.write_config(vt=5, grace=15, concurrency=1, prefetch=0, max_attempts=1)
    job = project.client.enqueue("sig", {"k": kind}).id
    w = spawn_leader(project, "fast")
    final = wait_final(project, [job])[job]
    assert final["status"] == "done", final
    assert w.poll() is None
    return int(final["result"]["pid"])


def _stopped_while_the_next_job_runs(project: Project, kind: str) -> None:
    """A job of ``kind``, then a 2 s job in the same child, and a stop that signals every
    process half a second into it: the second job finishes within the grace period."""
    pid = _first(project, kind)
    w = project.procs[-1]
    job = project.client.enqueue("sig", {"k": "long", "s": 2}).id
    wait_for(lambda: project.runs(job), timeout=30, what="the second job's start")
    assert project.runs(job) == [f"start {pid}"]  # the same child
    sigterm_everything(w.pid)
    assert w.wait(timeout=30) == 0
    final = rec(project, job)
    assert final["status"] == "done" and final["attempt"] == 1, final


def test_a_sigterm_handler_left_by_a_job_does_not_kill_the_next_one_at_a_stop(project: Project) -> None:
    """A handler that installed its own SIGTERM handler (sys.exit on SIGTERM) and returned:
    the next job in its child still gets the grace period at a stop to every process
    (it went dead at once with SystemExit)."""
    _stopped_while_the_next_job_runs(project, "exit-on-term")


def test_asyncio_signal_handlers_added_and_removed_leave_the_stop_to_the_worker(project: Project) -> None:
    """asyncio's add_signal_handler then remove_signal_handler leaves SIGTERM at SIG_DFL:
    the next job in that child still gets the grace period at a stop to every process
    (it was killed by SIGTERM, "executor crashed")."""
    _stopped_while_the_next_job_runs(project, "asyncio")


def test_a_sigalrm_handler_left_by_a_job_does_not_swallow_the_next_ones_timeout(project: Project) -> None:
    """A SIGALRM handler a job left behind: the next job in that child still gets
    JobTimeout at its TIMEOUT (it never did, and was killed after timeout_grace)."""
    pid = _first(project, "alarm", timeout=1)
    job = project.client.enqueue("sig", {"k": "spin"}).id
    final = wait_final(project, [job])[job]
    assert project.runs(job) == [f"start {pid}", "JobTimeout"], final


def test_sigchld_ignored_by_a_job_does_not_hide_a_later_tools_exit_status(project: Project) -> None:
    """SIGCHLD set to SIG_IGN by one job: a later job's tool in the same child still
    reports its exit status (subprocess said 0 for ``exit 3``)."""
    pid = _first(project, "ignore-children")
    job = project.client.enqueue("sig", {"k": "tool"}).id
    final = wait_final(project, [job])[job]
    assert final["status"] == "done" and final["result"] == {"pid": pid, "code": 3}, final


def test_a_stop_while_runner_encodes_a_result_leaves_the_finished_job_done(project: Project) -> None:
    """A handler that installed its own SIGTERM handler (sys.exit) and returned a 5 MB
    result, and a stop to every process while the child encodes it: the job is done,
    within the grace period (the handler's SIGTERM handler ran in runner's encoding and
    ended the child: "executor crashed", dead at MAX_ATTEMPTS 1)."""
    project.add_function("sig", SIGNALS.format(timeout=20))
    project.write_config(vt=5, grace=15, concurrency=1, prefetch=0, max_attempts=1,
                         worker="max_result_bytes = 20000000")
    job = project.client.enqueue("sig", {"k": "exit-on-term-big"}).id
    w = spawn_leader(project, "fast")
    final = wait_final(project, [job])[job]
    assert project.runs(job) == ["stop"]  # the stop came, while the child encoded the result
    assert w.wait(timeout=30) == 0
    assert final["status"] == "done" and final["attempt"] == 1 and len(final["result"]) == 120000, \
        {k: v for k, v in final.items() if k != "result"}


def _in_read(pid: int) -> bool:
    """The process's main thread is blocked in read() (x86-64 and arm64 numbers)."""
    try:
        call = Path(f"/proc/{pid}/syscall").read_text().split()[0]
    except (OSError, IndexError):
        return False
    return call in ("0", "63")


def test_a_handler_that_put_sigterm_back_leaves_the_next_jobs_c_read_restarted(project: Project) -> None:
    """A handler that saved SIGTERM's action and put it back (signal.signal clears
    SA_RESTART): the next job in that child, blocked in C code's read() on a pipe, goes
    on through a stop to every process and is done (read failed with EINTR: dead)."""
    pid = _first(project, "term-put-back")
    w = project.procs[-1]
    job = project.client.enqueue("sig", {"k": "c-read"}).id
    wait_for(lambda: project.runs(job), timeout=30, what="the second job's start")
    assert project.runs(job) == [f"start {pid}"]  # the same child
    wait_for(lambda: _in_read(pid), timeout=10, what="the child blocked in read()")
    sigterm_everything(w.pid)
    (project.records / "go").write_text("")
    assert w.wait(timeout=30) == 0
    final = rec(project, job)
    assert final["status"] == "done" and final["attempt"] == 1, final


BATCH_SIGNALS = '''
import os, signal, sys, threading, time
QUEUE = "fast"
ISOLATION = "process"
TIMEOUT = 20
MAX_ATTEMPTS = 1
BATCH = {"size": 4, "wait": 0.1}

def _stop_while_encoding(job_id):
    main = threading.main_thread().ident
    def watch():
        for _ in range(20000):
            f, names = sys._current_frames().get(main), []
            while f is not None:
                names.append(f.f_code.co_name)
                f = f.f_back
            if "outcome_of" in names:
                with open(os.path.join(os.environ["RECORD_DIR"], job_id), "a") as out:
                    out.write("stop\\n")
                os.kill(os.getppid(), signal.SIGTERM)
                os.killpg(0, signal.SIGTERM)
                return
            time.sleep(0.0005)
    threading.Thread(target=watch).start()

def handle_batch(payloads, ctx):
    signal.signal(signal.SIGTERM, lambda s, f: sys.exit(0))
    _stop_while_encoding(ctx.jobs[0].id)
    return [[{"k": i, "v": [i, i + 1, "x" * 10]} for i in range(120000)] for _ in payloads]
'''


def test_a_stop_while_runner_encodes_a_batchs_results_leaves_its_jobs_done(project: Project) -> None:
    """The same for handle_batch: its SIGTERM handler (sys.exit), a 5 MB result, and a
    stop to every process while the child encodes it: the job is done (it was dead,
    "executor crashed")."""
    project.add_function("bsig", BATCH_SIGNALS)
    project.write_config(vt=5, grace=15, concurrency=1, prefetch=0, max_attempts=1,
                         worker="max_result_bytes = 20000000")
    job = project.client.enqueue("bsig", {}).id
    w = spawn_leader(project, "fast")
    final = wait_final(project, [job])[job]
    assert project.runs(job) == ["stop"]
    assert w.wait(timeout=30) == 0
    assert final["status"] == "done" and final["attempt"] == 1 and len(final["result"]) == 120000, \
        {k: v for k, v in final.items() if k != "result"}
