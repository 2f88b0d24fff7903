"""The `runner` CLI against a real server: payload sources, --jsonl backfills, job, stats,
dead ls/requeue/purge, functions, new, and the exit codes of the cli module's docstring."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from runner import config as config_mod
from runner.cli import cli
from runner.cli.root import EXIT_REFUSED
from runner.store.embedded import free_port
from runner.worker.worker import Worker

from conftest import Project, wait_for

Invoke = Callable[..., Result]


@pytest.fixture
def run(project: Project) -> Invoke:
    """Invoke the CLI in-process, as a user in the project folder would."""

    def invoke(*args: str, input: str | None = None, env: dict[str, str] | None = None) -> Result:
        runner = CliRunner()
        return runner.invoke(cli, ["--config", str(project.root / "runner.toml"), *args],
                             input=input, env={**project.env, **(env or {})}, catch_exceptions=False)

    return invoke


def out_json(result: Result) -> Any:
    return json.loads(result.stdout)


def run_worker_until(project: Project, done: Callable[[], Any], queues: tuple[str, ...] = ("fast",)) -> None:
    w = Worker(project.runtime, list(queues))
    w.start()
    try:
        wait_for(done, timeout=15, what="the worker to finish")
    finally:
        w.stop(2)


def test_enqueue_takes_the_payload_from_an_argument_a_file_or_stdin(project: Project, run: Invoke,
                                                                   tmp_path: Path) -> None:
    """PAYLOAD is JSON text, @file or -; each enqueues a validated job (exit 0)."""
    (tmp_path / "p.json").write_text('{"n": 2}')
    results = [run("enqueue", "record", '{"n": 1}', "--json"),
               run("enqueue", "record", f"@{tmp_path / 'p.json'}", "--json"),
               run("enqueue", "record", "-", "--json", input='{"n": 3}')]
    assert [r.exit_code for r in results] == [0, 0, 0]
    ids = [out_json(r)["id"] for r in results]
    payloads = [project.client.get(i).as_dict()["payload"] for i in ids]
    assert payloads == [{"n": 1}, {"n": 2}, {"n": 3}]
    human = run("enqueue", "record", '{"n": 4}', "--delay", "60")
    assert human.exit_code == 0 and " record v1 -> fast scheduled" in human.stdout


def test_an_invalid_payload_is_refused_with_every_error_and_nothing_is_written(project: Project,
                                                                               run: Invoke) -> None:
    """Exit 1, each validation error printed with its JSON path; Redis untouched."""
    r = run("enqueue", "idem", '{"v": "x"}')
    assert r.exit_code == 1
    assert "invalid payload for idem v1" in r.stderr
    assert 'k" is a required property' in r.stderr
    assert "$.v: " in r.stderr and "integer" in r.stderr
    as_json = run("enqueue", "idem", '{"v": "x"}', "--json")
    assert as_json.exit_code == 1
    assert sorted(e["path"] for e in out_json(as_json)["errors"]) == ["$", "$.v"]
    assert project.runtime.redis.llen(project.keys().ready) == 0
    assert run("enqueue", "nosuch", "{}").exit_code == 1
    bad_json = run("enqueue", "record", "{nope")
    assert bad_json.exit_code == 1 and "not valid JSON" in bad_json.stderr


def test_exit_codes_for_usage_config_and_unreachable_redis(project: Project, run: Invoke) -> None:
    """2 for a bad option or config (naming file and key), 3 when Redis does not answer."""
    assert run("enqueue", "record", "--no-such-option").exit_code == 2
    assert run("enqueue", "record", "{}", "--jsonl", "-").exit_code == 2
    closed = f"redis://127.0.0.1:{free_port()}/0"
    down = run("enqueue", "record", "{}", env={"REDIS_URL": closed})
    assert down.exit_code == 3 and "Redis unavailable" in down.stderr
    assert run("stats", env={"REDIS_URL": closed}).exit_code == 3
    assert run("dead", "ls", env={"REDIS_URL": closed}).exit_code == 3
    (project.root / "runner.toml").write_text('[queues.fast]\nconcurrency = "many"\n')
    bad = run("stats")
    assert bad.exit_code == 2
    assert "runner.toml" in bad.stderr and "queues.fast.concurrency" in bad.stderr


def test_jsonl_enqueues_in_batches_and_reports_each_refused_line(project: Project, run: Invoke,
                                                                 tmp_path: Path) -> None:
    """A backfill of 1,203 lines: valid lines go in (batched), blank lines are skipped, and
    each refused line is reported by number with its errors; exit 1 since some were refused."""
    lines = [json.dumps({"n": i}) for i in range(1200)]
    lines[10] = '{"n": "ten"}'
    lines[700] = "{broken"
    lines.insert(500, "")
    src = tmp_path / "backfill.jsonl"
    src.write_text("\n".join(lines) + "\n")
    r = run("enqueue", "record", "--jsonl", str(src), "--json")
    assert r.exit_code == 1
    report = out_json(r)
    assert report["enqueued"] == 1198
    assert [x["line"] for x in report["refused"]] == [11, 702]
    assert report["refused"][0]["errors"][0]["path"] == "$.n"
    assert "not valid JSON" in report["refused"][1]["error"]
    assert project.runtime.redis.llen(project.keys().ready) == 1198
    human = run("enqueue", "record", "--jsonl", "-", input='{"n": 1}\n{"n": 2}\n')
    assert human.exit_code == 0
    assert "enqueued 2 job(s) of record" in human.stdout


def test_job_and_stats_show_tables_or_json(project: Project, run: Invoke) -> None:
    job_id = project.client.enqueue("record", {"n": 5}).id
    r = run("job", job_id, "--json")
    assert r.exit_code == 0 and out_json(r)["payload"] == {"n": 5}
    assert "status: queued" in run("job", job_id).stdout
    assert run("job", "no-such-job").exit_code == 1
    stats = run("stats", "--json")
    assert out_json(stats)["queues"][0]["name"] == "fast" and out_json(stats)["queues"][0]["ready"] == 1
    table = run("stats").stdout.splitlines()
    assert table[0].startswith(f"redis: {project.server.url} (REDIS_URL)")
    assert table[1].split() == ["queue", "ready", "processing", "scheduled", "sleeping", "waiting", "dead",
                                "succeeded", "retried", "cancelled", "paused"]
    assert table[2].split()[:2] == ["fast", "1"]


def test_stats_counts_cancelled_jobs_apart_from_dead(project: Project, run: Invoke) -> None:
    """A cancel is an outcome of its own: `runner stats` counts it in a cancelled column
    (the sum of the function counters, beside succeeded and retried) and never as dead."""
    ids = [project.client.enqueue("record", {"n": i}).id for i in range(2)]
    assert run("cancel", *ids).exit_code == 0
    table = run("stats").stdout.splitlines()
    head, fast = table[1].split(), table[2].split()
    row = dict(zip(head, fast, strict=True))
    assert (row["queue"], row["dead"], row["cancelled"]) == ("fast", "0", "2"), table
    per_function = out_json(run("stats", "--json"))["queues"][0]["functions"]["record"]
    assert (per_function["cancelled"], per_function["dead"]) == (2, 0)


def test_dead_ls_requeue_with_an_edited_payload_and_purge(project: Project, run: Invoke) -> None:
    """Dead jobs are listed with their reason; requeue validates an edited payload (an invalid
    one stays dead, exit 1); requeue --all and purge --all work in bulk."""
    c = project.client
    ids = [c.enqueue("perm", {"i": i}).id for i in range(3)]
    run_worker_until(project, lambda: c.stats()["fast"]["dead"] == 3)
    ls = run("dead", "ls")
    assert ls.exit_code == 0
    assert all(i in ls.stdout for i in ids) and "permanent failure" in ls.stdout
    listed = out_json(run("dead", "ls", "--queue", "fast", "--json"))
    assert listed["fast"]["total"] == 3
    assert {j["id"] for j in listed["fast"]["jobs"]} == set(ids)
    first = run("dead", "ls", "--queue", "fast", "--limit", "2")  # a page, and the command for the next
    assert "next page: runner dead ls --queue fast --limit 2 --cursor " in first.stdout, first.stdout
    cursor = first.stdout.rsplit("--cursor ", 1)[1].split()[0]
    rest = out_json(run("dead", "ls", "--queue", "fast", "--limit", "2", "--cursor", cursor, "--json"))
    assert rest["fast"]["cursor"] is None and len(rest["fast"]["jobs"]) == 1
    shown = [j["id"] for j in out_json(run("dead", "ls", "-q", "fast", "--limit", "2", "--json"))["fast"]["jobs"]]
    assert set(shown) | {rest["fast"]["jobs"][0]["id"]} == set(ids)
    assert run("dead", "ls", "--queue", "fast", "--cursor", "forged!").exit_code == EXIT_REFUSED
    assert run("dead", "ls", "--cursor", cursor).exit_code == 2  # (which queue's?)

    bad = run("dead", "requeue", ids[0], "--payload", "[1, 2]")
    assert bad.exit_code == 1 and "is not of type" in bad.stderr
    assert c.get(ids[0]).status == "dead"
    good = run("dead", "requeue", ids[0], "--payload", '{"edited": true}')
    assert good.exit_code == 0, good.stderr
    rec = c.get(ids[0]).as_dict()
    assert rec["status"] == "queued" and rec["payload"] == {"edited": True}

    assert run("dead", "requeue", "--all", ids[1]).exit_code == 2
    everything = run("dead", "requeue", "--all", "--json")
    assert everything.exit_code == 0 and out_json(everything)["requeued"] == 2
    assert c.stats()["fast"]["dead"] == 0

    run_worker_until(project, lambda: c.stats()["fast"]["dead"] == 3)
    one = run("dead", "purge", ids[2])
    assert one.exit_code == 0 and "purged 1 job(s)" in one.stdout
    declined = run("dead", "purge", "--all", input="n\n")
    assert declined.exit_code == 1 and "nothing was deleted" in declined.output and "--yes" in declined.output
    unasked = run("dead", "purge", "--all", input="")  # no terminal, no answer: a script's run
    assert unasked.exit_code == 1 and "--yes" in unasked.output, unasked.output
    assert c.stats()["fast"]["dead"] == 2
    assert run("dead", "purge", "--all", "--yes").exit_code == 0
    assert c.stats()["fast"]["dead"] == 0
    assert run("dead", "purge", "no-such-job").exit_code == 1


def test_functions_lists_what_loaded_and_what_did_not(project: Project, run: Invoke) -> None:
    ok = run("functions", "--json")
    assert ok.exit_code == 0
    assert {f["type"] for f in out_json(ok)["functions"]} >= {"record", "perm", "slow"}
    (project.root / "functions" / "typo.py").write_text("QUEUEE = 'fast'\ndef handle(p, ctx):\n    pass\n")
    broken = run("functions")
    assert broken.exit_code == 1
    assert "typo.py:1: QUEUEE is not an option; did you mean QUEUE?" in broken.stdout


def test_the_functions_table_shows_flow_and_schedule_options(project: Project, run: Invoke) -> None:
    """What limits and starts a function's jobs is in the table, not only in --json."""
    (project.root / "functions" / "billing.py").write_text(
        'QUEUE = "fast"\nCONCURRENCY = {"key": "tenant:{tenant}", "limit": 2}\n'
        'RATE_LIMIT = {"limit": 5, "period": 1}\nPRIORITY = 7\nMAX_AGE = 3600\n'
        'SCHEDULE = [{"cron": "0 9 * * 1-5", "tz": "Europe/Madrid", "payload": {"tenant": "ops"}, "id": "morning"}]\n'
        'def handle(p, ctx):\n    pass\n')
    (project.root / "schemas" / "billing").mkdir()
    (project.root / "schemas" / "billing" / "v1.json").write_text(
        '{"type": "object", "properties": {"tenant": {"type": "string"}}}')
    shown = run("functions")
    assert shown.exit_code == 0, shown.output
    (line,) = [ln for ln in shown.stdout.splitlines() if ln.startswith("billing")]
    for part in ("concurrency=2 per tenant:{tenant}", "rate=5/1s", "priority=7", "max_age=3600s",
                 "schedule='0 9 * * 1-5' Europe/Madrid"):
        assert part in line, (part, line)


