"""Process isolation on a real platform: a stop signal to every process (Heroku, systemd's
KillMode=control-group, honcho), a worker killed while a job waits for its child, and
children that crash, time out or leave work behind. Real workers, real children."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from chaoskit import descendants
from crashkit import outcomes, rec, wait_final

from runner.store.embedded import Server

from conftest import Project, make_project, size, wait_for

PWORK = '''
import os, time
QUEUE = "fast"
ISOLATION = "process"
TIMEOUT = 20
MAX_ATTEMPTS = 1

def handle(payload, ctx):
    with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id), "a") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(payload.get("s", 0))
    return {"pid": os.getpid()}
'''


def spawn_leader(project: Project, *queues: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A worker leading a process group of its own, as a PaaS or honcho starts one."""
    args = [sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"), "worker"]
    for q in queues:
        args += ["--queue", q]
    log = open(project.root / f"worker-{len(project.procs)}.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen(args, cwd=project.root, env={**project.env, **(env or {})}, stdout=log,
                            stderr=subprocess.STDOUT, process_group=0)
    project.procs.append(proc)
    return proc


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def sigterm_everything(pid: int) -> None:
    """What Heroku and systemd's KillMode=control-group do at a stop: SIGTERM to the
    worker's group and to every process under it, whatever its group."""
    os.killpg(pid, signal.SIGTERM)
    for p in descendants(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGTERM)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, server: Server) -> Iterator[Project]:
    """One project and one worker (one slot, nothing claimed ahead, one attempt) for the
    module's tests that only enqueue jobs of functions of their own and read their
    outcomes (and the lines the worker's output gained meanwhile, see ``_output_since``):
    a worker per test (its start, imports and first child) was most of such a test's
    time. Every function is there before the worker starts, which loads them all."""
    project = make_project(tmp_path_factory.mktemp("served"), server)
    functions = {"forks_thread": FORKS.format(isolation="thread"), "forks_process": FORKS.format(isolation="process"),
                 "exits_thread": EXITS.format(isolation="thread"), "exits_process": EXITS.format(isolation="process"),
                 "threaded": THREADED, "heartbeat": HEARTBEAT, "bigresult": BIGRESULT, "at_the_cap": AT_THE_CAP,
                 "logsaline": LOGS_A_LINE, "redirects": REDIRECTS,
                 "calls_at_once_thread": CALLS_AT_ONCE.format(isolation="thread"),
                 "calls_at_once_process": CALLS_AT_ONCE.format(isolation="process"),
                 "parked_a": PARKED, "parked_b": PARKED}
    for name, source in functions.items():
        project.add_function(name, source)
    project.write_config(vt=5, concurrency=1, prefetch=0, max_attempts=1)
    project.spawn_worker("fast")
    try:
        yield project
    finally:
        project.close()


def _output_since(project: Project, start: int) -> str:
    """The shared worker's output from byte ``start`` on (what it wrote during a test)."""
    with open(project.root / "worker-0.log", "rb") as f:
        f.seek(start)
        return f.read().decode(errors="replace")


def _output_size(project: Project) -> int:
    return (project.root / "worker-0.log").stat().st_size


def test_a_sigterm_to_every_process_lets_the_running_handler_finish(project: Project) -> None:
    """A stop that signals every process of the worker (not the worker alone) behaves as a
    SIGTERM to the worker: the handler running in a child finishes within the grace
    period, and the job claimed ahead goes back without spending an attempt."""
    project.add_function("pwork", PWORK)
    project.write_config(vt=5, grace=15, concurrency=1, prefetch=1, max_attempts=1)
    c = project.client
    running = c.enqueue("pwork", {"s": 2}).id
    w = spawn_leader(project, "fast")
    wait_for(lambda: project.runs(running), timeout=30, what="the handler to start")
    ahead = c.enqueue("pwork", {}).id
    wait_for(lambda: rec(project, ahead)["status"] == "processing", timeout=10, what="the next job's claim")
    sigterm_everything(w.pid)
    assert w.wait(timeout=30) == 0
    final = rec(project, running)
    assert final["status"] == "done" and final["attempt"] == 1, final
    back = rec(project, ahead)
    assert back["status"] == "queued" and back["attempt"] == 0, back
    assert not project.runs(ahead)


def test_handlers_past_the_grace_period_go_back_unspent_however_their_children_die(project: Project) -> None:
    """A stop to every process while handlers in children run past the grace period: each
    child is killed and its job goes back at once, ``interrupted``, no attempt spent. The
    slot watching a child saw it die and settled the job "executor crashed" (an attempt
    spent; with MAX_ATTEMPTS 1, dead) whenever it got there before the stop's hand-back: 7
    of 19 jobs. The stop marks each run handed back before it kills the child, and the
    settler keeps only the hand-back of a run so marked."""
    project.add_function("pwork", PWORK)
    project.write_config(vt=5, grace=1, concurrency=6, max_attempts=1)
    c = project.client
    ids = [c.enqueue("pwork", {"s": 60}).id for _ in range(6)]
    w = spawn_leader(project, "fast")
    wait_for(lambda: all(project.runs(i) for i in ids), timeout=60, what="the six handlers to start")
    sigterm_everything(w.pid)
    assert w.wait(timeout=30) == 0
    for i in ids:
        r = rec(project, i)
        assert r["status"] == "queued" and r["attempt"] == 0, r
        assert outcomes(r) == ["interrupted"], r


def test_a_stop_under_honcho_lets_the_running_handler_finish(project: Project) -> None:
    """The Procfile's worker line under honcho, stopped the way honcho stops it (SIGTERM to
    each process group): the handler running in a child finishes, nothing is killed."""
    project.add_function("pwork", PWORK)
    project.write_config(vt=5, grace=15, concurrency=1, prefetch=1, max_attempts=1)
    (project.root / "Procfile").write_text("worker: runner worker --queue fast\n")
    env = {**project.env, "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
           "RUNNER_CONFIG": str(project.root / "runner.toml")}
    running = project.client.enqueue("pwork", {"s": 2}).id
    log = project.root / "honcho.log"
    honcho = subprocess.Popen([sys.executable, "-m", "honcho", "start", "worker"], cwd=project.root, env=env,
                              stdout=log.open("wb"), stderr=subprocess.STDOUT)
    project.procs.append(honcho)
    wait_for(lambda: project.runs(running), timeout=30, what="the handler to start")
    ahead = project.client.enqueue("pwork", {}).id
    wait_for(lambda: rec(project, ahead)["status"] == "processing", timeout=10, what="the next job's claim")
    honcho.send_signal(signal.SIGTERM)
    honcho.wait(timeout=30)
    out = log.read_text(errors="replace")
    assert "SIGKILL" not in out, out
    final = rec(project, running)
    assert final["status"] == "done" and final["attempt"] == 1, final
    back = rec(project, ahead)
    assert back["status"] == "queued" and back["attempt"] == 0, back


BLOCKED_IN_C = '''
import ctypes, os, threading, time
QUEUE = "fast"
ISOLATION = "{isolation}"
TIMEOUT = 20
MAX_ATTEMPTS = 1

def handle(payload, ctx):
    r, w = os.pipe()
    threading.Timer(3.0, os.write, (w, b"x")).start()
    with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id), "a") as f:
        f.write("started\\n")
    buf = ctypes.create_string_buffer(1)
    got = ctypes.CDLL(None, use_errno=True).read(r, buf, 1)  # C code that does not retry on EINTR
    if got != 1:
        raise OSError(ctypes.get_errno(), "read interrupted")
    return {{"read": got}}
'''


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_handler_blocked_in_c_goes_on_through_a_stop_to_every_process(project: Project, isolation: str) -> None:
    """A stop's SIGTERM to every process while a handler is blocked in a C read that does
    not retry an interrupted call: the read goes on (the signal's system calls restart),
    and the job is done within the grace period under both isolations (under process
    isolation the child's no-op handler interrupted the read: the job went dead)."""
    project.add_function("blocked", BLOCKED_IN_C.format(isolation=isolation))
    final = _stopped_mid_run(project, "blocked", sigterm_everything)
    assert final["status"] == "done", final


def _stopped_mid_run(project: Project, name: str, stop: Callable[[int], None]) -> dict[str, str]:
    """One job of ``name`` on a worker leading its own process group, ``stop`` sent to the
    worker's pid half a second into the handler's run: the job's record once the worker
    exited (cleanly, as a stop lets it)."""
    project.write_config(vt=5, grace=15, concurrency=1, prefetch=0, max_attempts=1)
    job = project.client.enqueue(name, {}).id
    w = spawn_leader(project, "fast")
    wait_for(lambda: project.runs(job), timeout=30, what="the handler to start")
    time.sleep(0.5)  # into the handler's blocking work
    stop(w.pid)
    assert w.wait(timeout=30) == 0
    return rec(project, job)


