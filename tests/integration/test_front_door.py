"""What a newcomer meets first, driven as they drive it (the CLI as a subprocess, `runner
dev`, `runner web` under gunicorn, plain HTTP clients): which Redis each process and
command talks to and says it talks to, the guard at every start, oversized bodies, and
the messages of the commands' small mistakes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from test_dev import Dev, email
from test_web_support import runner_web

from runner import config as config_mod
from runner.client import Client
from runner.runtime import Runtime
from runner.store.embedded import Server, free_port

from conftest import REPO, Project, wait_for

QUEUES = "[queues.fast]\nvisibility_timeout = 5\n\n[queues.slow]\nvisibility_timeout = 60\n\n" \
         "[worker]\ngrace_period = 5\nscheduler_interval = 0.05\n"


def fresh(root: Path, redis_section: str = "") -> Path:
    """A project with the shipped examples and a runner.toml as a newcomer has it."""
    shutil.copytree(REPO / "functions", root / "functions")
    shutil.copytree(REPO / "schemas", root / "schemas")
    (root / "runner.toml").write_text(redis_section + QUEUES)
    return root


def user_env(root: Path, **extra: str) -> dict[str, str]:
    """A shell with nothing of runner's set: no REDIS_URL, no RUNNER_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_") and k != "REDIS_URL"}
    env.update({"OUTBOX_DIR": str(root / "outbox"), "PYTHONUNBUFFERED": "1", **extra})
    return env


def cli(root: Path, env: dict[str, str], *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runner.cli", *args], cwd=root, env=env, input=stdin,
                          capture_output=True, text=True, timeout=60)


def session(root: Path) -> dict[str, Any]:
    return dict(json.loads((root / ".runner" / "dev.json").read_text()))


@pytest.fixture
def foreign(tmp_path: Path) -> Iterator[Server]:
    """Another app's Redis: persistence off, keys of its own, some under runner's prefix."""
    s = Server(tmp_path / "foreign", appendonly=False).start()
    r = redis.Redis.from_url(s.url)
    r.set("shop:cart:1", "x")
    r.set("shop:cart:2", "y")
    for i in range(3):
        r.set(f"runner:{{fast}}:job:old{i}", "left over")
    r.close()
    yield s
    s.stop(kill=True)


# --- 1. a refused second `runner dev` ------------------------------------------------------


def test_a_refused_second_dev_leaves_the_first_serving_and_found(tmp_path: Path) -> None:
    """A second `runner dev` in the same project exits 2 naming the first; the first keeps
    its embedded server and its session file, so `runner enqueue` and `runner stats` still
    reach it and its workers run the job."""
    root = fresh(tmp_path / "app")
    env = user_env(root)
    first = Dev(root, env)
    try:
        assert "no Redis configured" in first.log()
        before = session(root)
        second = cli(root, env, "dev", "--port", str(free_port()))
        assert second.returncode == 2, second.stderr
        assert "another `runner dev` is using" in second.stderr
        assert session(root) == before, "the refused dev touched the first one's session file"
        assert first.proc.poll() is None

        enq = cli(root, env, "enqueue", "send_email", json.dumps(email(1)), "--json")
        assert enq.returncode == 0, enq.stderr
        assert first.finished(json.loads(enq.stdout)["id"])["status"] == "done"
        stats = cli(root, env, "stats", "--json")
        assert stats.returncode == 0, stats.stderr
        assert json.loads(stats.stdout)["redis"]["url"] == before["url"]
    finally:
        assert first.stop() == 0


# --- 2. dev on a Redis it did not start; the guard at every start -------------------------


