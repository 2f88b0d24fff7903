"""The schema keywords evaluated here rather than by the compiled validator, each so that
no payload can hold a process (schemas.py says when each applies).

- ``pattern``, in a schema with a regex the linear-time engine refuses (a lookaround, a
  backreference): that regex is matched by the ``regex`` module with the GIL released,
  within what is left of PATTERN_BUDGET_S for the payload, after ``maxLength`` (a longer
  string is refused by maxLength and never matched). Every other pattern stays on the
  linear engine.
- ``patternProperties``, in a schema with such a key regex: the same for names, skipping
  the names ``propertyNames.maxLength`` refuses and an object over ``maxProperties``. The
  compiler would match them with its own backtracking engine, out of reach of any time
  bound (100 names of 10,000 characters held a process for 30 s). A keyword that matches
  the key regexes itself (``additionalProperties`` beside them, ``unevaluatedProperties``)
  cannot be bounded, so such a schema is refused at load (``refusal``).
- ``propertyNames``: the compiler's error for a bad name holds a copy of the whole object,
  so n bad names of an object of s bytes cost n x s (4,000 names of 100 characters: 42 s).
  Here an object's bad names are one error.
- ``anyOf`` and ``oneOf``, in the validator that lists errors: one error for a value no
  branch takes (or, for oneOf, more than one), worded as the compiler words it. The
  compiler's error carries every error of every branch, built whether read or not, so a
  union at the root of a payload cost as much as listing the errors of each branch, even
  for its first error alone (a 268 KiB payload: 50 s). Here each branch is only asked
  whether it holds; where a branch's errors go (``unevaluatedProperties`` and
  ``unevaluatedItems`` see through a union) is unchanged, as the compiler works those out
  from the schema.

An error here that stands for several (every bad value under ``patternProperties``, every
bad name) is one error whose message is MARK and the JSON of ``[[path, message], ...]``,
paths relative to the keyword's object; ``expand`` reads any error back as field errors.
A keyword's subschemas are compiled once, after the document (``Compile.prime``), in the
document's own context, so a ``$ref`` in them resolves as it would anywhere.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import orjson

# What matching backtracking patterns may take in all, per payload validated.
PATTERN_BUDGET_S = 0.25
# At claim a payload is checked again (a schema may have changed since). The budget is a
# wall-clock one, and a busy worker's threads share its cores, so a payload an idle web
# matched in 0.2 s would run out of 0.25 s there and be buried as invalid, for the load:
# a worker is no event loop, and gives it ten times as long.
CLAIM_BUDGET_S = 10 * PATTERN_BUDGET_S
# The start of a message that stands for several errors (see the module docstring).
MARK = "\x1e"
_OVER = f" took over {PATTERN_BUDGET_S:g} s (what matching may take per payload, or per batch or group): "
# Keywords whose values are a map of names to subschemas, and those holding data, not schemas.
_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
_DATA = frozenset({"enum", "const", "default", "examples", "required", "dependentRequired"})

Path = list[str | int]


class _Budget(threading.local):
    deadline = 0.0
    # The error of the first match the budget cut short, for this payload.
    ran_out: str | None = None
    # Within one_budget: the payloads share its deadline.
    shared = False


_budget = _Budget()


def start_budget() -> None:
    """Give the payload about to be validated on this thread its PATTERN_BUDGET_S (or what
    is left of the one it shares)."""
    if not _budget.shared:
        _budget.deadline = time.monotonic() + PATTERN_BUDGET_S
    _budget.ran_out = None


@contextlib.contextmanager
def one_budget(seconds: float = PATTERN_BUDGET_S) -> Iterator[None]:
    """The payloads validated within share one budget of ``seconds``: those of one request
    (a batch, a group), which a budget each would let hold a thread for 0.25 s a payload;
    or a payload checked again at claim (CLAIM_BUDGET_S)."""
    if _budget.shared:  # inside another: that one holds
        yield
        return
    _budget.deadline = time.monotonic() + seconds
    _budget.shared = True
    try:
        yield
    finally:
        _budget.shared = False


def ran_out() -> str | None:
    """The error of the first match the budget cut short since start_budget, if any: the
    payload is then refused, whatever the validator said. A match that could not tell is
    an error, which a ``not``, an ``if`` or a branch of ``anyOf`` would turn into a pass."""
    return _budget.ran_out


def _cut_short(message: str) -> str:
    if _budget.ran_out is None:
        _budget.ran_out = message
    return message


class OverBudget(Exception):
    """The budget ran out before a backtracking match could tell."""


def over_budget(message: str) -> bool:
    return _OVER in message


def _rs() -> Any:
    import jsonschema_rs

    return jsonschema_rs


def linear(source: str) -> bool:
    """Whether the linear-time engine takes this regex."""
    rs = _rs()
    try:
        rs.Draft202012Validator({"pattern": source}, pattern_options=rs.RegexOptions())
    except Exception:
        return False
    return True


# ECMA-262's `.` matches any character but its line terminators; Python's, any but \n.
_DOT = "[^\n\r\u2028\u2029]"
# The same on the linear engine, as regex text: there `.` matched \r, U+2028 and U+2029
# (so "^.{1,40}$" took "a\rb"), while its \s, \d, \w and $ are ECMA-262's already.
_LINEAR_DOT = r"[^\n\r\u2028\u2029]"
# ECMA-262's \s: its WhiteSpace and LineTerminator code points (U+FEFF and Zs among them,
# U+0085 not), where regex.ASCII takes the six ASCII ones only.
_WS = frozenset("\t\n\v\f\r \u00a0\u1680\u2028\u2029\u202f\u205f\u3000\ufeff"
                + "".join(map(chr, range(0x2000, 0x200B))))


def _class_body(points: frozenset[str], negate: bool = False) -> str:
    """A character class's body (no brackets): these code points, or all others."""
    ranges: list[tuple[int, int]] = []
    for cp in sorted(map(ord, points)):
        if ranges and ranges[-1][1] == cp - 1:
            ranges[-1] = (ranges[-1][0], cp)
        else:
            ranges.append((cp, cp))
    if negate:
        gaps, low = [], 0
        for a, b in ranges:
            if a > low:
                gaps.append((low, a - 1))
            low = b + 1
        ranges = [*gaps, (low, 0x10FFFF)] if low <= 0x10FFFF else gaps
    return "".join(f"\\U{a:08x}" + (f"-\\U{b:08x}" if b > a else "") for a, b in ranges)


