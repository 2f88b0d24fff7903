"""`runner check` against a real server: the deploy gate counts the waiting jobs (queued,
scheduled, dead) that the functions on disk can no longer run, the Redis settings are
checked, and the exit codes follow the cli docstring."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from runner.cli import cli
from runner.store import census, records
from runner.store.embedded import Server, free_port
from runner.worker.worker import Worker

from conftest import Project, wait_for

V2 = '{"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object"}'


def check(project: Project, *args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, ["--config", str(project.root / "runner.toml"), "check", *args],
                              env={**project.env, **(env or {})}, catch_exceptions=False)


def test_the_deploy_gate_counts_stranded_jobs_by_queue_state_type_and_version(
    project: Project, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After the code on disk changes, every waiting job it cannot run is counted: a deleted
    function (queued and dead jobs), a version newer than the newest schema, and v1 jobs once
    a v2 schema arrives without an upgrade(); adding the upgrade() clears those."""
    monkeypatch.setattr(census, "CHUNK", 3)  # several chunks per structure
    c = project.client
    r = project.runtime.redis
    k = project.keys()
    dead = c.enqueue("perm", {}).id
    worker = Worker(project.runtime, ["fast"])
    worker.start()
    wait_for(lambda: c.get(dead).status == "dead", what="the perm job to die")
    worker.stop(1)
    ready = [c.enqueue("record", {"n": i}).id for i in range(4)]
    for i in range(2):
        c.enqueue("record", {"n": i}, delay=3600)
    c.enqueue("noop", {})

    clean = check(project, "--json")
    assert clean.exit_code == 0, clean.stdout
    assert json.loads(clean.stdout)["stranded"] == []

    fns = project.root / "functions"
    (fns / "noop.py").unlink()
    (fns / "perm.py").unlink()
    (project.root / "schemas" / "record" / "v2.json").write_text(V2)
    # A job from a newer release (one that knows v9), written as its enqueue writes it: the
    # record says v9 and the census counts it under v9.
    rec = records.parse(r.get(k.job(ready[0])))
    assert rec is not None
    r.set(k.job(ready[0]), records.encode({**rec, "version": "9"}))
    r.hincrby(k.census, "record|1", -1)
    r.hincrby(k.census, "record|9", 1)

    failed = check(project, "--json", "--scan")
    assert failed.exit_code == 1
    got = {(s["queue"], s["state"], s["type"], s["version"]): (s["count"], s["problem"])
           for s in json.loads(failed.stdout)["stranded"]}
    assert set(got) == {
        ("fast", "queued", "noop", "1"), ("fast", "queued", "record", "1"),
        ("fast", "queued", "record", "9"), ("fast", "scheduled", "record", "1"),
        ("fast", "dead", "perm", "1"),
    }
    assert got[("fast", "queued", "record", "1")][0] == 3
    assert got[("fast", "scheduled", "record", "1")][0] == 2
    assert "newer than the newest schema (v2)" in got[("fast", "queued", "record", "9")][1]
    assert "needs an upgrade() to reach v2" in got[("fast", "queued", "record", "1")][1]
    assert "unknown type" in got[("fast", "dead", "perm", "1")][1]

    human = check(project, "--scan")
    assert human.exit_code == 1
    assert "deploy gate: 8 waiting job(s) the functions on disk cannot run" in human.stdout
    assert any(line.split()[:5] == ["fast", "scheduled", "record", "1", "2"] for line in human.stdout.splitlines())

    # Without --scan the gate answers from the census: the same jobs, one count per
    # (type, version) whatever the state, and the same verdict.
    quick = check(project, "--json")
    assert quick.exit_code == 1
    got = {(s["queue"], s["state"], s["type"], s["version"]): s["count"]
           for s in json.loads(quick.stdout)["stranded"]}
    assert got == {("fast", "waiting", "noop", "1"): 1, ("fast", "waiting", "record", "1"): 5,
                   ("fast", "waiting", "record", "9"): 1, ("fast", "waiting", "perm", "1"): 1}

    with (fns / "record.py").open("a") as f:
        f.write("\n\ndef upgrade(payload, from_version):\n    return payload\n")
    after = json.loads(check(project, "--json").stdout)
    assert {(s["type"], s["version"]) for s in after["stranded"]} == {("noop", "1"), ("record", "9"),
                                                                      ("perm", "1")}


def test_risky_redis_settings_warn_and_fail_with_strict(project: Project, tmp_path: Path) -> None:
    """A Redis that may evict or lose jobs is a warning; --strict makes it an error."""
    with Server(tmp_path / "risky", appendonly=False, extra=["--maxmemory-policy", "allkeys-lru"]) as risky:
        env = {"REDIS_URL": risky.url}
        warned = check(project, env=env)
        assert warned.exit_code == 0, warned.stdout
        assert "maxmemory-policy is allkeys-lru" in warned.stdout
        assert "persistence is off" in warned.stdout
        assert check(project, "--strict", env=env).exit_code == 1


