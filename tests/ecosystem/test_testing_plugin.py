"""The pytest plugin, as a user's project gets it: a tiny project of its own (functions,
schemas, runner.toml, a test file) run by pytest in a subprocess, with the plugin loaded
the way installing runner loads it (its ``pytest11`` entry point)."""

from __future__ import annotations

import collections
import importlib.metadata
import importlib.util
import json
import os
import time
import tomllib
import uuid
import xml.etree.ElementTree as ET

import pytest
import redis

from runner.store.bell import BELL_S
from runner.store.embedded import Server
from runner.testing.harness import Harness

from conftest import REPO, SCAN_COUNT, Project

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
CHAIN = '''
import random, time
QUEUE = "fast"

def handle(payload, ctx):
    time.sleep(random.uniform(0, 0.02))  # each link ends at some moment of drain's polls
    if payload["n"] > 0:
        ctx.enqueue("chain", {"n": payload["n"] - 1})
    return {"n": payload["n"]}
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


def test_drain_waits_for_the_follow_ups_of_a_chain(runner_client, runner_worker):
    # A parent read as done may have written its follow-up after drain read the ids: the
    # first drain returned [2, 3] or [1, 2, 3] now and then, and a second ran the rest.
    for _ in range(40):
        runner_client.enqueue("chain", {"n": 3})
        assert sorted(o.result["n"] for o in runner_worker.drain(timeout=10)) == [0, 1, 2, 3]


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


# The pytest plugins of this suite's own test tools (schemathesis's, anyio's, hypothesis's,
# pytest-benchmark's, xdist's), which a project's pytest would not have: each pytest run
# here imported them at its start (hypothesis alone 1.3 s of CPU; without the five a
# pytest starts in a third of the CPU). Every other installed plugin, runner's and
# pytest-django's among them, loads as usual.
NOT_THE_PROJECTS = ["-p", "no:schemathesis", "-p", "no:anyio", "-p", "no:hypothesispytest", "-p", "no:benchmark",
                    "-p", "no:xdist", "-p", "no:xdist.looponfail"]


def _plugin_args() -> list[str]:
    """Runner's plugin by its entry point when that is installed (pytest loads it itself);
    a source checkout run without installing names the module instead."""
    eps = importlib.metadata.entry_points(group="pytest11")
    return NOT_THE_PROJECTS + ([] if any(ep.name == "runner_testing" for ep in eps)
                               else ["-p", "runner.testing.plugin"])


def test_pyproject_registers_the_plugin() -> None:
    """Installing runner is enough: the plugin is a pytest11 entry point, not named
    "runner" (pytest's own plugin of that name would shadow it)."""
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"]["pytest11"] == {"runner_testing": "runner.testing.plugin"}


def _outcomes(pytester: pytest.Pytester, *args: str) -> dict[str, dict[str, int]]:
    """One pytest run of the project's test files (a user's ``pytest``), and each file's
    outcomes read from its JUnit report: {"test_x": {"passed": 4, "xfailed": 1}}. One run
    for several files a project of the same layout holds, where a run each started
    pytest, the plugin's server and its imports again (most of each one's CPU)."""
    report = pytester.path / "report.xml"
    result = pytester.runpytest_subprocess(*_plugin_args(), "-p", "no:cacheprovider", "-q",
                                           f"--junitxml={report}", *args, timeout=420)
    assert report.exists(), result.stdout.str() + result.stderr.str()
    out: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for case in ET.parse(report).iter("testcase"):
        tags = {child.tag: child for child in case}
        if "error" in tags:
            outcome = "errors"
        elif "failure" in tags:
            outcome = "failed"
        elif "skipped" in tags:
            outcome = "xfailed" if tags["skipped"].get("type") == "pytest.xfail" else "skipped"
        else:
            outcome = "passed"
        # (a file's module, also in a folder: "orders.test_orders" is test_orders)
        out[next((part for part in case.get("classname", "").split(".") if part.startswith("test_")), "")][outcome] += 1
    return {module: dict(counts) for module, counts in out.items()}


@pytest.mark.timeout(480)  # (four projects' tests in its one pytest run)
def test_a_project_tests_its_functions_and_its_fastapi_routes_with_the_plugin(
        pytester: pytest.Pytester, server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """A user's project gets run_inline, a private server, a client, a draining worker
    and assert_enqueued, and its own app code enqueues on that server (test_functions).

    A FastAPI app started once for the module (its lifespan caches a client): every
    test's requests enqueue under that test's own prefix, and a "nothing enqueued" check
    fails when the app did enqueue (test_signup).

    A route that awaits ``runner.acall`` (enqueue, then wait for the result) answers
    under the fixtures: requesting ``runner_worker`` starts its worker, which runs jobs as
    they arrive, and ``drain`` still reports them. No worker ran until the first drain,
    so the request waited out its timeout and failed StillRunning (test_greet).

    A FastAPI app started once for the session, whose lifespan stores its own
    Client.from_config(), made before any test's fixtures: its jobs land on the plugin's
    private server where each test looks (only that test's), and none reaches the Redis
    runner.toml names (a stand-in for a shared one; by default 127.0.0.1:6379)
    (test_lifespan).

    A Django project whose settings name a prefix and a server of their own (its
    conftest, in its folder): from the second test on, enqueue_on_commit still lands
    under that test's prefix on the private server, with no user code; and a "nothing
    enqueued" check fails when the app did enqueue (test_orders, run without
    pytest-django, even where the test extra has it).

    One pytest run for the four: each run started pytest, the plugin's server and its
    imports again."""
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.delenv("RUNNER_REDIS_PREFIX", raising=False)
    _project(pytester)
    shared = f"shared{uuid.uuid4().hex[:8]}"
    toml = pytester.path / "runner.toml"
    toml.write_text(toml.read_text() + f'\n[redis]\nurl = "{server.url}"\nprefix = "{shared}"\n')
    pytester.makepyfile(test_functions=USER_TESTS)
    fastapi = importlib.util.find_spec("fastapi") is not None
    django = importlib.util.find_spec("django") is not None
    if fastapi:
        pytester.makepyfile(signup_app=FASTAPI_APP, test_signup=FASTAPI_TESTS, call_app=CALL_APP,
                            test_greet=CALL_TESTS, app=LIFESPAN_APP, test_lifespan=LIFESPAN_TESTS)
        pytester.makeconftest(LIFESPAN_CONFTEST)
    if django:
        orders = pytester.path / "orders"
        orders.mkdir()
        (orders / "conftest.py").write_text(DJANGO_CONFTEST)
        (orders / "test_orders.py").write_text(DJANGO_TESTS)
    got = _outcomes(pytester, "-p", "no:django")
    shared_redis = redis.Redis.from_url(server.url)
    try:
        assert list(shared_redis.scan_iter(count=SCAN_COUNT, match=f"{shared}:*")) == []
    finally:
        shared_redis.close()
    assert got.pop("test_functions") == {"passed": 6}, got
    if django:
        assert got.pop("test_orders") == {"passed": 4, "xfailed": 1}, got
    if not fastapi:
        pytest.skip("fastapi is not installed (pip install -e '.[test]' installs it): its projects' tests did not run")
    assert got == {"test_signup": {"passed": 4, "xfailed": 1}, "test_greet": {"passed": 1},
                   "test_lifespan": {"passed": 4}}, got
    if not django:
        pytest.skip("django is not installed (pip install -e '.[test]' installs it): its project's tests did not run")


REPLICATED_TESTS = '''
from runner import Client


