"""Test harness: real Redis-protocol servers on free ports, started by the suite.

- ``server``: the embedded Valkey that ``pip install`` brings (one per session).
- ``any_server``: parametrised over that Valkey and Debian's redis-server 7.0 when it is
  installed (CI installs it; with CI=true a missing one is an error, not a skip).
- ``project``: a fresh project folder (fixture functions + schemas + runner.toml) with a
  unique key prefix, its Runtime and Client, and ``spawn_worker`` for subprocess workers.

Never sleep to synchronise: use ``wait_for`` with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redisguard

from runner import config as config_mod
from runner.client import Client
from runner.runtime import Runtime
from runner.store import records
from runner.store.embedded import Server, debian_binary

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).parent.parent

redisguard.install()


# No test may reach a Redis it did not start. Without REDIS_URL, runner's default is
# 127.0.0.1:6379: a client a test forgot to point at its own server (a handler's
# ``Client.from_config()`` in this process or in a child of a worker started here) wrote
# into whatever answers there, a developer's or another app's server, and passed. So
# REDIS_URL of this process, and of every process that inherits its environment
# (xdist's workers, subprocesses, a worker's children), names a port this process holds
# bound and never listens on: such a client fails at once with a connection error. A
# test of what happens without REDIS_URL says so in the environment it passes
# (``config.load(path, env={})``, a subprocess's ``env=`` without it, monkeypatch.delenv).
NO_REDIS = "RUNNER_TESTS_NO_REDIS"  # (a RUNNER_ name: Project.env leaves it out of its processes)


def _no_redis_here() -> socket.socket | None:
    """Point REDIS_URL at a port bound here (never listening) unless the process that
    started this one did (xdist's workers keep their controller's); the socket holds the
    port for as long as this process lives, so no server a test starts can take it."""
    url = os.environ.get(NO_REDIS)
    if url and os.environ.get("REDIS_URL") == url:
        return None
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    url = f"redis://127.0.0.1:{held.getsockname()[1]}/0"
    os.environ["REDIS_URL"] = os.environ[NO_REDIS] = url
    return held


_NO_REDIS_PORT = _no_redis_here()


def compile_package() -> None:
    """The runner package's bytecode, written once before the run, as ``pip install``
    writes an installed package's. On a host that sets PYTHONDONTWRITEBYTECODE nothing
    else writes it, and every worker, child, web server and command the tests start
    compiled the whole package from source first (about a third of each one's start-up
    CPU). Hash-checked: a file edited since is compiled afresh, however quick the edit.
    A package that cannot be written to (installed read-only) is left as it is."""
    if not sys.dont_write_bytecode:
        return  # the first process to import a module writes its bytecode, as usual
    import importlib.util
    import py_compile

    for source in sorted(Path(config_mod.__file__).parent.rglob("*.py")):
        cached = Path(importlib.util.cache_from_source(str(source)))
        want = importlib.util.source_hash(source.read_bytes())
        with contextlib.suppress(OSError):
            head = cached.read_bytes()[:16]
            if head[4:8] == (3).to_bytes(4, "little") and head[8:16] == want:
                continue  # compiled from this very source already
        with contextlib.suppress(OSError, py_compile.PyCompileError):
            py_compile.compile(str(source), str(cached), doraise=True,
                               invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)


def rewrite_test_modules(config: pytest.Config) -> None:
    """The test modules' assertion-rewritten bytecode, written once before the run, where
    pytest writes it itself (``__pycache__/*-pytest-*.pyc``) on a host that does not set
    PYTHONDONTWRITEBYTECODE. On one that does, every test process rewrote every test
    module it collected, on every run: parsing them and rewriting their asserts was about
    9 s of CPU of each process's 12 s of collection (four times over under ``-n 4``). The
    processes read what is written here as pytest reads its own cache (valid while the
    source's mtime and size match; a module edited since is rewritten as before). This
    calls pytest's own rewriting, whose names are private: under a pytest without them,
    each process rewrites for itself, as before."""
    if not sys.dont_write_bytecode or config.getoption("assertmode") != "rewrite":
        return  # pytest writes its cache itself, or rewrites nothing
    try:
        from _pytest.assertion import rewrite

        read, make, write = rewrite._read_pyc, rewrite._rewrite_test, rewrite._write_pyc
        cache_dir, tail, state = rewrite.get_cache_dir, rewrite.PYC_TAIL, config.stash[rewrite.assertstate_key]
    except (ImportError, AttributeError, KeyError):
        return
    import fnmatch

    patterns = [*config.getini("python_files"), "conftest.py"]
    modules: set[Path] = set()
    for arg in config.args:
        path = config.invocation_params.dir / arg.split("::")[0]
        if path.is_file():
            modules |= {path, *(p / "conftest.py" for p in path.parents if (p / "conftest.py").is_file())}
        elif path.is_dir():
            modules |= {p for p in path.rglob("*.py")
                        if any(fnmatch.fnmatch(p.name, pat) for pat in patterns)
                        and not any(part.startswith(".") or part == "node_modules" for part in p.parts)}
    for source in sorted(modules):
        pyc = cache_dir(source) / (source.name[:-3] + tail)
        if read(source, pyc) is not None:
            continue  # rewritten from this very source already
        with contextlib.suppress(OSError, SyntaxError):
            pyc.parent.mkdir(exist_ok=True)
            stat, code = make(source, config)
            write(state, code, stat, pyc)


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # once, in the process that starts the others
        compile_package()
        rewrite_test_modules(config)


@pytest.fixture(autouse=True)
def _store_owns_redis() -> Iterator[None]:
    """Fail a test during which runner code outside ``runner/store/`` sent Redis a command
    in this process (redisguard.py): the store owns every command."""
    redisguard.seen.clear()
    yield
    found, redisguard.seen[:] = sorted(set(redisguard.seen)), []
    if found:
        pytest.fail("Redis commands sent from outside runner/store/ (module, line, command): "
                    + "; ".join(f"{m}:{line} {c}" for m, line, c in found), pytrace=False)


class LoopTicks:
    """Counts 10 ms turns of the running event loop while a test awaits something: a
    count near the time awaited shows the loop was never blocked meanwhile."""

    def __init__(self) -> None:
        self.count = 0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(0.01)
            self.count += 1

    async def __aenter__(self) -> LoopTicks:
        self._task = asyncio.get_running_loop().create_task(self._tick())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()


# SCAN's page in the tests' look-ups of a prefix's keys (scan_iter(count=SCAN_COUNT, ...)):
# a test process's session server holds the keys of every test it ran before (hundreds of
# thousands late in a run), and at SCAN's default of 10 a look for one test's keys took
# tens of thousands of round trips (4 to 23 s each in test_web_hostile's checks).
SCAN_COUNT = 10_000


def wait_for(pred: Callable[[], Any], timeout: float = 10.0, interval: float | None = None, what: str = "") -> Any:
    """``pred()``'s first true value, polled until ``timeout`` s have passed. Without an
    ``interval`` the polls come 10 ms apart at first and back off to 50 ms: most waits end
    within a few polls, and a long one (a worker's start, a lease's lapse, a child's) polled
    every 10 ms throughout cost a look-up in the test process and one in Redis each time,
    CPU the run is short of."""
    deadline = time.monotonic() + timeout
    pause = 0.01 if interval is None else interval
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or pred}")
        time.sleep(pause)
        if interval is None:
            pause = min(pause * 1.5, 0.05)


# The long randomised runs (chaos, the hypothesis models, the API fuzz) are bounded in the
# default run; RUNNER_TEST_FULL=1 runs them all at full size, and each one's own variable
# (CHAOS_SECONDS, MODEL_EXAMPLES, ...) still wins over both.
FULL = os.environ.get("RUNNER_TEST_FULL") == "1"


def size(name: str, default: float, full: float) -> float:
    """A test's size: its variable if set, else the full or the bounded default."""
    value = os.environ.get(name)
    return float(value) if value else (full if FULL else default)


PROTECTED_CONFIGS = ["--enable-protected-configs", "yes"]  # server args: CONFIG SET dir


def refuse_writes(r: Any, scratch: Path) -> None:
    """Make a server (started with PROTECTED_CONFIGS) refuse every write with MISCONF, as
    it does when it cannot persist: snapshots on, and the next one fails because its
    directory is gone."""
    gone = scratch / "gone"
    gone.mkdir()
    r.config_set("dir", str(gone))
    gone.rmdir()
    r.config_set("save", "3600 1")  # writes stop on a failed snapshot only with snapshots on
    r.config_set("stop-writes-on-bgsave-error", "yes")
    r.bgsave()
    wait_for(lambda: r.info("persistence")["rdb_last_bgsave_status"] == "err", timeout=10,
             what="a failed snapshot")


def take_writes_again(r: Any, scratch: Path) -> None:
    """Undo refuse_writes: a snapshot that succeeds lifts the refusal."""
    r.config_set("dir", str(scratch))
    r.bgsave()
    wait_for(lambda: r.info("persistence")["rdb_last_bgsave_status"] == "ok", timeout=10,
             what="a good snapshot")


@pytest.fixture(scope="session")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One headless browser per test process (browserkit.Chromium), each browser test's
    ``browser`` a fresh tab of it."""
    from browserkit import Chromium

    c = Chromium(tmp_path_factory.mktemp("chromium-profile"))
    yield c
    c.quit()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = Server(tmp_path_factory.mktemp("valkey"), appendonly=True).start()
    yield s
    s.stop()


def _redis7(tmp_path_factory: pytest.TempPathFactory) -> Server | None:
    binary = debian_binary()
    if binary is None:
        if os.environ.get("CI"):
            raise RuntimeError("CI must install Debian's redis-server (apt-get install redis-server)")
        return None
    return Server(tmp_path_factory.mktemp("redis7"), binary=binary, appendonly=True).start()


@pytest.fixture(scope="session")
def redis7_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server | None]:
    s = _redis7(tmp_path_factory)
    yield s
    if s is not None:
        s.stop()


@pytest.fixture(params=["valkey", "redis7"])
def any_server(request: pytest.FixtureRequest, server: Server) -> Server:
    if request.param == "valkey":
        return server
    s = request.getfixturevalue("redis7_server")
    if s is None:
        pytest.skip("Debian's redis-server is not installed here (apt-get install redis-server runs these)")
    return s


DEFAULT_TOML = """
[redis]
prefix = "{prefix}"

[queues.fast]
visibility_timeout = {vt}
concurrency = {concurrency}
max_attempts = {max_attempts}
batch = {batch}
prefetch = {prefetch}
backoff = {{ base = 0.01, cap = 0.05, jitter = "full" }}
{fast_extra}

[queues.slow]
visibility_timeout = {slow_vt}
concurrency = 2
max_attempts = 3
max_timeout = 600

[retention]
done = 3600
dead = 3600
idempotency = 3600

[worker]
grace_period = {grace}
scheduler_interval = 0.05
{worker_extra}

[log]
level = "INFO"
format = "json"
"""


@dataclass
class Project:
    root: Path
    server: Server
    prefix: str
    records: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _runtime: Runtime | None = None

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}
        env.update({
            "REDIS_URL": self.server.url,
            "RECORD_DIR": str(self.records),
            "OUTBOX_DIR": str(self.root / "outbox"),
            "REPORTS_DIR": str(self.root / "reports"),
            "PYTHONUNBUFFERED": "1",
        })
        return env

    def config(self) -> config_mod.Config:
        return config_mod.load(self.root / "runner.toml", env=self.env)

    @property
    def runtime(self) -> Runtime:
        if self._runtime is None:
            self._runtime = Runtime.create(self.config())
        return self._runtime

    @property
    def client(self) -> Client:
        return Client(self.runtime)

    def add_function(self, name: str, source: str, schema: str = '{"type": "object"}') -> None:
        """functions/<name>.py with ``source`` and its v1 schema; the next runtime loads it."""
        (self.root / "functions" / f"{name}.py").write_text(source)
        (self.root / "schemas" / name).mkdir(parents=True, exist_ok=True)
        (self.root / "schemas" / name / "v1.json").write_text(schema)
        self._runtime = None

    def write_config(
        self, vt: float = 2, slow_vt: float = 10, grace: float = 5, extra: str = "", *,
        concurrency: int = 8, max_attempts: int = 3, batch: int = 64, prefetch: int = 8,
        worker: str = "", fast: str = "",
    ) -> None:
        """runner.toml for the test; ``worker`` and ``fast`` add lines to its [worker] and
        [queues.fast] tables, ``extra`` appends tables of its own."""
        text = DEFAULT_TOML.format(
            prefix=self.prefix, vt=vt, slow_vt=slow_vt, grace=grace, concurrency=concurrency,
            max_attempts=max_attempts, batch=batch, prefetch=prefetch, worker_extra=worker, fast_extra=fast,
        ) + extra
        (self.root / "runner.toml").write_text(text)
        if self._runtime is not None:
            self._runtime.close()
        self._runtime = None

    def spawn_worker(
        self, *queues: str, env: dict[str, str] | None = None, log_name: str | None = None
    ) -> subprocess.Popen[bytes]:
        args = [sys.executable, "-m", "runner.cli", "--config", str(self.root / "runner.toml"), "worker"]
        for q in queues:
            args += ["--queue", q]
        log = open(self.root / (log_name or f"worker-{len(self.procs)}.log"), "ab")  # noqa: SIM115
        proc = subprocess.Popen(args, cwd=self.root, env={**self.env, **(env or {})},
                                stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def keys(self, queue: str = "fast") -> Any:
        return self.runtime.keys[queue]

    def runs(self, job_id: str) -> list[str]:
        p = self.records / job_id
        return p.read_text().splitlines() if p.exists() else []

    def close(self) -> None:
        """Its processes killed and its runtime's connections closed (a fixture's end)."""
        self.stop_all()
        if self._runtime is not None:
            self._runtime.close()

    def stop_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)


@dataclass
class Endpoint:
    """A server a Project is made for by its URL alone (a cluster, a sentinel set, TLS)."""

    url: str


def make_project(root: Path, server: Server, examples: bool = False) -> Project:
    """A project folder with the test fixtures' functions and schemas, or with the
    repository's shipped examples (``examples=True``), as a user's project has them."""
    root.mkdir(parents=True, exist_ok=True)
    source = REPO if examples else FIXTURES
    shutil.copytree(source / "functions", root / "functions", dirs_exist_ok=True)
    shutil.copytree(source / "schemas", root / "schemas", dirs_exist_ok=True)
    records = root / "records"
    records.mkdir(exist_ok=True)
    p = Project(root=root, server=server, prefix=f"t{uuid.uuid4().hex[:10]}", records=records)
    p.write_config()
    return p


@contextlib.contextmanager
def worker_project(root: Path, server: Server, functions: dict[str, str], queue: str = "fast",
                   concurrency: int = 8) -> Iterator[Project]:
    """One project and one worker on ``queue`` for a module's tests that read only their
    own jobs (and the counters of functions of their own), every function there before
    the worker starts (it loads them all). A worker per test (its start, imports and first
    claim, and a first child under process isolation) was most of such a test's time.
    ``concurrency``: its executor slots; with a process-isolated function among them, each
    slot warms a child at the start (about 0.2 s of CPU each), so tests that run one job at
    a time ask for two."""
    project = make_project(root, server)
    if concurrency != 8:
        project.write_config(concurrency=concurrency)
    for name, source in functions.items():
        project.add_function(name, source)
    project.spawn_worker(queue)
    try:
        yield project
    finally:
        project.close()


def keep_functions(project: Project, *names: str) -> Project:
    """Leave only these fixture functions (and their schemas) in the project's folder, before
    its runtime is made: tests of the scripts read no function, and each runtime loads what
    the folder holds."""
    for path in (project.root / "functions").glob("*.py"):
        if path.stem not in names:
            path.unlink()
            shutil.rmtree(project.root / "schemas" / path.stem, ignore_errors=True)
    return project


def _project_on(root: Path, server: Server) -> Iterator[Project]:
    p = make_project(root, server)
    yield p
    p.stop_all()
    if p._runtime is not None:
        p._runtime.close()


@pytest.fixture
def project(tmp_path: Path, server: Server) -> Iterator[Project]:
    yield from _project_on(tmp_path / "project", server)


@pytest.fixture
def any_project(tmp_path: Path, any_server: Server) -> Iterator[Project]:
    yield from _project_on(tmp_path / "project", any_server)


def done_ids(r: Any, k: Any) -> list[str]:
    """The ids with a done outcome in any generation kept (see includes/done.lua: done_gen); every
    id of a generation is in its log too."""
    gen = int(r.hget(k.done_meta, "gen") or 0)
    out: list[str] = []
    for g in range(gen, gen - 4, -1):
        pipe = r.pipeline(transaction=True)  # one snapshot: the worker writes both at once
        pipe.hkeys(k.done(g))
        pipe.lrange(k.done(g) + ":log", 0, -1)
        ids, log = pipe.execute()
        assert sorted(ids) == sorted(log), ("a done generation and its log differ", g, ids, log)
        out += ids
    return out


def structures(project: Project, queue: str = "fast") -> dict[str, list[str]]:
    """Where every job id of a queue is: ready, leases, scheduled (the sleeping set's too:
    a sleeping job waits there alone), parked (on a limit's waiter list), dead, done (the
    done outcomes). Claims and leases must hold the same ids."""
    k = project.keys(queue)
    r = project.runtime.redis
    leases, claims = r.zrange(k.leases, 0, -1), r.hkeys(k.claims)
    assert sorted(leases) == sorted(claims), ("leases and claims differ", leases, claims)
    parked: list[str] = []
    for key in r.zrange(k.limwait, 0, -1):
        parked += r.lrange(k.limit(key) + ":w", 0, -1)
    return {
        "ready": r.lrange(k.ready, 0, -1),
        "leases": leases,
        "scheduled": r.zrange(k.scheduled, 0, -1) + r.zrange(k.sleeping, 0, -1),
        "parked": parked,
        "dead": r.zrange(k.dead, 0, -1),
        "done": done_ids(r, k),
    }


def view(project: Project, job_id: str, queue: str = "fast") -> dict[str, str]:
    """A job as readers see it: record, state, claim or done outcome in one view."""
    rec, state, claim, outcome = project.runtime.scripts.lookup(project.keys(queue), job_id)
    rec = rec if isinstance(rec, str) and not rec.startswith("\0") else None
    return records.view(job_id, rec, state or [], claim or None, outcome or None)


def raw_status(raw: Any, k: Any, job_id: bytes) -> bytes | None:
    """A job's status read with a bytes client (ids that are not UTF-8): a done outcome or
    a claim overrides the state's own field (see records.view)."""
    gen = int(raw.hget(k.done_meta.encode(), "gen") or 0)
    if any(raw.hexists(k.done(g).encode(), job_id) for g in range(gen, gen - 4, -1)):
        return b"done"
    if raw.hexists(k.claims.encode(), job_id):
        return b"processing"
    jk = k.job_prefix.encode() + job_id
    if not raw.exists(jk, jk + b":s"):  # a buried id without a record keeps its state alone
        return None
    return raw.hget(jk + b":s", "status") or b"queued"  # type: ignore[no-any-return]


def assert_no_job_in_two_structures(project: Project, queue: str = "fast") -> None:
    seen: dict[str, str] = {}
    for name, ids in structures(project, queue).items():
        for i in ids:
            assert i not in seen, f"job {i} is in both {seen[i]} and {name}"
            seen[i] = name
    assert_suspended_indexed(project, queue)


def assert_suspended_indexed(project: Project, queue: str = "fast") -> None:
    """The delayed and waiting list indexes hold exactly the scheduled ids of their statuses
    (delayed: scheduled and retrying), each at its due time there; the sleeping set holds
    the sleeping jobs, none of which is in scheduled."""
    r = project.runtime.redis
    for k in project.runtime.parts.get(queue) or [project.keys(queue)]:
        asleep = dict(r.zrange(k.sleeping, 0, -1, withscores=True))
        due = dict(r.zrange(k.scheduled, 0, -1, withscores=True))
        due.update(asleep)
        pipe = r.pipeline(transaction=False)
        for job_id in due:
            pipe.hget(k.state(job_id), "status")
        status = dict(zip(due, pipe.execute(), strict=True)) if due else {}
        for names, key in ((("sleeping",), k.sleeping), (("waiting",), k.waiting),
                           (("scheduled", "retrying"), k.delayed)):
            want = {i: due[i] for i, s in status.items() if s in names}
            assert dict(r.zrange(key, 0, -1, withscores=True)) == want, (names, k.queue)
