"""One emit's write is bounded in bytes: its data is written once per subscriber by one
script call (a partition's atomic step), during which Redis answers nobody, so an emit
whose copies pass MAX_EMIT_BYTES is refused before anything is written, with a 413
naming the bound, the subscribers and what to do, from the client, HTTP and the CLI
alike; `runner check` warns of an event whose subscribers make the API's largest body
too large to emit."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import falcon.testing
import pytest

from runner.catalog.options import MAX_EMIT_BYTES
from runner.cli.root import EXIT_REFUSED
from runner.errors import EventTooLarge
from runner.web import create_app

from conftest import Project

SUB = '''
QUEUE = "{queue}"
TRIGGERS = ["big.event"]

def handle(payload, ctx):
    return None
'''
SUBSCRIBERS = 10


def _subscribe(project: Project) -> None:
    for i in range(SUBSCRIBERS):
        project.add_function(f"sub{i}", textwrap.dedent(SUB.format(queue="fast" if i % 2 else "slow")),
                             '{"type": "object"}')


def _scripts_run(project: Project) -> int:
    stats = project.runtime.redis.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))


def _data(total: int) -> dict[str, str]:
    """Data whose JSON is ``total`` bytes."""
    return {"pad": "x" * (total - len('{"pad":""}'))}


def test_an_emit_past_the_bound_is_refused_before_anything_is_written(project: Project) -> None:
    """10 subscribers x 900 KB (9 MB in one script call) is refused with EventTooLarge
    naming the bound and the subscribers, and no script runs; 10 x 800 KB is emitted."""
    _subscribe(project)
    c, r = project.client, project.runtime.redis
    mine = project.runtime.config.redis.prefix + "*"
    keys = sorted(r.keys(mine))
    before = _scripts_run(project)
    with pytest.raises(EventTooLarge) as err:
        c.emit("big.event", _data(900_000))
    assert _scripts_run(project) == before and sorted(r.keys(mine)) == keys
    e = err.value
    assert (e.subscribers, e.data_bytes, e.bound) == (SUBSCRIBERS, 900_000, MAX_EMIT_BYTES)
    words = str(e)
    assert "nothing was enqueued" in words and f"{MAX_EMIT_BYTES:,}" in words and "10 subscriber" in words
    assert "reference" in words and f"{MAX_EMIT_BYTES // SUBSCRIBERS:,}" in words
    out = c.emit("big.event", _data(800_000))
    assert len(out.jobs) == SUBSCRIBERS


def test_http_and_the_cli_refuse_it_alike(project: Project) -> None:
    """POST /events/{name}: a 413 problem with the bound, the subscribers and the bytes;
    `runner emit`: a refusal (EXIT_REFUSED) in the same words, and --json with its kind."""
    project.write_config(extra="\n[api]\nmax_body_bytes = 4194304\n")
    _subscribe(project)
    client = falcon.testing.TestClient(create_app(project.runtime))
    got = client.simulate_post("/events/big.event", json=_data(900_000))
    assert got.status_code == 413, got.text
    body = got.json
    assert body["type"].endswith("event-too-large") and body["bound"] == MAX_EMIT_BYTES
    assert body["subscribers"] == SUBSCRIBERS and body["data_bytes"] == 900_000
    assert body["bytes"] == 9_000_000 and "reference" in body["detail"]
    data = project.root / "big.json"
    data.write_text(json.dumps(_data(900_000)))
    base = [sys.executable, "-m", "runner.cli", "--config", str(project.root / "runner.toml"), "emit", "big.event",
            f"@{data}"]
    cli = subprocess.run(base, env=project.env, cwd=project.root, capture_output=True, text=True, timeout=60)
    assert cli.returncode == EXIT_REFUSED, (cli.returncode, cli.stderr)
    assert "too large to emit" in cli.stderr and f"{MAX_EMIT_BYTES:,}" in cli.stderr, cli.stderr
    cli = subprocess.run([*base, "--json"], env=project.env, cwd=project.root, capture_output=True, text=True,
                         timeout=60)
    assert json.loads(cli.stdout)["kind"] == "EventTooLarge", cli.stdout


def test_runner_check_warns_of_an_event_too_large_to_emit_at_the_body_limit(project: Project) -> None:
    """With [api] max_body_bytes of 4 MiB, 10 subscribers: a warning naming the event and
    the most data an emit of it may carry; 2 subscribers at 1 MiB: none."""
    from runner.catalog import checks

    project.write_config(extra="\n[api]\nmax_body_bytes = 4194304\n")
    _subscribe(project)
    report = checks.check_files(project.root / "runner.toml", env=project.env)
    [warning] = [p for p in report.problems if "'big.event'" in p.message]
    assert warning.severity == "warning" and f"{MAX_EMIT_BYTES // SUBSCRIBERS:,} bytes" in warning.message
    project.write_config()
    for i in range(2, SUBSCRIBERS):
        (project.root / "functions" / f"sub{i}.py").unlink()
    report = checks.check_files(project.root / "runner.toml", env=project.env)
    assert not [p for p in report.problems if "'big.event'" in p.message]