def test_enqueue_and_drain(runner_client, runner_worker, assert_enqueued):
    runner_client.enqueue("notify", {"who": "test"})
    Client.from_config().enqueue("notify", {"who": "app"})
    assert_enqueued("notify", count=2)
    assert [o.status for o in runner_worker.drain(timeout=10)] == ["done", "done"]
'''


def test_the_fixtures_serve_a_project_that_waits_for_replicas(pytester: pytest.Pytester) -> None:
    """A project whose runner.toml asks every write to reach a replica
    (``wait_replicas = 1``, as production should) is tested on the private server, which
    has none: the fixtures wait for no replica there, for the test's client and the app's
    own. Every enqueue failed NotReplicated."""
    _project(pytester)
    (pytester.path / "runner.toml").write_text("[redis]\nwait_replicas = 1\nwait_timeout = 0.2\n" + TOML)
    pytester.makepyfile(test_replicated=REPLICATED_TESTS)
    result = pytester.runpytest_subprocess(*_plugin_args(), "-p", "no:cacheprovider", "-q", timeout=240)
    result.assert_outcomes(passed=1)


def _project(pytester: pytest.Pytester) -> None:
    """greet, notify and flaky with their schemas and runner.toml, in pytester's folder."""
    pytester.makefile(".toml", runner=TOML)
    for name, src in {"greet": GREET, "notify": NOTIFY, "flaky": FLAKY, "chain": CHAIN}.items():
        (pytester.path / "functions").mkdir(exist_ok=True)
        (pytester.path / "functions" / f"{name}.py").write_text(src)
    for name, props in {"greet": {"name": "string"}, "notify": {"who": "string"}, "flaky": {},
                        "chain": {"n": "integer"}}.items():
        (pytester.path / "schemas" / name).mkdir(parents=True)
        (pytester.path / "schemas" / name / "v1.json").write_text(_schema(props))


DJANGO_CONFTEST = '''
import django
from django.conf import settings