def test_dev_on_a_redis_it_did_not_start_says_which_what_it_holds_and_how_to_go_embedded(
        tmp_path: Path, foreign: Server) -> None:
    """Told to use a server that answers, `runner dev` uses it and says so loudly: where it
    is and where that came from, what it already holds under the prefix and in all, the
    guard's risks, and `runner dev --embedded` for a private one instead."""
    root = fresh(tmp_path / "app")
    dev = Dev(root, user_env(root, REDIS_URL=foreign.url))
    try:
        log = dev.log()
        assert f"using the Redis at {foreign.url} (from REDIS_URL)" in log
        assert "3 key(s) under the prefix 'runner' already" in log
        assert "5 key(s) in all" in log
        assert "REDIS RISK: persistence is off" in log
        assert "runner dev --embedded" in log
        assert not (root / ".runner" / "dev.json").exists()
    finally:
        assert dev.stop() == 0
    private = Dev(root, user_env(root, REDIS_URL=foreign.url), args=("--embedded",))
    try:
        assert "embedded Redis" in private.log() and "using the Redis at" not in private.log()
        assert session(root)["url"] != foreign.url
    finally:
        assert private.stop() == 0
    helped = cli(root, user_env(root), "dev", "--help")
    assert "--embedded" in helped.stdout


