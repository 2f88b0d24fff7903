"""The manual as a reader meets it: every page of docs/ linked from its index, every
relative link and #anchor of the README and docs/ resolving, every code sample parsing
(Python, TOML, JSON), every function option a sample sets loading as the function file it
shows, the Redis key table the same as runner/store/keys.py's and true to the keys the
code builds, every runner.toml key documented, and the map from modules to tests naming
every part of runner/ and only files that exist."""

from __future__ import annotations

import ast
import inspect
import json
import re
import string
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runner import config
from runner.catalog import options, registry
from runner.store import keys, roster

from conftest import REPO

DOCS = REPO / "docs"
PAGES = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)\)")


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans (links there are code)."""
    text = FENCE.sub("", text)
    return re.sub(r"`[^`\n]*`", "", text)


def samples(lang: str) -> Iterator[tuple[str, str]]:
    """Every fenced code block of that language in the README and docs/: (where, code)."""
    for page in PAGES:
        text = page.read_text()
        for m in FENCE.finditer(text):
            if m.group(1) == lang:
                yield f"{rel(page)}:{text[:m.start()].count(chr(10)) + 1}", m.group(2)


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        m = re.match(r"#{1,6} (.+)", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> list[str]:
    return LINK.findall(prose(page.read_text()))


def test_every_page_is_linked_from_the_index() -> None:
    """docs/README.md links every page of docs/, and the README links the index."""
    index = {(DOCS / t.split("#")[0]).resolve() for t in links(DOCS / "README.md") if not t.startswith("#")}
    pages = {p.resolve() for p in DOCS.glob("*.md") if p.name != "README.md"}
    assert len(pages) >= 20
    assert not pages - index, f"not in docs/README.md: {sorted(p.name for p in pages - index)}"
    assert "docs/README.md" in links(REPO / "README.md")


def test_every_relative_link_and_anchor_resolves() -> None:
    """Each relative link of the README and docs/ names a file or folder that exists, and
    each #anchor a heading of its page."""
    broken: list[str] = []
    checked = 0
    for page in PAGES:
        for target in links(page):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            checked += 1
            if not dest.exists():
                broken.append(f"{rel(page)}: {target} (no such file)")
            elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
                broken.append(f"{rel(page)}: {target} (no such heading)")
    assert checked >= 100
    assert not broken, "\n".join(broken)


def test_every_code_sample_parses() -> None:
    """Python samples compile (top-level await allowed: they show calls from async code),
    TOML samples load, JSON samples decode."""
    flags = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    python = list(samples("python"))
    for where, code in python:
        try:
            compile(code, where, "exec", flags=flags)
        except SyntaxError as exc:
            pytest.fail(f"{where}: {exc}")
    toml = list(samples("toml"))
    for where, code in toml:
        try:
            tomllib.loads(code)
        except tomllib.TOMLDecodeError as exc:
            pytest.fail(f"{where}: {exc}")
    for where, code in samples("json"):
        try:
            json.loads(code)
        except ValueError as exc:
            pytest.fail(f"{where}: {exc}")
    assert len(python) >= 10 and len(toml) >= 3


def _variants(tree: ast.Module) -> list[dict[str, ast.expr]]:
    """The option sets a sample shows: its UPPER-case assignments in order, where a name set
    a second time is an alternative to the first (a new set, keeping the other options)."""
    out: list[dict[str, ast.expr]] = [{}]
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name.isupper():
                if name in out[-1]:
                    out.append(dict(out[-1]))
                out[-1][name] = node.value
    return [v for v in out if v]


