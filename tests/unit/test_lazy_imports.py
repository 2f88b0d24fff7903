"""Every `runner` command pays for what `import runner.cli` imports before it parses its
arguments, and every handler for what `import runner` imports: the heavy dependencies
load only in the commands and processes that use them. A fresh interpreter per case, so
what the test run itself imported does not count."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parent.parent.parent

# Loaded by the web server, the worker, `runner check` and `runner dev`, never by parsing.
HEAVY = ("jsonschema", "jsonschema_rs", "falcon", "uvicorn", "gunicorn", "watchfiles",
         "prometheus_client", "cronsim")
CORE = ("runner.worker.worker", "runner.web", "runner.dev.supervisor", "runner.catalog.registry")


def loaded_after(code: str) -> set[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True, text=True, env=env, cwd=REPO, check=True,
    ).stdout
    return set(json.loads(out.splitlines()[-1]))


@pytest.mark.parametrize("code", ["import runner.cli", "import runner; runner.Retry; runner.PermanentFailure"])
def test_parsing_a_command_or_importing_the_api_loads_no_heavy_dependency(code: str) -> None:
    """`import runner.cli` (every command) and `import runner` (every handler) load none
    of the web, worker, schema or file-watching dependencies, nor redis-py."""
    loaded = loaded_after(code)
    assert sorted(m for m in (*HEAVY, *CORE, "redis") if m in loaded) == []


def test_the_client_loads_no_schema_compiler_and_no_web_or_worker() -> None:
    """`runner.Client` (`runner job`, `runner stats`, an app that enqueues) loads redis-py
    but compiles no schema until a registry is loaded, and knows no web, worker or dev."""
    loaded = loaded_after("import runner; runner.Client")
    assert "redis" in loaded
    assert sorted(m for m in (*HEAVY, *CORE) if m in loaded) == []


def test_help_names_its_redis_without_redis_py() -> None:
    """`runner --help` says which Redis it would use, from the config alone."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "REDIS_URL": "redis://127.0.0.1:1/0"}
    code = ("import sys, runpy; sys.argv = ['runner', '--help']\n"
            "try:\n    runpy.run_module('runner.cli', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "print('redis' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO,
                         check=True).stdout
    assert "Redis here and now: redis://127.0.0.1:1/0" in out
    assert out.splitlines()[-1] == "False"


def test_the_command_map_names_every_command_and_its_module() -> None:
    """root.COMMANDS (what the lazy root group imports per command) matches what the
    command modules register."""
    import importlib

    from runner.cli.root import COMMANDS, cli

    for module in set(COMMANDS.values()):
        importlib.import_module(f"runner.cli.{module}")
    assert sorted(cli.commands) == sorted(COMMANDS)
    assert {n: c.callback.__module__ for n, c in cli.commands.items() if c.callback} == {
        n: f"runner.cli.{m}" for n, m in COMMANDS.items()}