FORKS = '''
import multiprocessing, os, signal, subprocess, time
QUEUE = "fast"
ISOLATION = "{isolation}"
TIMEOUT = 20

def handle(payload, ctx):
    p = multiprocessing.get_context("fork").Process(target=time.sleep, args=(30,))
    p.start()
    time.sleep(0.3)
    p.terminate()
    p.join(5)
    code = p.exitcode
    if code is None:
        p.kill()
        p.join()
    tool = subprocess.Popen(["sleep", "30"])
    time.sleep(0.3)
    tool.send_signal(signal.SIGINT)
    try:
        tool_code = tool.wait(5)
    except subprocess.TimeoutExpired:
        tool.kill()
        tool_code = None
    return {{"terminated": code, "interrupted": tool_code}}
'''


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_handlers_forks_and_tools_get_the_default_signal_actions(served: Project, isolation: str) -> None:
    """A process the handler forks stops on Process.terminate() (it inherited runner's
    SIGTERM handler and ran on), and a tool it starts stops on SIGINT (the child's SIGINT
    was ignored, and a tool inherits that), under both isolations."""
    c = served.client
    job = c.enqueue(f"forks_{isolation}", {}).id
    view = c.wait(job, 40)
    assert view.status == "done", view.as_dict()
    assert view.as_dict()["result"] == {"terminated": -signal.SIGTERM, "interrupted": -signal.SIGINT}, view.as_dict()


POOLED = '''
import multiprocessing, os, time
QUEUE = "fast"
TIMEOUT = 20
MAX_ATTEMPTS = 1

def handle(payload, ctx):
    with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id), "a") as f:
        f.write("started\\n")
    with multiprocessing.get_context("fork").Pool(2) as pool:  # (time.sleep: a function it can pickle)
        return {{"naps": len(pool.map(time.sleep, [2, 2]))}}
'''


def test_a_thread_handlers_pool_goes_on_through_a_stop_to_the_workers_group(project: Project) -> None:
    """A thread handler whose work runs in a fork Pool, and a stop's SIGTERM to the
    worker's process group (honcho, kill -TERM -- -PGID): the Pool's processes are in a
    group of their own, so the work goes on and the job is done within the grace period
    (with the default SIGTERM action that lets Process.terminate() work, they died with
    the stop, and the job with them)."""
    project.add_function("pooled", POOLED.format())
    final = _stopped_mid_run(project, "pooled", lambda pid: os.killpg(pid, signal.SIGTERM))
    assert final["status"] == "done", final


SPAWNED = '''
import concurrent.futures, multiprocessing, os, time
QUEUE = "fast"
TIMEOUT = 30
MAX_ATTEMPTS = 1

def handle(payload, ctx):
    mp = multiprocessing.get_context(payload["method"])
    if payload["kind"] == "pool":
        pool = mp.Pool(2)
    else:
        pool = concurrent.futures.ProcessPoolExecutor(2, mp_context=mp)
    with pool:
        list(pool.map(abs, [1, 2]))  # its processes are up
        with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id), "a") as f:
            f.write(f"{os.getpid()}\\n")
        return {"naps": len(list(pool.map(time.sleep, [3, 3])))}
'''


@pytest.mark.parametrize(("method", "kind", "under"), [("spawn", "pool", "killpg"),
                                                      ("forkserver", "executor", "killpg"),
                                                      ("spawn", "executor", "honcho")])
def test_a_thread_handlers_spawned_pool_goes_on_through_a_stop_to_the_workers_group(
        project: Project, method: str, kind: str, under: str) -> None:
    """A thread handler whose work runs in a "spawn" Pool or a "forkserver"
    ProcessPoolExecutor, and a stop's SIGTERM to the worker's process group 1 s into its
    3 s of work (``kill -TERM -- -PGID``, or honcho stopping the Procfile's worker): the
    pool's processes (started by fork and exec, which runs no at-fork hook) were in the
    worker's group and died at once, and the job with them; they are in a group of their
    own now, so the job is done within the grace period, run once."""
    project.add_function("spawned", SPAWNED)
    project.write_config(vt=5, grace=10, concurrency=1, prefetch=0, max_attempts=1)
    job = project.client.enqueue("spawned", {"method": method, "kind": kind}).id
    if under == "honcho":
        (project.root / "Procfile").write_text("worker: runner worker --queue fast\n")
        env = {**project.env, "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
               "RUNNER_CONFIG": str(project.root / "runner.toml")}
        log = project.root / "honcho.log"
        w = subprocess.Popen([sys.executable, "-m", "honcho", "start", "worker"], cwd=project.root, env=env,
                             stdout=log.open("wb"), stderr=subprocess.STDOUT)
        project.procs.append(w)
    else:
        w = spawn_leader(project, "fast")
    wait_for(lambda: project.runs(job), timeout=60, what="the pool to start")
    time.sleep(1.0)  # into the pool's work
    if under == "honcho":
        w.send_signal(signal.SIGTERM)
        w.wait(timeout=30)
        assert "SIGKILL" not in log.read_text(errors="replace")
    else:
        os.killpg(w.pid, signal.SIGTERM)
        assert w.wait(timeout=30) == 0
    final = rec(project, job)
    assert final["status"] == "done" and final["attempt"] == 1, final
    assert final["result"] == {"naps": 2}, final
    assert len(project.runs(job)) == 1


SPAWNED_LONG = '''
import multiprocessing, os, time
QUEUE = "fast"
TIMEOUT = 40

def handle(payload, ctx):
    with multiprocessing.get_context(payload.get("method", "spawn")).Pool(2) as pool:
        list(pool.map(abs, [1, 2]))
        pids = " ".join(str(p.pid) for p in multiprocessing.active_children())
        with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id), "a") as f:
            f.write(pids + "\\n")
        return len(pool.map(time.sleep, [60, 60]))
'''


def _running(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z"


def _kill_and_see_gone(w: subprocess.Popen[Any], pids: list[int], *, group: bool, what: str) -> None:
    """SIGKILL the worker (alone, or with its whole group), then wait for ``pids`` to die;
    whatever is left is killed, so a failure leaves nothing running."""
    try:
        if group:
            os.killpg(w.pid, signal.SIGKILL)
        else:
            w.kill()
        w.wait(timeout=10)
        wait_for(lambda: not any(_running(p) for p in pids), timeout=10, what=f"{what} to die")
    finally:
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)


@pytest.mark.parametrize(("method", "kill"), [("spawn", "worker"), ("fork", "worker"), ("fork", "group")])
def test_a_thread_handlers_pool_dies_with_its_worker(project: Project, method: str, kill: str) -> None:
    """The group a thread handler's pool processes are put in dies with the worker: a
    worker SIGKILLed alone, or with its whole group (a supervisor's last resort), leaves
    none of them running. Spawned ones ran on, orphaned, in the worker's group until a
    kill of that whole group; a fork Pool's, each in a group of its own, ran on through
    both, beside the job's retry."""
    project.add_function("spawned", SPAWNED_LONG)
    project.write_config(vt=5, concurrency=1, prefetch=0)
    job = project.client.enqueue("spawned", {"method": method}).id
    w = spawn_leader(project, "fast")
    wait_for(lambda: project.runs(job), timeout=60, what="the pool to start")
    pids = [int(p) for p in project.runs(job)[0].split()]
    assert len(pids) == 2 and all(_running(p) for p in pids), pids
    _kill_and_see_gone(w, pids, group=kill == "group", what="the pool's processes")


FORKED_TWICE = '''
import multiprocessing, os, time
QUEUE = "fast"
TIMEOUT = 40

def nap(path):
    with open(path, "a") as f:
        f.write(f"{os.getpid()} ")
    time.sleep(60)

def fork_again(path):
    multiprocessing.get_context("fork").Process(target=nap, args=(path,)).start()
    nap(path)

def handle(payload, ctx):
    path = os.path.join(os.environ["RECORD_DIR"], ctx.job_id)
    p = multiprocessing.get_context("fork").Process(target=fork_again, args=(path,))
    p.start()
    p.join()
'''


def test_a_thread_handlers_forks_of_forks_die_with_its_worker_and_not_with_a_stop(project: Project) -> None:
    """A thread handler's fork and that fork's own fork: both out of the worker's group (a
    stop's SIGTERM to it does not reach them), in one group, and gone once the worker is
    SIGKILLed alone."""
    project.add_function("twice", FORKED_TWICE)
    project.write_config(vt=5, concurrency=1, prefetch=0)
    job = project.client.enqueue("twice", {}).id
    w = spawn_leader(project, "fast")
    pids = wait_for(lambda: [int(p) for p in project.runs(job)[0].split()] if project.runs(job)
                    and len(project.runs(job)[0].split()) == 2 else None, timeout=60, what="both forks")
    groups = {os.getpgid(p) for p in pids}
    try:
        assert len(groups) == 1 and w.pid not in groups, (groups, w.pid)
    finally:
        _kill_and_see_gone(w, pids, group=False, what="both forks")