# The project's own settings name a prefix and a server of their own: the fixtures must
# still route its enqueue_on_commit to each test's private server and prefix.
settings.configure(
    INSTALLED_APPS=["runner.contrib.django"],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
    RUNNER={"PREFIX": "shop", "REDIS_URL": "redis://127.0.0.1:9/0"},
)
django.setup()
'''
DJANGO_TESTS = '''
import pytest
from django.db import transaction

from runner.contrib.django import enqueue_on_commit


def place_order(who, fail=False):
    """The app's code: one job per order, sent once its transaction commits."""
    with transaction.atomic():
        enqueue_on_commit("notify", {"who": who})
        if fail:
            raise RuntimeError("payment refused")


def test_first_order_is_enqueued_once(assert_enqueued):
    place_order("ada")
    assert_enqueued("notify", {"who": "ada"}, count=1)


def test_second_test_sees_its_own_order_only(assert_enqueued):
    place_order("bo")
    assert_enqueued("notify", {"who": "bo"}, count=1)
    assert_enqueued("notify", count=1)


def test_a_rolled_back_order_enqueues_nothing(assert_enqueued):
    with pytest.raises(RuntimeError):
        place_order("cy", fail=True)
    assert_enqueued("notify", count=0)
    place_order("di")
    assert_enqueued("notify", {"who": "di"}, count=1)


def test_the_worker_runs_the_order(runner_worker):
    place_order("ed")
    assert [(o.type, o.status, o.result) for o in runner_worker.drain(timeout=10)] == [
        ("notify", "done", {"notified": "ed"})]


@pytest.mark.xfail(strict=True, raises=AssertionError, reason="the app enqueued: a nothing-enqueued check must fail")
def test_nothing_enqueued_fails_when_the_app_enqueued(assert_enqueued):
    place_order("fay")
    assert_enqueued("notify", count=0)
'''
FASTAPI_APP = '''
from fastapi import FastAPI
from runner.contrib.fastapi import RunnerClient, lifespan

app = FastAPI(lifespan=lifespan)


@app.post("/signup/{who}", status_code=202)
async def signup(who: str, runner: RunnerClient):
    job = await runner.aenqueue("notify", {"who": who})
    return {"job": job.id}
'''
FASTAPI_TESTS = '''
import pytest
from fastapi.testclient import TestClient

from signup_app import app


@pytest.fixture(scope="module")
def http():
    with TestClient(app) as c:  # one app start for the module: its lifespan runs once
        yield c


def test_first_signup(http, assert_enqueued):
    assert http.post("/signup/ada").status_code == 202
    assert_enqueued("notify", {"who": "ada"}, count=1)


def test_second_signup_lands_in_this_test(http, assert_enqueued):
    job = http.post("/signup/bo").json()["job"]
    assert [j["id"] for j in assert_enqueued("notify", count=1)] == [job]


def test_the_worker_runs_the_signup(http, runner_worker):
    http.post("/signup/cy")
    assert [(o.type, o.status, o.result) for o in runner_worker.drain(timeout=10)] == [
        ("notify", "done", {"notified": "cy"})]