_SPACE = _class_body(_WS)
_NOT_SPACE = _class_body(_WS, negate=True)


def _rewrite(source: str, plain: Mapping[str, str], escapes: Mapping[str, tuple[str, str]]) -> str:
    """``source`` with each token of ``plain`` outside a character class replaced, and each
    escape of ``escapes`` by its first form outside a class, its second inside one; other
    escapes and classes are copied as they are."""
    out: list[str] = []
    i, n, in_class = 0, len(source), False
    while i < n:
        c = source[i]
        if c == "\\" and i + 1 < n:
            token = source[i:i + 2]
            swap = escapes.get(token)
            out.append(token if swap is None else swap[in_class])
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":  # (an empty class, [] or [^], is refused when the schema loads)
            in_class = True
        else:
            c = plain.get(c, c)
        out.append(c)
        i += 1
    return "".join(out)


def ecma(source: str) -> str:
    r"""An ECMA-262 regex (no flags, as JSON Schema's ``pattern``) for Python's ``regex``
    module under ``regex.ASCII``, where three tokens differ: ``$`` also matches before a
    final newline (so "abc1\n" met ``^[a-z0-9]+$``), ``.`` also matches \r, U+2028 and
    U+2029, and ``\s`` takes ASCII spaces only (not U+00A0 or U+FEFF). Outside a character
    class, ``$`` becomes ``\Z`` (the very end) and ``.`` the class ECMA means; ``\s`` and
    ``\S`` become ECMA's sets, in a class or out."""
    return _rewrite(source, {"$": "\\Z", ".": _DOT},
                    {"\\s": (f"[{_SPACE}]", _SPACE), "\\S": (f"[{_NOT_SPACE}]", _NOT_SPACE)})