EXITS = '''
import os, sys
QUEUE = "fast"
ISOLATION = "{isolation}"
MAX_ATTEMPTS = 1

def handle(payload, ctx):
    if payload["how"] == "exit":
        sys.exit(3)
    if payload["how"] == "interrupt":
        raise KeyboardInterrupt()
    return {{"pid": os.getpid()}}
'''


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_sys_exit_or_keyboard_interrupt_from_a_handler_is_its_failure_with_a_traceback(
        served: Project, isolation: str) -> None:
    """sys.exit(3) or KeyboardInterrupt raised by a handler fails its attempt with the
    exception's type and traceback under both isolations, and the child lives on for the
    next job (it died: "executor crashed ... exited with code 3", no traceback)."""
    c, name = served.client, f"exits_{isolation}"
    before = c.wait(c.enqueue(name, {"how": "ok"}).id, 30).as_dict()
    assert before["status"] == "done", before
    for how, kind in (("exit", "SystemExit"), ("interrupt", "KeyboardInterrupt")):
        view = c.wait(c.enqueue(name, {"how": how}).id, 30).as_dict()
        assert view["status"] == "dead", view
        err = view["last_error"]
        assert err["type"] == kind and "Traceback" in err["traceback"] and "handle" in err["traceback"], err
    after = c.wait(c.enqueue(name, {"how": "ok"}).id, 30).as_dict()
    assert after["status"] == "done" and after["result"]["pid"] == before["result"]["pid"], (before, after)


SLOWSTART = PWORK + '''
import __main__
if getattr(getattr(__main__, "__spec__", None), "name", "") == "runner.worker.child":
    time.sleep(float(os.environ.get("CHILD_IMPORT_S", "0")))  # heavy imports, in the child only
'''


def _held(project: Project, job_id: str) -> bool:
    entry = project.runtime.redis.hget(project.keys().claims, job_id)
    return bool(entry) and "h" in entry.split()[3]


def test_a_worker_killed_while_its_job_waits_for_the_child_spends_no_attempt(project: Project) -> None:
    """A job whose child process is still starting (heavy imports) has not started: a
    worker SIGKILLed in that wait, three times over, charges it nothing (it used to go
    dead as "worker lost" at the first, its handler never run); the fourth worker runs it
    as attempt 1."""
    project.add_function("pwork", SLOWSTART)
    project.write_config(vt=1, concurrency=1, prefetch=0, max_attempts=1, fast="max_timeout = 600")
    job = project.client.enqueue("pwork", {}).id
    for _ in range(3):
        w = spawn_leader(project, "fast", env={"CHILD_IMPORT_S": "60"})
        wait_for(lambda: rec(project, job)["status"] == "processing", timeout=30, what="the claim")
        wait_for(lambda: _held(project, job), timeout=10, what="the claim to wait for the child")
        os.killpg(w.pid, signal.SIGKILL)
        w.wait(timeout=10)
        assert not project.runs(job)
    spawn_leader(project, "fast")
    final = wait_final(project, [job], timeout=60)[job]
    assert final["status"] == "done" and final["attempt"] == 1, final
    assert len(project.runs(job)) == 1


def test_a_graceful_stop_hands_back_a_job_waiting_for_its_child_at_once(project: Project) -> None:
    """SIGTERM while a job waits for its child to start: the job goes back at once,
    spending nothing (it used to wait out its lease and lose the attempt), and the worker
    does not wait for the child."""
    project.add_function("pwork", SLOWSTART)
    project.write_config(vt=60, grace=20, concurrency=1, prefetch=0, max_attempts=1)
    job = project.client.enqueue("pwork", {}).id
    w = spawn_leader(project, "fast", env={"CHILD_IMPORT_S": "60"})
    wait_for(lambda: _held(project, job), timeout=30, what="the claim to wait for the child")
    w.send_signal(signal.SIGTERM)
    assert w.wait(timeout=10) == 0
    back = rec(project, job)
    assert back["status"] == "queued" and back["attempt"] == 0, back
    spawn_leader(project, "fast")
    final = wait_final(project, [job], timeout=60)[job]
    assert final["status"] == "done" and final["attempt"] == 1, final


CRASHER = '''
import ctypes, os, signal, subprocess
QUEUE = "fast"
ISOLATION = "process"
TIMEOUT = 30
MAX_ATTEMPTS = 1

def handle(payload, ctx):
    # A tool left running in the background, the way a careless handler leaves one (with
    # every descriptor it could inherit), then the crash.
    tool = subprocess.Popen(["sleep", "60"], close_fds=False)
    with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id), "a") as f:
        f.write(f"{tool.pid}\\n")
    how = payload["how"]
    if how == "segfault":
        ctypes.string_at(0)
    elif how == "exit":
        os._exit(3)
    else:  # as the OOM killer does it
        os.kill(os.getpid(), signal.SIGKILL)
'''


def _alive(pid: int) -> bool:
    f = _stat(pid)
    return f is not None and f[0] != "Z"


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _crash_run(project: Project, rounds: int) -> None:
    project.add_function("crasher", CRASHER)
    project.write_config(vt=5, concurrency=1, prefetch=0, max_attempts=1)
    w = spawn_leader(project, "fast")
    hows = ["segfault", "exit", "oom"]
    seen: list[tuple[int, int]] = []
    for i in range(rounds):
        job = project.client.enqueue("crasher", {"how": hows[i % 3]}).id
        final = wait_final(project, [job], timeout=30)[job]
        err = final["last_error"]
        assert final["status"] == "dead" and err["type"] == "ExecutorCrashed", err
        # Seen at its exit, not at TIMEOUT: its tool held no copy of the child's socket,
        # and the worker watches the child itself.
        assert final["finished_at"] - final["started_at"] < 10, final
        tool = int(project.runs(job)[0])
        wait_for(lambda tool=tool: not _alive(tool), timeout=5, what=f"the crashed child's tool {tool} to stop")
        seen.append((_fds(w.pid), len(descendants(w.pid))))
    # Flat: each crash used to leave a file descriptor and a process behind.
    assert max(f for f, _ in seen[2:]) <= seen[1][0] + 1, seen
    assert all(n == 0 for _, n in seen), seen


def test_crashed_children_leave_no_process_or_descriptor_behind(project: Project) -> None:
    """A child that segfaults, calls os._exit or is killed as by the OOM killer, each with
    a tool it started running in the background: the crash is settled at once, the tool
    is killed with the child's group, and the worker's open descriptors and processes
    stay flat."""
    _crash_run(project, 6)


@pytest.mark.slow
def test_sixty_crashed_children_leave_the_worker_flat(project: Project) -> None:
    _crash_run(project, 60)


THREADED = '''
import os, threading, time
QUEUE = "fast"
ISOLATION = "process"
TIMEOUT = 1
MAX_ATTEMPTS = 1

def handle(payload, ctx):
    path = os.path.join(os.environ["RECORD_DIR"], ctx.job_id)
    with open(path, "a") as f:
        f.write(f"start {os.getpid()}\\n")
    def work():
        time.sleep(payload["s"])
        with open(path, "a") as f:
            f.write("end\\n")
    t = threading.Thread(target=work)  # a pool, a download: the work is in a thread
    t.start()
    t.join()
'''


def test_a_timeout_kills_work_running_in_the_handlers_threads(served: Project) -> None:
    """TIMEOUT 1 s, and the handler's work runs in a thread of its own that would go on
    for 3 s: the job fails as a timeout, the child is killed with the thread in it (the
    work never ends), and the next job runs in a new child."""
    project = served
    c = project.client
    slow = c.enqueue("threaded", {"s": 3}).id
    final = wait_final(project, [slow], timeout=30)[slow]
    assert final["status"] == "dead" and final["last_error"]["type"] == "JobTimeout", final["last_error"]
    quick = c.enqueue("threaded", {"s": 0}).id
    assert wait_final(project, [quick], timeout=30)[quick]["status"] == "done"
    pid = project.runs(slow)[0].split()[1]
    assert project.runs(quick)[0].split()[1] != pid, "the timed-out job's child ran the next job"
    deadline = final["started_at"] + 4
    wait_for(lambda: time.time() > deadline, timeout=10, interval=0.1, what="the thread's end to pass")
    assert project.runs(slow) == [f"start {pid}"], "the timed-out job's thread ran on"


HEARTBEAT = '''
import os, threading, time
QUEUE = "fast"
ISOLATION = "process"
TIMEOUT = 10
MAX_ATTEMPTS = 2

def handle(payload, ctx):
    if payload.get("beat"):
        def beat():  # saves progress now and then, and outlives its job
            for _ in range(100):
                ctx.save_checkpoint({"owner": ctx.job_id})
                time.sleep(0.02)
        threading.Thread(target=beat, daemon=True).start()
        return {"ok": True}
    with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id), "a") as f:
        f.write(f"{ctx.attempt} {ctx.checkpoint}\\n")
    if ctx.attempt == 1:
        time.sleep(0.5)
        raise RuntimeError("fails once")
    return {"ok": True}
'''


