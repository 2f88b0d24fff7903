"""The pytest plugin, as a user's project gets it: a tiny project of its own (functions,
schemas, runner.toml, a test file) run by pytest in a subprocess, with the plugin loaded
the way installing runner loads it (its ``pytest11`` entry point)."""

from __future__ import annotations

import importlib.metadata
import json
import tomllib

import pytest

from conftest import REPO

pytest_plugins = ["pytester"]

GREET = '''
QUEUE = "fast"

def handle(payload, ctx):
    ctx.progress(0.5)
    ctx.enqueue("notify", {"who": payload["name"]})
    return {"greeting": "Hello, " + payload["name"]}
'''
NOTIFY = '''
QUEUE = "fast"

def handle(payload, ctx):
    return {"notified": payload["who"]}
'''
FLAKY = '''
from runner import Retry

QUEUE = "fast"

def handle(payload, ctx):
    if ctx.attempt < 2:
        raise Retry(delay=0.1)
    return {"attempt": ctx.attempt}
'''
TOML = '''
[queues.fast]
visibility_timeout = 5
concurrency = 4
max_attempts = 3

[worker]
scheduler_interval = 0.05
'''
USER_TESTS = '''
import pytest
from runner import Client
from runner.testing import run_inline


def test_inline_runs_the_handler_and_records_follow_ups():
    out = run_inline("greet", {"name": "Ada"})
    assert out.status == "done" and out.result == {"greeting": "Hello, Ada"}
    assert [(f.type, f.payload) for f in out.enqueued] == [("notify", {"who": "Ada"})]
    assert out.progress == (0.5,)


def test_inline_refuses_an_invalid_payload():
    out = run_inline("greet", {"name": 3})
    assert (out.status, out.reason) == ("dead", "invalid payload")


def test_drain_runs_jobs_and_their_follow_ups(runner_client, runner_worker, assert_enqueued):
    runner_client.enqueue("greet", {"name": "Bo"})
    runner_client.enqueue("flaky", {})
    outcomes = runner_worker.drain(timeout=10)
    assert sorted((o.type, o.status) for o in outcomes) == [("flaky", "done"), ("greet", "done"), ("notify", "done")]
    assert next(o for o in outcomes if o.type == "flaky").attempt == 2
    assert_enqueued("notify", {"who": "Bo"}, count=1)
    assert runner_worker.drain(timeout=1) == []


def test_app_code_enqueues_on_the_private_server(assert_enqueued):
    Client.from_config().enqueue("notify", {"who": "app"})
    assert_enqueued("notify", {"who": "app"})


def test_each_test_starts_empty(assert_enqueued):
    with pytest.raises(AssertionError, match="expected at least one notify"):
        assert_enqueued("notify")
'''


def _schema(props: dict[str, str]) -> str:
    return json.dumps({"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
                       "properties": {k: {"type": t} for k, t in props.items()},
                       "required": list(props), "additionalProperties": False})


def _plugin_args() -> list[str]:
    """Nothing when the entry point is installed (pytest loads it itself); a source
    checkout run without installing names the module instead."""
    eps = importlib.metadata.entry_points(group="pytest11")
    return [] if any(ep.name == "runner_testing" for ep in eps) else ["-p", "runner.testing.plugin"]


def test_pyproject_registers_the_plugin() -> None:
    """Installing runner is enough: the plugin is a pytest11 entry point, not named
    "runner" (pytest's own plugin of that name would shadow it)."""
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"]["pytest11"] == {"runner_testing": "runner.testing.plugin"}


def test_a_project_tests_its_functions_with_the_plugin(pytester: pytest.Pytester) -> None:
    """A user's project gets run_inline, a private server, a client, a draining worker
    and assert_enqueued, and its own app code enqueues on that server."""
    pytester.makefile(".toml", runner=TOML)
    for name, src in {"greet": GREET, "notify": NOTIFY, "flaky": FLAKY}.items():
        (pytester.path / "functions").mkdir(exist_ok=True)
        (pytester.path / "functions" / f"{name}.py").write_text(src)
    for name, props in {"greet": {"name": "string"}, "notify": {"who": "string"}, "flaky": {}}.items():
        (pytester.path / "schemas" / name).mkdir(parents=True)
        (pytester.path / "schemas" / name / "v1.json").write_text(_schema(props))
    pytester.makepyfile(test_functions=USER_TESTS)
    result = pytester.runpytest_subprocess(*_plugin_args(), "-p", "no:cacheprovider", "-q", timeout=240)
    result.assert_outcomes(passed=5)
