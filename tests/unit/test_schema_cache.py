"""The schema check cache (catalog/checked.py): a load of schema files whose very text
passed before skips the metaschema check and compiles on first use, with the same
registry as a full load; anything else is checked at load as before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runner import config
from runner.catalog import checked, registry

REPO = Path(__file__).parent.parent.parent
TOML = "[queues.fast]\nvisibility_timeout = 30\n"
SCHEMA = {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
          "properties": {"to": {"type": "string", "format": "emial"}, "n": {"type": "integer"}},
          "required": ["n"]}
GOOD = 'QUEUE = "fast"\n\ndef handle(payload, ctx):\n    return None\n'


def project(root: Path, schema: object = SCHEMA) -> config.Config:
    (root / "runner.toml").write_text(TOML)
    (root / "functions").mkdir(exist_ok=True)
    (root / "functions" / "fn.py").write_text(GOOD)
    write_schema(root, schema)
    return config.load(root / "runner.toml", env={})


def write_schema(root: Path, schema: object) -> None:
    p = root / "schemas" / "fn" / "v1.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(schema if isinstance(schema, str) else json.dumps(schema))


def cache_file(root: Path) -> Path:
    return root / config.STATE_DIR / checked.FILE


def test_a_second_load_is_the_same_registry_without_the_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = project(tmp_path)
    first = registry.load(cfg)
    assert cache_file(tmp_path).is_file()

    def no_check(*_: object) -> None:
        raise AssertionError("the metaschema check ran for a schema the cache vouched for")

    import jsonschema

    monkeypatch.setattr(jsonschema.Draft202012Validator, "check_schema", classmethod(no_check))
    second = registry.load(cfg)
    s1, s2 = first.get("fn").versions.schemas[1], second.get("fn").versions.schemas[1]
    assert s1.compiled is not None and s2.compiled is None  # compiled on first use
    assert second.warnings == first.warnings and "did you mean email?" in second.warnings[0]
    for payload in ({"n": 1}, {"n": "x"}, {}, {"n": 1, "to": 3}):
        assert s2.errors(payload) == s1.errors(payload)
    assert s2.compiled is not None


def test_an_edited_schema_is_checked_again_and_reported_at_load(tmp_path: Path) -> None:
    cfg = project(tmp_path)
    assert registry.load(cfg).functions
    write_schema(tmp_path, {"type": "nonsense"})
    reg = registry.load(cfg)
    assert "fn" not in reg.functions
    assert "invalid schema at" in str(next(iter(reg.errors.values())))
    # Broken schemas are never remembered: the same broken text fails again.
    assert "invalid schema at" in str(next(iter(registry.load(cfg).errors.values())))


@pytest.mark.parametrize("damage", [b"{not json", b'{"format": 1, "versions": ["old"], "schemas": {}}',
                                    b'{"format": 1, "versions": null, "schemas": {"k": 3}}', b"[]"])
def test_a_damaged_or_stale_cache_is_ignored(tmp_path: Path, damage: bytes) -> None:
    cfg = project(tmp_path, {"type": "nonsense"})
    cache_file(tmp_path).parent.mkdir()
    cache_file(tmp_path).write_bytes(damage)
    assert "invalid schema at" in str(next(iter(registry.load(cfg).errors.values())))
    write_schema(tmp_path, SCHEMA)
    assert registry.load(cfg).get("fn").versions.schemas[1].compiled is not None  # checked, not vouched for


def test_a_cache_naming_other_text_vouches_for_nothing(tmp_path: Path) -> None:
    """An entry is the file's path and text: the same text elsewhere, or other text here,
    is checked at load."""
    cfg = project(tmp_path)
    registry.load(cfg)
    data = json.loads(cache_file(tmp_path).read_bytes())
    write_schema(tmp_path, {"type": "nonsense"})
    cache_file(tmp_path).write_text(json.dumps(data))
    assert "invalid schema at" in str(next(iter(registry.load(cfg).errors.values())))


def test_a_project_where_the_cache_cannot_be_written_still_loads(tmp_path: Path) -> None:
    cfg = project(tmp_path)
    (tmp_path / config.STATE_DIR).write_text("a file where the folder would be")
    assert registry.load(cfg).get("fn")
    assert registry.load(cfg).get("fn").versions.schemas[1].compiled is not None  # nothing kept
    assert sorted(p.name for p in tmp_path.iterdir()) == [".runner", "functions", "runner.toml", "schemas"]


def test_an_unchanged_project_loads_without_jsonschema(tmp_path: Path) -> None:
    """The point of the cache: a process whose schemas passed before never imports
    jsonschema, nor compiles a validator before it is used."""
    registry.load(project(tmp_path))
    code = ("import sys\nfrom runner import config\nfrom runner.catalog import registry\n"
            f"reg = registry.load(config.load({str(tmp_path / 'runner.toml')!r}, env={{}}))\n"
            "assert reg.get('fn')\nprint('jsonschema' in sys.modules, 'jsonschema_rs' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.split() == ["False", "False"]