def test_a_leftover_thread_does_not_write_into_the_next_job(served: Project) -> None:
    """A handler returns and leaves a thread saving checkpoints: none of them lands on the
    next job (whose retry would resume from another job's checkpoint)."""
    project = served  # (HEARTBEAT's own MAX_ATTEMPTS = 2 gives its retry)
    c = project.client
    first = c.enqueue("heartbeat", {"beat": True}).id
    assert wait_final(project, [first], timeout=30)[first]["status"] == "done"
    other = c.enqueue("heartbeat", {}).id
    assert wait_final(project, [other], timeout=30)[other]["status"] == "done"
    assert project.runs(other) == ["1 None", "2 None"]


BIGRESULT = '''
QUEUE = "fast"
ISOLATION = "process"
MEMORY_MB = 64
TIMEOUT = 20
MAX_ATTEMPTS = 1

def handle(payload, ctx):
    return ["x" * 30] * 2_000_000  # 16 MB of list, 66 MB of JSON
'''


def test_memory_cap_does_not_apply_to_encoding_the_result(served: Project) -> None:
    """MEMORY_MB caps the handler, not runner's encoding of what it returned: a result
    whose JSON is larger than the cap fails for what it is (over max_result_bytes), not
    as a crashed executor."""
    job = served.client.enqueue("bigresult", {}).id
    final = wait_final(served, [job], timeout=60)[job]
    assert final["last_error"]["type"] == "ResultTooLarge", final["last_error"]



AT_THE_CAP = '''
QUEUE = "fast"
ISOLATION = "process"
MEMORY_MB = 40
TIMEOUT = 20
MAX_ATTEMPTS = 1

def fill(keep, size):
    try:
        while True:
            keep.append(bytearray(size))
    except MemoryError:  # the refused allocation is the handler's to catch
        pass

def handle(payload, ctx):
    keep = []
    for size in (1 << 20, 4096, 64):  # up to the last bytes under the cap
        fill(keep, size)
    call = payload["call"]
    if call == "log":
        ctx.logger.info("at the cap, holding %d blocks", len(keep))
    elif call == "extend_lease":
        ctx.extend_lease()
    elif call == "save_checkpoint":
        ctx.save_checkpoint({"blocks": len(keep)})
    elif call == "progress":
        ctx.progress({"blocks": len(keep)})
    elif call == "stream":
        ctx.stream({"blocks": len(keep)})
    elif call == "enqueue":
        ctx.enqueue("noop", {})
    elif call == "step":
        ctx.step("count", lambda: {"blocks": len(keep)})
    keep.clear()
    return {"went on": call}
'''


def test_ctx_calls_at_the_memory_cap_are_not_under_it(served: Project) -> None:
    """A handler that reached MEMORY_MB, caught the MemoryError and goes on may still call
    its ctx (a log line, extend_lease, save_checkpoint, progress, stream, enqueue, a
    durable step): encoding what it hands in and the message to the worker are runner's
    own work, not under the handler's cap. Each job is done with
    its handler's result. (The child died of SIGSEGV encoding the message, and the
    attempt read "executor crashed", not even "memory limit".)"""
    calls = ["log", "extend_lease", "save_checkpoint", "progress", "stream", "enqueue", "step"]
    jobs = [served.client.enqueue("at_the_cap", {"call": call}).id for call in calls]
    final = wait_final(served, jobs, timeout=90)
    for call, job in zip(calls, jobs, strict=True):
        r = final[job]
        assert r["status"] == "done" and r["result"] == {"went on": call}, (call, r["last_error"])

# Two functions of a queue the served worker does not serve: what a test enqueues to them
# stays queued, to be read back.
PARKED = '''
QUEUE = "slow"

def handle(payload, ctx):
    return payload
'''

CALLS_AT_ONCE = '''
import threading
from concurrent.futures import ThreadPoolExecutor
QUEUE = "fast"
ISOLATION = "{isolation}"
TIMEOUT = 40
MAX_ATTEMPTS = 1

def handle(payload, ctx):
    rounds = payload["rounds"]
    go = threading.Barrier(8)
    def work(i):
        go.wait()  # all eight threads call at once
        made, wrong = [], []
        for k in range(rounds):
            kind = (i + k) % 4
            try:
                if kind in (0, 1):
                    target = "parked_a" if kind == 0 else "parked_b"
                    e = ctx.enqueue(target, {{"i": i, "k": k}})
                    if e.type != target or e.queue != "slow":
                        wrong.append(f"enqueue {{target}} answered {{e!r}}")
                    made.append([e.id, i, k, target])
                elif kind == 2:
                    ctx.save_checkpoint({{"i": i, "k": k}})  # (StaleLease if refused)
                else:
                    ctx.progress({{"i": i, "k": k}})
                    ctx.logger.info("thread %d call %d", i, k)
                    ctx.extend_lease()
            except Exception as exc:
                wrong.append(f"{{type(exc).__name__}}: {{exc}}")
        return made, wrong
    with ThreadPoolExecutor(8) as pool:
        out = list(pool.map(work, range(8)))
    return {{"made": [m for made, _ in out for m in made], "wrong": [w for _, wrong in out for w in wrong]}}
'''


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_ctx_calls_from_many_threads_at_once_each_get_their_own_answer(served: Project, isolation: str) -> None:
    """A handler whose pool of 8 threads calls ctx at the same time (enqueue to two
    functions, save_checkpoint, extend_lease, progress, logger): each call gets its own
    answer, in both isolations, and each enqueued job holds the payload of the call that
    got its id. Under process isolation every call's answer came off one queue the
    child shared, so a call could take another's: of 90 calls a job, 3 to 18 enqueues
    answered another call's type and id and 18 to 26 raised TypeError."""
    project = served
    job = project.client.enqueue(f"calls_at_once_{isolation}", {"rounds": 16}).id
    final = wait_final(project, [job], timeout=60)[job]
    assert final["status"] == "done", final["last_error"]
    result = final["result"]
    assert result["wrong"] == [], result["wrong"][:5]
    made = result["made"]
    assert len(made) == 8 * 16 // 2 and len({m[0] for m in made}) == len(made)
    ids = [m[0] for m in made]
    wait_for(lambda: len(project.client.get_many(ids)) == len(ids), timeout=30,
             what="the follow-ups to be written (as their job settles)")
    written = project.client.get_many(ids)
    for enqueued, i, k, target in made:  # the job behind each id is the call's own
        r = written[enqueued].as_dict()
        assert (r["type"], r["payload"], r["status"]) == (target, {"i": i, "k": k}, "queued"), (i, k, r)


SESSIONS = '''
import os, subprocess
QUEUE = "fast"
ISOLATION = "process"
TIMEOUT = 30
MAX_ATTEMPTS = 1

def handle(payload, ctx):
    # A tool in a session of its own, and a daemon (double fork, setsid): neither is in
    # the child's process group.
    tool = subprocess.Popen(["sleep", "60"], start_new_session=True)
    daemon = subprocess.run(["sh", "-c", "setsid sleep 61 > /dev/null 2>&1 & echo $!"], capture_output=True,
                            text=True).stdout.strip()
    with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id), "a") as f:
        f.write(f"{tool.pid}\\n{daemon}\\n")
    os._exit(3)
'''


def test_tools_in_sessions_of_their_own_die_with_a_crashed_child(project: Project) -> None:
    """A handler starts a tool with start_new_session=True and a daemon, then its child
    crashes: the group kill misses both (they left the group), but the worker, their
    subreaper, kills them once the child is gone."""
    project.add_function("sessions", SESSIONS)
    project.write_config(vt=5, concurrency=1, prefetch=0, max_attempts=1)
    job = project.client.enqueue("sessions", {}).id
    w = spawn_leader(project, "fast")
    final = wait_final(project, [job], timeout=30)[job]
    assert final["last_error"]["type"] == "ExecutorCrashed", final["last_error"]
    for pid in map(int, project.runs(job)):
        wait_for(lambda pid=pid: not _alive(pid), timeout=5, what=f"the handler's tool {pid} to stop")
    assert descendants(w.pid) == []


BACKGROUND = '''
import subprocess
QUEUE = "slow"
ISOLATION = "process"
MAX_ATTEMPTS = 1

def handle(payload, ctx):
    subprocess.run(["sh", "-c", "sleep 0.05 &"], check=True)  # a tool that backgrounds something
    return {}
'''