def test_web_and_check_run_the_guard_at_start(tmp_path: Path, foreign: Server) -> None:
    """`runner web` (its master, before it forks) and `runner check` warn about a Redis that
    could lose jobs, naming the setting, as `runner worker` does."""
    root = fresh(tmp_path / "app", "[api]\nauth = false\n\n")
    env = user_env(root, REDIS_URL=foreign.url, PORT=str(free_port()))
    web = subprocess.Popen([sys.executable, "-m", "runner.cli", "web", "--workers", "1"], cwd=root, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines: list[str] = []
        assert web.stdout is not None
        while not any("Listening at" in line for line in lines):
            line = web.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
        assert any("REDIS RISK" in line and "appendonly yes" in line for line in lines), "".join(lines)
    finally:
        web.terminate()
        web.wait(timeout=30)
    check = cli(root, env, "check")
    assert "persistence is off" in check.stdout


# --- 3. an explicit choice of server wins over a running dev ------------------------------


def test_an_explicit_redis_url_or_config_wins_over_a_running_dev(tmp_path: Path, server: Server) -> None:
    """While `runner dev` runs its embedded server, the project's commands follow it unless
    REDIS_URL or a --config file naming a Redis says otherwise (`runner worker` never
    does); `--help` and `runner stats` say which server it is and why."""
    root = fresh(tmp_path / "app")
    env = user_env(root)
    dev = Dev(root, env)
    try:
        embedded = session(root)["url"]
        followed = cli(root, env, "stats", "--json")
        assert json.loads(followed.stdout)["redis"]["url"] == embedded
        assert "runner dev" in json.loads(followed.stdout)["redis"]["source"]
        human = cli(root, env, "stats").stdout.splitlines()
        assert human[0].startswith(f"redis: {embedded} (") and "runner dev" in human[0]
        assert embedded in cli(root, env, "enqueue", "--help").stdout
        # Processes never follow dev, and say so.
        worker_help = " ".join(cli(root, env, "worker", "--help").stdout.split())
        assert f"REDIS_URL={embedded} points it there" in worker_help
        # Pointed there by hand, nothing says it is not used.
        there = user_env(root, REDIS_URL=embedded.replace("127.0.0.1", "localhost"))
        pointed = json.loads(cli(root, there, "stats", "--json").stdout)["redis"]
        assert pointed["source"] == "REDIS_URL" and "note" not in pointed, pointed
        assert "not used" not in cli(root, there, "worker", "--help").stdout

        prefix = f"t{os.getpid()}"
        explicit = user_env(root, REDIS_URL=server.url, RUNNER_REDIS_PREFIX=prefix)
        enq = cli(root, explicit, "enqueue", "send_email", json.dumps(email(2)), "--json")
        assert enq.returncode == 0, enq.stderr
        r = redis.Redis.from_url(server.url)
        assert r.llen(f"{prefix}:{{fast}}:ready") == 1
        out = json.loads(cli(root, explicit, "stats", "--json").stdout)["redis"]
        assert out["url"] == server.url and out["source"] == "REDIS_URL"
        assert "not used" in out["note"] and embedded in out["note"]
        assert server.url in cli(root, explicit, "stats", "--help").stdout

        other = root / "other.toml"
        other.write_text(f'[redis]\nurl = "{server.url}"\nprefix = "{prefix}"\n\n' + QUEUES)
        named = json.loads(cli(root, env, "--config", str(other), "stats", "--json").stdout)
        assert named["redis"]["url"] == server.url
        assert named["queues"][0]["ready"] == 1
        # Naming the project's own file, which names no server, still follows dev.
        same = json.loads(cli(root, env, "--config", str(root / "runner.toml"), "stats", "--json").stdout)
        assert same["redis"]["url"] == embedded
        r.close()
    finally:
        assert dev.stop() == 0


APP_SCRIPT = """
import json, sys
from runner import Client
client = Client.from_config(*sys.argv[1:])
job = client.enqueue("send_email", {"user_id": 4, "to": ["ada@example.com"], "name": "Ada", "template": "welcome"})
print(json.dumps({"url": client.runtime.config.redis.url, "id": job.id, "duplicate": job.duplicate}))
"""


def test_the_python_client_follows_a_running_dev_as_the_cli_does(tmp_path: Path, server: Server) -> None:
    """An app's own `Client.from_config()` beside `runner dev` (nothing configured) enqueues
    into dev's embedded server, where dev's worker runs the job, as the CLI's enqueue
    does; not into whatever answers at the default 127.0.0.1:6379. REDIS_URL, or a file
    named that names a server, still wins."""
    root = fresh(tmp_path / "app")
    env = user_env(root)
    (root / "app.py").write_text(APP_SCRIPT)
    dev = Dev(root, env)
    try:
        embedded = session(root)["url"]
        ran = subprocess.run([sys.executable, "app.py"], cwd=root, env=env, capture_output=True, text=True,
                             timeout=60)
        assert ran.returncode == 0, ran.stderr
        out = json.loads(ran.stdout)
        assert out["url"] == embedded
        assert dev.finished(out["id"], timeout=15)["status"] == "done"

        prefix = f"app{os.getpid()}"  # the server is shared: a prefix of this test's own
        explicit = user_env(root, REDIS_URL=server.url, RUNNER_REDIS_PREFIX=prefix)
        ran = subprocess.run([sys.executable, "app.py"], cwd=root, env=explicit, capture_output=True,
                             text=True, timeout=60)
        assert ran.returncode == 0, ran.stderr
        first = json.loads(ran.stdout)
        assert first["url"] == server.url
        other = root / "other.toml"
        other.write_text(f'[redis]\nurl = "{server.url}"\nprefix = "{prefix}"\n\n' + QUEUES)
        ran = subprocess.run([sys.executable, "app.py", str(other)], cwd=root, env=env, capture_output=True,
                             text=True, timeout=60)
        assert ran.returncode == 0, ran.stderr
        again = json.loads(ran.stdout)
        # The same server and prefix: the same payload is the first job's duplicate there.
        assert again["url"] == server.url and again["duplicate"] and again["id"] == first["id"]
        r = redis.Redis.from_url(server.url)
        assert r.llen(f"{prefix}:{{fast}}:ready") == 1
        r.close()
    finally:
        assert dev.stop() == 0


PROBE = '''"""Enqueues an email with the app's own client, and says where that client went."""
QUEUE = "fast"
ISOLATION = "{isolation}"


def handle(payload, ctx):
    from runner import Client
    with Client.from_config() as client:
        job = client.enqueue("send_email", payload)
        return {{"url": client.runtime.config.redis.url, "id": job.id}}
'''


def test_a_handlers_own_client_reaches_the_server_its_worker_runs_on(tmp_path: Path, foreign: Server) -> None:
    """A handler's own `Client.from_config()` enqueues where its worker runs the jobs, in a
    child process (ISOLATION = "process") as in a thread: under `runner dev --embedded`,
    with runner.toml naming another app's server that answers, the child's client went to
    that server (the child was handed the file as named), where no worker of the project
    runs; its thread twin followed dev."""
    root = fresh(tmp_path / "app", f'[redis]\nurl = "{foreign.url}"\n\n')
    for isolation in ("thread", "process"):
        (root / "functions" / f"probe_{isolation}.py").write_text(PROBE.format(isolation=isolation))
        (root / "schemas" / f"probe_{isolation}").mkdir()
        (root / "schemas" / f"probe_{isolation}" / "v1.json").write_text('{"type": "object"}')
    env = user_env(root)
    dev = Dev(root, env, args=("--embedded",))
    _probes_reach_dev(root, env, dev, foreign)


def test_under_dev_embedded_with_redis_url_set_thread_and_process_handlers_reach_devs_server(
        tmp_path: Path, foreign: Server) -> None:
    """`runner dev --embedded` with REDIS_URL naming another server: dev's worker runs on its
    embedded server, and a handler's own `Client.from_config()` enqueues there, in a thread
    as in a child process. The thread's client went to REDIS_URL, where no worker of the
    project runs, while its process twin reached dev's."""
    root = fresh(tmp_path / "app")
    for isolation in ("thread", "process"):
        (root / "functions" / f"probe_{isolation}.py").write_text(PROBE.format(isolation=isolation))
        (root / "schemas" / f"probe_{isolation}").mkdir()
        (root / "schemas" / f"probe_{isolation}" / "v1.json").write_text('{"type": "object"}')
    env = user_env(root)
    dev = Dev(root, user_env(root, REDIS_URL=foreign.url), args=("--embedded",))
    _probes_reach_dev(root, env, dev, foreign)


PASSWORD = "Pw-only-in-runner-toml"
OTHER_APP = '''"""Enqueues into another app, named by its runner.toml, and says what it saw."""
import os

QUEUE = "fast"
ISOLATION = "{isolation}"


def handle(payload, ctx):
    from runner import Client
    with Client.from_config(payload["config"]) as other:
        job = other.enqueue("send_email", payload["email"])
        return {{"id": job.id, "prefix": other.runtime.config.redis.prefix,
                "password_in_env": sorted(k for k, v in os.environ.items() if "{password}" in v)}}
'''


def test_a_handlers_client_for_another_app_reaches_that_app_and_no_password_is_in_its_environment(
        tmp_path: Path, server: Server) -> None:
    """A handler's `Client.from_config("<another app>/runner.toml")` enqueues into that app's
    server and prefix, in a child process (ISOLATION = "process") as in a thread: the child's
    environment named its own worker's server and prefix, which won over the file named,
    and the job landed in the worker's own app. Nor does the child's environment, or a
    tool's it starts, hold the Redis password that only the worker's runner.toml holds."""
    own = Server(tmp_path / "own", appendonly=False).start()
    try:
        r = redis.Redis.from_url(own.url)
        r.config_set("requirepass", PASSWORD)
        r.close()
        url = f"redis://:{PASSWORD}@127.0.0.1:{own.port}/0"
        a = fresh(tmp_path / "a", f'[redis]\nurl = "{url}"\nprefix = "appa"\n\n')
        b = fresh(tmp_path / "b", f'[redis]\nurl = "{server.url}"\nprefix = "appb"\n\n')
        for isolation in ("thread", "process"):
            (a / "functions" / f"other_{isolation}.py").write_text(
                OTHER_APP.format(isolation=isolation, password=PASSWORD))
            (a / "schemas" / f"other_{isolation}").mkdir()
            (a / "schemas" / f"other_{isolation}" / "v1.json").write_text('{"type": "object"}')
        env = user_env(a)
        log = (tmp_path / "worker.log").open("wb")
        worker = subprocess.Popen([sys.executable, "-m", "runner.cli", "worker", "--queue", "fast"], cwd=a, env=env,
                                  stdout=log, stderr=subprocess.STDOUT)
        ca = Client(Runtime.create(config_mod.load(a / "runner.toml", env={})))
        cb = Client(Runtime.create(config_mod.load(b / "runner.toml", env={})))
        try:
            for isolation in ("thread", "process"):
                jid = ca.enqueue(f"other_{isolation}", {"config": str(b / "runner.toml"), "email": email(1)}).id
                got = wait_for(lambda jid=jid: (j := ca.get(jid).as_dict())["status"] in ("done", "dead") and j,
                               timeout=30, interval=0.05, what=f"the {isolation} probe")
                assert got["status"] == "done", (isolation, got.get("last_error"))
                assert got["result"]["prefix"] == "appb", (isolation, got["result"])
                assert cb.get(got["result"]["id"]) is not None, isolation
                assert got["result"]["password_in_env"] == [], (isolation, got["result"])
        finally:
            ca.close()
            cb.close()
            worker.terminate()
            worker.wait(30)
            log.close()
        assert PASSWORD not in (tmp_path / "worker.log").read_text(errors="replace")
    finally:
        own.stop(kill=True)


# --- 5. an oversized body reaches its 413 --------------------------------------------------


def test_an_oversized_body_sent_whole_before_reading_gets_its_413(project: Project) -> None:
    """Clients that send the whole body before they read (urllib, curl without Expect)
    get the 413 problem, not a connection reset, from `runner web`; and the server's
    start-up line names the address it listens on."""
    project.write_config(extra="\n[api]\nmax_body_bytes = 2048\n")
    with runner_web(project, "web-413", workers=1) as web:
        for size in (100_000, 2_000_000, 20_000_000):
            body = b'{"n": 1, "pad": "' + b"x" * size + b'"}'
            req = urllib.request.Request(web.url + "/jobs/record", data=body, method="POST",
                                         headers={"Content-Type": "application/json",
                                                  "Authorization": "Bearer t"})
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(req, timeout=30)
            assert err.value.code == 413, size
            assert json.loads(err.value.read())["type"] == "urn:runner:problem:payload-too-large"
        big = project.root / "big.json"
        big.write_bytes(b'{"pad": "' + b"x" * 5_000_000 + b'"}')
        for extra in ([], ["-H", "Connection: close"]):
            curl = subprocess.run(
                ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "-H", "Expect:", *extra,
                 "-H", "Content-Type: application/json", "-H", "Authorization: Bearer t",
                 "--data-binary", f"@{big}", web.url + "/jobs/record"],
                capture_output=True, text=True, timeout=60)
            assert curl.stdout == "413", curl.stderr
        # The server still serves, and a small job still goes in.
        ok = urllib.request.Request(web.url + "/jobs/record", data=b'{"n": 2}', method="POST",
                                    headers={"Content-Type": "application/json", "Authorization": "Bearer t"})
        assert urllib.request.urlopen(ok, timeout=10).status == 202
        log = (project.root / "web-413.log").read_text()
        assert f"Listening at: http://127.0.0.1:{web.port}" in log
        assert f"Redis at {project.server.url} (REDIS_URL)" in log


