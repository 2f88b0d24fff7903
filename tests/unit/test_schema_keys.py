"""Schemas that constrain property names: a ``patternProperties`` key regex the
linear-time engine refuses (a lookaround, a backreference) is matched within the
per-payload pattern budget, and validates the values of the names it matches as the
keyword says; a schema whose other keywords would match such a key regex outside the
budget is refused at load, naming what to write instead; ``propertyNames`` reports every
bad name at the object's path, however many there are."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runner.catalog import keywords, schemas
from runner.errors import FieldError, FunctionLoadError

# A common password rule: quadratic on a long name that fails it.
PASSWORD = "(?=.*[A-Z])(?=.*[0-9]).{8,}"
# Exponential in a backtracking engine on "a" * n + "!".
NESTED = "^(?=(a+)+$)"


def load(tmp_path: Path, doc: dict[str, Any]) -> schemas.Schema:
    path = tmp_path / "schemas" / "fn" / "v1.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return schemas.load_schema(path, 1)


def test_a_backtracking_key_pattern_validates_the_values_of_the_names_it_matches(tmp_path: Path) -> None:
    """A name that matches the key regex has its value checked against the subschema (a
    $ref into the document's $defs resolves as it would anywhere), with the error's path
    inside the value; a name that fails the regex is not constrained; a linear key regex
    beside it in the same document works as before."""
    s = load(tmp_path, {"type": "object", "$defs": {"n": {"type": "integer"}},
                        "patternProperties": {PASSWORD: {"type": "object", "properties": {"n": {"$ref": "#/$defs/n"}}},
                                              "^x-": {"type": "string"}}})
    assert s.backtracks
    assert s.errors({"Abcdefg1": {"n": 3}, "abcdefgh": {"n": "free"}, "x-a": "s"}) == []
    assert s.errors({"Abcdefg1": {"n": "x"}, "x-a": 1, "abcdefgh": 2}) == [
        FieldError("$.Abcdefg1.n", '"x" is not of type "integer"'),
        FieldError("$.x-a", '1 is not of type "string"'),
    ]
    assert s.errors({"Abcdefg1": 5}) == [FieldError("$.Abcdefg1", '5 is not of type "object"')]


def test_key_patterns_nest_and_report_each_error_at_its_own_path(tmp_path: Path) -> None:
    """A backtracking key regex inside the subschema of another, and inside an array's
    items: every error is reported at its full path, each failing value on its own."""
    inner = {"type": "object", "patternProperties": {PASSWORD: {"type": "integer"}}}
    s = load(tmp_path, {"type": "object", "properties": {"list": {"type": "array", "items": inner}},
                        "patternProperties": {"^(?=Z)": inner}})
    errors = s.errors({"list": [{"Abcdefg1": 1}, {"Abcdefg2": "a", "Abcdefg3": "b"}], "Zed": {"Abcdefg4": []}})
    assert errors == [
        FieldError("$.Zed.Abcdefg4", '[] is not of type "integer"'),
        FieldError("$.list[1].Abcdefg2", '"a" is not of type "integer"'),
        FieldError("$.list[1].Abcdefg3", '"b" is not of type "integer"'),
    ]


def test_a_key_pattern_past_the_budget_is_refused_naming_the_limit(tmp_path: Path) -> None:
    """Names whose matching runs past PATTERN_BUDGET_S: the payload is refused (never
    taken unmatched) with one error that names the limit and what to send instead."""
    s = load(tmp_path, {"type": "object", "patternProperties": {NESTED: {"type": "integer"}}})
    errors = s.errors({f"{'a' * 20_000}{i}!": "x" for i in range(20)})
    assert len(errors) == 1, errors
    assert errors[0].path == "$"
    assert f"{schemas.PATTERN_BUDGET_S:g} s" in errors[0].message and "propertyNames" in errors[0].message
    assert NESTED in errors[0].message


@pytest.mark.parametrize(("doc", "ok"), [
    ({"type": "object", "not": {"patternProperties": {NESTED: {"type": "string"}}}}, {"aaa": 1}),
    ({"type": "object", "if": {"patternProperties": {NESTED: {}}}, "then": {"required": ["x"]}}, {"x": 1}),
    ({"type": "object", "anyOf": [{"patternProperties": {NESTED: {"type": "string"}}}, {"required": ["v"]}]},
     {"v": "b"}),
    ({"type": "object", "properties": {"v": {"not": {"pattern": NESTED}}}}, {"v": "b"}),
])
def test_a_match_the_budget_cut_short_refuses_the_payload_wherever_it_is(
    tmp_path: Path, doc: dict[str, Any], ok: dict[str, Any],
) -> None:
    """Under a not, an if or a branch of anyOf, a match that could not tell fails its
    subschema, which would let the payload pass: it is refused, naming the limit. A
    payload matched in time is judged as usual."""
    s = load(tmp_path, doc)
    errors = s.errors({"v": "a" * 20_000 + "!", **{f"{'a' * 20_000}{i}!": 1 for i in range(5)}})
    assert any(f"took over {schemas.PATTERN_BUDGET_S:g} s" in e.message and NESTED in e.message for e in errors), \
        errors
    assert s.errors(ok) == []


def test_the_payloads_of_one_request_share_one_budget(tmp_path: Path) -> None:
    """Within one_budget (a batch, a group), a payload gets what the ones before it left:
    once it has run out, a name that would match at once is refused too; after it, each
    payload has a budget of its own again."""
    s = load(tmp_path, {"type": "object", "patternProperties": {NESTED: {}}})
    over = f"took over {schemas.PATTERN_BUDGET_S:g} s"
    with keywords.one_budget():
        assert over in s.errors({"a" * 20_000 + "!": 1})[0].message
        assert over in s.errors({"aaaa": 1})[0].message
    assert s.errors({"aaaa": 1}) == []


def test_names_another_keyword_refuses_are_never_matched(tmp_path: Path) -> None:
    """maxProperties and propertyNames.maxLength refuse the object or the name whatever the
    key regex says: the names are not matched at all, so no budget runs out."""
    s = load(tmp_path, {"type": "object", "maxProperties": 5, "propertyNames": {"maxLength": 64},
                        "patternProperties": {NESTED: {"type": "integer"}}})
    many = s.errors({f"{'a' * 60}{i:02d}!": 1 for i in range(50)})
    assert len(many) == 1 and "has more than 5 properties" in many[0].message, many
    long = s.errors({"a" * 30_000 + "!": 1})  # past LIST_BYTES: its first error, and the note
    assert [e.note for e in long] == [False, True] and "longer than 64 characters" in long[0].message, long
    assert not any(keywords.over_budget(e.message) for e in long), long


@pytest.mark.parametrize("doc", [
    {"type": "object", "patternProperties": {PASSWORD: {}}, "additionalProperties": False},
    {"type": "object", "properties": {"o": {"patternProperties": {PASSWORD: {}}, "additionalProperties": {}}}},
    {"type": "object", "allOf": [{"patternProperties": {PASSWORD: {}}}], "unevaluatedProperties": False},
])
def test_a_keyword_that_would_match_a_backtracking_key_pattern_unbounded_is_refused(
    tmp_path: Path, doc: dict[str, Any],
) -> None:
    """additionalProperties beside a backtracking key regex, or unevaluatedProperties in a
    document with one, would match names outside the budget: refused at load, naming the
    keyword, the regex and the rewrite."""
    with pytest.raises(FunctionLoadError) as exc:
        load(tmp_path, doc)
    text = str(exc.value)
    keyword = "unevaluatedProperties" if "unevaluatedProperties" in json.dumps(doc) else "additionalProperties"
    assert keyword in text and PASSWORD in text and "propertyNames" in text, text


def test_additional_properties_beside_a_linear_key_pattern_still_loads(tmp_path: Path) -> None:
    """In a document with a backtracking key regex, additionalProperties beside a linear one
    is taken, and correct; so is additionalProperties or unevaluatedProperties true, which
    constrains nothing."""
    s = load(tmp_path, {"type": "object", "properties": {"o": {"patternProperties": {"^x-": {"type": "string"}},
                                                               "additionalProperties": False}},
                        "patternProperties": {PASSWORD: {"type": "integer"}}, "additionalProperties": True,
                        "unevaluatedProperties": True})
    assert s.errors({"o": {"x-a": "s"}, "Abcdefg1": 1}) == []
    assert [e.path for e in s.errors({"o": {"x-a": 1, "y": 2}})] == ["$.o", "$.o.x-a"]


def test_each_backtracking_key_pattern_is_a_warning(tmp_path: Path) -> None:
    s = load(tmp_path, {"type": "object", "patternProperties": {PASSWORD: {}, "^ok$": {}},
                        "properties": {"o": {"patternProperties": {NESTED: {}}}}})
    assert len(s.warnings) == 2, s.warnings
    assert all("patternProperties" in w and schemas._BACKTRACKS in w for w in s.warnings)
    assert any(PASSWORD in w for w in s.warnings) and any(NESTED in w for w in s.warnings)
    assert not any("^ok$" in w for w in s.warnings)


@pytest.mark.parametrize(("names", "ok", "bad"), [
    ({"maxLength": 3}, "abc", ["Wrong-1", "Wrong-2", "Wrong-3"]),
    ({"pattern": "^[a-z]+$"}, "abc", ["Wrong-1", "Wrong-2"]),
    ({"pattern": PASSWORD}, "Abcdefg1", ["wrong-name", "other-name"]),
])
def test_property_names_reports_every_bad_name_at_the_objects_path(
    tmp_path: Path, names: dict[str, Any], ok: str, bad: list[str],
) -> None:
    """One error per bad name, at the object's path, with the message the keyword gives;
    a name that passes gives none."""
    s = load(tmp_path, {"type": "object", "properties": {"o": {"type": "object", "propertyNames": names}}})
    errors = s.errors({"o": {ok: 1, **dict.fromkeys(bad, 1)}})
    assert [e.path for e in errors] == ["$.o"] * len(bad), errors
    for name in bad:
        assert any(e.message.startswith(json.dumps(name)) for e in errors), (name, errors)


def test_a_backtracking_key_pattern_under_a_ref_resolves_its_own_refs(tmp_path: Path) -> None:
    """A patternProperties key regex the linear engine refuses, in a $defs entry reached by
    $ref, whose subschema is itself a $ref: it loads, and checks what it matches."""
    s = load(tmp_path, {"$ref": "#/$defs/u", "properties": {"p": {"$ref": "#/$defs/u"}},
                        "$defs": {"u": {"type": "object", "patternProperties": {"^(?=a)": {"$ref": "#/$defs/s"}}},
                                  "s": {"type": "string"}}})
    assert s.errors({"ab": "x", "p": {"ax": "y", "b": 1}}) == []
    assert s.errors({"ab": 1, "p": {"ax": 2}}) == [FieldError("$.ab", '1 is not of type "string"'),
                                                    FieldError("$.p.ax", '2 is not of type "string"')]


@pytest.mark.parametrize(("pattern", "value", "matches"), [
    ("^(?=.*[0-9])[a-z0-9]+$", "abc1", True),
    ("^(?=.*[0-9])[a-z0-9]+$", "abc1\n", False),  # `$` is the very end in ECMA-262
    ("^(?=.*1).+$", "x1\r\ny", False),  # `.` matches no line terminator
    ("^(?=.*1).+$", "x1\u2028", False),
    ("^(?=.*1)[.$]+1$", ".$1", True),  # inside a class, `.` and `$` are themselves
    ("^(?=.*a)\\$a$", "$a", True),  # an escaped `$` is the dollar
])
def test_a_backtracking_pattern_means_what_it_means_in_ecma_262(
        tmp_path: Path, pattern: str, value: str, matches: bool) -> None:
    """A pattern the linear engine refuses (a lookaround) is matched by another engine,
    which reads `$` and `.` otherwise: "abc1\\n" met ^(?=.*[0-9])[a-z0-9]+$ and was
    accepted, though the same rule without the lookahead (and any ECMA-262 engine)
    refuses it. The schema's verdict is ECMA-262's."""
    s = load(tmp_path, {"type": "object", "properties": {"v": {"type": "string", "pattern": pattern}}})
    assert s.backtracks
    assert s.valid({"v": value}) is matches


# ECMA-262's `.` takes no line terminator (\n, \r, U+2028, U+2029) but takes U+0085; its
# \s takes U+00A0, U+FEFF and the Zs spaces, not U+0085.
ECMA_CASES = [
    ("^.{1,40}$", "a\rb", False), ("^.{1,40}$", "a\u2028b", False), ("^.{1,40}$", "a\u2029b", False),
    ("^.{1,40}$", "a\nb", False), ("^.{1,40}$", "a\x85b", True), ("^.{1,40}$", "ab", True),
    ("^a[.]b$", "a.b", True), ("^a[.]b$", "a\rb", False), ("^a\\.b$", "a.b", True),
    ("^\\s$", "\u00a0", True), ("^\\s$", "\ufeff", True), ("^\\s$", "\u3000", True), ("^\\s$", "\x85", False),
    ("^\\S$", "\ufeff", False), ("^\\S$", "\x85", True), ("^[\\s,]+$", "\u00a0,", True),
    ("^[^\\s]$", "\ufeff", False), ("^[^\\S]$", "\ufeff", True), ("^a$", "a\n", False),
]


@pytest.mark.parametrize("lookahead", [False, True], ids=["linear", "backtracking"])
@pytest.mark.parametrize(("pattern", "value", "matches"), ECMA_CASES)
def test_both_engines_read_dot_and_spaces_as_ecma_262(
        tmp_path: Path, lookahead: bool, pattern: str, value: str, matches: bool) -> None:
    r"""The same rule gets the same verdict on either engine, ECMA-262's: on the linear one
    `.` matched \r, U+2028 and U+2029 (so "^.{1,40}$" took "a\rb"), and on the other
    (regex.ASCII) `\s` refused U+00A0 and U+FEFF. As a value's pattern, a
    patternProperties key and a propertyNames pattern."""
    rx = "(?=[\\s\\S])" + pattern if lookahead else pattern
    s = load(tmp_path, {"type": "object", "properties": {"v": {"type": "string", "pattern": rx}}})
    assert s.backtracks is lookahead
    assert s.valid({"v": value}) is matches
    keyed = load(tmp_path, {"type": "object", "patternProperties": {rx: {"type": "integer"}}})
    assert keyed.valid({value: "x"}) is not matches  # a name it matches must hold an integer
    named = load(tmp_path, {"type": "object", "propertyNames": {"pattern": rx}})
    assert named.valid({value: 1}) is matches


def test_a_pattern_error_quotes_the_regex_as_written(tmp_path: Path) -> None:
    """The regex an error quotes is the schema's, not the one the engine was given."""
    for rx in ("^.{1,3}$", "^(?=a).{1,3}$"):
        s = load(tmp_path, {"type": "object", "properties": {"v": {"type": "string", "pattern": rx}}})
        assert s.errors({"v": "a\rb"}) == [FieldError("$.v", '"a\\rb" does not match ' + json.dumps(rx))]


def test_a_pattern_in_a_referenced_file_reads_dot_as_ecma_262(tmp_path: Path) -> None:
    r"""A `$ref`'d schema file's regex is read as ECMA-262 too: its `.` takes no \r."""
    line = tmp_path / "schemas" / "common" / "line.json"
    line.parent.mkdir(parents=True)
    line.write_text(json.dumps({"type": "string", "pattern": "^.{1,40}$"}))
    s = load(tmp_path, {"type": "object", "properties": {"v": {"$ref": "../common/line.json"}}})
    assert s.valid({"v": "ab"}) and not s.valid({"v": "a\rb"})


def _slow_valid_code() -> tuple[str, float]:
    """A value that passes SLOW, and how long its match takes here: the engine's time
    grows with the square of its length, so the length is doubled until a match takes
    0.1 s (the fastest of three runs: the host's load only slows a run, so the match takes at
    least that)."""
    import time

    import regex

    rx = regex.compile(keywords.ecma(SLOW), regex.ASCII | regex.V0)

    def took(code: str) -> float:
        t = time.monotonic()
        assert rx.search(code)
        return time.monotonic() - t

    n = 1000
    while True:
        code = "a" * n + "1A2"
        t = min(took(code) for _ in range(3))
        if t >= 0.1:
            return code, t
        n *= 2


# Quadratic on a long run of lower-case letters before its digit, and valid all the same.
SLOW = "(?=.*[0-9])[a-z]*[A-Z]"


def test_a_payload_checked_again_at_claim_gets_the_claim_budget(tmp_path: Path) -> None:
    """At claim a payload is checked again, on a worker whose threads share its cores: a
    valid payload that an idle web matched in 0.2 s ran out of the same 0.25 s there and
    was buried as "invalid payload". The claim's budget is ten times the enqueue's, and a
    budget is what decides: a match past it is refused, naming the limit, one well within
    it passes (budgets set around the match's measured time, ten times either way, so a
    loaded host moves neither side)."""
    s = load(tmp_path, {"type": "object", "properties": {"code": {"type": "string", "pattern": SLOW}}})
    code, t = _slow_valid_code()
    with keywords.one_budget(t / 10):
        assert not s.valid({"code": code})
    with keywords.one_budget(t * 20):
        assert s.valid({"code": code})
    assert keywords.CLAIM_BUDGET_S >= 10 * keywords.PATTERN_BUDGET_S