def only_functions(project: Project, *names: str) -> None:
    """Leave only these functions in the project (a worker whose handlers all run in
    child processes)."""
    for f in (project.root / "functions").glob("*.py"):
        if f.stem not in names:
            f.unlink()
    project.write_config(vt=5, concurrency=1, prefetch=1, max_attempts=1)


def _zombies_under(pid: int) -> int:
    return sum(1 for p in Path("/proc").glob("[0-9]*") if (f := _stat(int(p.name))) and f[0] == "Z"
               and int(f[1]) == pid)


def _children_of(pid: int) -> list[int]:
    return [int(p.name) for p in Path("/proc").glob("[0-9]*") if (f := _stat(int(p.name))) and int(f[1]) == pid]


@pytest.mark.parametrize("mixed", [True, False], ids=["with-thread-functions", "process-only"])
def test_tools_that_background_something_leave_no_zombies(project: Project, mixed: bool) -> None:
    """Each job's tool leaves an orphan (``sh -c "cmd &"``): in a thread-mode handler it
    is the worker's to adopt if the worker is a subreaper, in a process-mode one its
    child's. Neither keeps it as a zombie: they used to, one per job, for good."""
    n = int(size("ZOMBIE_JOBS", 4, 12))  # jobs per function
    project.add_function("bgp", BACKGROUND)
    project.add_function("bgt", BACKGROUND.replace('QUEUE = "slow"\nISOLATION = "process"', 'QUEUE = "fast"'))
    project.write_config(vt=5, concurrency=1, prefetch=1, max_attempts=1)
    if not mixed:
        only_functions(project, "bgp")
    queues = ("fast", "slow") if mixed else ("slow",)
    w = spawn_leader(project, *queues)
    ids = [project.client.enqueue("bgp", {}).id for _ in range(n)]
    if mixed:
        ids += [project.client.enqueue("bgt", {}).id for _ in range(n)]
    out = wait_final(project, ids, timeout=120)
    assert all(r["status"] == "done" for r in out.values()), [r for r in out.values() if r["status"] != "done"]

    def zombies() -> int:
        return _zombies_under(w.pid) + sum(_zombies_under(c) for c in _children_of(w.pid))
    wait_for(lambda: zombies() == 0, timeout=5, what="no zombie under the worker or its children")


TOOL_STATUS = '''
import subprocess, time
QUEUE = "fast"
MAX_ATTEMPTS = 1

def handle(payload, ctx):
    tool = subprocess.Popen(["sh", "-c", "sleep 1; exit 3"], start_new_session=True)
    time.sleep(4)  # other work: the tool has exited by now, not yet waited for
    return {"returncode": tool.wait()}
'''

CRASH_NOW = '''
import os, time
QUEUE = "slow"
ISOLATION = "process"
MAX_ATTEMPTS = 1

def handle(payload, ctx):
    os._exit(1)
'''


def test_a_dropped_child_never_takes_a_thread_handlers_tool_status(project: Project) -> None:
    """A thread-mode handler's tool in a session of its own has exited (not yet waited
    for) when a process child is dropped: the tool is the handler's, its exit status too
    (Popen.wait() read 0 instead of 3 once the worker took it for a stray and reaped it)."""
    project.add_function("thtool", TOOL_STATUS)
    project.add_function("crashp", CRASH_NOW)
    project.write_config(vt=5, concurrency=2, prefetch=1, max_attempts=1)
    spawn_leader(project, "fast", "slow")
    tool_job = project.client.enqueue("thtool", {}).id
    wait_for(lambda: rec(project, tool_job)["status"] == "processing", timeout=30, what="the tool's job")
    time.sleep(2.5)  # the tool has exited by now (1 s), its handler still naps (4 s)
    crash = project.client.enqueue("crashp", {}).id
    out = wait_final(project, [tool_job, crash], timeout=60)
    assert out[crash]["status"] == "dead"
    assert out[tool_job]["result"] == {"returncode": 3}, out[tool_job]


LEAVER = '''
import os, subprocess
QUEUE = "fast"
ISOLATION = "process"
TIMEOUT = 20
MAX_ATTEMPTS = 2

def handle(payload, ctx):
    tool = subprocess.Popen(["sleep", "60"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id), "a") as f:
        f.write(f"{os.getpid()} {tool.pid}\\n")
    if ctx.attempt == 1:
        raise RuntimeError("transient: the tool's first step failed")
    return {}
'''


def test_a_retry_never_runs_beside_its_first_attempts_tool(project: Project) -> None:
    """A handler that started a tool (in its child's group) and failed: the child is not
    used again, so the tool dies with its group before the retry runs (the retry used to
    run in the same child, beside it)."""
    project.add_function("leaver", LEAVER)
    project.write_config(vt=5, concurrency=1, prefetch=1, max_attempts=2)
    spawn_leader(project, "fast")
    job = project.client.enqueue("leaver", {}).id
    final = wait_final(project, [job], timeout=60)[job]
    assert final["status"] == "done", final
    (child1, tool1), (child2, tool2) = (map(int, line.split()) for line in project.runs(job))
    assert child1 != child2
    assert not _alive(tool1)
    wait_for(lambda: not _alive(tool2), timeout=5, what="the second attempt's tool to stop")


RAW_THREAD = '''
import os, time, _thread
QUEUE = "fast"
ISOLATION = "process"
TIMEOUT = 20
MAX_ATTEMPTS = 1

def handle(payload, ctx):
    if payload.get("spawn"):
        _thread.start_new_thread(time.sleep, (60,))  # not a threading thread
    return {"pid": os.getpid()}
'''


def test_a_handlers_raw_thread_keeps_its_child_from_the_next_job(project: Project) -> None:
    """A thread the threading module does not count (_thread, a C extension's) left
    running: the child is not used again (it was, the thread ran on beside the next job)."""
    project.add_function("rawthr", RAW_THREAD)
    project.write_config(vt=5, concurrency=1, prefetch=1, max_attempts=1)
    spawn_leader(project, "fast")
    a = project.client.enqueue("rawthr", {"spawn": True}).id
    first = wait_final(project, [a], timeout=60)[a]
    b = project.client.enqueue("rawthr", {}).id
    second = wait_final(project, [b], timeout=60)[b]
    assert first["result"]["pid"] != second["result"]["pid"]
    assert not _alive(first["result"]["pid"])


DIE_AT_START = PWORK + '''
import __main__
if getattr(getattr(__main__, "__spec__", None), "name", "") == "runner.worker.child":
    if not os.path.exists(os.path.join(os.environ["RECORD_DIR"], "started-once")):
        open(os.path.join(os.environ["RECORD_DIR"], "started-once"), "w").close()
        os.kill(os.getpid(), {signal})  # the OOM killer, or a stop's SIGTERM, while it imports
'''


def test_a_child_lost_at_start_charges_its_job_nothing(project: Project) -> None:
    """A child killed before its handler got the job (while it imports; no stop under
    way) hands the job back unspent: with MAX_ATTEMPTS = 1 it used to go dead as
    "executor crashed ... at start", its handler never run."""
    project.add_function("pwork", DIE_AT_START.replace("{signal}", f"{int(signal.SIGKILL)}"))
    project.write_config(vt=5, concurrency=1, prefetch=0, max_attempts=1)
    job = project.client.enqueue("pwork", {}).id
    spawn_leader(project, "fast")
    final = wait_final(project, [job], timeout=60)[job]
    assert final["status"] == "done" and final["attempt"] == 1, final
    assert len(project.runs(job)) == 1


def test_a_worker_killed_right_after_its_claim_spends_no_attempt(project: Project) -> None:
    """A worker SIGKILLed as soon as its claim shows, its child still starting: the job's
    claim was held only after the slot started its child (a spawn from a threaded
    process), so the kill charged "worker lost" to a job whose handler never ran."""
    project.add_function("pwork", SLOWSTART)
    only_functions(project, "pwork")
    project.write_config(vt=1, concurrency=2, prefetch=0, max_attempts=1, fast="max_timeout = 600")
    # Each round's kill lands in the child's 3 s start; RUNNER_TEST_FULL=1 runs 4.
    for _ in range(int(size("CLAIM_KILL_ROUNDS", 2, 4))):
        job = project.client.enqueue("pwork", {}).id
        w = spawn_leader(project, "fast", env={"CHILD_IMPORT_S": "3"})
        # Polled, not spun: a spinning test takes the CPU the worker needs to claim.
        wait_for(lambda: rec(project, job)["status"] == "processing", timeout=30, interval=0.005,  # noqa: B023
                 what="the claim")
        os.killpg(w.pid, signal.SIGKILL)
        w.wait(timeout=10)
        w2 = spawn_leader(project, "fast")
        final = wait_final(project, [job], timeout=60)[job]
        assert final["status"] == "done" and final["attempt"] == 1, final
        w2.send_signal(signal.SIGTERM)
        w2.wait(timeout=30)


