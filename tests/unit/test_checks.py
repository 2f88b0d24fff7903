"""`runner check` without Redis: every config, function and schema problem is collected with
its file, and the deploy gate's rule for which (type, version) the code on disk can run."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from runner import config as config_mod
from runner.catalog import checks, registry
from runner.store.connection import redact

TOML = """
[queues.fast]
visibility_timeout = 30
"""


def project(root: Path, files: dict[str, str]) -> Path:
    (root / "runner.toml").write_text(TOML)
    for name, text in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return root / "runner.toml"


SCHEMA = '{"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object"}'
GOOD = "QUEUE = 'fast'\ndef handle(payload, ctx):\n    return None\n"
UPGRADING = GOOD + "def upgrade(payload, from_version):\n    return payload\n"


def test_every_broken_file_is_listed_with_its_path_and_line(tmp_path: Path) -> None:
    cfg_path = project(tmp_path, {
        "functions/ok.py": GOOD,
        "schemas/ok/v1.json": SCHEMA,
        "functions/syntax.py": "def handle(payload, ctx)\n    pass\n",
        "schemas/syntax/v1.json": SCHEMA,
        "functions/badschema.py": GOOD,
        "schemas/badschema/v1.json": '{"type": "no-such-type"}',
        "functions/noschema.py": GOOD,
        "schemas/orphan/v1.json": SCHEMA,
    })
    report = checks.check_files(cfg_path, env={})
    errors = {p.where: p.message for p in report.problems if p.severity == "error"}
    assert errors[str(tmp_path / "functions" / "syntax.py") + ":1"].startswith("syntax error")
    assert "invalid schema" in errors[str(tmp_path / "schemas" / "badschema" / "v1.json")]
    assert "no schema" in errors[str(tmp_path / "functions" / "noschema.py")]
    warnings = [p for p in report.problems if p.severity == "warning"]
    assert [w.where for w in warnings] == [str(tmp_path / "schemas" / "orphan")]
    assert report.registry is not None and set(report.registry.functions) == {"ok"}
    assert report.failed()


def test_a_config_error_names_the_file_and_key(tmp_path: Path) -> None:
    (tmp_path / "runner.toml").write_text("[queues.fast]\nvisibilty_timeout = 3\n")
    report = checks.check_files(tmp_path / "runner.toml", env={})
    assert report.config is None
    [problem] = report.problems
    assert "runner.toml" in problem.message and "queues.fast.visibilty_timeout" in problem.message


def test_warnings_fail_only_when_strict(tmp_path: Path) -> None:
    cfg_path = project(tmp_path, {"functions/ok.py": GOOD, "schemas/ok/v1.json": SCHEMA,
                                  "schemas/orphan/v1.json": SCHEMA})
    report = checks.check_files(cfg_path, env={})
    assert not report.failed() and report.failed(strict=True)


@pytest.fixture
def reg(tmp_path: Path) -> registry.Registry:
    cfg_path = project(tmp_path, {
        "functions/one.py": GOOD, "schemas/one/v1.json": SCHEMA,
        "functions/two.py": GOOD, "schemas/two/v1.json": SCHEMA, "schemas/two/v2.json": SCHEMA,
        "functions/lifted.py": UPGRADING, "schemas/lifted/v1.json": SCHEMA, "schemas/lifted/v2.json": SCHEMA,
    })
    return registry.load(config_mod.load(cfg_path, env={}))


@pytest.mark.parametrize("type_,version,problem", [
    ("one", "1", None),
    ("lifted", "1", None),
    ("lifted", "2", None),
    ("two", "2", None),
    ("gone", "1", "unknown type"),
    ("one", "2", "version 2 is newer than the newest schema (v1)"),
    ("two", "1", "v1 needs an upgrade() to reach v2"),
    ("one", "0", "no schema for version 0"),
    ("one", "x", "malformed version"),
])
def test_the_gate_rule(reg: registry.Registry, type_: str, version: str, problem: str | None) -> None:
    """A job can run when its type is loaded and its version is the newest, or older with an
    upgrade(); anything else strands it."""
    got = checks.classify(reg, type_, version)
    if problem is None:
        assert got is None
    else:
        assert got is not None and problem in got


def test_redact_hides_the_password_only() -> None:
    assert redact("rediss://:s3cret@host.example:6380/0") == "rediss://:***@host.example:6380/0"
    assert redact("redis://user:pw@h/1") == "redis://user:***@h/1"
    assert redact("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


def test_report_with_a_replay_the_new_code_breaks_gives_no_all_clear() -> None:
    """A sleeping job whose recorded step the code on disk no longer reaches fails the
    deploy gate: the report names it and does not also say every waiting job can run,
    which it still says when nothing stands in the way."""
    from runner.cli.project import EXIT_OK, EXIT_REFUSED, render_check

    clear = checks.Report(redis_checked=True, scanned=1)
    assert "deploy gate: every waiting job can run" in render_check(clear, False, EXIT_OK)
    drifted = checks.Report(redis_checked=True, scanned=1, problems=[checks.Problem(
        "deploy gate", "1 sleeping or waiting job(s) of dur recorded step 'ship' ... Jobs: j1 (sleeping)")])
    text = render_check(drifted, False, EXIT_REFUSED)
    assert "recorded step 'ship'" in text and "every waiting job can run" not in text, text