def test_new_scaffolds_a_function_that_loads_and_runs(project: Project, run: Invoke) -> None:
    """`runner new greet` writes files that load, enqueue and run as they are."""
    made = run("new", "greet")
    assert made.exit_code == 0, made.stderr
    assert (project.root / "functions" / "greet.py").exists()
    assert (project.root / "schemas" / "greet" / "v1.json").exists()
    assert run("new", "greet").exit_code == 1  # never overwrites
    assert run("new", "not-a-name").exit_code == 1
    assert run("new", "x", "--queue", "nosuch").exit_code == 2
    assert run("check", "--offline").exit_code == 0
    job = out_json(run("enqueue", "greet", '{"name": "world"}', "--json"))
    assert run("enqueue", "greet", '{"nom": "x"}').exit_code == 1
    project._runtime = None  # pick up the new function
    run_worker_until(project, lambda: project.client.get(job["id"]).status == "done")
    assert project.client.get(job["id"]).as_dict()["result"] == {"greeting": "Hello, world!"}


def test_the_console_script_runs_as_a_process(project: Project) -> None:
    """The installed entry point (python -m runner.cli) exits with the documented codes."""
    base = [sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml")]
    ok = subprocess.run([*base, "enqueue", "record", '{"n": 1}'], env=project.env, capture_output=True,
                        timeout=30)
    assert ok.returncode == 0, ok.stderr
    refused = subprocess.run([*base, "enqueue", "record", '{"n": "x"}'], env=project.env,
                             capture_output=True, timeout=30)
    assert refused.returncode == 1 and b"$.n" in refused.stderr


def test_web_refuses_to_start_without_a_token(project: Project, run: Invoke) -> None:
    """Outside dev the API is never served open by accident: no RUNNER_API_TOKEN is exit 2,
    unless runner.toml switches auth off explicitly."""
    refused = run("web")
    assert refused.exit_code == 2
    assert "RUNNER_API_TOKEN" in refused.stderr and "auth = false" in refused.stderr


def test_the_next_page_command_keeps_the_filters(project: Project, run: Invoke) -> None:
    """`runner jobs` prints a next-page command with the --type, --queue and --limit it was
    given, and that command lists the rest of the same selection."""
    ids = [project.client.enqueue("record", {"n": i}).id for i in range(3)]
    project.client.enqueue("noop", {})
    first = run("jobs", "--type", "record", "--queue", "fast", "--limit", "2")
    assert first.exit_code == 0, first.stderr
    (line,) = [x for x in first.stdout.splitlines() if x.startswith("next page: ")]
    command = line.removeprefix("next page: ").split()
    assert command[:6] == ["runner", "jobs", "--status", "queued", "--type", "record"]
    assert command[6:10] == ["--queue", "fast", "--limit", "2"] and command[10] == "--cursor"
    rest = run(*command[1:])
    assert rest.exit_code == 0, rest.stderr
    listed = [x.split()[0] for x in (first.stdout + rest.stdout).splitlines() if x.startswith(tuple(ids))]
    assert sorted(listed) == sorted(ids) and "next page" not in rest.stdout


def test_version(run: Invoke) -> None:
    from runner import __version__

    r = run("--version")
    assert r.exit_code == 0 and r.stdout.strip() == f"runner {__version__} (runner-redis)"
    # `python -m runner` is the command too (it said "No module named runner.__main__").
    import subprocess
    import sys

    m = subprocess.run([sys.executable, "-m", "runner", "--version"], capture_output=True, text=True, timeout=60)
    assert m.returncode == 0 and m.stdout.strip() == r.stdout.strip(), m.stderr


def test_job_prints_readable_times_and_no_none(project: Project, run: Invoke) -> None:
    """`runner job` shows times as UTC dates (the epoch beside them), leaves unset
    fields out and says "none" for an empty list (no history yet, no children); --json
    keeps the numbers and the lists."""
    job_id = project.client.enqueue("record", {"n": 5}).id
    human = run("job", job_id).stdout
    assert "None" not in human and "null" not in human and "[]" not in human, human
    assert re.search(r"^\s+history: none$", human, re.M), human
    assert out_json(run("job", job_id, "--json"))["history"] == []
    created = next(x for x in human.splitlines() if x.strip().startswith("created_at:"))
    assert re.search(r"created_at: 20\d\d-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC", created), created
    assert isinstance(out_json(run("job", job_id, "--json"))["created_at"], int | float)


def test_job_prints_the_last_error_as_lines(project: Project, run: Invoke) -> None:
    """`runner job` shows a failed job's last error as its type and message, then its
    traceback a line each (it printed one JSON line of escaped newlines); --json keeps it
    as the object."""
    project.add_function("boom", "import runner\nQUEUE = 'fast'\n\ndef handle(payload, ctx):\n"
                                 "    raise runner.PermanentFailure('card declined')\n")
    job_id = project.client.enqueue("boom", {}).id
    project.spawn_worker("fast")
    assert project.client.wait(job_id, timeout_s=30).status == "dead"
    human = run("job", job_id).stdout
    assert re.search(r"^\s+last_error: PermanentFailure: card declined$", human, re.M), human
    assert re.search(r"^\s+Traceback \(most recent call last\):$", human, re.M), human
    assert "\\n" not in human, human
    assert out_json(run("job", job_id, "--json"))["last_error"]["type"] == "PermanentFailure"


def test_every_json_error_is_json(project: Project, run: Invoke) -> None:
    """With --json, a refusal is a JSON object with "error" and "exit_code" on stdout (and
    the text on stderr), whatever refused: an unknown job, a payload that is not JSON or
    not valid, an unknown function, one whose file is broken (kind "BrokenFunction", not
    "UnknownFunction": it is there), an unreachable Redis."""
    project.add_function("shaky", "def handle(payload, ctx:\n")
    closed = f"redis://127.0.0.1:{free_port()}/0"
    cases = [(run("job", "no-such-job", "--json"), 1),
             (run("enqueue", "record", "{broken", "--json"), 1),
             (run("enqueue", "record", '{"n": "x"}', "--json"), 1),
             (run("enqueue", "recrod", "{}", "--json"), 1),
             (run("enqueue", "shaky", "{}", "--json"), 1),
             (run("call", "recrod", "{}", "--json"), 1),
             (run("jobs", "--json", "--cursor", "not-a-cursor"), 1),
             (run("stats", "--json", env={"REDIS_URL": closed}), 3)]
    for r, code in cases:
        assert r.exit_code == code, (r.stdout, r.stderr)
        body = json.loads(r.stdout)
        assert isinstance(body, dict) and body["error"] and body["exit_code"] == code, r.stdout
    unknown, broken = json.loads(cases[3][0].stdout), json.loads(cases[4][0].stdout)
    assert unknown["kind"] == "UnknownFunction" and "runner functions" in unknown["error"], unknown
    assert broken["kind"] == "BrokenFunction" and broken["function"] == "shaky", broken
    assert "is broken" in broken["error"] and "Fix the file" in broken["error"], broken



def test_new_in_a_folder_with_no_project_starts_one_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`runner new` with no runner.toml here or in a parent folder writes one with the
    defaults and says so, so `runner new` from functions/ later finds the project (it wrote
    none before, and from functions/ nested functions/functions/NAME.py); from the
    functions/ of an older project with no runner.toml it says where to run instead."""
    monkeypatch.delenv("RUNNER_CONFIG", raising=False)
    env = {"REDIS_URL": "redis://127.0.0.1:1/0"}
    root = tmp_path / "shop"
    (root / ".git").mkdir(parents=True)
    monkeypatch.chdir(root)
    made = CliRunner().invoke(cli, ["new", "foo"], env=env, catch_exceptions=False)
    assert made.exit_code == 0, made.output
    assert "runner.toml" in made.stdout and (root / "runner.toml").is_file()
    assert list(config_mod.load(root / "runner.toml", env={}).queues) == ["default"]
    monkeypatch.chdir(root / "functions")
    again = CliRunner().invoke(cli, ["new", "bar"], env=env, catch_exceptions=False)
    assert again.exit_code == 0, again.output
    assert (root / "functions" / "bar.py").is_file() and (root / "schemas" / "bar" / "v1.json").is_file()
    assert not (root / "functions" / "functions").exists() and "runner.toml" not in again.stdout

    old = tmp_path / "old"
    (old / "functions").mkdir(parents=True)
    (old / "schemas").mkdir()
    monkeypatch.chdir(old / "functions")
    refused = CliRunner().invoke(cli, ["new", "baz"], env=env, catch_exceptions=False)
    assert refused.exit_code == 2 and f"project in {old}" in refused.stderr, refused.output
    assert sorted(p.name for p in old.rglob("*")) == ["functions", "schemas"]

def test_a_misspelt_function_gets_a_did_you_mean(run: Invoke) -> None:
    r = run("enqueue", "recrod", "{}")
    assert r.exit_code == 1 and "did you mean record?" in r.stderr, r.stderr


def test_the_state_folder_is_git_ignored(project: Project, run: Invoke) -> None:
    """.runner/ (dev's server data, the schema cache) ignores itself: no commit picks it up."""
    assert run("new", "greet").exit_code == 0
    assert (project.root / ".runner" / ".gitignore").read_text() == "*\n"


def test_a_wrong_redis_password_is_an_auth_error(project: Project, run: Invoke, tmp_path: Path) -> None:
    """A server that refuses the password is not "unreachable": the message says the
    password was refused and where it came from (exit 3)."""
    import redis

    from runner.store.embedded import Server

    s = Server(tmp_path / "locked", appendonly=False).start()
    redis.Redis(port=s.port).config_set("requirepass", "right")
    try:
        for url in (f"redis://:wrong@127.0.0.1:{s.port}/0", f"redis://127.0.0.1:{s.port}/0"):
            r = run("stats", env={"REDIS_URL": url})
            assert r.exit_code == 3, r.stderr
            assert "refused" in r.stderr and "password" in r.stderr and "REDIS_URL" in r.stderr, r.stderr
            assert "Start a Redis there" not in r.stderr
    finally:
        s.stop()


def test_an_old_version_with_no_upgrade_is_refused_at_enqueue(project: Project, run: Invoke) -> None:
    """A v1 payload of a function at v2 with no upgrade() could never run (its claim would
    bury it): the enqueue refuses it, saying how to go on, as `runner check` would; the
    newest version is taken."""
    from runner import ValidationFailed

    project.add_function("twice", "QUEUE = 'fast'\n\ndef handle(payload, ctx):\n    return payload\n")
    (project.root / "schemas" / "twice" / "v2.json").write_text('{"type": "object"}')
    with pytest.raises(ValidationFailed, match=r"v1 cannot run: twice.py has no upgrade\(\)"):
        project.client.enqueue("twice", {}, version=1)
    assert project.client.enqueue("twice", {}).version == 2
    refused = run("enqueue", "twice", "{}", "--version", "1")
    assert refused.exit_code == 1 and "no upgrade()" in refused.stderr, refused.stderr


def test_control_characters_of_job_data_print_escaped(project: Project, run: Invoke) -> None:
    """Job data holding terminal escapes (ESC, BEL, the 8-bit CSI U+009B, DEL) prints
    escaped in every form: `runner job` as text and as JSON, `runner jobs` and `runner dead
    ls` tables. Printed raw, a payload or a handler's error could rewrite the operator's
    terminal (clear it, set its title, fake lines)."""
    hostile = "\x1b[2J\x1b]0;owned\x07\x9b31m\x7f\nfake line"
    k = project.keys()
    r = project.runtime.redis
    job_id = project.client.enqueue("record", {"s": hostile}).id
    r.lrem(k.ready, 0, job_id)
    error = json.dumps({"type": "RuntimeError", "message": hostile})
    r.hset(k.state(job_id), mapping={"status": "dead", "reason": hostile, "error": error})
    r.zadd(k.dead, {job_id: 1})
    outputs = [run("job", job_id), run("job", job_id, "--json"), run("dead", "ls"), run("dead", "ls", "--json"),
               run("jobs", "--status", "dead"), run("jobs", "--status", "dead", "--json")]
    for out in outputs:
        assert out.exit_code == 0, out.output
        bad = [c for c in out.stdout if (ord(c) < 32 and c != "\n") or 0x7f <= ord(c) <= 0x9f]
        assert not bad, (out.stdout, bad)
    assert "\\x1b[2J" in outputs[0].stdout or "\\u001b[2J" in outputs[0].stdout
    assert "fake line" in outputs[0].stdout and "\nfake line" not in outputs[0].stdout
    assert json.loads(outputs[1].stdout)["payload"] == {"s": hostile}


def test_new_with_a_queue_in_a_folder_with_no_project_starts_one_with_that_queue(tmp_path: Path) -> None:
    """`runner new --queue fast hello` in an empty folder starts the project as `runner new
    hello` does, its runner.toml defining the queue asked for and the function on it (it
    wrote nothing and said "no queue 'fast' in runner.toml" of a file that did not exist);
    a queue name no runner.toml can hold is refused, and nothing is written."""
    env = {k: v for k, v in os.environ.items() if k != "RUNNER_CONFIG"}
    env["REDIS_URL"] = "redis://127.0.0.1:1/0"

    def runner(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "runner.cli", *args], cwd=folder, env=env,
                              capture_output=True, text=True, timeout=60)

    root = tmp_path / "x"
    (root / ".git").mkdir(parents=True)
    made = runner(root, "new", "--queue", "fast", "hello")
    assert made.returncode == 0, made.stderr
    assert 'one queue "fast"' in made.stdout, made.stdout
    assert list(config_mod.load(root / "runner.toml", env={}).queues) == ["fast"]
    listed = runner(root, "functions", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [(f["type"], f["queue"]) for f in json.loads(listed.stdout)["functions"]] == [("hello", "fast")]
    assert runner(root, "check", "--offline").returncode == 0
    # A second function on another queue of the project now: the error names what to do.
    other = runner(root, "new", "--queue", "slow", "bye")
    assert other.returncode == 2 and "[queues.slow]" in other.stderr, other.stderr

    bad = tmp_path / "y"
    (bad / ".git").mkdir(parents=True)
    refused = runner(bad, "new", "--queue", "a b", "hello")
    assert refused.returncode == 2 and "letters, digits" in refused.stderr, refused.stderr
    assert sorted(p.name for p in bad.iterdir()) == [".git"]
