"""The CLI's refusals: a misspelt name gets a did-you-mean (functions, queues, on the
command line and over HTTP), a usage error under --json is JSON on stdout, a password
problem reads the same in every command (and in a worker's log), and `runner job` shows
times as dates."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import falcon.testing
import pytest
from click.testing import CliRunner, Result

from runner.cli import cli
from runner.errors import UnknownFunction, UnknownQueue, likely
from runner.store.embedded import Server
from runner.web import create_app

from conftest import Project

Invoke = Callable[..., Result]


@pytest.fixture
def run(project: Project) -> Invoke:
    def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
        return CliRunner().invoke(cli, ["--config", str(project.root / "runner.toml"), *args],
                                  env={**project.env, **(env or {})}, catch_exceptions=False)

    return invoke


def refused_json(r: Result, code: int) -> dict[str, object]:
    assert r.exit_code == code, (r.exit_code, r.stdout, r.stderr)
    body = json.loads(r.stdout)
    assert isinstance(body, dict) and body["error"] and body["exit_code"] == code, body
    return body


def test_a_swap_of_two_letters_is_a_likely_misspelling() -> None:
    assert likely("fv", ["vf", "noop"]) == "vf"
    assert likely("recrod", ["record", "noop"]) == "record"
    assert likely("fsat", ["fast", "slow"]) == "fast"
    assert likely("zz", ["vf", "noop"]) is None and likely("x", ["y"]) is None
    assert "did you mean vf?" in str(UnknownFunction("fv", ["noop", "vf"]))
    assert "did you mean fast?" in str(UnknownQueue("fsat", ["fast", "slow"]))


def test_cancel_all_with_a_misspelt_type_or_queue_is_refused(run: Invoke) -> None:
    """`cancel --all` names the close match (exit 1), in JSON with --json: no traceback."""
    for flag, typo, meant in (("--type", "recrod", "record"), ("--queue", "fsat", "fast")):
        r = run("cancel", "--all", flag, typo)
        assert r.exit_code == 1 and f"did you mean {meant}?" in r.stderr, (r.stderr, r.stdout)
        body = refused_json(run("cancel", "--all", flag, typo, "--json"), 1)
        assert f"did you mean {meant}?" in str(body["error"])


def test_usage_errors_under_json_are_json(run: Invoke) -> None:
    """Click's own refusals (a bad choice, a missing argument, an unknown option) are a JSON
    object on stdout under --json, exit 2, with the text on stderr as before."""
    for args in (("jobs", "--status", "nope", "--json"), ("enqueue", "--json"),
                 ("stats", "--json", "--bogus"), ("enqueue", "record", "--delay", "-1", "--json")):
        r = run(*args)
        body = refused_json(r, 2)
        assert "Usage:" not in str(body["error"]) and r.stderr.strip(), (args, r.stderr)
    assert run("jobs", "--status", "nope").stdout == ""  # without --json, stdout stays empty


def test_pause_of_a_misspelt_queue_gets_a_did_you_mean(run: Invoke) -> None:
    r = run("pause", "fsat")
    assert r.exit_code == 1 and "did you mean fast?" in r.stderr, r.stderr


def test_http_unknown_function_names_the_close_match(project: Project) -> None:
    client = falcon.testing.TestClient(create_app(project.runtime))
    r = client.simulate_post("/jobs/recrod", json={})
    assert r.status_code == 404 and "did you mean record?" in r.json["detail"], r.json
    assert r.json["function"] == "recrod"


def test_job_shows_history_times_as_dates(project: Project, run: Invoke) -> None:
    """The history's epoch milliseconds read as UTC dates; --json keeps the numbers."""
    from runner.worker.worker import Worker

    from conftest import wait_for

    job_id = project.client.enqueue("perm", {}).id
    w = Worker(project.runtime, ["fast"])
    w.start()
    try:
        wait_for(lambda: project.client.get(job_id).status == "dead", timeout=15, what="the job")
    finally:
        w.stop(2)
    human = run("job", job_id).stdout
    assert not re.search(r"\b1\d{12}\b(?! *\))", human.split("history:", 1)[1]), human
    assert re.search(r"attempt 1\b.* 20\d\d-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", human), human
    history = json.loads(run("job", job_id, "--json").stdout)["history"]
    assert isinstance(history[0]["at_ms"], int)


@pytest.fixture
def locked(tmp_path: Path) -> Iterator[Server]:
    import redis

    s = Server(tmp_path / "locked", appendonly=False).start()
    redis.Redis(port=s.port).config_set("requirepass", "right")
    yield s
    s.stop()


