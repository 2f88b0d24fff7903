"""The systems under test: how to start two workers of each and how to run its producer.

runner runs from the interpreter that runs the benchmark (where runner is installed);
the peers run from their own virtual environment (see venv.py). Every worker process
imports bench/peers/benchprobe.py, and every system reads the same Redis URL.
"""

from __future__ import annotations

import compileall
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent.parent
PEERS_DIR = BENCH / "peers"
REPO = BENCH.parent
WORKERS = 2


def snapshot(dest: Path) -> Path:
    """Freeze the runner under test: a copy of the package (and of the repository's
    runner.toml, functions/ and schemas/) that every runner process of this run imports
    first, so edits to the work tree during a run never mix two versions in one table."""
    shutil.copytree(REPO / "runner", dest / "runner", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("functions", "schemas"):
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, dest / "repo" / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "runner.toml", dest / "repo" / "runner.toml")
    # Compiled as `pip install` compiles an installed package: without it, a machine that
    # sets PYTHONDONTWRITEBYTECODE would compile every module from source on every start,
    # and the start-up, worker-start and deploy-gate figures would time the compiler.
    compileall.compile_dir(dest / "runner", quiet=1)
    os.environ["BENCH_RUNNER_SRC"] = str(dest)
    sys.path.insert(0, str(dest))
    return dest


def runner_src() -> Path:
    """The frozen copy when the run made one, else the repository."""
    src = os.environ.get("BENCH_RUNNER_SRC")
    return Path(src) if src else REPO


def git_state() -> dict[str, str]:
    def git(*args: str) -> str:
        out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
        return out.stdout.strip()

    return {"commit": git("rev-parse", "--short", "HEAD"),
            "runner_dirty": "yes" if git("status", "--porcelain", "--", "runner") else "no"}


@dataclass
class System:
    name: str
    label: str  # name, version and mode, as the table shows it
    python: str
    worker_cmds: list[list[str]]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = str(PEERS_DIR)
    note: str = ""
    producer: str = ""  # drive.py's name for its producer, when not the system's name

    def with_env(self, **extra: str) -> System:
        """The same system, its workers started with these variables too."""
        return replace(self, env={**self.env, **extra})

    def environ(self, url: str, probe_dir: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("RUNNER_", "PYTHON", "VIRTUAL_ENV"))}
        env.update({
            "BENCH_REDIS_URL": url, "REDIS_URL": url, "BENCH_PROBE_DIR": str(probe_dir),
            "PYTHONPATH": f"{runner_src()}:{PEERS_DIR}" if runner_src() != REPO else str(PEERS_DIR),
            "PYTHONUNBUFFERED": "1",
        })
        env.update(self.env)
        return env

    def drive(self, url: str, probe_dir: Path, *args: str, timeout_s: float = 120.0) -> dict[str, Any]:
        """Run bench/peers/drive.py in this system's environment; its JSON answer."""
        cmd = [self.python, str(PEERS_DIR / "drive.py"), self.producer or self.name, *args]
        proc = subprocess.run(cmd, env=self.environ(url, probe_dir), cwd=self.cwd,
                              capture_output=True, text=True, timeout=timeout_s)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"{self.name} producer failed ({proc.returncode}): "
                               f"{proc.stderr.strip()[-1500:]}")
        out: dict[str, Any] = json.loads(lines[-1])
        return out


# --- runner ----------------------------------------------------------------------------

NOOP = '''"""A no-op job for the benchmark: it only tells the probe that it started."""

from benchprobe import hit, work

QUEUE = "fast"


def handle(payload, ctx):
    hit(payload.get("t", 0.0))
    work()  # $BENCH_WORK: nothing, one Redis INCR, or a 1 ms sleep
'''

GUARDED = '''"""A no-op job with an idempotency key and a resource lock (distinct per job)."""

from benchprobe import hit

QUEUE = "fast"
IDEMPOTENCY_KEY = "{k}"
RESOURCE_KEY = "res:{k}"


def handle(payload, ctx):
    hit(payload.get("t", 0.0))
'''

SLEEPER = '''"""A long job on the slow queue: it sleeps (I/O-bound) for payload["s"] seconds."""

import time

QUEUE = "slow"
TIMEOUT = 120


def handle(payload, ctx):
    time.sleep(payload["s"])
'''