def for_linear(source: str) -> str:
    """An ECMA-262 regex as the linear engine must get it: each ``.`` outside a class as
    _LINEAR_DOT. ``shown`` turns it back for an error message."""
    return _rewrite(source, {".": _LINEAR_DOT}, {}) if "." in source else source


def shown_regex(text: str) -> str:
    """``text`` (a regex, or a message that quotes one as JSON) as its author wrote it."""
    return text.replace(_LINEAR_DOT, ".").replace(_LINEAR_DOT.replace("\\", "\\\\"), ".")


def linear_doc(node: Any) -> Any:
    """A copy of a schema document whose ``pattern``s and ``patternProperties`` keys that
    the linear engine takes mean on it what ECMA-262 says (see for_linear); those it
    refuses are left as written (Matcher translates them for the other engine)."""
    def fix(source: str) -> str:
        out = for_linear(source)
        return source if out == source or not linear(source) else out

    def walk(n: Any) -> Any:
        if isinstance(n, list):
            return [walk(v) for v in n]
        if not isinstance(n, dict):
            return n
        out: dict[str, Any] = {}
        for k, v in n.items():
            if k in _DATA:
                out[k] = v
            elif k == "pattern" and isinstance(v, str):
                out[k] = fix(v)
            elif k in _MAPS and isinstance(v, dict):
                out[k] = {(fix(name) if k == "patternProperties" else name): walk(sub) for name, sub in v.items()}
            else:
                out[k] = walk(v)
        return out

    return walk(node)


class Matcher:
    """Search one ECMA-262 regex: on the linear engine when it takes it, else with the
    ``regex`` module (ECMA-262's ASCII classes) within what is left of the budget."""

    def __init__(self, source: str) -> None:
        rs = _rs()
        self.source = source
        self._linear: Any = None
        self._slow: Any = None
        try:
            self._linear = rs.Draft202012Validator({"pattern": source}, pattern_options=rs.RegexOptions())
        except Exception:
            import regex

            self._slow = regex.compile(ecma(source), regex.ASCII | regex.V0)

    def search(self, text: str) -> bool:
        """Raises OverBudget when the budget runs out first."""
        if self._linear is not None:
            return bool(self._linear.is_valid(text))
        left = _budget.deadline - time.monotonic()
        if left <= 0:
            raise OverBudget
        try:
            return self._slow.search(text, timeout=left, concurrent=True) is not None
        except TimeoutError:
            raise OverBudget from None


def schemas_in(node: Any) -> Iterator[dict[str, Any]]:
    """Every schema object of a document (data under enum, const, default... is not one)."""
    return (schema for _, schema in _places(node, []))