# --- 6. the smaller stumbles ----------------------------------------------------------------


def test_option_and_lookup_mistakes_say_what_to_do(project: Project) -> None:
    """A negative --delay is a usage error (exit 2) about the option; an unknown function
    lists the loaded ones and points at `runner functions`; an unreachable Redis says where
    it looked and how to get one; a missing queue lists the queues one way."""
    env, root = project.env, project.root
    delay = cli(root, env, "enqueue", "record", '{"n": 1}', "--delay", "-5")
    assert delay.returncode == 2 and "--delay" in delay.stderr and "invalid payload" not in delay.stderr
    unknown = cli(root, env, "enqueue", "nosuch", "{}")
    assert unknown.returncode == 1
    assert "unknown function 'nosuch'" in unknown.stderr and "record" in unknown.stderr
    assert "runner functions" in unknown.stderr
    closed = f"redis://127.0.0.1:{free_port()}/0"
    down = cli(root, {**env, "REDIS_URL": closed}, "stats")
    assert down.returncode == 3
    assert closed in down.stderr and "REDIS_URL" in down.stderr and "runner dev" in down.stderr
    worker = cli(root, env, "worker", "--queue", "nosuch")
    dead = cli(root, env, "dead", "ls", "--queue", "nosuch")
    for res in (worker, dead):
        assert res.returncode == 2 and "(have: fast, slow)" in res.stderr, res.stderr