@pytest.fixture
def open_server(tmp_path: Path) -> Iterator[Server]:
    s = Server(tmp_path / "open", appendonly=False).start()
    yield s
    s.stop()


def test_a_refused_password_reads_the_same_in_every_command(run: Invoke, locked: Server) -> None:
    """stats, jobs, enqueue and cancel: "refused the password" (or "wants a password" when the
    URL has none), never "unreachable" beside it, in the same words."""
    for url, said in ((f"redis://:wrong@127.0.0.1:{locked.port}/0", "refused the password"),
                      (f"redis://127.0.0.1:{locked.port}/0", "wants a password")):
        lines = set()
        for args in (("stats",), ("jobs",), ("enqueue", "record", "{}"), ("cancel", "--all")):
            r = run(*args, env={"REDIS_URL": url})
            assert r.exit_code == 3, (args, r.stderr)
            assert said in r.stderr and "unreachable" not in r.stderr, (args, r.stderr)
            assert "Start a Redis there" not in r.stderr
            lines.add(r.stderr.splitlines()[0])
        assert len(lines) == 1, lines


def test_a_password_the_server_does_not_want_reads_the_same_in_every_command(run: Invoke,
                                                                             open_server: Server) -> None:
    """A URL with a password for a server that has none: one message, saying to drop it."""
    url = f"redis://:extra@127.0.0.1:{open_server.port}/0"
    lines = set()
    for args in (("stats",), ("jobs",), ("enqueue", "record", "{}")):
        r = run(*args, env={"REDIS_URL": url})
        assert r.exit_code == 3, (args, r.stderr, r.stdout)
        assert "has no password" in r.stderr and "unreachable" not in r.stderr, (args, r.stderr)
        lines.add(r.stderr.splitlines()[0])
    assert len(lines) == 1, lines


def test_a_worker_with_a_wrong_password_says_so_in_its_log(project: Project, locked: Server) -> None:
    """Not the generic "Redis unavailable ... retrying": the password was refused, and
    what to do about it."""
    from conftest import wait_for

    url = f"redis://:wrong@127.0.0.1:{locked.port}/0"
    proc = project.spawn_worker("fast", env={"REDIS_URL": url}, log_name="locked.log")
    log = project.root / "locked.log"
    try:
        wait_for(lambda: "scheduler: " in log.read_text(), timeout=20, what="the scheduler's first try")
    finally:
        proc.kill()
        proc.wait()
    text = log.read_text()
    assert "refused the password" in text and "REDIS_URL" in text, text
    assert "Redis unavailable" not in text, text
    # The start-up settings check words it the same way, one clear line (no raw redis-py
    # message as a warning before it), and no line reads as if its words were a secret.
    lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    guard = [line for line in lines if line["logger"] == "runner.guard"]
    assert len(guard) == 1 and guard[0]["level"] == "error", guard
    assert "Redis settings" in guard[0]["msg"] and "refused the password" in guard[0]["msg"], guard
    assert "invalid username-password" not in text and "password: ***" not in text, text


def test_http_says_a_refused_password_to_a_caller_with_a_token(project: Project, locked: Server) -> None:
    """A request of `runner web` against a Redis that turns its password down: a 503 that
    says the password was refused and what to do, never the address or the password; to
    a caller without a token /healthz says no more than before."""
    from runner import config as config_mod
    from runner.runtime import Runtime

    env = {**project.env, "REDIS_URL": f"redis://:s3cret-pw@127.0.0.1:{locked.port}/0",
           "RUNNER_API_TOKEN": "pw-t0ken"}
    rt = Runtime.create(config_mod.load(project.root / "runner.toml", env=env), lazy=True)
    try:
        client = falcon.testing.TestClient(create_app(rt))
        token = {"Authorization": "Bearer pw-t0ken"}
        for r in (client.simulate_get("/queues", headers=token),
                  client.simulate_post("/jobs/record", json={}, headers=token),
                  client.simulate_get("/healthz", headers=token)):
            assert r.status_code == 503, r.text
            assert r.json["type"].endswith(":redis-password-refused"), r.json
            assert "refused the password" in r.json["detail"] and "REDIS_URL" in r.json["detail"], r.json
            assert "s3cret" not in r.text and str(locked.port) not in r.text, r.text
        anonymous = client.simulate_get("/healthz")
        assert anonymous.status_code == 503 and "password" not in anonymous.text, anonymous.text
        assert str(locked.port) not in anonymous.text
    finally:
        rt.close()