def _places(node: Any, at: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Every schema object of a document with its place in it."""
    if isinstance(node, dict):
        yield at, node
        for k, v in node.items():
            if k in _DATA:
                continue
            if k in _MAPS and isinstance(v, dict):
                for name, sub in v.items():
                    yield from _places(sub, [*at, k, name])
            else:
                yield from _places(v, [*at, k])
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _places(v, [*at, i])


def _key_patterns(schema: Mapping[str, Any]) -> list[str]:
    keys = schema.get("patternProperties")
    return list(keys) if isinstance(keys, dict) else []


def backtracking(docs: list[Any]) -> tuple[list[str], list[str]]:
    """(the ``pattern``s, the ``patternProperties`` keys) of these documents that the
    linear engine refuses, each once, in document order."""
    values: dict[str, None] = {}
    keys: dict[str, None] = {}
    for doc in docs:
        for s in schemas_in(doc):
            p = s.get("pattern")
            if isinstance(p, str) and p not in values and not linear(p):
                values[p] = None
            for k in _key_patterns(s):
                if k not in keys and not linear(k):
                    keys[k] = None
    return list(values), list(keys)


def names_in(docs: list[Any]) -> bool:
    """Whether these documents have a ``propertyNames``."""
    return any("propertyNames" in s for doc in docs for s in schemas_in(doc))


def unions_in(docs: list[Any]) -> bool:
    """Whether these documents have an ``anyOf`` or a ``oneOf``."""
    return any("anyOf" in s or "oneOf" in s for doc in docs for s in schemas_in(doc))


def refusal(docs: list[Any], slow_keys: list[str]) -> str | None:
    """Why these documents cannot be validated within the budget, or None: a keyword that
    matches backtracking key regexes itself, outside any time bound."""
    if not slow_keys:
        return None
    slow = set(slow_keys)
    hint = ("use a key regex without lookaround or backreference, or drop {kw} and constrain the names "
            'with "propertyNames" (its "pattern" is matched within the time bound), e.g. '
            '"propertyNames": {{"anyOf": [{{"enum": [<the names in properties>]}}, {{"pattern": {key}}}]}}')
    for doc in docs:
        for s in schemas_in(doc):
            mine = [k for k in _key_patterns(s) if k in slow]
            # true constrains nothing, and the compiler then matches nothing.
            if mine and s.get("additionalProperties", True) is not True:
                key = orjson.dumps(mine[0]).decode()
                return (f"additionalProperties beside the patternProperties key {key}, which needs a backtracking "
                        "engine, would match it with no time bound; " + hint.format(kw="additionalProperties",
                                                                                     key=key))
            if s.get("unevaluatedProperties", True) is not True:
                key = orjson.dumps(slow_keys[0]).decode()
                return (f"unevaluatedProperties in a schema with the patternProperties key {key}, which needs a "
                        "backtracking engine, would match it with no time bound; "
                        + hint.format(kw="unevaluatedProperties", key=key))
    return None


def _pointer(parts: Path) -> str:
    return "#" + "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def _node_at(doc: Any, parts: Path) -> Any:
    node = doc
    for p in parts:
        inside = (isinstance(node, dict) and isinstance(p, str) and p in node) or \
            (isinstance(node, list) and isinstance(p, int) and 0 <= p < len(node))
        if not inside:
            return None
        node = node[p]
    return node


def _refers(node: Any) -> bool:
    """Whether a subschema refers anywhere (else it compiles the same on its own)."""
    if isinstance(node, dict):
        return any(k in ("$ref", "$dynamicRef", "$recursiveRef") or _refers(v) for k, v in node.items())
    if isinstance(node, list):
        return any(_refers(v) for v in node)
    return False


class Compile:
    """One compile of a schema document: its keyword classes, and the validators of the
    subschemas those keywords apply, compiled once after the document's own."""

    def __init__(self, doc: Any, base_uri: str, loaded: Mapping[str, Any], *, explains: bool = False) -> None:
        self.resources = {base_uri: doc, **loaded}  # the document, then the files it refers to
        self.pending: list[_Keyword] = []
        self.maps: dict[str, Any] = {}
        self.options: dict[str, Any] = {}
        # The validator that lists errors: its first error (``validate``) is read, so it
        # says what is wrong; elsewhere validate only says whether, at no cost.
        self.explains = explains

    def keywords(self, *, values: bool, keys: bool, names: bool, unions: bool = False) -> dict[str, type]:
        """The keyword classes of this compile: ``pattern`` when a value regex backtracks,
        ``patternProperties`` when a key regex does; ``propertyNames``, and ``anyOf`` and
        ``oneOf`` with ``unions``, to list errors."""
        bound = {"compile": self}
        out: dict[str, type] = {}
        if names:
            out["propertyNames"] = type("PropertyNames", (PropertyNames,), bound)
        if unions:
            out["anyOf"] = type("AnyOf", (AnyOf,), bound)
            out["oneOf"] = type("OneOf", (OneOf,), bound)
        if values:
            out["pattern"] = type("Pattern", (Pattern,), bound)
        if keys:
            out["patternProperties"] = type("PatternProperties", (PatternProperties,), bound)
        return out

    def validator(self, doc: Any, **options: Any) -> Any:
        """The document compiled with these options, its keywords' subschemas with it."""
        self.options = options
        compiled = _rs().Draft202012Validator(doc, **options)
        while self.pending:
            self.pending.pop().prime()
        return compiled

    def subschema(self, parent: Mapping[str, Any], keyword: Path, key: str | int | None = None) -> Any:
        """The validator of the subschema of the keyword at ``keyword`` (under ``key`` for a
        map or a list of them) in ``parent``: compiled on its own when it refers nowhere,
        else in the document that holds ``parent`` there."""
        rs = _rs()
        node = parent[str(keyword[-1])] if key is None else parent[str(keyword[-1])][key]
        if not _refers(node):
            return rs.Draft202012Validator(node, **self.options)
        tail = [keyword[-1]] if key is None else [keyword[-1], key]
        found = self._locate(parent, keyword[:-1])
        if found is None:
            raise ValueError(f"the subschema at {_pointer([*keyword[:-1], *tail])} refers elsewhere, and its "
                             "document was not found")
        uri, at = found
        if uri not in self.maps:
            self.maps[uri] = rs.validator_map_for(self.resources[uri], **{**self.options, "base_uri": uri})
        return self.maps[uri][_pointer([*at, *tail])]

    def _locate(self, parent: Mapping[str, Any], at: Path) -> tuple[str, Path] | None:
        """The document that holds ``parent`` and its place there: ``at``, or a place that
        ends with ``at``, because the compiler gives a keyword's place from the part of the
        document it compiles (a $defs entry reached by a $ref is compiled on its own too)."""
        for uri, doc in self.resources.items():
            if _node_at(doc, at) == parent:
                return uri, at
        for uri, doc in self.resources.items():
            for place, node in _places(doc, []):
                if place[len(place) - len(at):] == at and node == parent:
                    return uri, place
        return None


class _Keyword:
    compile: ClassVar[Compile]

    def __init__(self, parent: dict[str, Any], value: Any, schema_path: Path) -> None:
        self.parent = parent
        self.value = value
        self.where = list(schema_path)
        self.compile.pending.append(self)

    def prime(self) -> None:
        """Compile the subschemas this keyword applies (after the document's compile)."""

    def problems(self, instance: Any, first: bool) -> list[tuple[Path, str]]:
        raise NotImplementedError

    def validate(self, instance: Any) -> None:
        found = self.problems(instance, True)
        if found:
            raise ValueError(_encoded(found))

    def iter_errors(self, instance: Any) -> Iterator[ValueError]:
        found = self.problems(instance, False)
        if found:
            yield ValueError(_encoded(found))


def _encoded(found: list[tuple[Path, str]]) -> str:
    if len(found) == 1 and not found[0][0]:
        return found[0][1]
    return MARK + orjson.dumps(found).decode()


def expand(error: Any) -> list[tuple[Path, str]]:
    """A validator's error as (instance path, message) pairs: several for one of ours."""
    base: Path = list(error.instance_path)
    message: str = error.message
    if isinstance(error.kind, _rs().ValidationErrorKind.Pattern):
        message = shown_regex(message)  # the regex as written, not as the engine got it
    if message.startswith(MARK) and isinstance(error.kind, _rs().ValidationErrorKind.Custom):
        return [(base + list(p), m) for p, m in orjson.loads(message[len(MARK):])]
    return [(base, message)]


def _errors(compile: Compile, validator: Any, instance: Any, first: bool) -> list[tuple[Path, str]]:
    """The errors of ``instance``; with ``first``, its first error, or outside the
    validator that lists errors one that only says it is invalid (for ``is_valid``, where
    no one reads it, and the first error of a union would cost what listing its branches'
    errors does)."""
    if validator.is_valid(instance):
        return []
    if first:
        if compile.explains:
            try:
                validator.validate(instance)
            except _rs().ValidationError as exc:
                return expand(exc)
        return [([], "is invalid")]
    out: list[tuple[Path, str]] = []
    for e in validator.iter_errors(instance):
        out.extend(expand(e))
    return out


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class Pattern(_Keyword):
    """``pattern``, bounded (see the module docstring)."""

    def __init__(self, parent: dict[str, Any], value: Any, schema_path: Path) -> None:
        super().__init__(parent, value, schema_path)
        self.matcher = Matcher(value)
        self.max_length = _int(parent.get("maxLength"))

    def problems(self, instance: Any, first: bool) -> list[tuple[Path, str]]:
        if not isinstance(instance, str):
            return []
        if self.max_length is not None and len(instance) > self.max_length:
            return []  # maxLength refuses it; matching it would only cost time
        try:
            if self.matcher.search(instance):
                return []
        except OverBudget:
            return [([], _cut_short(f"matching pattern {self.value!r}{_OVER}send shorter values, or fewer "
                                    "at a time (or give the field a maxLength)"))]
        shown = instance if len(instance) <= 80 else instance[:80] + "..."
        return [([], f"{orjson.dumps(shown).decode()} does not match {orjson.dumps(shown_regex(self.value)).decode()}")]


class PatternProperties(_Keyword):
    """``patternProperties``, bounded (see the module docstring)."""

    def __init__(self, parent: dict[str, Any], value: Any, schema_path: Path) -> None:
        super().__init__(parent, value, schema_path)
        self.matchers = [Matcher(k) for k in value]
        self.subs: list[Any] = []
        self.max_properties = _int(parent.get("maxProperties"))
        names = parent.get("propertyNames")
        self.max_name = _int(names.get("maxLength")) if isinstance(names, dict) else None

    def prime(self) -> None:
        self.subs = [self.compile.subschema(self.parent, self.where, k) for k in self.value]

    def problems(self, instance: Any, first: bool) -> list[tuple[Path, str]]:
        if not isinstance(instance, dict):
            return []
        if self.max_properties is not None and len(instance) > self.max_properties:
            return []  # maxProperties refuses the object whatever its names
        out: list[tuple[Path, str]] = []
        for name, value in instance.items():
            if self.max_name is not None and len(name) > self.max_name:
                continue  # propertyNames refuses it
            for matcher, sub in zip(self.matchers, self.subs, strict=True):
                try:
                    if not matcher.search(name):
                        continue
                except OverBudget:
                    return [*out, ([], _cut_short(
                        f"matching key pattern {orjson.dumps(matcher.source).decode()} of patternProperties{_OVER}"
                        "send fewer or shorter property names, or fewer payloads at a time (or give the object "
                        "a maxProperties, or propertyNames with a maxLength)"))]
                out.extend(([name, *p], m) for p, m in _errors(self.compile, sub, value, first))
                if first and out:
                    return out
        return out


class PropertyNames(_Keyword):
    """``propertyNames``: an object's bad names as one error (see the module docstring)."""

    def prime(self) -> None:
        self.sub = self.compile.subschema(self.parent, self.where)

    def problems(self, instance: Any, first: bool) -> list[tuple[Path, str]]:
        if not isinstance(instance, dict):
            return []
        out: list[tuple[Path, str]] = []
        for name in instance:
            out.extend(([], m) for _, m in _errors(self.compile, self.sub, name, first))
            if first and out:
                return out
        return out


def shown(value: Any) -> str:
    """A value as the compiler's messages quote it (compact JSON), cut at 80 characters."""
    try:
        text = orjson.dumps(value).decode()
    except TypeError:  # an integer past 64 bits
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text if len(text) <= 80 else text[:80] + "..."


class AnyOf(_Keyword):
    """``anyOf`` where errors are listed: each branch asked only whether it holds (see the
    module docstring)."""

    def prime(self) -> None:
        self.subs = [self.compile.subschema(self.parent, self.where, i) for i in range(len(self.value))]

    def problems(self, instance: Any, first: bool) -> list[tuple[Path, str]]:
        if any(sub.is_valid(instance) for sub in self.subs):
            return []
        return [([], f"{shown(instance)} is not valid under any of the schemas listed in the 'anyOf' keyword")]


class OneOf(AnyOf):
    """``oneOf`` where errors are listed, as AnyOf."""

    def problems(self, instance: Any, first: bool) -> list[tuple[Path, str]]:
        held = 0
        for sub in self.subs:
            if sub.is_valid(instance):
                held += 1
                if held > 1:
                    return [([], f"{shown(instance)} is valid under more than one of the schemas listed in the "
                                 "'oneOf' keyword")]
        if held == 0:
            return [([], f"{shown(instance)} is not valid under any of the schemas listed in the 'oneOf' keyword")]
        return []