def test_commands_run_from_a_subfolder_use_the_projects_runner_toml(project: Project) -> None:
    """`runner enqueue` and `runner functions` run inside the project's functions folder
    find runner.toml in the folder above: the same functions and queues as from the top."""
    sub = project.root / "functions"
    listed = cli(sub, project.env, "functions")
    assert listed.returncode == 0 and "record" in listed.stdout, listed.stderr
    sent = cli(sub, project.env, "enqueue", "record", '{"n": 1}')
    assert sent.returncode == 0, sent.stderr
    assert project.client.get(sent.stdout.split()[0].strip()).status == "queued"


def test_jsonl_reports_each_refused_line_once_in_line_order(project: Project) -> None:
    """Bad JSON and invalid payloads, mixed, are reported in the order of their lines,
    each line once, with its errors under it."""
    lines = ['{"n": 1}', "not json", '{"n": "x"}', '{"n": 2}', "{bad", '{"n": "y"}']
    out = cli(project.root, project.env, "enqueue", "record", "--jsonl", "-", stdin="\n".join(lines) + "\n")
    assert out.returncode == 1
    reported = [line for line in out.stderr.splitlines() if line.startswith("line ")]
    assert [r.split(":")[0] for r in reported] == ["line 2", "line 3", "line 5", "line 6"]
    assert out.stderr.count("$.n") == 2
    report = json.loads(cli(project.root, project.env, "enqueue", "record", "--jsonl", "-", "--json",
                            stdin="\n".join(lines) + "\n").stdout)
    assert [r["line"] for r in report["refused"]] == [2, 3, 5, 6]