def _fields(tree: ast.Module) -> set[str]:
    """Every payload field a key template of the sample names (``"tenant:{tenant_id}"``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                names |= {f.split(".")[0] for _, f, _, _ in string.Formatter().parse(node.value) if f}
            except ValueError:
                continue
    return names


TOML = """
[queues.fast]
visibility_timeout = 30
[queues.slow]
visibility_timeout = 900
isolation = "process"
"""


def test_the_function_options_samples_show_load(tmp_path: Path) -> None:
    """Each option set a sample shows (README's function file, the isolation, flow control,
    schedule and workflow options, ...) loads as a function file, with a handler and a
    schema that declares the fields its templates name: no option misspelt, mistyped or
    out of range, and every alternative value shown is one the loader takes."""
    loaded = 0
    for n, (where, code) in enumerate(samples("python")):
        tree = ast.parse(code)
        unknown = {name for v in _variants(tree) for name in v} - set(options.OPTIONS)
        assert not unknown, f"{where}: not options: {sorted(unknown)}"
        for m, variant in enumerate(_variants(tree)):
            for name, value in variant.items():
                try:
                    ast.literal_eval(value)
                except ValueError:
                    pytest.fail(f"{where}: {name} is not a literal")
            root = tmp_path / f"s{n}_{m}"
            (root / "functions").mkdir(parents=True)
            (root / "runner.toml").write_text(TOML)
            props = {f: {} for f in _fields(tree)}
            schema = json.dumps({"type": "object", "properties": props})
            lines = [f"{name} = {ast.unparse(value)}" for name, value in variant.items()]
            if "QUEUE" not in variant:
                lines.insert(0, 'QUEUE = "fast"')
            source = "\n".join(lines) + "\n\ndef handle(payload, ctx):\n    return None\n"
            if "BATCH" in variant:  # a batch function's handler takes the batch
                source += "\n\ndef handle_batch(payloads, ctx):\n    return None\n"
            stubs = {ast.literal_eval(variant[d]) for d in ("ON_SUCCESS", "ON_FAILURE") if d in variant}
            for name in {"shown", *stubs}:
                (root / "functions" / f"{name}.py").write_text(
                    source if name == "shown" else 'QUEUE = "fast"\n\ndef handle(payload, ctx):\n    return None\n')
                (root / "schemas" / name).mkdir(parents=True)
                (root / "schemas" / name / "v1.json").write_text(schema if name == "shown" else '{"type": "object"}')
            reg = registry.load(config.load(root / "runner.toml", env={}))
            assert not reg.errors, f"{where}: {source}\n{[str(e) for e in reg.errors.values()]}"
            loaded += 1
    assert loaded >= 6


def _key_blocks(text: str) -> list[str]:
    """The key tables of a text: runs of indented lines that start with ``<prefix>:``, with
    their continuation lines."""
    blocks: list[str] = []
    for m in re.finditer(r"(?:^ {4}<prefix>:.*\n(?:^ {8,}\S.*\n)*)+", text, re.M):
        blocks.append(m.group(0))
    return blocks


def _table_keys(block: str) -> set[str]:
    return {line.split()[0] for line in block.splitlines() if line.strip().startswith("<prefix>:")}


def _built_keys() -> tuple[set[str], set[str]]:
    """What the code builds, with placeholders for its arguments: (whole keys, prefixes a
    script or a caller appends to)."""
    placeholders = {"job_id": "<id>", "type_": "<type>", "key": "<key>", "gen": "<gen>", "minute": "<minute>",
                    "group_id": "<id>", "schedule_id": "<id>", "prefix": "<prefix>", "queue": "<queue>"}
    k = keys.QueueKeys(prefix="<prefix>", queue="<queue>")
    whole: set[str] = set()
    prefixes: set[str] = set()
    for name in k.__dataclass_fields__:
        value = getattr(k, name)
        if isinstance(value, str) and value.startswith("<prefix>:") and name != "base":
            (prefixes if value.endswith(":") else whole).add(value)
    builders: list[Any] = [getattr(k, n) for n, f in inspect.getmembers(type(k), inspect.isfunction)
                           if not n.startswith("_") and n != "pattern"]
    builders += [f for n, f in inspect.getmembers(keys, inspect.isfunction)
                 if f.__module__ == keys.__name__ and inspect.signature(f).return_annotation in ("str", str)]
    builders += [roster.key, roster.pruner_key]
    for fn in builders:
        params = inspect.signature(fn).parameters
        unknown = set(params) - set(placeholders)
        assert not unknown, f"{fn.__qualname__} builds a key from {unknown}: name its placeholder here"
        whole.add(fn(*(placeholders[p] for p in params)))
    e = keys.EventKeys(prefix="<prefix>", name="<name>")  # an event name's waiters (ctx.wait_for_event)
    whole.add(e.shapes)
    prefixes |= {e.bucket_prefix, e.woke_prefix}
    prefixes.add(keys.place_prefix("<prefix>", "<queue>") + ":")  # a digest in a tag of its own follows
    whole.discard(keys.place_prefix("<prefix>", "<queue>"))
    return whole, prefixes


def test_the_key_table_is_keys_py_and_the_keys_the_code_builds() -> None:
    """docs/internals.md shows the key tables of runner/store/keys.py's docstring as they
    are (copy them over when they change); every key the code builds is in them, and every
    key in them is built (whole, or from a prefix the code hands a script)."""
    doc = _key_blocks((DOCS / "internals.md").read_text())
    src = _key_blocks(keys.__doc__ or "")
    assert len(src) == 2 and doc == src, "docs/internals.md's key tables differ from keys.py's docstring"
    table = set().union(*map(_table_keys, src))
    whole, prefixes = _built_keys()
    assert not whole - table, f"built but not in the table: {sorted(whole - table)}"
    unbuilt = {t for t in table if t not in whole and not any(t.startswith(p) for p in prefixes)}
    assert not unbuilt, f"in the table but built nowhere: {sorted(unbuilt)}"
    assert {"<prefix>:{<queue>}:cancels", "<prefix>:{<queue>}:lost", "<prefix>:{<queue>}:partitions"} <= table


def test_every_runner_toml_key_is_documented() -> None:
    """docs/configuration.md's row for each section names every key runner.toml takes there."""
    text = (DOCS / "configuration.md").read_text()
    row = re.compile(r"^\| `\[([\w.<>]+)\]` \| ([^|]*(?:\\\|[^|]*)*) \|", re.M)
    rows = {m.group(1): m.group(2) for m in row.finditer(text)}
    wanted = {name: set(spec) - {"tokens"} for name, spec in config._SPECS.items()}
    wanted["queues.<name>"] = set(config._QUEUE_SPEC)
    wanted["api.tokens.<name>"] = set(config._TOKEN_SPEC)
    for section, names in wanted.items():
        assert section in rows, f"no row for [{section}]"
        named = set(re.findall(r"\w+", rows[section]))
        assert names <= named, f"[{section}] lacks {sorted(names - named)}"
    assert set(config._BACKOFF_SPEC) <= set(re.findall(r"\w+", rows["queues.<name>"]))


def test_the_module_map_names_every_part_and_only_files_that_exist() -> None:
    """docs/contributing.md maps every module and sub-package of runner/ to its tests, and
    every path a page names in code (`runner/...`, `tests/...`) exists."""
    text = (DOCS / "contributing.md").read_text()
    table = text.split("## Which tests pin down what", 1)[1].split("\n## ", 1)[0]
    parts = {p.name for p in (REPO / "runner").iterdir()
             if (p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists()))}
    missing = {p for p in parts if f"`runner/{p}" not in table}
    assert not missing, f"not in the map: {sorted(missing)}"
    named = 0
    for page in PAGES:
        for path in re.findall(r"`((?:runner|tests)/[\w/.-]*\w/?)`", page.read_text()):
            named += 1
            assert (REPO / path).exists(), f"{rel(page)} names {path}, which does not exist"
    assert named >= 100