SLOW_UPGRADE = PWORK + '''

def upgrade(payload, from_version):
    # A step of the child's own before the handler (as validating a big payload, or a
    # fresh child's first build of a context): seconds, when the test asks for them.
    if os.environ.get("UPGRADE_S"):
        open(os.path.join(os.environ["RECORD_DIR"], "upgrading"), "w").close()
        time.sleep(float(os.environ["UPGRADE_S"]))
    return payload
'''


def test_on_a_mixed_queue_a_process_job_spends_its_attempt_when_its_handler_starts(project: Project) -> None:
    """A queue with thread functions beside a process-isolated one: a job claimed for a
    ready child, its worker killed with its worker while the child still prepares it (here an
    upgrade of its payload) charges nothing; it used to spend its attempt at the claim,
    as a thread job does, and go dead as "worker lost" with MAX_ATTEMPTS = 1, its handler
    never run. The next worker runs it as attempt 1."""
    project.add_function("pwork", SLOW_UPGRADE)
    (project.root / "schemas" / "pwork" / "v2.json").write_text('{"type": "object"}')
    project.write_config(vt=2, concurrency=1, prefetch=0, max_attempts=1, fast="max_timeout = 600")
    assert any(f.isolation == "thread" for f in project.runtime.registry.for_queue("fast"))
    w = spawn_leader(project, "fast", env={"UPGRADE_S": "30"})
    warm = project.client.enqueue("pwork", {}).id  # (v2: no upgrade) its child is ready after it
    assert wait_final(project, [warm], timeout=30)[warm]["status"] == "done"
    job = project.client.enqueue("pwork", {}, version=1).id
    wait_for(lambda: (project.records / "upgrading").exists(), timeout=30, what="the child to prepare the job")
    assert rec(project, job)["attempt"] == 0, rec(project, job)
    os.killpg(w.pid, signal.SIGKILL)
    w.wait(timeout=10)
    assert not project.runs(job)
    spawn_leader(project, "fast")
    final = wait_final(project, [job], timeout=60)[job]
    assert final["status"] == "done" and final["attempt"] == 1, final
    assert len(project.runs(job)) == 1


CLEAN_ENV = '''
import os, subprocess
QUEUE = "fast"
ISOLATION = "process"
TIMEOUT = 30
MAX_ATTEMPTS = 1

def handle(payload, ctx):
    # A tool in a session of its own with a cleared environment (sudo, systemd-run and
    # many daemons start one so): it carries no mark of this worker.
    tool = subprocess.Popen(["sleep", "60"], start_new_session=True, env={}, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id), "a") as f:
        f.write(f"{tool.pid}\\n")
    os._exit(3)
'''


def test_a_process_only_worker_kills_unmarked_strays_of_a_crashed_child(project: Project) -> None:
    """A worker that runs no handler itself adopts only what its children left: a tool
    with a cleared environment (no mark) dies with its crashed child too."""
    project.add_function("clean", CLEAN_ENV)
    only_functions(project, "clean")
    job = project.client.enqueue("clean", {}).id
    w = spawn_leader(project, "fast")
    final = wait_final(project, [job], timeout=30)[job]
    assert final["last_error"]["type"] == "ExecutorCrashed", final["last_error"]
    (tool,) = map(int, project.runs(job))
    wait_for(lambda: not _alive(tool), timeout=5, what=f"the handler's tool {tool} to stop")
    assert descendants(w.pid) == []


def test_a_tool_left_in_a_session_of_its_own_dies_at_its_jobs_end(project: Project) -> None:
    """A handler that returns with a tool still running in a session of its own and a
    cleared environment (no mark: nothing could find it once its child is gone), in a
    worker that also serves thread-mode functions: its child kills it at the job's end,
    while it is still the child's, and is not used again."""
    project.add_function("clean", CLEAN_ENV.replace("    os._exit(3)\n", "    return {\"pid\": os.getpid()}\n"))
    project.write_config(vt=5, concurrency=1, prefetch=0, max_attempts=1)
    spawn_leader(project, "fast")
    job = project.client.enqueue("clean", {}).id
    final = wait_final(project, [job], timeout=30)[job]
    assert final["status"] == "done", final
    (tool,) = map(int, project.runs(job))
    wait_for(lambda: not _alive(tool), timeout=5, what=f"the handler's tool {tool} to stop")
    again = project.client.enqueue("clean", {}).id
    second = wait_final(project, [again], timeout=30)[again]
    assert second["result"]["pid"] != final["result"]["pid"]
    for pid in map(int, project.runs(again)):
        wait_for(lambda pid=pid: not _alive(pid), timeout=5, what=f"the handler's tool {pid} to stop")


ALWAYS_DIES = PWORK + '''
import __main__
if getattr(getattr(__main__, "__spec__", None), "name", "") == "runner.worker.child":
    os._exit(5)  # a child that cannot start here (a missing library, too little memory)
'''


def test_children_that_keep_dying_at_start_bury_no_job(project: Project) -> None:
    """Every child dies at start: the job is handed back each time, unspent, and the
    worker says loudly that its children cannot start, and backs off (the job used to go
    dead at the first, as "executor crashed ... at start", its handler never run)."""
    project.add_function("pwork", ALWAYS_DIES)
    project.write_config(vt=5, concurrency=1, prefetch=0, max_attempts=1)
    job = project.client.enqueue("pwork", {}).id
    w = spawn_leader(project, "fast")
    log = project.root / "worker-0.log"
    wait_for(lambda: "in a row were lost before their handler got a job" in log.read_text(), timeout=60,
             what="the worker's error about its children")
    r = rec(project, job)
    assert r["status"] in ("queued", "processing") and r["attempt"] == 0, r
    w.send_signal(signal.SIGTERM)
    assert w.wait(timeout=30) == 0
    r = rec(project, job)
    assert r["status"] == "queued" and r["attempt"] == 0, r


STACKS = PWORK + '''
import __main__, faulthandler, signal
if getattr(getattr(__main__, "__spec__", None), "name", "") == "runner.worker.child":
    # SIGUSR1 writes where each thread of the child is (the test freezes the child first).
    _stacks = open(os.path.join(os.environ["RECORD_DIR"], f"stacks-{os.getpid()}"), "w")
    faulthandler.register(signal.SIGUSR1, file=_stacks, all_threads=True)
'''


def _child_of(pid: int) -> int | None:
    """The child process (runner.worker.child) of the worker ``pid``, once it has one."""
    for p in _children_of(pid):
        with contextlib.suppress(OSError):
            if b"runner.worker.child" in Path(f"/proc/{p}/cmdline").read_bytes():
                return p
    return None


def _stacks_of(project: Project, pid: int) -> str:
    """Where each thread of the stopped child ``pid`` is: SIGUSR1 is pending when SIGCONT
    wakes it, so its handler writes the stacks before another line of Python runs."""
    os.kill(pid, signal.SIGUSR1)
    os.kill(pid, signal.SIGCONT)
    out = project.records / f"stacks-{pid}"
    return wait_for(lambda: (text := out.read_text()) and "<module>" in text and text, timeout=10,
                    what=f"the stacks of the child {pid}")


