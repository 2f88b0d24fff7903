"""Compiled payload validators per (type, version) and the upgrade chain.

Schemas are JSON Schema draft 2020-12, checked against the metaschema once at load and
compiled once (a Rust validator: well under a microsecond for the examples), never per job.
The one compiled validator serves enqueue and claim alike. A schema file whose very text
passed both before (the check cache, checked.py) is not checked again, and is compiled
on first use.

``format`` is asserted, not only annotated (draft 2020-12 leaves that to the validator; a
schema author who writes ``"format": "email"`` expects a check): every format of the
specification, FORMATS below. A format outside that list checks nothing and is reported
as a warning at load, with the likely one it misspells.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from runner.errors import FieldError, FunctionLoadError, UnknownVersion, ValidationFailed

if TYPE_CHECKING:
    from runner.catalog.checked import Checked

_VERSION_FILE = re.compile(r"^v([1-9][0-9]*)\.json$")
# The formats of JSON Schema draft 2020-12, each asserted by the compiled validator.
FORMATS = ("date-time", "date", "time", "duration", "email", "idn-email", "hostname", "idn-hostname",
           "ipv4", "ipv6", "uri", "uri-reference", "iri", "iri-reference", "uuid", "uri-template",
           "json-pointer", "relative-json-pointer", "regex")
_UNKNOWN_FORMAT = re.compile(r"Unknown format: '([^']*)'")


def json_path(parts: Any) -> str:
    out = "$"
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


@dataclass(frozen=True, slots=True)
class Schema:
    version: int
    path: str
    document: Mapping[str, Any]
    # None until first use for a schema the check cache vouched for (checked.py).
    compiled: Any = None
    warnings: tuple[str, ...] = ()

    @property
    def validator(self) -> Any:
        if self.compiled is None:
            # It compiled before: the same document, the same compiler (see checked.py).
            try:
                compiled = _rs().Draft202012Validator(self.document, validate_formats=True)
            except Exception as exc:
                raise FunctionLoadError(self.path, f"schema does not compile: {exc}") from None
            object.__setattr__(self, "compiled", compiled)  # two threads at once: either wins
        return self.compiled

    def errors(self, payload: Any) -> list[FieldError]:
        validator = self.compiled if self.compiled is not None else self.validator
        if validator.is_valid(payload):
            return []
        return sorted(
            (FieldError(json_path(e.instance_path), e.message)
             for e in validator.iter_errors(payload)),
            key=lambda e: (e.path, e.message),
        )


def _rs() -> Any:
    import jsonschema_rs

    return jsonschema_rs


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def load_schema(path: Path, version: int, checked: Checked | None = None) -> Schema:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise FunctionLoadError(str(path), f"cannot read schema: {exc}") from None
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise FunctionLoadError(str(path), f"not valid JSON: {exc.msg}", exc.lineno) from None
    if not isinstance(doc, dict):
        raise FunctionLoadError(str(path), "a schema must be a JSON object")
    declared = doc.get("$schema")
    if declared is not None and "2020-12" not in str(declared):
        raise FunctionLoadError(
            str(path), f"$schema must be JSON Schema draft 2020-12, got {declared!r}"
        )
    vouched = checked.vouched(path, text) if checked is not None else None
    if vouched is not None:  # this very text passed the check and compiled before
        return Schema(version=version, path=str(path), document=doc, warnings=vouched)
    # Here, not at the top: the client and the CLI import this module, and only a
    # registry load needs the metaschema check (jsonschema is the slowest import we have).
    import jsonschema

    try:
        jsonschema.Draft202012Validator.check_schema(doc)
    except jsonschema.SchemaError as exc:
        where = json_path(exc.absolute_path)
        raise FunctionLoadError(str(path), f"invalid schema at {where}: {exc.message}") from None
    compiled, warnings = _compile(doc, path)
    if checked is not None:
        checked.passed(path, text, warnings)
    return Schema(version=version, path=str(path), document=doc, compiled=compiled, warnings=warnings)


def _compile(doc: dict[str, Any], path: Path) -> tuple[Any, tuple[str, ...]]:
    """The validator, asserting formats; a format it does not know is a warning (it checks
    nothing), found by compiling strictly first."""
    rs = _rs()
    warnings: list[str] = []
    try:
        rs.Draft202012Validator(doc, validate_formats=True, ignore_unknown_formats=False)
    except Exception as exc:
        m = _UNKNOWN_FORMAT.search(str(exc))
        if m is None:  # the compiler's own errors (e.g. a bad regex)
            raise FunctionLoadError(str(path), f"schema does not compile: {exc}") from None
        close = difflib.get_close_matches(m.group(1), FORMATS, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else f" (checked: {', '.join(FORMATS)})"
        warnings.append(f"{path}: unknown format {m.group(1)!r} checks nothing{hint}")
    try:
        compiled = rs.Draft202012Validator(doc, validate_formats=True)
    except Exception as exc:
        raise FunctionLoadError(str(path), f"schema does not compile: {exc}") from None
    return compiled, tuple(warnings)


def load_versions(folder: Path, checked: Checked | None = None) -> dict[int, Schema]:
    """Every ``v<N>.json`` of a function's schema folder; versions must run 1..N."""
    found: dict[int, Schema] = {}
    if not folder.is_dir():
        return found
    for p in sorted(folder.iterdir()):
        if p.suffix != ".json":
            continue
        m = _VERSION_FILE.match(p.name)
        if not m:
            raise FunctionLoadError(str(p), "schema files are named v1.json, v2.json, ...")
        found[int(m.group(1))] = load_schema(p, int(m.group(1)), checked)
    if found:
        expected = list(range(1, max(found) + 1))
        if sorted(found) != expected:
            missing = sorted(set(expected) - set(found))
            raise FunctionLoadError(str(folder), f"schema versions must run from v1 with no gap; missing {missing}")
    return found


Upgrade = Callable[[dict[str, Any], int], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Versions:
    """The schemas of one function and how to lift an old payload to the newest."""

    type: str
    schemas: Mapping[int, Schema]
    upgrade: Upgrade | None
    newest: int = field(init=False)  # computed once: it is read on every claim

    def __post_init__(self) -> None:
        object.__setattr__(self, "newest", max(self.schemas))

    def schema(self, version: int) -> Schema:
        try:
            return self.schemas[version]
        except KeyError:
            raise UnknownVersion(self.type, version, sorted(self.schemas)) from None

    def validate(self, payload: Any, version: int) -> None:
        errors = self.schema(version).errors(payload)
        if errors:
            raise ValidationFailed(self.type, version, errors)

    def lift(self, payload: Any, version: int) -> Any:
        """Validate at ``version``, upgrade step by step, validate at the newest.

        Raises UnknownVersion, ValidationFailed, or UpgradeFailed.
        """
        self.validate(payload, version)
        if version == self.newest:
            return payload
        if self.upgrade is None:
            raise UpgradeFailed(f"v{version} payload needs an upgrade() to reach v{self.newest}")
        current = payload
        for v in range(version, self.newest):
            try:
                current = self.upgrade(current, v)
            except Exception as exc:
                raise UpgradeFailed(f"upgrade from v{v} raised {type(exc).__name__}: {exc}") from exc
            if not isinstance(current, dict):
                raise UpgradeFailed(f"upgrade from v{v} returned {type(current).__name__}, not a dict")
        self.validate(current, self.newest)
        return current


class UpgradeFailed(Exception):
    """An old payload could not be lifted to the newest version."""