# Flow control (issue 22): a per-key concurrency limit over FLOW_KEYS keys (2 x 100 = 200
# slots, well above the 32 threads of 2 workers) and a global rate limit far above capacity.
FLOW_KEYS = 100
FLOW_KEY_LIMIT = 2
FLOW_RATE = 1_000_000  # starts per second

KEYED = f'''"""A no-op job with a per-key concurrency limit: at most {FLOW_KEY_LIMIT} running per key."""

from benchprobe import hit, work

QUEUE = "fast"
CONCURRENCY = {{"key": "tenant:{{k}}", "limit": {FLOW_KEY_LIMIT}}}


def handle(payload, ctx):
    hit(payload.get("t", 0.0))
    work()
'''

RATED = f'''"""A no-op job with a global rate limit far above what the workers can start."""

from benchprobe import hit, work

QUEUE = "fast"
RATE_LIMIT = {{"limit": {FLOW_RATE}, "period": 1}}


def handle(payload, ctx):
    hit(payload.get("t", 0.0))
    work()
'''

SCHEMA = {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
          "properties": {"t": {"type": "number"}}, "additionalProperties": False}
GUARDED_SCHEMA = {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
                  "properties": {"t": {"type": "number"}, "k": {"type": "string"}},
                  "required": ["k"], "additionalProperties": False}
SLEEPER_SCHEMA = {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
                  "properties": {"s": {"type": "number", "minimum": 0, "maximum": 120}},
                  "required": ["s"], "additionalProperties": False}


def runner_project(root: Path) -> Path:
    """A project folder: the no-op functions and their schemas, and runner.toml with the
    repository's shipped queue defaults, logging at WARNING. Returns the runner.toml."""
    (root / "functions").mkdir(parents=True, exist_ok=True)
    for name, src, schema in (("noop", NOOP, SCHEMA), ("noop_guarded", GUARDED, GUARDED_SCHEMA),
                              ("sleeper", SLEEPER, SLEEPER_SCHEMA)):
        (root / "functions" / f"{name}.py").write_text(src)
        (root / "schemas" / name).mkdir(parents=True, exist_ok=True)
        (root / "schemas" / name / "v1.json").write_text(json.dumps(schema, indent=2))
    shipped = (runner_src() / "repo" / "runner.toml" if runner_src() != REPO
               else REPO / "runner.toml").read_text()
    lines = [ln for ln in shipped.splitlines() if not ln.startswith("url")]
    text = "\n".join(lines).replace('prefix = "runner"', 'prefix = "bench"')
    toml = root / "runner.toml"
    toml.write_text(text + '\n\n[log]\nlevel = "WARNING"\n')
    return toml


def flow_project(root: Path) -> Path:
    """runner_project's folder plus the flow-controlled no-ops (noop_keyed: per-key
    CONCURRENCY; noop_rated: RATE_LIMIT), so one worker setup serves all three drains."""
    toml = runner_project(root)
    for name, src, schema in (("noop_keyed", KEYED, GUARDED_SCHEMA), ("noop_rated", RATED, SCHEMA)):
        (root / "functions" / f"{name}.py").write_text(src)
        (root / "schemas" / name).mkdir(parents=True, exist_ok=True)
        (root / "schemas" / name / "v1.json").write_text(json.dumps(schema, indent=2))
    return toml


PROCESS_CONCURRENCY = 2  # children per worker process: the shipped slow queue's


def isolated_project(toml: Path, isolation: str = "process") -> Path:
    """A runner.toml beside ``toml`` (same functions) whose fast queue runs its handlers
    with the given isolation (the shipped fast queue runs them in threads). In process
    mode each worker process gets the shipped slow queue's 2 children: a child runs one
    job at a time in its own interpreter, so children beyond the cores only compete for
    them (measured: 2 x 2 children drained about 50 % more no-ops than 2 x 4)."""
    text = toml.read_text()
    head = "[queues.fast]\n"
    if head not in text:
        raise RuntimeError(f"no [queues.fast] table in {toml}")
    out = toml.with_name(f"runner-{isolation}.toml")
    text = text.replace(head, f'{head}isolation = "{isolation}"\n', 1)
    if isolation == "process":
        fast = text.index(head)
        end = text.find("\n[", fast + len(head))
        table = text[fast:end if end > 0 else len(text)]
        if "concurrency = " not in table:
            raise RuntimeError(f"no concurrency in the [queues.fast] table of {toml}")
        new = "\n".join(f"concurrency = {PROCESS_CONCURRENCY}" if ln.startswith("concurrency = ") else ln
                        for ln in table.split("\n"))
        text = text.replace(table, new, 1)
    out.write_text(text)
    return out


