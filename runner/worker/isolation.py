"""Process isolation, the worker's side: one warm child process per executor slot
(child.py), started by spawning a fresh interpreter (never a fork of this threaded
process), fed batches of jobs (slot.py), and killed when it must be.

The worker process holds the leases and never runs handler code for these jobs, so a
handler that holds the GIL, blocks in C, leaks memory or crashes its interpreter cannot
stop lease renewal or take other jobs down:

- past TIMEOUT plus ``[worker] timeout_grace`` the child is killed: the attempt fails as
  a timeout (JobTimeout), and the next job gets a new child; so does the next job after
  one that ran past TIMEOUT or left threads or processes running (the child says so with
  its outcome);
- a child that dies (segfault, ``os._exit``, the OOM killer) fails only its job's attempt,
  "executor crashed" with the signal or exit code, seen through a pidfd at once (its
  socket alone would not tell while a tool it started held a copy); the log lines it held
  back in a flood are read from memory it shares with the worker (spill.py) into the job's log;
- children are replaced after ``max_jobs_per_child`` jobs, above ``max_rss_mb``, and when
  the functions were reloaded (`runner dev`), so new jobs run new code while a running
  job finishes on its own.

A job waits for its child when the child is still starting: its claim is held before the
slot starts or replaces the child (no attempt counts), as a job claimed ahead is from its
claim, and the hold ends just before the child gets it (slot.Feed, _ChildRun and
Executors.hand_off in executors.py), so a worker killed in that wait charges it nothing,
however often; a child lost before its handler got the job hands the job back unspent.

Each child leads a process group of its own, and every way of dropping a child
(ChildProcess.end) kills the group, reaps the child and closes its socket, pidfd and
sentry pipe: a tool the handler ran (a shell, ffmpeg) stops with it. What left the group
(setsid, daemons) is killed once its child is gone (reap_adopted). Should the worker
itself die (SIGKILL, the OOM killer), a sentry in the group kills it (_guard_group), so no
tool in it runs on orphaned. Children are started from one thread that lives as long as
the worker: a child asks to be killed when its parent dies (PR_SET_PDEATHSIG, child.py),
and Linux sends that signal when the *thread* that started it exits, so a child started
by an executor thread that was later abandoned died with it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import dataclasses
import logging
import marshal
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runner.catalog import registry as registry_mod
from runner.config import Config
from runner.worker.channel import Channel
from runner.worker.spill import Spill

log = logging.getLogger("runner.worker")

START_TIMEOUT_S = 60.0  # a child imports the functions before it says it is ready
CODE_ENV = "RUNNER_CHILD_CODE"  # the descriptor of the function files' bytes its worker loaded

# The child's entry point: its first statement makes a stop's SIGTERM (one to every
# process, at a PaaS stop) the worker's to act on, before runner's own imports (a second
# or more on a loaded host) rather than after them (child.py, _on_stop).
# (runpy as ``-m`` does it: the child is ``__main__`` with its module's spec.)
CHILD_MAIN = ("import signal; signal.signal(signal.SIGTERM, lambda signum, frame: None); "
              "signal.siginterrupt(signal.SIGTERM, False); "
              "import runpy; runpy.run_module('runner.worker.child', run_name='__main__', alter_sys=True)")


def default_signals_after_fork(own_group: bool = False) -> None:
    """A process a handler forks (multiprocessing's fork, os.fork) starts with SIGTERM,
    SIGINT and SIGQUIT at their default actions, not runner's handlers: Process.terminate() and
    Pool.terminate() stop it, as they would outside runner. ``own_group`` (a thread
    handler's, forked from the worker itself): out of the worker's process group, as a
    child process's forks are out of it in the child's, so a stop's SIGTERM to the
    worker's group (honcho, ``kill -TERM -- -PGID``) does not reach work the handler still
    has in hand. It joins the group its spawned processes join, whose sentry kills it when
    the worker dies (_spawn_group): in a group of its own it outlived the worker, whether
    SIGKILLed alone or with its whole group, and ran on beside the job's retry. A fork of
    such a fork stays where its parent is."""
    worker = os.getpid()
    group = 0  # (set in the parent just before each fork: a child cannot start the sentry)

    def choose() -> None:
        nonlocal group
        group = _spawn_group() if own_group and os.getpid() == worker else 0

    def reset() -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
            with contextlib.suppress(ValueError):  # (not the main thread: not so right after a fork)
                signal.signal(sig, signal.SIG_DFL)
        if group > 0:
            with contextlib.suppress(OSError):  # (a sentry gone meanwhile: it stays in the worker's group)
                os.setpgid(0, group)

    os.register_at_fork(before=choose, after_in_child=reset)


# Processes a thread handler starts by fork and exec (multiprocessing's "spawn" and
# "forkserver" start methods, ProcessPoolExecutor with either; the forkserver itself is
# started so, and its forks inherit its group) run no at-fork hook, so the reset above
# never puts them in a group of their own: a stop's SIGTERM to the worker's group killed
# them at once, and their handler's work with them, though the worker gives it the grace
# period. They are started in one group apart (multiprocessing.util.spawnv_passfds, the
# one call every such start goes through, wrapped) led by a sentry that kills the group
# when the worker dies, however it dies: in the worker's group they died only with a
# kill of that whole group, and a worker SIGKILLed alone left them running for good.
_spawn_group_lock = threading.Lock()
_spawn_sentry: subprocess.Popen[bytes] | None = None
_spawn_sentry_w = -1
_spawn_unguarded = False


def _spawn_group() -> int:
    """The group a process spawned or forked for a thread handler joins (its sentry's pid, the
    sentry started or restarted as needed); -1: the worker's own (no shell to run)."""
    global _spawn_sentry, _spawn_sentry_w, _spawn_unguarded
    with _spawn_group_lock:
        if _spawn_sentry is not None and _spawn_sentry.poll() is None:
            return _spawn_sentry.pid
        if _spawn_unguarded:
            return -1
        if _spawn_sentry_w >= 0:
            os.close(_spawn_sentry_w)
            _spawn_sentry_w = -1
        read_fd, write_fd = os.pipe()
        try:
            sentry = subprocess.Popen([SENTRY_SHELL, "-c", "trap '' TERM INT; read x; kill -KILL 0"], stdin=read_fd,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, process_group=0)
        except OSError as exc:
            os.close(write_fd)
            _spawn_unguarded = True
            log.warning("no sentry for the processes thread handlers fork or spawn (%s: %s): they stay in the "
                        "worker's process group, and a stop's SIGTERM to that group stops them", SENTRY_SHELL, exc)
            return -1
        finally:
            os.close(read_fd)
        with _known_lock:
            _known.add(sentry.pid)
        _spawn_sentry, _spawn_sentry_w = sentry, write_fd
        return sentry.pid


def _spawnv_passfds(path: str, args: list[str], passfds: Any) -> int:
    """multiprocessing.util.spawnv_passfds (3.11 to 3.13, the same call) with the child
    put in the spawn group (_spawn_group) as it starts."""
    import _posixsubprocess

    group = _spawn_group()
    passfds = tuple(sorted(map(int, passfds)))
    errpipe_read, errpipe_write = os.pipe()
    try:
        fork_exec: Any = _posixsubprocess.fork_exec  # (typeshed's stub wants a cwd and a preexec_fn)
        pid: int = fork_exec(
            args, [path], True, passfds, None, None,
            -1, -1, -1, -1, -1, -1, errpipe_read, errpipe_write,
            False, False, group, None, None, None, -1, None,
            subprocess._USE_VFORK)
        return pid
    finally:
        os.close(errpipe_read)
        os.close(errpipe_write)


def spawn_apart() -> None:
    """Start what thread handlers spawn (multiprocessing's spawn and forkserver) outside
    the worker's process group, in one guarded by a sentry (see _spawn_group). A fork of
    this process drops its copy of the sentry's pipe, which would keep the sentry from
    seeing this process die; what the fork spawns gets a sentry of its own."""
    import multiprocessing.util

    if sys.platform.startswith("linux") and (3, 11) <= sys.version_info[:2] <= (3, 13):
        multiprocessing.util.spawnv_passfds = _spawnv_passfds  # type: ignore[assignment]

    def forget() -> None:  # (also for a handler's forks, which join the sentry's group)
        global _spawn_sentry, _spawn_sentry_w
        if _spawn_sentry_w >= 0:
            with contextlib.suppress(OSError):
                os.close(_spawn_sentry_w)
            _spawn_sentry_w = -1
        _spawn_sentry = None
    os.register_at_fork(after_in_child=forget)


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


# Descendants that leave their child's process group (``setsid``, daemons) escape its
# group kill. Each child is a subreaper (child.py): while it lives, what its handler
# daemonizes stays under it. When a child dies, what it left goes to the worker's nearest
# subreaper, and ``reap_adopted`` kills it:
#
# - a worker that runs no handler itself (every function it serves is process-isolated)
#   is that subreaper (``contain``): it starts no process but its children, so every other
#   child it has was adopted, and it kills and reaps them all, marked or not, and with
#   them every zombie it adopts (a subreaper must reap what it adopts, or each orphan of
#   each job stays a zombie for the worker's life);
# - a worker that runs thread-mode handlers is not one: their own tools are its children
#   too (one started with start_new_session=True, not yet waited for, looks exactly like
#   an adopted stray, and reaping it stole its exit status), and the orphans of their
#   tools would stay its zombies. There strays go to init, which reaps them, and
#   ``reap_adopted`` kills the live ones by the mark their child's environment passed on
#   (MARK). A stray started with a cleared environment carries no mark: the limit the
#   docs/isolation.md states.
PR_SET_CHILD_SUBREAPER = 36
_known: set[int] = set()
_known_lock = threading.Lock()
_containing = False
_exclusive: Callable[[], bool] = bool  # (set by contain; bool() is False)


def _subreaper(on: bool) -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0)


def contain(exclusive: Callable[[], bool]) -> bool:
    """Make this process the subreaper of its children's strays (Linux only) while
    ``exclusive()`` holds: no handler runs in this process, so its only children are its
    child processes and what it adopts from them. True when it is."""
    global _containing, _exclusive
    if not sys.platform.startswith("linux") or not exclusive():
        return False
    _exclusive = exclusive
    _containing = _subreaper(True)
    return _containing


def without_init(contained: bool, pid: int | None = None) -> str:
    """What to say at start when this worker is PID 1 (a container started without an
    init: an exec-form command, no ``--init``) and runs thread-mode handlers: then it is
    the init that every orphan of the container goes to, and it reaps none (a reaper here
    would take the exit status of a thread handler's own ``subprocess.run``), so what a
    handler's tool leaves in the background stays a zombie, each holding a pid, for the
    worker's life. "" when all is well: not PID 1, or a worker whose functions all run in
    child processes (``contained``: it reaps everything it adopts)."""
    if (os.getpid() if pid is None else pid) != 1 or contained:
        return ""
    return ("this worker is PID 1 with no init, and it reaps no orphans: what a thread-mode handler's "
            "tools leave running in the background stays a zombie until the worker exits. Run it under an "
            "init: `docker run --init`, `init: true` in compose.yaml, or tini as the image's ENTRYPOINT "
            "(the shipped Dockerfile does this)")


MARK = "RUNNER_CHILD_OF"


def _marked(pid: int, mark: bytes) -> bool:
    """A live process that came from one of this worker's child processes."""
    try:
        return mark in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _outside(pid: int) -> bool:
    """Not under this process: a marked process under a live child is its handler's."""
    me = os.getpid()
    for _ in range(64):
        pid = _ppid(pid)
        if pid == me:
            return False
        if pid <= 1:
            return True
    return False


def _children() -> list[int]:
    out: list[int] = []
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            out += [int(x) for x in Path(f"/proc/self/task/{task}/children").read_text().split()]
    return out


def reap_adopted() -> int:
    """SIGKILL what this worker's dead children left outside their groups (a stray's own
    children come next, so it goes round until none is left), and reap what this process
    adopted; how many were killed."""
    global _containing
    if _containing and not _exclusive():  # a reload brought thread-mode handlers here
        _subreaper(False)
        _containing = False
    if not sys.platform.startswith("linux"):
        return 0
    n = 0
    mark = f"{MARK}={os.getpid()}\0".encode()
    for _ in range(16):
        if _containing:
            with _known_lock:  # (a child process being started is known before it can be seen)
                strays = [pid for pid in _children() if pid not in _known]
        else:
            strays = [int(d) for d in os.listdir("/proc") if d.isdigit() and _marked(int(d), mark)
                      and _outside(int(d))]
        for pid in strays:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if not strays:
            break
        if _containing:
            for pid in strays:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
        else:  # init reaps them; wait until they are gone (or a stray's children, next round)
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline and any(_marked(pid, mark) for pid in strays):
                time.sleep(0.005)
        n += len(strays)
    if n:
        log.warning("killed %d process(es) a handler started outside its child's process group (setsid, "
                    "a daemon) once that child was gone", n)
    return n


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child and every process of its group (what the handler started). Only
    while the child is not reaped: until then its pid, the group's id, cannot be reused
    (nothing here reaps it before: see ChildProcess.alive)."""
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


MESSAGE, EXITED = 1, 2  # what ChildProcess.wait saw


SENTRY_SHELL = "/bin/sh"


def _guard_group(read_fd: int, group: int, shell: str = SENTRY_SHELL) -> subprocess.Popen[bytes] | None:
    """A sentry in a child's process group that kills the group when the worker dies.

    The child's death signal (child.py) stops the child, not the tools a handler started:
    they would run on orphaned while the job is reclaimed and run again. The sentry, a
    shell that reads a pipe whose only write end the worker holds, wakes at EOF (the worker
    gone, however it died) and SIGKILLs the group it joined; being a member, it keeps the
    group's id from being reused by anyone else meanwhile. It is the worker's child, not
    the child's: the child then has no process of its own, and finding what a handler left
    running costs it one system call a job (child.py, processes_left). Without a shell to
    run (a minimal image) the child still serves, unguarded, and says so."""
    try:
        # It ignores SIGTERM: a stop signalling every process must not take the guard away.
        return subprocess.Popen([shell, "-c", "trap '' TERM INT; read x; kill -KILL 0"], stdin=read_fd,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, process_group=group)
    except OSError as exc:
        log.warning("no sentry for this child process (%s: %s): should the worker be killed, tools a handler "
                    "started keep running", shell, exc)
        return None
    finally:
        os.close(read_fd)


def child_env(config: Config) -> dict[str, str]:
    """What a child's environment says of its worker, over what the worker's own says: the
    config file the worker loaded (RUNNER_CONFIG: the child loads it too, and a `runner`
    command a handler runs finds it). Never the server or prefix the worker runs on: a
    handler's tools inherit the environment, a password in the URL with it, and there
    REDIS_URL wins over any file named, another app's too. The child is told them over
    its socket instead (``worker_message``)."""
    return {"RUNNER_CONFIG": str(Path(config.source).resolve())} if Path(config.source).exists() else {}


def worker_message(config: Config) -> dict[str, Any]:
    """The first message a child gets: the config file and the Redis settings its worker
    runs on, which need not be the file's or the environment's (`runner dev` on its
    embedded server). The child records them (session.host), so a handler's own
    ``Client.from_config()`` reaches the worker's jobs, and another app's file another app."""
    return {"op": "worker", "source": config.source, "redis": dataclasses.asdict(config.redis)}


class ChildProcess:
    """One child, its sentry, the socket to it, and a pidfd that says when it exits (its
    socket alone would not: a process the handler started may hold it open)."""

    def __init__(self, config: Config, generation: int, code: int = -1) -> None:
        """``config``: the worker's (child_env); ``code``: a descriptor holding the function
        files' bytes the worker loaded (Generations.code; -1 none: the child reads the files)."""
        parent, child = socket.socketpair()
        env = dict(os.environ)
        env.pop(CODE_ENV, None)
        env.update(child_env(config))
        if code >= 0:
            env[CODE_ENV] = str(code)
        env[MARK] = str(os.getpid())  # what the handler starts carries it (see reap_adopted)
        self.generation = generation
        self.jobs = 0
        self.rss_mb = 0.0
        self.sentry: subprocess.Popen[bytes] | None = None
        # The sentry reads sentry_r; this process alone holds the write end (not inherited
        # by any other process), so it closes when this process dies.
        sentry_r, self._sentry_w = os.pipe()
        # The lines its handler holds back in a flood, read should it die (spill.py).
        self.spill = Spill.create()
        self.held: tuple[list[str], int] = ([], 0)  # what it held at its end (read by end)
        shared = (self.spill.fd,) if self.spill is not None else ()
        try:
            with _known_lock:
                try:
                    self.proc = _spawn([sys.executable, "-c", CHILD_MAIN, str(child.fileno()),
                                        *(str(fd) for fd in shared)],
                                       pass_fds=(child.fileno(), *shared, *((code,) if code >= 0 else ())), env=env,
                                       stdin=subprocess.DEVNULL, process_group=0)
                except BaseException:
                    os.close(sentry_r)
                    raise
                _known.add(self.proc.pid)
                # Into the child's group while the child lives (it is importing for a
                # while yet): a group is joined only while a member is in it.
                self.sentry = _guard_group(sentry_r, self.proc.pid)
                if self.sentry is not None:
                    _known.add(self.sentry.pid)
        except BaseException:
            os.close(self._sentry_w)
            parent.close()
            if self.spill is not None:
                self.spill.close()
            raise
        finally:
            child.close()
        self.channel = Channel(parent)
        # Read first, before the child loads anything; a child gone already is seen, as
        # gone, by wait_ready.
        with contextlib.suppress(OSError):
            self.channel.send(worker_message(config))
        self.ready = False
        # The worker's stop and the slot watching the child can both end it at once: one
        # does, the other waits and reads its code (a select on the pidfd the first had
        # closed raised EBADF in the stop's thread, and the jobs after went unreturned).
        self._end_lock = threading.Lock()
        self._code: int | None = None
        self._pidfd = -1
        with contextlib.suppress(AttributeError, OSError):  # Linux 5.3 and later
            self._pidfd = os.pidfd_open(self.proc.pid)
        # One poll() call watches both (the hot path makes one system call per wait).
        self._poller = select.poll()
        self._poller.register(self.channel.fileno(), select.POLLIN)
        if self._pidfd >= 0:
            self._poller.register(self._pidfd, select.POLLIN)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait(self, timeout_s: float) -> int:
        """MESSAGE when the child said something (or closed its socket), EXITED when it is
        gone with nothing left to read, 0 at the timeout."""
        events = self._poller.poll(max(0, int(timeout_s * 1000)))
        if not events:
            return 0
        sock = self.channel.fileno()
        if any(fd == sock for fd, _ in events):
            return MESSAGE
        return EXITED

    def poll_ready(self) -> bool:
        """Ready now, without waiting (a child that said so already counts)."""
        if not self.ready and self.wait(0) == MESSAGE:
            self.wait_ready(0)
        return self.ready

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S, stop: Callable[[], bool] | None = None) -> bool:
        """Wait until the child says it is ready (True), or ``stop`` says to give up (False)."""
        deadline = time.monotonic() + timeout_s
        while not self.ready:
            seen = self.wait(min(0.1, max(0.0, deadline - time.monotonic())))
            if seen == MESSAGE:
                break
            if seen == EXITED:
                raise ExecutorCrashed(f"the child process {describe_exit(self.end())} at start")
            if stop is not None and stop():
                return False
            if time.monotonic() >= deadline:
                self.kill()
                raise ExecutorCrashed(f"the child process did not start within {timeout_s:g} s")
        if self.ready:
            return True
        try:
            msg = self.channel.recv()
        except (EOFError, OSError, ValueError):
            raise ExecutorCrashed(f"the child process {describe_exit(self.end())} at start") from None
        if msg.get("op") != "ready":
            self.kill()
            raise ExecutorCrashed(f"the child process said {msg!r} at start")
        self.ready = True
        return True

    def send(self, msg: dict[str, Any]) -> None:
        self.channel.send(msg)

    def _exited(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the child to exit, without reaping it."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self._pidfd >= 0:
                if select.select([self._pidfd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                    return True
            elif not self.alive():
                return True
            if time.monotonic() >= deadline:
                return False
            if self._pidfd < 0:
                time.sleep(0.01)

    def end(self, timeout_s: float = 5.0) -> int:
        """How a child that is gone (or going) ended; every way of dropping a child ends
        here: its process group is killed (the tools its handler left, and its sentry), the
        child and its sentry reaped, and its socket, pidfd and sentry pipe closed."""
        with self._end_lock:
            if self._code is None:
                self._code = self._end(timeout_s)
            return self._code

    def _end(self, timeout_s: float) -> int:
        self._exited(timeout_s)
        _kill_group(self.proc)
        code = self.proc.wait()
        if self.sentry is not None:
            with contextlib.suppress(ProcessLookupError):
                self.sentry.kill()  # (it left the group's kill only if it never joined the group)
            self.sentry.wait()
        with _known_lock:
            _known.discard(self.proc.pid)
            if self.sentry is not None:
                _known.discard(self.sentry.pid)
        if self.spill is not None:  # (a header read when it held nothing)
            self.held = self.spill.read()
        self._close()
        reap_adopted()
        return code

    def kill(self) -> None:
        # Also once the child has exited (not yet reaped): what it started may still run.
        _kill_group(self.proc)
        self.end(0)

    def _close(self) -> None:
        self.channel.close()
        if self.spill is not None:
            self.spill.close()
            self.spill = None
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1
        if self._sentry_w >= 0:  # after the sentry is reaped
            os.close(self._sentry_w)
            self._sentry_w = -1

    def retire(self) -> None:
        """Ask the child to exit once idle (it is); what it left running goes with it."""
        with contextlib.suppress(OSError):
            self.send({"op": "exit"})
        self.end(2)

    def alive(self) -> bool:
        """Not reaping it (Popen.poll would): until this process reaps the child, its pid,
        the id of the group killed at its end, is never reused."""
        try:
            return os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
        except ChildProcessError:
            return False


class Superseded(Exception):
    """A child asked for a generation of the functions whose code is no longer kept (two
    reloads since): the job goes back, to run under the code loaded now."""


class Generations:
    """The functions' generation, for a child to say which code it runs: a number that
    changes with each registry (a reload in `runner dev`). A counter, not the registry's
    address (``id``), which a new registry took over from a freed one about half the time;
    the registry last seen is held, so ``is`` compares exactly."""

    def __init__(self) -> None:
        self._last: registry_mod.Registry | None = None
        self._n = 0
        self._lock = threading.Lock()
        # The last two generations' registries (a child may be asked for the one before
        # the newest: a reload landed between an executor's look and its child's start),
        # and the descriptor of each one's code once a child needed it.
        self._registries: dict[int, registry_mod.Registry] = {}
        self._code: dict[int, int] = {}

    def of(self, registry: registry_mod.Registry) -> int:
        if registry is self._last:  # every job but the first after a reload
            return self._n
        with self._lock:
            if registry is not self._last:
                self._last, self._n = registry, self._n + 1
                self._registries[self._n] = registry
                for g in [g for g in self._registries if g < self._n - 1]:
                    del self._registries[g]
                    if g in self._code:
                        os.close(self._code.pop(g))
            return self._n

    def code(self, generation: int) -> int:
        """A descriptor holding the bytes of the function files this generation's registry
        loaded, for a child to load (child.py) instead of the files, which may have changed
        or broken since: a child started later (after a crash, a kill, a recycle, or a
        reload that landed just before its start) runs what its worker loaded for it, and
        only a reload brings a new version in. -1: none (functions made in code, or no
        memfd on this platform; the child reads the files). Superseded: a generation two
        reloads old, whose code is no longer kept."""
        with self._lock:
            fd = self._code.get(generation)
            if fd is not None:
                return fd
            registry = self._registries.get(generation)
            if registry is None:
                raise Superseded(f"the functions were reloaded twice since generation {generation} was loaded")
            files = registry_mod.code(registry)
            if files is None:
                return -1
            fd = _code_fd(files)
            if fd >= 0:
                self._code[generation] = fd
            return fd


def _code_fd(files: dict[str, bytes]) -> int:
    """An anonymous file (memfd) holding ``files`` (marshal: the child is this interpreter)."""
    try:
        fd = os.memfd_create("runner-code")
    except (AttributeError, OSError):
        return -1
    data = memoryview(marshal.dumps(files))
    while data:
        data = data[os.write(fd, data):]
    return fd


def read_code(fd: int) -> dict[str, bytes]:
    """The function files a worker handed its child (``_code_fd``); closes ``fd``."""
    try:
        size = os.fstat(fd).st_size
        parts, at = [], 0
        while at < size:
            chunk = os.pread(fd, size - at, at)
            if not chunk:
                break
            parts.append(chunk)
            at += len(chunk)
    finally:
        os.close(fd)
    files = marshal.loads(b"".join(parts))
    if not isinstance(files, dict):
        raise ValueError("the worker's code is not a map of files")
    return files