def test_unreachable_redis_is_exit_3_unless_offline(project: Project) -> None:
    env = {"REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    down = check(project, env=env)
    assert down.exit_code == 3 and "deploy gate did not run" in down.stdout
    assert check(project, "--offline", env=env).exit_code == 0


def test_broken_files_and_config_are_listed(project: Project) -> None:
    (project.root / "functions" / "oops.py").write_text("def handle(p, ctx):\n    return (\n")
    broken = check(project, "--offline")
    assert broken.exit_code == 1 and "oops.py:2: syntax error" in broken.stdout
    (project.root / "runner.toml").write_text("[queues.fast]\nconcurrency = 0\n")
    bad_config = check(project)
    assert bad_config.exit_code == 2
    assert "queues.fast.concurrency must be a positive integer" in bad_config.stdout


def test_one_resource_key_on_two_queues_fails_the_check(project: Project) -> None:
    """Two functions of different queues that render one RESOURCE_KEY would run their
    jobs at once (each queue keeps its own locks): `runner check` fails (exit 1), naming
    both functions and both queues; on one queue it passes."""
    fns, schemas = project.root / "functions", project.root / "schemas"
    for name, queue in (("send_email", "fast"), ("export_user", "slow")):
        (fns / f"{name}.py").write_text(f'QUEUE = "{queue}"\nRESOURCE_KEY = "user:{{user_id}}"\n\n'
                                        "def handle(payload, ctx):\n    pass\n")
        (schemas / name).mkdir()
        (schemas / name / "v1.json").write_text('{"type": "object", "properties": {"user_id": {"type": "integer"}}}')
    failed = check(project, "--offline")
    assert failed.exit_code == 1, failed.stdout
    for text in ("send_email.py", "export_user.py", "RESOURCE_KEY", "'fast'", "'slow'", "one queue"):
        assert text in failed.stdout, (text, failed.stdout)
    (fns / "export_user.py").write_text((fns / "export_user.py").read_text().replace('"slow"', '"fast"'))
    assert check(project, "--offline").exit_code == 0


def test_a_destination_whose_schema_rejects_the_record_fails_the_check(project: Project) -> None:
    """`runner check` fails (exit 1) on an ON_SUCCESS / ON_FAILURE destination whose newest
    schema cannot take the record it would get ({"job": ..., "result" | "error": ...}),
    naming the option and the destination; a schema that takes it passes."""
    fns, schemas = project.root / "functions", project.root / "schemas"
    (fns / "source.py").write_text('QUEUE = "fast"\nON_SUCCESS = "sink"\nON_FAILURE = "sink"\n\n'
                                   "def handle(payload, ctx):\n    return 1\n")
    (schemas / "source").mkdir()
    (schemas / "source" / "v1.json").write_text('{"type": "object"}')
    (fns / "sink.py").write_text('QUEUE = "fast"\n\ndef handle(payload, ctx):\n    pass\n')
    (schemas / "sink").mkdir()
    (schemas / "sink" / "v1.json").write_text('{"type": "object", "required": ["order_id"]}')
    failed = check(project, "--offline")
    assert failed.exit_code == 1, failed.stdout
    assert "source.py" in failed.stdout and "ON_SUCCESS: the v1 schema of 'sink' rejects the record" in failed.stdout
    (schemas / "sink" / "v1.json").write_text('{"type": "object", "required": ["job"]}')
    assert check(project, "--offline").exit_code == 0


def test_the_scan_reads_jobs_waiting_in_the_priority_set(project: Project) -> None:
    """`runner check --scan` reads every place a waiting job can be: a queued job of
    priority 1-9 waits in the priority set, not in ready, and is counted like the rest
    (the census and the scan agree), as `Client.stats()` counts it ready."""
    c = project.client
    c.enqueue("record", {"n": 1})
    c.enqueue("record", {"n": 2}, priority=7)
    scanned, by_scan = census.waiting_versions(project.runtime.redis, project.runtime.keys)
    counted, _ = census.counts(project.runtime.redis, project.runtime.keys)
    assert scanned == counted == 2, (scanned, counted)
    assert by_scan[("fast", "queued", "record", "1")] == 2
    assert c.stats()["fast"]["ready"] == 2  # both wait to run, whichever structure holds them


def test_the_scan_reads_jobs_held_by_a_pause_or_waiting_on_a_limit(project: Project) -> None:
    """Jobs held back without an attempt (a paused function's held list, a full limit's
    waiters) are waiting jobs too: the scan counts them as deferred, as the census does."""
    c, k, sc = project.client, project.keys(), project.runtime.scripts
    c.pause(function="record")
    for n in range(2):
        c.enqueue("record", {"n": n})
    c.enqueue("resource", {"r": "x"})
    c.enqueue("resource", {"r": "x"})
    got = sc.claim(k, n=10, start=10, lease_ms=60_000, token_base="t.1", dead_ttl_ms=10**7, done_ttl_ms=10**7)
    assert len(got[2:]) == 15  # one resource job claimed; the other waits on its limit
    scanned, by_scan = census.waiting_versions(project.runtime.redis, project.runtime.keys)
    counted, _ = census.counts(project.runtime.redis, project.runtime.keys)
    assert scanned == counted == 4, (scanned, counted, by_scan)
    assert by_scan[("fast", "deferred", "record", "1")] == 2
    assert by_scan[("fast", "deferred", "resource", "1")] == 1


def test_the_unrelated_runner_distribution_installed_beside_is_a_warning(project: Project, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """`pip install runner` installs an unrelated package (Runner 1.1, its folder
    `Runner/`): on a case-insensitive file system its files land in our `runner/`. With
    its dist-info on the path, `runner check --offline` warns and says what to do; without
    it, no such warning."""
    clean = check(project, "--offline", "--json")
    assert clean.exit_code == 0 and not [p for p in json.loads(clean.stdout)["problems"] if p["where"] == "install"]
    site = tmp_path / "site"
    info = site / "Runner-1.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: Runner\nVersion: 1.1\n")
    (info / "RECORD").write_text("Runner/__init__.py,,\n")
    monkeypatch.syspath_prepend(str(site))
    out = check(project, "--offline", "--json")
    assert out.exit_code == 0, out.output
    (warning,) = [p for p in json.loads(out.stdout)["problems"] if p["where"] == "install"]
    assert warning["severity"] == "warning"
    assert "Runner 1.1" in warning["message"] and "pip uninstall runner" in warning["message"], warning
    assert "runner-redis" in warning["message"]
    assert check(project, "--offline", "--strict").exit_code != 0