def test_token_scope_of_a_function_that_does_not_exist_is_refused(run: Invoke, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """In a project, `token new --scope enqueue:<type>` refuses a type no function defines
    (exit 2, did-you-mean; JSON under --json); outside one, only the scope's shape is checked."""
    r = run("token", "new", "ci", "--scope", "enqueue:recrod")
    assert r.exit_code == 2 and "did you mean record?" in r.stderr, r.stderr
    assert "did you mean record?" in refused_json(run("token", "new", "ci", "--scope", "enqueue:recrod",
                                                      "--json"), 2)["error"]
    assert run("token", "new", "ci", "--scope", "enqueue:record,read").exit_code == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    outside = CliRunner().invoke(cli, ["token", "new", "ci", "--scope", "enqueue:anything"], catch_exceptions=False)
    assert outside.exit_code == 0, outside.stderr


def test_a_graceful_stop_of_runner_web_closes_its_sockets_cleanly(project: Project) -> None:
    """SIGTERM to `runner web` (real gunicorn, two worker processes): each worker shuts
    down without "Error while closing socket [Errno 9]" (its listening socket was closed
    twice: by the event loop, then by gunicorn's wrapper)."""
    import signal
    import subprocess
    import sys

    import requests

    from runner.store.embedded import free_port

    from conftest import wait_for

    port = free_port()
    log = project.root / "web.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "runner.cli", "web", "--port", str(port), "--workers", "2"],
                                cwd=project.root, env={**project.env, "RUNNER_API_TOKEN": "t0ken"},
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        def up() -> bool:
            assert proc.poll() is None, log.read_text()
            try:
                return requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
            except requests.ConnectionError:
                return False

        wait_for(up, timeout=30, what="runner web to answer")
        wait_for(lambda: log.read_text().count("Application startup complete") == 2, timeout=30,
                 what="both workers to start")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert text.count("Finished server process") == 2, text
    assert "Error while closing socket" not in text, text


def test_a_function_broken_under_dev_is_broken_not_unknown(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """While `runner dev` serves a function's last good version (its file broken since),
    `runner enqueue` says the file is broken, where, and that dev's HTTP and workers keep
    the last good version: not "unknown function"."""
    from test_dev import BROKEN_HELLO, HELLO, HELLO_SCHEMA, Dev

    from conftest import wait_for

    (project.root / "functions" / "hello.py").write_text(HELLO)
    (project.root / "schemas" / "hello").mkdir()
    (project.root / "schemas" / "hello" / "v1.json").write_text(json.dumps(HELLO_SCHEMA))
    env = {k: v for k, v in project.env.items() if k != "REDIS_URL"}
    dev = Dev(project.root, env, ("--embedded",))
    monkeypatch.chdir(project.root)
    monkeypatch.delenv("REDIS_URL")  # (CliRunner's env= is laid over this process's: a shell without it)

    def enqueue() -> Result:
        return CliRunner().invoke(cli, ["enqueue", "hello", '{"name": "x"}'], env=env, catch_exceptions=False)

    try:
        assert enqueue().exit_code == 0
        (project.root / "functions" / "hello.py").write_text(BROKEN_HELLO)
        wait_for(lambda: "hello.py:3: syntax error" in dev.log(), timeout=10, what="the syntax error log line")
        assert dev.post("hello", {"name": "y"}).status_code == 202  # HTTP: the last good version
        r = enqueue()
        assert r.exit_code == 1, r.stderr
        assert "unknown function" not in r.stderr, r.stderr
        assert "broken" in r.stderr and "functions/hello.py:3" in r.stderr, r.stderr
        assert f"pid {dev.proc.pid}" in r.stderr and "last good version" in r.stderr, r.stderr
    finally:
        assert dev.stop() == 0, dev.log()


def test_check_words_a_password_problem_as_the_other_commands_do(run: Invoke, open_server: Server) -> None:
    r = run("check", env={"REDIS_URL": f"redis://:extra@127.0.0.1:{open_server.port}/0"})
    assert r.exit_code == 3, r.stdout
    assert "has no password, yet the URL gives one" in r.stdout and "cannot reach" not in r.stdout, r.stdout



def test_dead_ls_of_a_misspelt_queue_gets_a_did_you_mean(run: Invoke) -> None:
    """`runner dead ls -q fsat` names the queue it probably meant, as the other queue commands
    do (exit 2, as `runner worker --queue`: the queue options of the process commands)."""
    r = run("dead", "ls", "-q", "fsat")
    assert r.exit_code == 2 and "did you mean fast?" in r.stderr, (r.exit_code, r.stderr)


@pytest.mark.parametrize("tail", ["/16", "/99999999999999999999", "/0?client_name=a%20b"])
def test_a_url_setting_the_server_refuses_is_one_line_naming_it(project: Project, tail: str) -> None:
    """A database past the server's 16, a database number past 64 bits, a client name
    with a space: `runner stats` and `runner worker` exit 2 with one line naming the part
    of the URL and what to write, where each printed redis-py's traceback."""
    import subprocess
    import sys

    base = project.env["REDIS_URL"].rsplit("/", 1)[0]
    for args in (["stats"], ["worker", "--queue", "fast"]):
        out = subprocess.run([sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"),
                              *args], env={**project.env, "REDIS_URL": base + tail},
                             capture_output=True, text=True, timeout=30)
        said = out.stdout + out.stderr
        assert out.returncode == 2, (args, out.returncode, said[-600:])
        assert "Traceback" not in said, said[-600:]
        assert ("database" in said) if "client_name" not in tail else ("client_name" in said), said[-600:]


# Commands that run until stopped (they print logs, not a result) and `new` (it writes
# files and says which) print no table to put in JSON.
NO_TABLE = {"dev", "web", "worker", "new"}


def _leaf_commands() -> list[tuple[str, ...]]:
    import click

    ctx = click.Context(cli)
    out: list[tuple[str, ...]] = []

    def walk(cmd: click.Command, path: tuple[str, ...]) -> None:
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                assert sub is not None
                walk(sub, (*path, name))
        else:
            out.append(path)

    walk(cli, ())
    return out


def test_every_command_that_prints_a_table_takes_json() -> None:
    """docs/cli.md: every command prints a table, or JSON with --json. A walk of the CLI's
    commands finds --json on each but the long-running ones and `new` (pause and resume
    had none: exit 2, "No such option")."""
    import click

    ctx = click.Context(cli)
    missing = []
    for path in _leaf_commands():
        cmd: click.Command | None = cli
        for name in path:
            assert isinstance(cmd, click.Group)
            cmd = cmd.get_command(ctx, name)
        assert cmd is not None
        if path[0] not in NO_TABLE and not any("--json" in p.opts for p in cmd.params):
            missing.append(" ".join(path))
    assert not missing, f"commands without --json: {missing}"
    assert {p[0] for p in _leaf_commands()} >= NO_TABLE | {"pause", "resume", "stats"}


def test_pause_and_resume_answer_in_json(project: Project, run: Invoke) -> None:
    """`runner pause --json` and `runner resume --json` print what they did, as JSON, for
    a queue and for a function (with the held jobs put back); a refusal is JSON too."""
    assert json.loads(run("pause", "fast", "--json").stdout) == {"queue": "fast", "function": None,
                                                                  "paused": True}
    assert json.loads(run("resume", "fast", "--json").stdout) == {"queue": "fast", "function": None,
                                                                   "paused": False, "moved": 0}
    assert json.loads(run("pause", "--function", "record", "--json").stdout) == {
        "queue": "fast", "function": "record", "paused": True}
    assert json.loads(run("resume", "--function", "record", "--json").stdout) == {
        "queue": "fast", "function": "record", "paused": False, "moved": 0}
    refused_json(run("pause", "fsat", "--json"), 1)


def test_a_refusal_of_redis_reads_as_the_one_helper_words_it_in_every_command(project: Project,
                                                                               run: Invoke) -> None:
    """Redis at its maxmemory, then busy in a long script: `runner enqueue`, `runner job`
    and `runner stats` each print the one error helper's sentence for that kind (exit 3),
    with its next step, and not the advice for a server that is down. Before, enqueue
    added "Start a Redis there ... or run `runner dev`" after the helper's words, and job
    and stats printed Redis's bare text with that same line."""
    from test_busy import busy

    r = project.runtime.redis
    job = project.client.enqueue("record", {"n": 1}).id
    was = r.config_get("maxmemory-policy")["maxmemory-policy"]
    r.config_set("maxmemory-policy", "noeviction")
    r.config_set("maxmemory", 1)
    try:
        said = run("enqueue", "record", '{"n": 2}')
    finally:
        r.config_set("maxmemory", 0)
        r.config_set("maxmemory-policy", was)
    assert said.exit_code == 3, (said.stdout, said.stderr)
    assert "raise maxmemory" in said.stderr and "Start a Redis" not in said.stderr, said.stderr
    with busy(project):
        for args in (("job", job), ("stats",), ("enqueue", "record", '{"n": 3}')):
            said = run(*args)
            assert said.exit_code == 3, (args, said.stdout, said.stderr)
            text = said.stderr
            assert "Redis is busy" in text and "retry once it ends" in text, (args, text)
            assert "Start a Redis" not in text and "of pipeline caused error" not in text, (args, text)
