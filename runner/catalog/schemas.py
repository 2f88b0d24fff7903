"""Compiled payload validators per (type, version) and the upgrade chain.

Schemas are JSON Schema draft 2020-12, checked against the metaschema once at load and
compiled once (a Rust validator: well under a microsecond for the examples), never per job.
The one compiled validator serves enqueue and claim alike. A schema file whose very text
passed both before (the check cache, checked.py) is not checked again, and is compiled
on first use.

No payload stalls a process. A regex the linear-time engine takes (Rust's regex: no
backtracking, so no input costs more than its length) runs there. A schema with a
``pattern`` or a ``patternProperties`` key regex it refuses (a lookaround, a
backreference: "(?=.*[A-Z]).{8,}" is common, and quadratic on a long string that fails)
has that keyword evaluated by keywords.py instead, within PATTERN_BUDGET_S per
validation and with the GIL released; such a function's payloads are validated off the
event loop (``Versions.backtracks``), and ``runner check`` warns about each such regex.
The payloads of one request (a batch, a group) share one budget (``listing.one_request``).
A schema where another keyword would match such a key regex outside that bound
(``additionalProperties`` beside it, ``unevaluatedProperties``) is refused at load.
``propertyNames`` is evaluated there too, so many bad names cost their own length and
not each the whole object's.

Listing a payload's errors is listing.py's: every one up to LIST_BYTES of payload, else
the first and a note; the validator that lists them (``explain``) evaluates ``anyOf`` and
``oneOf`` in keywords.py.

A ``$ref`` resolves only from the project's schemas/ folder (a relative reference, from
the schema file's own place) and the metaschemas: a remote one is an error at load that
names it, and nothing is ever fetched over the network (whoever served the URL would
decide what validates, and a host that does not answer held a load for 30 s).

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

from runner.catalog import keywords, listing
from runner.catalog.keywords import PATTERN_BUDGET_S
from runner.catalog.listing import Unlisted, json_path
from runner.errors import FieldError, FunctionLoadError, UnknownVersion, ValidationFailed

if TYPE_CHECKING:
    from runner.catalog.checked import Checked

_VERSION_FILE = re.compile(r"^v([1-9][0-9]*)\.json$")
# The formats of JSON Schema draft 2020-12, each asserted by the compiled validator.
FORMATS = ("date-time", "date", "time", "duration", "email", "idn-email", "hostname", "idn-hostname",
           "ipv4", "ipv6", "uri", "uri-reference", "iri", "iri-reference", "uuid", "uri-template",
           "json-pointer", "relative-json-pointer", "regex")
_UNKNOWN_FORMAT = re.compile(r"Unknown format: '([^']*)'")


def _local_only(path: Path, loaded: dict[str, Any]) -> Callable[[str], Any]:
    """The retriever of a schema file's ``$ref``s: files under its schemas/ folder, each
    kept in ``loaded`` by its URI."""
    root = path.resolve().parent.parent

    def retrieve(uri: str) -> Any:
        from urllib.parse import unquote, urlsplit

        parts = urlsplit(uri)
        if parts.scheme == "file":
            target = Path(unquote(parts.path)).resolve()
            if target.is_relative_to(root) and target.suffix == ".json" and target.is_file():
                loaded[uri] = keywords.linear_doc(orjson.loads(target.read_bytes()))
                return loaded[uri]
            raise ValueError(f"$ref {uri!r}: no such schema file under {root}")
        raise ValueError(f"$ref {uri!r} is not allowed: a schema refers only to files under {root} (relative "
                         "$refs) and to the metaschemas, and nothing is fetched over the network; copy the "
                         "schema into schemas/")

    return retrieve


@dataclass(frozen=True, slots=True)
class Compiled:
    """A schema's validators: ``check`` says whether a payload is valid (on every job),
    ``explain`` lists its errors or gives the first (the same, but for ``propertyNames``,
    ``anyOf`` and ``oneOf``, which keywords.py evaluates, and its keywords' first errors
    say what is wrong); and the regexes that need backtracking, in it or the files it
    refers to."""

    check: Any
    explain: Any
    values: list[str]
    keys: list[str]


def _build(doc: Mapping[str, Any], path: Path, **options: Any) -> Compiled:
    """The linear-time engine when it takes every regex, else keywords.py's bounded
    ``pattern`` and ``patternProperties`` for the regexes it refuses; ``$ref``s from
    schemas/ only."""
    rs = _rs()
    base_uri = path.resolve().as_uri()
    doc = keywords.linear_doc(doc)  # its regexes as ECMA-262 means them, on either engine
    loaded: dict[str, Any] = {}
    options = {"base_uri": base_uri, "retriever": _local_only(path, loaded), "validate_formats": True, **options}
    which = {"values": False, "keys": False}
    try:
        linear = {**options, "pattern_options": rs.RegexOptions()}
        check = _validator(doc, base_uri, loaded, linear, **which)
        options = linear
    except Exception:
        docs = [doc, *loaded.values()]  # the files it refers to may hold the regex
        values, keys = keywords.backtracking(docs)
        if not values and not keys:
            raise
        why = keywords.refusal(docs, keys)
        if why is not None:
            raise ValueError(why) from None
        # The compiler's own engine for what is left (the metaschema's "regex" format, which
        # must take these regexes): it matches none of them against a payload.
        which = {"values": bool(values), "keys": bool(keys)}
        check = _validator(doc, base_uri, loaded, options, **which)
    else:
        values, keys = [], []
    explain = check
    docs = [doc, *loaded.values()]
    names, unions = keywords.names_in(docs), keywords.unions_in(docs)
    if names or unions or keys:
        # Another compile: keywords.py's propertyNames costs a payload a few microseconds,
        # its unions spare listing the errors of every branch, and its keywords say what
        # is wrong in a first error (where ``check`` needs only whether).
        explain = _validator(doc, base_uri, loaded, options, names=names, unions=unions, explains=True, **which)
    return Compiled(check, explain, values, keys)


def _validator(doc: Mapping[str, Any], base_uri: str, loaded: dict[str, Any], options: dict[str, Any],
               values: bool, keys: bool, names: bool = False, unions: bool = False, explains: bool = False) -> Any:
    c = keywords.Compile(doc, base_uri, loaded, explains=explains)
    found = c.keywords(values=values, keys=keys, names=names, unions=unions)
    return c.validator(doc, keywords=found or None, **options)


@dataclass(frozen=True, slots=True)
class Schema:
    version: int
    path: str
    document: Mapping[str, Any]
    # None until first use for a schema the check cache vouched for (checked.py).
    compiled: Compiled | None = None
    warnings: tuple[str, ...] = ()
    # Some regex needs the backtracking engine: matched within PATTERN_BUDGET_S.
    backtracks: bool = False

    @property
    def validator(self) -> Compiled:
        if self.compiled is None:
            # It compiled before: the same document, the same compiler (see checked.py).
            try:
                compiled = _build(self.document, Path(self.path))
            except Exception as exc:
                raise FunctionLoadError(self.path, f"schema does not compile: {_first_line(exc)}") from None
            object.__setattr__(self, "backtracks", bool(compiled.values or compiled.keys))
            object.__setattr__(self, "compiled", compiled)  # two threads at once: either wins
            return compiled
        return self.compiled

    def valid(self, payload: Any) -> bool:
        """Whether the payload validates, without listing any error: microseconds."""
        validator = self.compiled if self.compiled is not None else self.validator
        if self.backtracks:
            keywords.start_budget()
        return bool(validator.check.is_valid(payload)) and (not self.backtracks or keywords.ran_out() is None)

    def errors(self, payload: Any) -> list[FieldError]:
        """Every error, or for a payload past what is listed (listing.LIST_BYTES) the first
        and a note."""
        validator = self.compiled if self.compiled is not None else self.validator
        if not self.backtracks and validator.check.is_valid(payload):
            return []  # (the file's name below is made only for a payload with errors)
        file = "/".join(Path(self.path).parts[-3:])  # schemas/<type>/v<N>.json, as the project has it
        return listing.errors(validator.check, validator.explain, payload, backtracks=self.backtracks, file=file)


def _first_line(exc: BaseException) -> str:
    # The compiler's messages go on with the schema and instance, which say nothing here.
    return str(exc).split("\n", 1)[0]


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
        return Schema(version=version, path=str(path), document=doc, warnings=vouched,
                      backtracks=any(_BACKTRACKS in w for w in vouched))
    # Here, not at the top: the client and the CLI import this module, and only a
    # registry load needs the metaschema check (jsonschema is the slowest import we have).
    import jsonschema

    try:
        jsonschema.Draft202012Validator.check_schema(doc)
    except jsonschema.SchemaError as exc:
        where = json_path(exc.absolute_path)
        raise FunctionLoadError(str(path), f"invalid schema at {where}: {exc.message}") from None
    compiled, backtracks, warnings = _compile(doc, path)
    if checked is not None:
        checked.passed(path, text, warnings)
    return Schema(version=version, path=str(path), document=doc, compiled=compiled, warnings=warnings,
                  backtracks=backtracks)


_BACKTRACKS = "needs a backtracking engine"


def _compile(doc: dict[str, Any], path: Path) -> tuple[Compiled, bool, tuple[str, ...]]:
    """The validator, asserting formats; a format it does not know is a warning (it checks
    nothing), found by compiling strictly first; so is each pattern that needs the
    backtracking engine."""
    warnings: list[str] = []
    try:
        _build(doc, path, ignore_unknown_formats=False)
    except Exception as exc:
        m = _UNKNOWN_FORMAT.search(str(exc))
        if m is None:  # the compiler's own errors (e.g. a bad regex)
            raise FunctionLoadError(str(path), f"schema does not compile: {_first_line(exc)}") from None
        close = difflib.get_close_matches(m.group(1), FORMATS, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else f" (checked: {', '.join(FORMATS)})"
        warnings.append(f"{path}: unknown format {m.group(1)!r} checks nothing{hint}")
    try:
        compiled = _build(doc, path)
    except Exception as exc:
        raise FunctionLoadError(str(path), f"schema does not compile: {_first_line(exc)}") from None
    values, keys = compiled.values, compiled.keys
    backtracks = bool(values or keys)
    # First, so that a vouched schema (checked.py) knows it backtracks without compiling.
    if backtracks:
        how = (f"whose time can grow faster than the {{}}'s length: it is matched within {PATTERN_BUDGET_S:g} s per "
               "payload, off the event loop; prefer a regex without them, and ")
        warnings[:0] = [
            *(f"{path}: pattern {p!r} {_BACKTRACKS} (a lookaround or a backreference), {how.format('value')}"
              "give the field a maxLength" for p in values),
            *(f"{path}: patternProperties key {k!r} {_BACKTRACKS} (a lookaround or a backreference), "
              f"{how.format('name')}give the object a maxProperties, or propertyNames with a maxLength"
              for k in keys),
        ]
    return compiled, backtracks, tuple(warnings)


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
    # A schema has a backtracking pattern: validate off the event loop.
    backtracks: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "newest", max(self.schemas))
        object.__setattr__(self, "backtracks", any(s.backtracks for s in self.schemas.values()))

    def schema(self, version: int) -> Schema:
        try:
            return self.schemas[version]
        except KeyError:
            raise UnknownVersion(self.type, version, sorted(self.schemas)) from None

    def validate(self, payload: Any, version: int, *, listing: bool = True) -> None:
        """Raises ValidationFailed with the payload's errors; without ``listing``, Unlisted
        (for a caller on an event loop, which lists them elsewhere)."""
        schema = self.schema(version)
        if not listing:
            if not schema.valid(payload):
                raise Unlisted
            return
        errors = schema.errors(payload)
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