def test_no_request_no_job(http, assert_enqueued):
    assert_enqueued("notify", count=0)


@pytest.mark.xfail(strict=True, raises=AssertionError, reason="the app enqueued: a nothing-enqueued check must fail")
def test_nothing_enqueued_fails_when_the_app_enqueued(http, assert_enqueued):
    http.post("/signup/di")
    assert_enqueued("notify", count=0)
'''




CALL_APP = '''
from fastapi import FastAPI
from runner.contrib.fastapi import RunnerClient, lifespan

app = FastAPI(lifespan=lifespan)


@app.post("/greet/{name}")
async def greet(name: str, runner: RunnerClient):
    return {"result": await runner.acall("notify", {"who": name}, timeout=5)}
'''
CALL_TESTS = '''
from fastapi.testclient import TestClient

from call_app import app


def test_a_route_that_waits_for_its_job(runner_worker):
    with TestClient(app) as http:
        assert http.post("/greet/ann").json() == {"result": {"notified": "ann"}}
    assert [(o.type, o.status) for o in runner_worker.drain(timeout=5)] == [("notify", "done")]
'''


LIFESPAN_APP = '''
from contextlib import asynccontextmanager
from fastapi import FastAPI
from runner import Client


@asynccontextmanager
async def lifespan(app):
    app.state.runner = Client.from_config()  # the app's own client, made at its start
    yield
    app.state.runner.close()


app = FastAPI(lifespan=lifespan)


@app.post("/signup/{who}", status_code=202)
async def signup(who: str):
    return {"job": (await app.state.runner.aenqueue("notify", {"who": who})).id}
'''
LIFESPAN_CONFTEST = '''
import pytest
from fastapi.testclient import TestClient

from app import app


@pytest.fixture(scope="session")
def http():
    with TestClient(app) as c:  # one app start for the session, before any test's fixtures
        yield c
'''
LIFESPAN_TESTS = '''
def test_first_signup(http, assert_enqueued):
    job = http.post("/signup/ada").json()["job"]
    assert [j["id"] for j in assert_enqueued("notify", {"who": "ada"}, count=1)] == [job]


def test_second_signup_lands_in_this_test_alone(http, assert_enqueued):
    http.post("/signup/bo")
    assert [j["payload"] for j in assert_enqueued("notify", count=1)] == [{"who": "bo"}]


def test_the_worker_runs_the_signup(http, runner_worker):
    http.post("/signup/cy")
    assert [(o.type, o.status, o.result) for o in runner_worker.drain(timeout=10)] == [
        ("notify", "done", {"notified": "cy"})]


def test_no_request_no_job(http, assert_enqueued):
    assert_enqueued("notify", count=0)