def test_a_refused_requeue_prints_each_error_once(project: Project) -> None:
    """`runner dead requeue --payload` with an invalid edit names the job and lists each
    validation error once, under it; the job stays dead."""
    job = project.client.enqueue("record", {"n": 1, "fail_times": 99})
    project.spawn_worker("fast")
    assert project.client.wait(job.id, timeout_s=15).status == "dead"
    out = cli(project.root, project.env, "dead", "requeue", job.id, "--payload", '{"n": "x"}')
    assert out.returncode == 1
    assert f"{job.id}: payload of record v1 is invalid" in out.stderr
    assert out.stderr.count('"x" is not of type "integer"') == 1
    assert project.client.get(job.id).status == "dead"


def test_worker_and_web_say_which_redis_at_start(project: Project) -> None:
    """The first lines of `runner worker` name the server it talks to and where that came
    from, as `runner web`'s do (below, in the 413 test's server log)."""
    w = project.spawn_worker("fast", log_name="which.log")
    log = project.root / "which.log"
    wait_for(lambda: b"serving" in log.read_bytes(), timeout=15, what="the worker to start")
    w.terminate()
    w.wait(timeout=15)
    assert f"Redis at {project.server.url} (REDIS_URL), prefix {project.prefix}" in log.read_text()


def test_config_errors_give_the_line_and_a_likely_key(project: Project) -> None:
    """A misspelt key in runner.toml is named with its line and the key it probably meant."""
    (project.root / "runner.toml").write_text(
        '[redis]\nprefix = "x"\n\n[queues.fast]\nvisibility_timeout = 5\nconcurency = 4\n')
    out = cli(project.root, project.env, "stats")
    assert out.returncode == 2
    assert "runner.toml:6: unknown key queues.fast.concurency; did you mean concurrency?" in out.stderr


