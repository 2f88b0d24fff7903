"""functions/ + schemas/ -> a snapshot; every load error names the file (and line) and the
problem, and one broken file never stops the others."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner import config
from runner.catalog import registry
from runner.catalog.schemas import UpgradeFailed
from runner.errors import UnknownVersion, ValidationFailed

TOML = """
[queues.fast]
visibility_timeout = 30
[queues.slow]
visibility_timeout = 900
"""
SCHEMA = {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
          "properties": {"user_id": {"type": "integer"}, "name": {"type": "string"}},
          "required": ["user_id"]}


def project(tmp_path: Path, files: dict[str, str], schemas: dict[str, object] | None = None) -> config.Config:
    (tmp_path / "runner.toml").write_text(TOML)
    (tmp_path / "functions").mkdir()
    for name, src in files.items():
        (tmp_path / "functions" / f"{name}.py").write_text(src)
    for rel, doc in (schemas if schemas is not None else {f"{n}/v1.json": SCHEMA for n in files}).items():
        p = tmp_path / "schemas" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return config.load(tmp_path / "runner.toml", env={})


GOOD = 'QUEUE = "fast"\n\ndef handle(payload, ctx):\n    return None\n'


def load_one(tmp_path: Path, src: str, schemas: dict[str, object] | None = None) -> registry.Registry:
    return registry.load(project(tmp_path, {"fn": src, "ok": GOOD}, schemas))


def error_of(reg: registry.Registry) -> str:
    (err,) = [e for p, e in reg.errors.items() if p.endswith("fn.py") or "/fn" in p]
    return str(err)


def test_good_function_loads_with_defaults(tmp_path: Path) -> None:
    reg = registry.load(project(tmp_path, {"ok": GOOD}))
    fn = reg.get("ok")
    assert fn.queue == "fast" and fn.timeout_s == 30 and fn.versions.newest == 1
    assert fn.max_age_s is None and fn.describe()["max_age"] is None
    assert not reg.errors


def test_max_age_is_kept_and_described(tmp_path: Path) -> None:
    """MAX_AGE (seconds, int or float) is on the function and in its description."""
    reg = load_one(tmp_path, 'MAX_AGE = 1.5\ndef handle(p, c):\n    pass\n')
    fn = reg.get("fn")
    assert fn.max_age_s == 1.5 and fn.describe()["max_age"] == 1.5


@pytest.mark.parametrize("src,needle,line", [
    ('QUEUEE = "fast"\ndef handle(p, c):\n    pass\n', "QUEUEE is not an option; did you mean QUEUE?", 1),
    ('MAX_ATTEMPT = 3\ndef handle(p, c):\n    pass\n', "did you mean MAX_ATTEMPTS?", 1),
    ('QUEUE = "nope"\ndef handle(p, c):\n    pass\n', "QUEUE 'nope' is not defined", 1),
    ('QUEUE = 3\ndef handle(p, c):\n    pass\n', "QUEUE must be a string", 1),
    ('\nMAX_ATTEMPTS = 0\ndef handle(p, c):\n    pass\n', "MAX_ATTEMPTS must be a positive integer", 2),
    ('TIMEOUT = "x"\ndef handle(p, c):\n    pass\n', "TIMEOUT must be a positive number", 1),
    ('TIMEOUT = 900\ndef handle(p, c):\n    pass\n', "does not fit queue 'fast'", 1),
    ('IDEMPOTENCY_KEY = "{missing}"\ndef handle(p, c):\n    pass\n', "names field 'missing'", 1),
    ('RESOURCE_KEY = "{x.__class__}"\ndef handle(p, c):\n    pass\n', "RESOURCE_KEY", 1),
    ('BACKOFF = {"base": 5, "cap": 1}\ndef handle(p, c):\n    pass\n', "BACKOFF needs", 1),
    ('MAX_AGE = 0\ndef handle(p, c):\n    pass\n', "MAX_AGE must be a positive number of seconds", 1),
    ('MAX_AGE = "1h"\ndef handle(p, c):\n    pass\n', "MAX_AGE must be a positive number of seconds", 1),
    ('MAX_AG = 60\ndef handle(p, c):\n    pass\n', "did you mean MAX_AGE?", 1),
    ('x = 1\n', "no handle(payload, ctx) function", None),
    ('def handle(payload):\n    pass\n', "handle must take exactly (payload, ctx)", 1),
    ('def handle(p, c)\n    pass\n', "syntax error", 1),
    ('import nonexistent_module_xyz\ndef handle(p, c):\n    pass\n', "import failed: ModuleNotFoundError", 1),
])
def test_bad_function_is_reported_with_file_and_line(tmp_path: Path, src: str, needle: str, line: int | None) -> None:
    reg = load_one(tmp_path, src)
    msg = error_of(reg)
    assert needle in msg
    assert str(tmp_path / "functions" / "fn.py") in msg
    if line is not None:
        assert f"fn.py:{line}:" in msg
    assert "ok" in reg.functions  # the others keep loading


def test_other_uppercase_names_are_the_authors_business(tmp_path: Path) -> None:
    reg = load_one(tmp_path, 'TEMPLATES = {}\nRATE = 3\n' + GOOD)
    assert "fn" in reg.functions


@pytest.mark.parametrize("schemas,needle", [
    ({"ok/v1.json": SCHEMA}, "no schema: expected"),
    ({"ok/v1.json": SCHEMA, "fn/v1.json": "{not json"}, "not valid JSON"),
    ({"ok/v1.json": SCHEMA, "fn/v1.json": {"type": "nonsense"}}, "invalid schema at"),
    ({"ok/v1.json": SCHEMA, "fn/v1.json": SCHEMA, "fn/v3.json": SCHEMA}, "missing [2]"),
    ({"ok/v1.json": SCHEMA, "fn/version1.json": SCHEMA}, "named v1.json"),
    ({"ok/v1.json": SCHEMA, "fn/v1.json": {"$schema": "http://json-schema.org/draft-07/schema#"}}, "draft 2020-12"),
])
def test_bad_schema_is_reported_with_its_file(tmp_path: Path, schemas: dict[str, object], needle: str) -> None:
    reg = load_one(tmp_path, GOOD, schemas)
    assert needle in error_of(reg)
    assert "ok" in reg.functions


def test_reload_keeps_last_good_version_of_a_broken_file(tmp_path: Path) -> None:
    cfg = project(tmp_path, {"fn": GOOD})
    first = registry.load(cfg)
    (tmp_path / "functions" / "fn.py").write_text("def handle(p, c)\n")
    second = registry.load(cfg, previous=first)
    assert second.functions["fn"] is first.functions["fn"]
    assert "syntax error" in error_of(second)


UPGRADING = '''
QUEUE = "fast"

def upgrade(payload, from_version):
    if from_version == 1:
        return {"user_id": payload["uid"], "name": payload.get("n", "x")}
    return payload

def handle(payload, ctx):
    return payload
'''
V1 = {"type": "object", "properties": {"uid": {"type": "integer"}, "n": {"type": "string"}}, "required": ["uid"],
      "additionalProperties": False}


def test_versions_validate_and_upgrade_step_by_step(tmp_path: Path) -> None:
    reg = registry.load(project(tmp_path, {"fn": UPGRADING}, {"fn/v1.json": V1, "fn/v2.json": SCHEMA}))
    v = reg.get("fn").versions
    assert v.newest == 2
    assert v.lift({"uid": 3}, 1) == {"user_id": 3, "name": "x"}
    with pytest.raises(ValidationFailed) as err:
        v.validate({"uid": "x", "extra": 1}, 1)
    paths = {e.path for e in err.value.errors}
    assert "$.uid" in paths and "$" in paths
    with pytest.raises(UnknownVersion):
        v.validate({}, 7)


def test_missing_upgrade_is_reported(tmp_path: Path) -> None:
    reg = registry.load(project(tmp_path, {"fn": GOOD}, {"fn/v1.json": V1, "fn/v2.json": SCHEMA}))
    assert any("no upgrade()" in w for w in reg.warnings)
    with pytest.raises(UpgradeFailed):
        reg.get("fn").versions.lift({"uid": 1}, 1)


def test_formats_are_asserted_and_an_unknown_one_is_a_warning(tmp_path: Path) -> None:
    """Every standard format is checked by the compiled validator; a format no validator
    knows (a typo, or a vendor's own) loads with a warning naming it, as it checks nothing."""
    doc = {"type": "object", "properties": {
        "to": {"type": "string", "format": "email"}, "at": {"type": "string", "format": "date-time"},
        "id": {"type": "string", "format": "uuid"}, "url": {"type": "string", "format": "uri"},
        "typo": {"type": "string", "format": "emial"}}}
    reg = load_one(tmp_path, GOOD, {"ok/v1.json": SCHEMA, "fn/v1.json": doc})
    versions = reg.get("fn").versions
    good = {"to": "a@example.com", "at": "2026-12-01T10:00:00Z", "id": "0b8f4c1e-8d2a-4c4e-9f1a-2b3c4d5e6f70",
            "url": "https://example.com/x", "typo": "anything"}
    versions.validate(good, 1)
    for field, value in (("to", "not-an-email"), ("at", "yesterday"), ("id", "123"), ("url", "no scheme")):
        with pytest.raises(ValidationFailed) as err:
            versions.validate({**good, field: value}, 1)
        assert [e.path for e in err.value.errors] == [f"$.{field}"]
    (warning,) = [w for w in reg.warnings if "emial" in w]
    assert "fn/v1.json" in warning and "did you mean email?" in warning


def test_a_module_file_resolves_as_path_resolve_does(tmp_path: Path) -> None:
    """_fresh_helpers resolves each directory once; the answer is Path.resolve()'s, through
    symlinked folders and files, missing files and every module loaded now."""
    import os
    import sys

    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "x.py").write_text("")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "y.py").symlink_to(tmp_path / "real" / "x.py")
    files = [str(tmp_path / "link" / "x.py"), str(tmp_path / "y.py"), str(tmp_path / "link" / "gone.py"),
             f"{tmp_path}/link//x.py", "relative.py"]
    files += [m.__file__ for m in list(sys.modules.values()) if isinstance(getattr(m, "__file__", None), str)]
    dirs: dict[str, str] = {}
    assert [registry._resolved(f, dirs) for f in files] == [str(Path(f).resolve()) for f in files]
    assert os.path.realpath(tmp_path / "real") in dirs.values()


def test_no_functions_folder_says_where_it_looked_and_what_to_do(tmp_path: Path) -> None:
    """A command run from a subfolder of the project (or run_inline without project=)
    found no functions folder, and said only "no function is loaded": the error names
    where it looked and how to point it at the project."""
    from runner.errors import UnknownFunction

    (tmp_path / "runner.toml").write_text(TOML)
    reg = registry.load(config.load(tmp_path / "runner.toml", env={}))
    with pytest.raises(UnknownFunction) as err:
        reg.get("greet")
    said = str(err.value)
    assert f"no functions folder at {tmp_path / 'functions'}" in said
    assert "--config" in said and "project=" in said
    # A project with functions says what it loaded, as before.
    with pytest.raises(UnknownFunction, match=r"\(loaded: ok\)"):
        (tmp_path / "p").mkdir()
        registry.load(project(tmp_path / "p", {"ok": GOOD})).get("greet")