@pytest.mark.parametrize("resource", [False, True])
def test_no_attempt_shows_spent_before_a_fresh_childs_handler_runs(project: Project, resource: bool) -> None:
    """At worker start (a fresh child), the attempt was marked when the child said it was
    ready, then the child validated the payload and built the job's context before its
    handler ran: a worker SIGKILLed as soon as the attempt showed buried a MAX_ATTEMPTS = 1
    job as "worker lost", its handler never run (with or without RESOURCE_KEY, whose jobs
    are never claimed ahead). The attempt is spent when the handler starts: whenever it
    shows, the handler has the job. The child is frozen (SIGSTOP) at each look at the
    attempt, so what it shows and where the child is are one moment: either the handler
    has run its first line, or the child is in the call to it (``guard`` in child.py,
    which says "began", then calls the handler), past the payload's validation and the
    context. (A worker killed right then charges an attempt whose handler was called; the
    test used to kill there and read the handler's first line, a race it lost under load.)"""
    source = STACKS.replace("MAX_ATTEMPTS = 1", 'MAX_ATTEMPTS = 1\nRESOURCE_KEY = "r:{k}"') if resource else STACKS
    project.add_function("pwork", source, '{"type": "object", "properties": {"k": {"type": "string"}}}')
    only_functions(project, "pwork")
    project.write_config(vt=2, concurrency=1, prefetch=0, max_attempts=1, fast="max_timeout = 600")
    for _ in range(2):
        job = project.client.enqueue("pwork", {"k": "a"}).id
        w = spawn_leader(project, "fast")
        child = wait_for(lambda w=w: _child_of(w.pid), timeout=30, what="the worker's child process")

        def spent(child: int = child, job: str = job) -> bool:
            os.kill(child, signal.SIGSTOP)
            if rec(project, job)["attempt"]:
                return True  # (left stopped)
            os.kill(child, signal.SIGCONT)
            return False

        wait_for(spent, timeout=60, interval=0.005, what="the attempt to show spent")
        try:
            if not project.runs(job):
                stacks = _stacks_of(project, child)
                assert 'child.py", line' in stacks and " in guard\n" in stacks, stacks
        finally:
            os.killpg(w.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
            w.wait(timeout=10)


def test_a_worker_that_is_pid_1_runs_its_process_isolated_jobs(project: Project) -> None:
    """A container whose command is the worker (exec form, no init: the shipped compose
    file's slow service) makes it PID 1. Each child took a parent of PID 1 for a dead
    worker and exited at start, so no process-isolated job ever ran; the worker restarted
    children for ever. Run under a PID namespace of its own, the worker is PID 1 and its
    job is done, in a child of its own."""
    probe = subprocess.run(["unshare", "-pf", "--mount-proc", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no PID namespace here (unshare: {probe.stderr.decode().strip()}): run as root to check this")
    project.add_function("pwork", PWORK, '{"type": "object"}')
    only_functions(project, "pwork")
    args = ["unshare", "-pf", "--mount-proc", sys.executable, "-m", "runner.cli", "--config",
            str(project.root / "runner.toml"), "worker", "--queue", "fast"]
    with open(project.root / "pid1.log", "ab") as log:
        w = subprocess.Popen(args, cwd=project.root, env=project.env, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        job = project.client.enqueue("pwork", {}).id
        assert project.client.wait(job, timeout_s=60).status == "done", (project.root / "pid1.log").read_text()
        assert len(project.runs(job)) == 1
        assert "exited with code 0 at start" not in (project.root / "pid1.log").read_text()
    finally:
        os.killpg(w.pid, signal.SIGKILL)
        w.wait(timeout=10)


def _tokens(project: Project, ids: list[str]) -> dict[str, str]:
    """Each job's claim token, where it has a claim."""
    entries = project.runtime.redis.hmget(project.keys().claims, ids)
    return {i: e.split()[0] for i, e in zip(ids, entries, strict=True) if e}


@pytest.mark.parametrize("mixed", [True, False], ids=["with-thread-functions", "process-only"])
def test_prefetched_jobs_waiting_for_a_starting_child_go_back_unspent_however_often(
        project: Project, mixed: bool) -> None:
    """With prefetch, the jobs claimed ahead wait in the worker while its child imports:
    none was handed to a child, so a worker SIGKILLed in that wait, three times over,
    charges none of them (the second loss of a job claimed ahead used to count, and with
    MAX_ATTEMPTS = 1 it went dead as "worker lost", its handler never run). The next
    worker runs each as attempt 1."""
    project.add_function("pwork", SLOWSTART)
    if not mixed:
        only_functions(project, "pwork")
    project.write_config(vt=1, concurrency=1, prefetch=4, max_attempts=1, fast="max_timeout = 600")
    jobs = [project.client.enqueue("pwork", {}).id for _ in range(5)]
    _killed_three_times_while_its_child_starts(project, jobs, held=False)


def _killed_three_times_while_its_child_starts(project: Project, jobs: list[str], held: bool) -> None:
    """Three workers, each SIGKILLed (its whole group) once it claimed every job anew
    (``held``: and holds each claim) while its child still imports: no job is dead or
    run meanwhile; then a worker with a quick child runs each once, at attempt 1."""
    before: dict[str, str] = {}
    for _ in range(3):
        w = spawn_leader(project, "fast", env={"CHILD_IMPORT_S": "60"})

        def claimed_anew(old: dict[str, str] = before) -> bool:
            now = _tokens(project, jobs)
            dead = [r for j in jobs if (r := rec(project, j))["status"] == "dead"]
            assert not dead, dead  # (its handler never ran: no run is recorded)
            return len(now) == len(jobs) and all(now[i] != old.get(i) and (not held or _held(project, i))
                                                 for i in jobs)

        wait_for(claimed_anew, timeout=30, what="every job claimed" + (" and held" if held else "") + " anew")
        before = _tokens(project, jobs)
        os.killpg(w.pid, signal.SIGKILL)
        w.wait(timeout=10)
        assert not any(project.runs(j) for j in jobs)
    spawn_leader(project, "fast")
    final = wait_final(project, jobs, timeout=60)
    for j in jobs:
        assert final[j]["status"] == "done" and final[j]["attempt"] == 1, final[j]
        assert len(project.runs(j)) == 1


KILLS_WORKER = PWORK.replace('''    time.sleep(payload.get("s", 0))''', '''    os.kill(os.getppid(), 9)  # its worker
    time.sleep(30)''')


def test_a_child_handler_that_kills_its_worker_cannot_loop_for_ever(project: Project) -> None:
    """The hold of a job claimed ahead ends before its child gets it: handlers that SIGKILL
    their worker at once, one claimed ahead of the other, end dead as "worker lost" after
    at most two runs each (the second loss after a hand-off counts), never looping. Their
    losses while held behind the other (none of their own doing) charge nothing."""
    project.add_function("pwork", KILLS_WORKER)
    only_functions(project, "pwork")
    project.write_config(vt=1, concurrency=1, prefetch=4, max_attempts=1, fast="max_timeout = 600")
    jobs = [project.client.enqueue("pwork", {}).id for _ in range(2)]

    def buried() -> bool:
        return all(rec(project, j)["status"] == "dead" for j in jobs)

    for _ in range(6):
        w = spawn_leader(project, "fast")
        wait_for(lambda w=w: w.poll() is not None or buried(), timeout=60, what="a handler to kill its worker")
        if buried():
            break
    for j in jobs:
        final = rec(project, j)
        assert final["status"] == "dead" and final["reason"] == "worker lost", final
        assert 1 <= len(project.runs(j)) <= 2, project.runs(j)


BATCH_SLOWSTART = '''
import os, time
QUEUE = "fast"
ISOLATION = "process"
TIMEOUT = 20
MAX_ATTEMPTS = 1
BATCH = {"size": 8, "wait": 0.1}

def handle_batch(payloads, ctx):
    for j in ctx.jobs:
        with open(os.path.join(os.environ["RECORD_DIR"], j.id), "a") as f:
            f.write(f"{os.getpid()}\\n")
    return [None for _ in payloads]

import __main__
if getattr(getattr(__main__, "__spec__", None), "name", "") == "runner.worker.child":
    time.sleep(float(os.environ.get("CHILD_IMPORT_S", "0")))  # heavy imports, in the child only
'''


@pytest.mark.parametrize(("mixed", "prefetch"), [(False, 4), (True, 0), (True, 4)])
def test_a_batch_waiting_for_its_child_goes_back_unspent_however_often(project: Project, mixed: bool,
                                                                      prefetch: int) -> None:
    """A BATCH function's call waits for a child still starting: its members, those
    claimed to start at once and those claimed ahead, are all held in that wait, so a
    worker SIGKILLed there three times charges none of them (on a queue with thread
    functions too, a member claimed to start at once was held by nothing, and its second
    loss would bury it, its call never made)."""
    project.add_function("pbatch", BATCH_SLOWSTART)
    if not mixed:
        only_functions(project, "pbatch")
    project.write_config(vt=1, concurrency=1, prefetch=prefetch, max_attempts=1, fast="max_timeout = 600")
    jobs = [project.client.enqueue("pbatch", {}).id for _ in range(3)]
    _killed_three_times_while_its_child_starts(project, jobs, held=True)


def _child_process_of(worker: int) -> int:
    """The pid of the worker's child process (runner.worker.child)."""
    for pid in descendants(worker):
        with contextlib.suppress(OSError):
            if b"runner.worker.child" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
    return 0


def _unread_by(pid: int) -> bool:
    """Whether a message waits unread in a socket of process ``pid`` (its Recv-Q)."""
    out = subprocess.run(["ss", "-xpn"], capture_output=True, text=True, check=True).stdout
    return any(f"pid={pid}," in line and int(line.split()[2]) > 0 for line in out.splitlines()[1:])


def test_a_worker_killed_after_sending_its_batch_charges_no_member(project: Project) -> None:
    """A BATCH function's members count their attempt from handle_batch's start, as its
    child reports it, not from the worker's send: a worker SIGKILLed after it sent the
    batch to its child (frozen there, the call not made) charges none of them, and with
    MAX_ATTEMPTS 1 each runs once, at attempt 1 (each went dead as "worker lost", its
    handler never run)."""
    project.add_function("pbatch", BATCH_SLOWSTART)
    only_functions(project, "pbatch")
    project.write_config(vt=1, concurrency=1, prefetch=0, max_attempts=1, fast="max_timeout = 600")
    w = spawn_leader(project, "fast")
    warm = project.client.enqueue("pbatch", {}).id
    assert wait_final(project, [warm], timeout=60)[warm]["status"] == "done"
    child = wait_for(lambda: _child_process_of(w.pid), timeout=10, what="the worker's child process")
    os.kill(child, signal.SIGSTOP)
    jobs = [project.client.enqueue("pbatch", {}).id for _ in range(3)]
    wait_for(lambda: _unread_by(child), timeout=30, interval=0.02, what="the batch sent to the frozen child")

    def settled_in_the_wait() -> bool:  # held (waiting for the call) or marked started
        entries = project.runtime.redis.hmget(project.keys().claims, jobs)
        return all(e and ("h" in e.split()[3] or "p" not in e.split()[3]) for e in entries)

    wait_for(settled_in_the_wait, timeout=10, interval=0.02, what="every member held or marked started")
    os.killpg(w.pid, signal.SIGKILL)
    os.kill(child, signal.SIGKILL)
    w.wait(timeout=10)
    assert not any(project.runs(j) for j in jobs)
    spawn_leader(project, "fast")
    final = wait_final(project, jobs, timeout=60)
    for j in jobs:
        assert final[j]["status"] == "done" and final[j]["attempt"] == 1, final[j]
        assert len(project.runs(j)) == 1


LOGS_A_LINE = '''
import os
QUEUE = "fast"
ISOLATION = "process"
TIMEOUT = 20
MAX_ATTEMPTS = 1

def handle(payload, ctx):
    ctx.logger.info("job %s says hello", ctx.job_id)
    return {"pid": os.getpid()}
'''


def test_a_handler_that_logs_keeps_its_child_for_the_next_job(served: Project) -> None:
    """A handler that logs through ctx.logger (echoed to the output at INFO, the default)
    leaves nothing running: runner's own writing of the line is no thread of the handler's,
    so the same child runs the jobs after it and the worker blames the handler for none."""
    project = served
    start = _output_size(project)
    pids = []
    for _ in range(3):
        j = project.client.enqueue("logsaline", {}).id
        final = wait_final(project, [j], timeout=60)[j]
        assert final["status"] == "done", final
        pids.append(final["result"]["pid"])
    out = _output_since(project, start)
    assert "replacing the child" not in out, out
    assert len(set(pids)) == 1, pids
    assert out.count("says hello") == 3, out


REDIRECTS = '''
import os
QUEUE = "fast"
ISOLATION = "process"
TIMEOUT = 20
MAX_ATTEMPTS = 1

def handle(payload, ctx):
    how = payload["how"]
    if how == "dup2":  # as a handler that silences a chatty C library, and never puts it back
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.close(null)
    elif how == "close":
        os.close(1)
        os.close(2)
        os.close(0)
    ctx.logger.info("%s says hello", payload["tag"])
    return {"pid": os.getpid()}
'''


@pytest.mark.parametrize("how", ["dup2", "close"])
def test_a_handlers_redirect_of_its_output_descriptors_ends_with_its_job(served: Project, how: str) -> None:
    """A handler that points fd 1 and 2 elsewhere (dup2 over them, or closes them, and fd 0)
    and returns: the jobs after it in the same child echo their ctx.logger lines to the
    worker's output again (they went to /dev/null for the rest of the child's life)."""
    project = served
    start = _output_size(project)
    pids = []
    for i, step in enumerate(["plain", how, "plain", "plain"]):
        j = project.client.enqueue("redirects", {"how": step, "tag": f"TAG{i}-{how}"}).id
        final = wait_final(project, [j], timeout=60)[j]
        assert final["status"] == "done", (step, final["last_error"])
        pids.append(final["result"]["pid"])
        if i != 1:
            wait_for(lambda: f"TAG{i}-{how} says hello" in _output_since(project, start), timeout=10,  # noqa: B023
                     what=f"job {i}'s echoed line")
    assert len(set(pids)) == 1, pids  # (the same warm child ran all four)


CHATTY_HOG = '''
import threading, time
QUEUE = "fast"
ISOLATION = "process"
MEMORY_MB = 64
TIMEOUT = 30
MAX_ATTEMPTS = 1

def handle(payload, ctx):
    stop = threading.Event()
    said = [0]

    def chatter():  # a progress logger, as busy as it gets
        i = 0
        while not stop.is_set():
            i += 1
            ctx.logger.info("progress %d", i)
            said[0] = i
            if i % 50 == 0:
                print("printed", i)

    t = threading.Thread(target=chatter)
    t.start()
    hog, refused = [], 0
    deadline = time.monotonic() + payload["s"]
    while time.monotonic() < deadline and len(hog) < 1024:
        try:
            hog.append(bytearray(1 << 20))
        except MemoryError:
            refused += 1
    stop.set()
    t.join()
    return {"held_mb": len(hog), "refused": refused, "said": said[0]}
'''


def test_memory_cap_holds_while_another_thread_of_the_handler_logs(project: Project) -> None:
    """MEMORY_MB holds for a handler whose other thread logs and prints without a pause:
    sending its lines lifted the cap each time, and the allocating thread got 92 to 162 MB
    under a cap of 64 in those whiles. The last line is in the job's log."""
    # A worker of its own: a warm child's mapped memory left by the jobs before (another
    # test's, on a shared worker) is under the cap too (docs/isolation.md, MEMORY_MB).
    project.add_function("chattyhog", CHATTY_HOG)
    project.write_config(vt=5, concurrency=1, prefetch=0, max_attempts=1)
    spawn_leader(project, "fast")
    for _ in range(2):
        j = project.client.enqueue("chattyhog", {"s": 3}).id
        final = wait_final(project, [j], timeout=90)[j]
        assert final["status"] == "done", final["last_error"]
        got = final["result"]
        assert got["refused"] > 0 and got["held_mb"] <= 64, got
        lines = [line["msg"] for line in project.client.logs(j)["lines"] if line["src"] == "log"]
        assert lines[-1] == f"progress {got['said']}", lines[-3:]


POISON = '''
import os, time
QUEUE = "fast"
ISOLATION = "process"
TIMEOUT = 20
MAX_ATTEMPTS = 3

def handle(payload, ctx):
    if payload.get("kill"):
        with open(os.path.join(os.environ["RECORD_DIR"], ctx.job_id), "a") as f:
            f.write(f"{os.getpid()}\\n")
        time.sleep(0.2)  # its start mark lands: each of its runs counts
        os.kill(os.getppid(), 9)  # its worker
        time.sleep(30)
'''


def test_jobs_waiting_behind_a_handler_that_kills_its_worker_are_never_charged(project: Project) -> None:
    """With prefetch on and the pace of quick jobs known, a job that SIGKILLs its worker
    has jobs of another function waiting behind it in its child's queue. Its every run
    counts, and after MAX_ATTEMPTS it is dead as "worker lost"; the jobs behind it, lost
    with the worker each time, never started and are never charged, however often
    (their hold used to end as they were sent to the child, so from their second loss
    each counted, and all went dead as "worker lost" without a run). Workers restarted as
    a PaaS does; a stream of quick jobs keeps the pace known."""
    project.add_function("poison", POISON)
    project.add_function("pwork", PWORK.replace("MAX_ATTEMPTS = 1", "MAX_ATTEMPTS = 3"))
    only_functions(project, "poison", "pwork")
    # (A lease of 3 s: a new worker learns the pace before the lost jobs come back.)
    project.write_config(vt=3, concurrency=1, prefetch=16, max_attempts=3, fast="max_timeout = 600")
    stop = threading.Event()

    def feed() -> None:
        while not stop.is_set():
            with contextlib.suppress(Exception):
                project.client.enqueue("poison", {})
            stop.wait(0.05)

    workers = [spawn_leader(project, "fast")]
    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        warm = project.client.enqueue("poison", {}).id
        wait_final(project, [warm], timeout=60)  # (its child knows the pace of its quick jobs)
        poison = project.client.enqueue("poison", {"kill": True}).id
        innocents = [project.client.enqueue("pwork", {"tag": i}).id for i in range(6)]
        deaths = 0

        def settled() -> bool:
            nonlocal deaths
            if workers[-1].poll() is not None:
                deaths += 1
                workers.append(spawn_leader(project, "fast"))
            return all(rec(project, j)["status"] in ("done", "dead") for j in [poison, *innocents])

        wait_for(settled, timeout=120, interval=0.1, what="the poison job and the others to end")
    finally:
        stop.set()
        feeder.join(timeout=5)
    final = rec(project, poison)
    assert final["status"] == "dead" and final["reason"] == "worker lost", final
    assert deaths >= 3 and len(project.runs(poison)) == 3, (deaths, project.runs(poison))
    losses = 0
    for j in innocents:
        r = rec(project, j)
        assert r["status"] == "done" and r["attempt"] == 1, (r["status"], r["attempt"], outcomes(r))
        assert len(project.runs(j)) == 1
        losses += outcomes(r).count("lost unstarted")
    assert losses >= 2 * len(innocents), losses  # (they waited behind it through its runs)