def test_stats_json_has_the_documented_shape(project: Project) -> None:
    """`runner stats --json` is {"redis": {...}, "queues": [...]}, each queue as GET /queues
    shows it, with per-function counters by name (no raw counter keys)."""
    job = project.client.enqueue("record", {"n": 1})
    project.spawn_worker("fast")
    project.client.wait(job.id, timeout_s=15)

    def stats() -> Any:
        return json.loads(cli(project.root, project.env, "stats", "--json").stdout)

    # A success's figures reach Redis within a second of its ack (the worker sums them).
    wait_for(lambda: next(q for q in stats()["queues"] if q["name"] == "fast")["functions"]["record"]["succeeded"],
             timeout=5, what="the success in the figures")
    out = stats()
    assert set(out) == {"redis", "queues"}
    assert out["redis"]["url"] == project.server.url and out["redis"]["prefix"] == project.prefix
    fast = next(q for q in out["queues"] if q["name"] == "fast")
    assert {"ready", "processing", "scheduled", "dead", "functions"} <= set(fast)
    record = fast["functions"]["record"]
    assert record["enqueued"] == 1 and record["succeeded"] == 1
    assert {"enqueued", "succeeded", "retried", "dead", "latency", "run_time"} <= set(record)
    assert not any("|" in key for q in out["queues"] for key in json.dumps(q).split('"'))


def test_dev_reports_a_broken_file_by_its_relative_path(tmp_path: Path) -> None:
    """The reload error names the file as docs/cli.md shows it: functions/hello.py:3."""
    root = fresh(tmp_path / "app")
    dev = Dev(root, user_env(root))
    try:
        (root / "schemas" / "hello").mkdir()
        (root / "schemas" / "hello" / "v1.json").write_text('{"type": "object"}')
        (root / "functions" / "hello.py").write_text('"""Greets."""\nQUEUE = "fast"\ndef handle(payload, ctx)\n')
        # The reload's summary line ("1 not loaded") comes just before the error itself.
        wait_for(lambda: "not loaded: functions/hello.py:3: syntax error" in dev.log(), timeout=10,
                 what="the error, named by its relative path and line")
    finally:
        assert dev.stop() == 0


def test_dashboard_says_the_function_dead_count_is_cumulative(project: Project) -> None:
    """The per-function "dead" column counts every job ever dead-lettered, unlike the dead
    list, and its heading says so."""
    from test_web_support import gunicorn

    with gunicorn(project) as web:
        page = web.get("/").text
    assert "Dead-lettered (all time)" in page


def _probes_reach_dev(root: Path, env: dict[str, str], dev: Dev, foreign: Server) -> None:
    """A thread and a process probe's own clients reach dev's embedded server (each one's
    job done there), and the foreign server keeps only its three old keys."""
    try:
        embedded = session(root)["url"]
        for n, isolation in enumerate(("thread", "process"), start=1):
            enq = cli(root, env, "enqueue", f"probe_{isolation}", json.dumps(email(n)), "--json")
            assert enq.returncode == 0, enq.stderr
            probe = dev.finished(json.loads(enq.stdout)["id"], timeout=30)
            assert probe["status"] == "done", (isolation, probe.get("last_error"))
            assert probe["result"]["url"] == embedded, (isolation, probe["result"], foreign.url)
            assert dev.finished(probe["result"]["id"])["status"] == "done", isolation
    finally:
        assert dev.stop() == 0
    r = redis.Redis.from_url(foreign.url)
    assert sorted(r.scan_iter("runner:*")) == [f"runner:{{fast}}:job:old{i}".encode() for i in range(3)]
    r.close()
