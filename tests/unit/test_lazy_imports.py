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

from runner.store.embedded import Server

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


def loaded_by_command(*args: str, url: str = "redis://127.0.0.1:1/0", code: int | None = None) -> set[str]:
    """The modules a `runner` command has imported when it exits (by default Redis is
    unreachable: the commands that talk to it get as far as their first round trip, then
    exit 3); ``code``: the exit code it must end with."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "REDIS_URL": url}
    script = (f"import sys, runpy, json; sys.argv = ['runner', *{list(args)!r}]\n"
              "try:\n    runpy.run_module('runner.cli', run_name='__main__')\n"
              "except SystemExit as exc:\n    print('exit', exc.code)\n"
              "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=REPO,
                         check=True).stdout.splitlines()
    if code is not None:
        assert f"exit {code}" in out or (code == 0 and not any(ln.startswith("exit ") for ln in out)), out
    return set(json.loads(out[-1]))


# Everything a command that only reads Redis must not import: the web, worker, schema,
# file-watching and metrics dependencies, the client, the catalog's loader.
NOT_FOR_READING = (*HEAVY, *CORE, "runner.client", "runner.worker", "opentelemetry")


def command_modules(loaded: set[str]) -> list[str]:
    return sorted(m for m in loaded if m.startswith("runner.cli.") and m not in ("runner.cli.root",
                                                                                   "runner.cli.target"))


@pytest.mark.parametrize("args,module", [
    (["--help"], None),
    (["job", "--help"], "runner.cli.jobs"),
    (["worker", "--help"], "runner.cli.processes"),
    (["dead", "ls", "--help"], "runner.cli.dead"),
])
def test_help_imports_no_redis_no_asyncio_and_only_its_command(args: list[str], module: str | None) -> None:
    """--help, of the root or of any command, loads no Redis client (nor asyncio, which
    redis-py brings) and none of the heavy dependencies; a command's help imports that
    command's module and no other."""
    loaded = loaded_by_command(*args)
    assert sorted(m for m in (*HEAVY, *CORE, "redis", "asyncio", "runner.client") if m in loaded) == []
    if module is not None:
        assert command_modules(loaded) == [module]


@pytest.mark.parametrize("args", [["stats"], ["job", "0123456789abcdef012345"], ["stats", "--json"]])
def test_reading_commands_import_no_redis_py_schema_client_or_worker(args: list[str]) -> None:
    """`runner stats` and `runner job ID` load their own command module and talk to Redis
    on the store's own connection (store/link.py): neither redis-py (nor asyncio, which it
    brings) nor jsonschema, the schema compiler, the function loader, the client, the
    worker, the web app or the other commands, even when Redis does not answer."""
    loaded = loaded_by_command(*args)
    assert sorted(m for m in (*NOT_FOR_READING, "redis", "asyncio")
                  if any(x == m or x.startswith(m + ".") for x in loaded)) == []
    assert command_modules(loaded) == ["runner.cli.jobs"]


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


def test_reading_commands_that_reach_redis_import_no_redis_py(server: Server) -> None:
    """The same against a server that answers: `runner stats` reads its figures and
    `runner job ID` finds a job (exit 0), and neither has imported redis-py when it exits,
    so the saving cannot be lost without this failing."""
    import redis

    from runner.store.keys import for_queue
    from runner.store.records import encode

    r = redis.Redis(port=server.port)
    r.set(for_queue("runner", "fast").job("0123456789abcdef012345"), encode({"type": "t", "version": 1}))
    r.close()
    for args in (["stats"], ["job", "0123456789abcdef012345"]):
        loaded = loaded_by_command(*args, url=server.url, code=0)
        assert sorted(m for m in ("redis", "asyncio", "ssl") if m in loaded) == [], args
        # Nor logging (with traceback and textwrap): the runtime logs only when Redis fails.
        assert "logging" not in loaded, args


def test_the_deploy_gate_against_a_server_imports_no_redis_py(server: Server) -> None:
    """`runner check` reads its counts, the Redis settings, the workers' roster and the
    partition tags on the store's own connection: at exit it has imported neither redis-py
    (nor asyncio) nor importlib.metadata (the schema cache's versions are read off the
    installed files), which were most of the gate's time; nor, in a project without a
    SCHEDULE, the cron parser and the time zone database. `--scan`, which walks every job
    with SCAN, still goes through redis-py and still answers."""
    loaded = loaded_by_command("check", url=server.url, code=0)
    assert "runner.catalog.schedules" in loaded  # the functions were loaded and checked
    assert sorted(m for m in ("redis", "asyncio", "importlib.metadata", "cronsim", "zoneinfo")
                  if m in loaded) == []
    assert "runner.store.link" in loaded  # it did talk to the server
    assert "redis" in loaded_by_command("check", "--scan", url=server.url, code=0)