'''


PYTEST_DJANGO_SETTINGS = '''
SECRET_KEY = "tests"
INSTALLED_APPS = ["django.contrib.contenttypes", "runner.contrib.django"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
RUNNER = {"PREFIX": "shop", "REDIS_URL": "redis://127.0.0.1:9/0"}
USE_TZ = True
'''
PYTEST_DJANGO_TESTS = '''
import pytest
from django.db import transaction

from runner.contrib.django import enqueue_on_commit


def place_order(who, fail=False):
    """The app's code: one job per order, sent once its transaction commits."""
    with transaction.atomic():
        enqueue_on_commit("notify", {"who": who})
        if fail:
            raise RuntimeError("payment refused")


def welcome(who):
    """The app's code outside a transaction of its own: sent at once in production."""
    enqueue_on_commit("notify", {"who": who})


@pytest.mark.django_db
def test_an_order_committed_inside_the_tests_transaction(assert_enqueued):
    place_order("ada")
    assert_enqueued("notify", {"who": "ada"}, count=1)


@pytest.mark.django_db
def test_an_enqueue_outside_the_apps_transaction_goes_at_once(runner_client, assert_enqueued):
    welcome("bo")
    assert [j.as_dict()["type"] for j in runner_client.jobs("queued").jobs] == ["notify"]  # before any look
    assert_enqueued("notify", {"who": "bo"}, count=1)


@pytest.mark.django_db
def test_a_rolled_back_order_enqueues_nothing(assert_enqueued):
    with pytest.raises(RuntimeError):
        place_order("cy", fail=True)
    assert_enqueued("notify", count=0)


@pytest.mark.django_db
def test_the_worker_runs_the_order(runner_worker):
    place_order("di")
    assert [(o.type, o.status) for o in runner_worker.drain(timeout=10)] == [("notify", "done")]


@pytest.mark.django_db
def test_an_order_still_open_is_not_sent(assert_enqueued):
    with transaction.atomic():  # the test holds the app's transaction open: no commit yet
        enqueue_on_commit("notify", {"who": "ed"})
        assert_enqueued("notify", count=0)
    assert_enqueued("notify", {"who": "ed"}, count=1)


@pytest.mark.django_db
def test_capturing_the_callbacks_sends_each_once(django_capture_on_commit_callbacks, assert_enqueued):
    with django_capture_on_commit_callbacks(execute=True):
        place_order("fay")
        assert_enqueued("notify", count=1)
    assert_enqueued("notify", {"who": "fay"}, count=1)


@pytest.mark.django_db(transaction=True)
def test_a_transactional_test_commits_for_real(assert_enqueued):
    place_order("gus")
    assert_enqueued("notify", {"who": "gus"}, count=1)


@pytest.mark.xfail(strict=True, raises=AssertionError, reason="the app enqueued: a nothing-enqueued check must fail")
@pytest.mark.django_db
def test_nothing_enqueued_fails_when_the_app_enqueued(assert_enqueued):
    place_order("hal")
    assert_enqueued("notify", count=0)
'''




LOOKUP = '''
QUEUE = "fast"
MAX_ATTEMPTS = 1


def handle(payload, ctx):
    from django.contrib.contenttypes.models import ContentType
    return ContentType.objects.get(app_label="shop", model=payload["model"]).model
'''
UNCOMMITTED_TESTS = '''
import warnings

import pytest
from django.contrib.contenttypes.models import ContentType


@pytest.mark.django_db
def test_inside_the_tests_transaction_a_failure_is_explained(runner_client, runner_worker):
    ContentType.objects.create(app_label="shop", model="order")
    runner_client.enqueue("lookup", {"model": "order"})
    with pytest.warns(UserWarning, match=r"never commits.*django_db\\(transaction=True\\)"):
        out = runner_worker.drain(timeout=10)
    assert [o.status for o in out] == ["dead"]


@pytest.mark.django_db(transaction=True)
def test_a_transactional_test_runs_the_handler_on_its_rows(runner_client, runner_worker):
    ContentType.objects.create(app_label="shop", model="order")
    runner_client.enqueue("lookup", {"model": "order"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = runner_worker.drain(timeout=10)
    assert [(o.status, o.result) for o in out] == [("done", "order")]
'''


@pytest.mark.timeout(480)  # (three or two projects' tests in its one pytest run)
def test_pytest_django_tests_see_what_the_app_committed_and_a_failure_is_explained(
        pytester: pytest.Pytester) -> None:
    """Under pytest-django's django_db, each test runs inside a transaction that never
    commits, so Django never runs an on_commit callback: without help, every
    enqueue_on_commit of the app was silently dropped and "nothing enqueued" checks
    passed whatever the app did. With the plugin's fixtures, an enqueue whose own
    transaction has ended (or that had none) is sent, as it would be in production; a
    rolled-back one or one still open is not; captured callbacks send it once
    (test_orders).

    Under pytest-django's default django_db the test's writes never commit, and the
    worker's handler threads, each on a connection of its own, cannot see them: the job
    fails. drain() then warns with the cause and the fix (django_db(transaction=True)),
    which the docs show; with it the handler sees the test's rows. The job used to die
    with only "database table is locked" to go on (test_lookup)."""
    pytest.importorskip("django")
    pytest.importorskip("pytest_django", reason="pytest-django is not installed (pip install -e '.[test]' installs it)")
    _project(pytester)
    (pytester.path / "functions" / "lookup.py").write_text(LOOKUP)
    (pytester.path / "schemas" / "lookup").mkdir()
    (pytester.path / "schemas" / "lookup" / "v1.json").write_text(_schema({"model": "string"}))
    pytester.makepyfile(django_settings=PYTEST_DJANGO_SETTINGS)
    pytester.makeini("[pytest]\nDJANGO_SETTINGS_MODULE = django_settings\npythonpath = .\n")
    pytester.makepyfile(test_orders=PYTEST_DJANGO_TESTS, test_lookup=UNCOMMITTED_TESTS)
    got = _outcomes(pytester)
    assert got == {"test_orders": {"passed": 7, "xfailed": 1}, "test_lookup": {"passed": 2}}, got


def _refused_here(pytester: pytest.Pytester) -> pytest.RunResult:
    """The project's pytest run in this process, for a project the fixtures refuse before
    they start a server or a worker: a pytest of its own (its start and imports) was all
    of such a test's time."""
    return pytester.runpytest_inprocess(*_plugin_args(), "-p", "no:cacheprovider", "-q")


def test_a_project_in_a_subfolder_is_named_in_the_error(pytester: pytest.Pytester) -> None:
    """A project whose runner files sit in a subfolder (backend/): the fixtures used to
    fail with only "unknown function 'greet' (no function is loaded)". The error names the
    folder searched and the `runner_project` ini option that points the plugin there."""
    _project(pytester)
    backend = pytester.path / "backend"
    backend.mkdir()
    for name in ("functions", "schemas", "runner.toml"):
        (pytester.path / name).rename(backend / name)
    pytester.makepyfile(test_sub='''
def test_greet(runner_client):
    runner_client.enqueue("greet", {"name": "a"})
''')
    result = _refused_here(pytester)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"*no functions/ nor runner.toml in {pytester.path}:*runner_project = backend*"])


@pytest.mark.parametrize("moved", ["functions", "runner.toml"])
def test_a_project_split_between_folders_is_named_in_the_error(pytester: pytest.Pytester, moved: str) -> None:
    """runner.toml at the rootdir and functions/ (with schemas/) in backend/, or the
    reverse: the fixtures used to fail with only "unknown function 'greet'", or ran with
    the default config instead of the project's. The error names what the plugin found,
    where it looked, and what to set."""
    _project(pytester)
    backend = pytester.path / "backend"
    backend.mkdir()
    for name in (("functions", "schemas") if moved == "functions" else ("runner.toml",)):
        (pytester.path / name).rename(backend / name)
    pytester.makepyfile(test_split='''
def test_greet(runner_client):
    runner_client.enqueue("greet", {"name": "a"})
''')
    result = _refused_here(pytester)
    result.assert_outcomes(errors=1)
    root, out = pytester.path, " ".join(result.stdout.str().split())
    if moved == "functions":
        said = [f"found {root / 'runner.toml'} but no functions folder at {root / 'functions'}",
                f"it found {backend / 'functions'}",
                'set `dir = "backend/functions"` and `schemas = "backend/schemas"` under [functions]']
    else:
        said = [f"found {root / 'functions'} but no runner.toml at {root / 'runner.toml'}",
                f"it found {backend / 'runner.toml'}", "`runner_project = backend`",
                'set `dir = "../functions"` and `schemas = "../schemas"` under [functions]']
    assert all(s in out for s in said), (said, out)


@pytest.mark.parametrize("partitions", [1, 3])
def test_a_drained_worker_stops_at_once(project: Project, server: Server, partitions: int) -> None:
    """The harness's worker, idle after a drain, is blocked waiting for a wake-up: its stop
    wakes that wait at once (it waited out the whole BELL_S, a second of teardown for every
    test that drained), on a queue of one partition (the wait sent with the next claim)
    and of several (one wait over every partition's list)."""
    toml = project.root / "runner.toml"
    toml.write_text(toml.read_text().replace("[queues.fast]", f"[queues.fast]\npartitions = {partitions}", 1))
    harness = Harness(project.root, server.url, os.environ)
    harness.client.enqueue("noop", {})
    assert [o.status for o in harness.drain(timeout=10)] == ["done"]
    t0 = time.monotonic()
    harness.close()
    took = time.monotonic() - t0
    assert took < BELL_S / 2, f"the stop took {took:.2f} s"
