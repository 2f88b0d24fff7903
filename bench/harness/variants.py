"""Other builds of runner, for the runner-only comparisons:

- a copy of the runner package as it is, and a copy with the metrics neutralised (the
  stats HINCRBYs in the scripts and the per-job timing fields the worker's settler sends), both run
  the same way (``python -m runner.cli`` with the copy first on PYTHONPATH);
- a virtual environment with the newest redis-py, to weigh the pin on redis<7.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from harness.systems import BENCH, PEERS_DIR, REPO, runner_src

# (file, text, replacement): every one must apply, or the build is refused.
METRICS_OFF = [
    ("store/lua/includes/stats.lua", "local function bump(fields)\n",
     "local function bump(fields)\n  if true then return end\n"),
    ("store/lua/includes/stats.lua", "local function tally(field)\n",
     "local function tally(field)\n  if true then return end\n"),
    ("store/lua/includes/stats.lua", "local function flush(stats_key)\n",
     "local function flush(stats_key)\n  if true then return end\n"),
    ("store/lua/includes/jobs.lua", "    stat_add(Q.stats, 'enqueued|' .. typ, c)\n", ""),
    ("worker/settler.py", "        if landed and fig.tput_prefix:\n", "        if False:\n"),
    ("worker/entries.py", 'fields = metrics.succeeded(t, (s.started_ms or now) - job.ready_ms, s.run_s * 1000, totals)',
     'fields = ""'),
]


def copy_runner(dest: Path, patches: list[tuple[str, str, str]] | None = None) -> Path:
    """A copy of the runner package under dest/ (importable with PYTHONPATH=dest)."""
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(runner_src() / "runner", dest / "runner",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for rel, old, new in patches or []:
        p = dest / "runner" / rel
        text = p.read_text()
        if old not in text:
            raise RuntimeError(f"metrics-off patch no longer applies to runner/{rel}: {old.strip()!r}")
        p.write_text(text.replace(old, new, 1))
    return dest


def pythonpath(dest: Path) -> dict[str, str]:
    return {"PYTHONPATH": f"{dest}:{PEERS_DIR}"}


NEW_REDIS_VENV = BENCH / ".venv-redis-new"
def _runner_deps() -> list[str]:
    """runner's dependencies but redis-py, as pyproject.toml declares them (a list kept by
    hand here went stale when one was added)."""
    import tomllib

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return [d for d in deps if not d.startswith("redis")]


RUNNER_DEPS = _runner_deps()


def new_redis_env(spec: str = "redis[hiredis]>=7") -> str | None:
    """The python of a venv with runner's dependencies and the newest redis-py."""
    py = NEW_REDIS_VENV / "bin" / "python"
    if not py.exists():
        print(f"  creating {NEW_REDIS_VENV.name} with {spec} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(NEW_REDIS_VENV)], check=True)
        proc = subprocess.run([str(py), "-m", "pip", "install", "-q", spec, *RUNNER_DEPS],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"  skip: cannot install {spec}: {proc.stderr.strip()[-400:]}", flush=True)
            shutil.rmtree(NEW_REDIS_VENV, ignore_errors=True)
            return None
    return str(py)