def runner_version(python: str = sys.executable, extra_env: dict[str, str] | None = None) -> str:
    code = ("import importlib.metadata as m, redis; "
            "print(m.version('runner'), redis.__version__)")
    env = {**os.environ, **(extra_env or {})}
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env)
    parts = out.stdout.split()
    return f"{parts[0]} (redis-py {parts[1]})" if len(parts) == 2 else "?"


def runner_system(
    toml: Path, name: str = "runner", python: str | None = None, queues: tuple[str, ...] = ("fast",),
    env: dict[str, str] | None = None, label: str | None = None, workers: int = WORKERS,
    system_name: str = "runner", note: str | None = None,
) -> System:
    """Two `runner worker --queue fast` processes (the console script), or, with another
    interpreter or source tree, the same command as ``python -m runner.cli``."""
    py = python or sys.executable
    script = Path(py).parent / "runner"
    base = [str(script)] if python is None and not env and script.exists() else [py, "-m", "runner.cli"]
    cmd = [*base, "--config", str(toml), "worker"]
    for q in queues:
        cmd += ["--queue", q]
    return System(
        name=system_name, label=label or f"{name} {runner_version(py, env)}", python=py,
        worker_cmds=[cmd] * workers, env={"RUNNER_CONFIG": str(toml), **(env or {})},
        cwd=str(toml.parent), producer="runner",
        note=note or f"{workers} processes x 16 threads (shipped defaults), at-least-once, "
                     "schema validation on",
    )


# --- peers -----------------------------------------------------------------------------

def peer_versions(python: str) -> dict[str, str]:
    code = ("import importlib.metadata as m, json; out = {}\n"
            "for d in ('huey','dramatiq','bullmq','taskiq','taskiq-redis','saq','arq','celery','rq',"
            "'redis','hiredis'):\n"
            "    try: out[d] = m.version(d)\n"
            "    except Exception: pass\n"
            "print(json.dumps(out))")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True)
    try:
        versions: dict[str, str] = json.loads(out.stdout)
    except json.JSONDecodeError:
        return {}
    return versions


def peer_systems(python: str, url: str) -> list[System]:
    """Every peer whose package imports in the peers environment."""
    v = peer_versions(python)
    bin_dir = Path(python).parent
    out: list[System] = []

    def add(name: str, dist: str, mode: str, cmds: list[list[str]]) -> None:
        if dist not in v or name not in v:
            print(f"  skip {name}: not installed in the peers environment", flush=True)
            return
        label = f"{name} {v[name]}" + (f" + {dist} {v[dist]}" if dist != name else "")
        out.append(System(name=name, label=label, python=python, worker_cmds=cmds, note=mode))

    add("huey", "huey", "1 consumer, 2 worker processes (-k process -w 2), at-most-once",
        [[str(bin_dir / "huey_consumer"), "huey_app.huey", "-k", "process", "-w", str(WORKERS), "-q"]])
    add("dramatiq", "dramatiq", "2 processes x 8 threads",
        [[str(bin_dir / "dramatiq"), "dramatiq_app", "--processes", str(WORKERS), "--threads", "8"]])
    add("bullmq", "bullmq", "2 processes, concurrency 10",
        [[python, str(PEERS_DIR / "drive.py"), "bullmq", "worker"]] * WORKERS)
    add("taskiq", "taskiq-redis", "2 processes, Redis streams (group from the start)",
        [[str(bin_dir / "taskiq"), "worker", "taskiq_app:broker", "--workers", str(WORKERS),
          "--log-level", "WARNING"]])
    add("saq", "saq", "2 processes, concurrency 10",
        [[str(bin_dir / "saq"), "saq_app.settings", "--workers", str(WORKERS)]])
    add("arq", "arq", "2 processes, poll 10 ms",
        [[str(bin_dir / "arq"), "arq_app.WorkerSettings"]] * WORKERS)
    add("celery", "celery", "prefork 2, acks on receipt",
        [[str(bin_dir / "celery"), "-A", "celery_app", "worker", "--pool", "prefork", "-c", str(WORKERS),
          "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "WARNING"]])
    add("rq", "rq", "SimpleWorker x 2",
        [[str(bin_dir / "rq"), "worker", "-w", "rq.worker.SimpleWorker", "--url", url, "-q", "bench"]]
        * WORKERS)
    return out


def which(name: str) -> str | None:
    return shutil.which(name)
