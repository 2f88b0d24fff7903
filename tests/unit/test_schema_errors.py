"""What listing a payload's validation errors costs and says: every error of a payload of
at most LIST_BYTES encoded (the payloads of one request, a batch or a group, share that
much), else its first error and a note that more may exist and how to see them all.
``anyOf`` and ``oneOf`` report the value no branch takes, as the compiler does, without
building the errors of every branch (the compiler builds them whether read or not: a
union at a payload's root cost as much as listing every error of every branch); and a
message quoting a long value is shortened, keeping its end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema_rs
import orjson
import pytest

from runner.catalog import listing, schemas
from runner.errors import FieldError

ITEMS = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "string"}},
                                          "b": {"type": "string"}}}
BRANCH = {"type": "object", "properties": {"kind": {"const": "a"}, "xs": {"type": "array", "items": {
    "anyOf": [{"type": "string"}, {"type": "object"}]}}}, "required": ["kind"]}
# A root union of two kinds of object, each with an array of items that are one of two types.
UNION = {"oneOf": [BRANCH, {**BRANCH, "properties": {**BRANCH["properties"], "kind": {"const": "b"}}}]}


def load(tmp_path: Path, doc: dict[str, Any], name: str = "fn") -> schemas.Schema:
    path = tmp_path / "schemas" / name / "v1.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return schemas.load_schema(path, 1)


def by_path(e: FieldError) -> tuple[str, str]:
    return e.path, e.message


def size(payload: Any) -> int:
    return len(orjson.dumps(payload))


def over_the_limit(make: Any) -> Any:
    """The smallest ``make(n)`` (n a power of two) past LIST_BYTES encoded."""
    n = 1
    while size(make(n)) <= listing.LIST_BYTES:
        n *= 2
    return make(n)


def test_every_error_of_a_payload_within_the_limit_is_listed(tmp_path: Path) -> None:
    """A payload of at most LIST_BYTES: one error per bad value, each at its path, in order."""
    s = load(tmp_path, ITEMS)
    payload = {"a": [0] * 100, "b": 5}
    assert size(payload) <= listing.LIST_BYTES
    expected = [FieldError(f"$.a[{i}]", '0 is not of type "string"') for i in range(100)]
    assert s.errors(payload) == sorted([*expected, FieldError("$.b", '5 is not of type "string"')], key=by_path)


def test_a_payload_past_the_limit_lists_its_first_error_and_how_to_see_the_rest(tmp_path: Path) -> None:
    """Past LIST_BYTES: the first error the validator meets, then one note at ``$`` that says
    only the first is listed, the limit, and how to see them all (the schema file to check
    it against, or smaller parts)."""
    s = load(tmp_path, ITEMS, name="items")
    payload = over_the_limit(lambda n: {"a": [0] * n, "b": 5})
    errors = s.errors(payload)
    assert len(errors) == 2, errors[:5]
    assert errors[0] == FieldError("$.a[0]", '0 is not of type "string"')
    note = errors[1]
    assert note.path == "$"
    for words in ("only the first error", f"{listing.LIST_BYTES // 1024} KiB", f"{size(payload):,} bytes",
                  "more may exist", "schemas/items/v1.json", "smaller parts"):
        assert words in note.message, (words, note.message)


def test_a_valid_payload_past_the_limit_has_no_error(tmp_path: Path) -> None:
    s = load(tmp_path, ITEMS)
    assert s.errors(over_the_limit(lambda n: {"a": ["x"] * n})) == []


def test_the_payloads_of_one_request_share_the_limit(tmp_path: Path) -> None:
    """Within one_request (a batch, a group), a payload's errors are all listed while the
    payloads listed so far come to at most LIST_BYTES; after that, each invalid payload
    gets its first error and the note, which says the request's other payloads used it."""
    s = load(tmp_path, ITEMS)
    n = listing.LIST_BYTES // 2 // 2 - 10  # "0," per item: each payload a little under half the limit
    payload = {"a": [0] * n}
    with listing.one_request():
        first, second, third = (s.errors(payload) for _ in range(3))
    assert len(first) == n and len(second) == n, (len(first), len(second))
    assert len(third) == 2 and third[0] == FieldError("$.a[0]", '0 is not of type "string"'), third[:3]
    assert "only the first error" in third[1].message and "payloads before it" in third[1].message
    assert len(s.errors(payload)) == n, "outside a request, each payload has the whole limit"


def test_a_union_reports_the_value_no_branch_takes(tmp_path: Path) -> None:
    """anyOf and oneOf: one error per value, at its path, worded as the compiler words it;
    a union at the root of a payload past the limit is its first error, the value shown
    shortened."""
    s = load(tmp_path, UNION)
    assert s.errors({"kind": "a", "xs": ["s", {}]}) == []
    assert s.errors({"kind": "a", "xs": [0]}) == [
        FieldError("$", '{"kind":"a","xs":[0]} is not valid under any of the schemas listed in the \'oneOf\' keyword')]
    both = load(tmp_path, {"oneOf": [{"type": "number"}, {"type": "integer"}]}, name="both")
    assert both.errors(1) == [
        FieldError("$", "1 is valid under more than one of the schemas listed in the 'oneOf' keyword")]
    items = load(tmp_path, BRANCH, name="items")
    assert items.errors({"kind": "a", "xs": ["s", 0, True]}) == [
        FieldError("$.xs[1]", "0 is not valid under any of the schemas listed in the 'anyOf' keyword"),
        FieldError("$.xs[2]", "true is not valid under any of the schemas listed in the 'anyOf' keyword"),
    ]
    errors = s.errors(over_the_limit(lambda n: {"kind": "c", "xs": [0] * n}))
    assert len(errors) == 2 and errors[0].path == "$", errors
    shown, _, rest = errors[0].message.partition(" is not valid under any of the schemas")
    assert rest == " listed in the 'oneOf' keyword" and shown.startswith('{"kind":"c","xs":[0,0') and len(shown) < 100


DEFS = {"a": {"type": "object", "properties": {"k": {"const": "a"}, "n": {"type": "integer"}}, "required": ["k"]},
        "b": {"type": "object", "properties": {"k": {"const": "b"}, "s": {"type": "string"}}, "required": ["k"]}}
# (schema, instances): what the runner lists must be what the compiler lists.
SAME = [
    ({"$defs": DEFS, "oneOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/b"}]},
     [{"k": "a", "n": 1}, {"k": "b", "s": 1}, {"k": "c"}, {"k": "a", "n": "x"}, 3]),
    ({"$defs": {**DEFS, "u": {"anyOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/b"}]}},
      "type": "object", "properties": {"one": {"$ref": "#/$defs/u"}, "many": {"items": {"$ref": "#/$defs/u"}}}},
     [{"one": {"k": "a"}, "many": [{"k": "b"}, {"k": "z"}, 1]}, {"one": {"k": "q"}}]),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "unevaluatedProperties": False,
      "anyOf": [{"properties": {"x": {"type": "integer"}}, "required": ["x"]},
                {"properties": {"y": {"type": "integer"}}, "required": ["y"]}]},
     [{"a": "s", "x": 1}, {"a": "s", "y": 1, "z": 2}, {"a": "s", "x": "no", "z": 1}, {"a": "s"}]),
    ({"type": "array", "prefixItems": [{"type": "string"}], "unevaluatedItems": False,
      "oneOf": [{"prefixItems": [True, {"type": "integer"}]}, {"prefixItems": [True, {"type": "boolean"}]}]},
     [["a", 1], ["a", True, 3], ["a", "b"], ["a"]]),
    ({"anyOf": [{"oneOf": [{"type": "integer"}, {"minimum": 5}]}, {"type": "string"}]}, [1, 7, 7.5, "s", None]),
    ({"not": {"anyOf": [{"type": "integer"}, {"type": "string"}]}}, [1, "s", None]),
    ({"if": {"oneOf": [{"type": "integer"}, {"type": "string"}]}, "then": {"const": 1}, "else": {"type": "null"}},
     [1, 2, "x", None, 1.5]),
    ({"$defs": {"node": {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"$ref": "#/$defs/node"}}]}},
      "$ref": "#/$defs/node"}, [[1, [2, [3, "x"]]], "y"]),
]


@pytest.mark.parametrize(("doc", "instances"), SAME)
def test_unions_keep_their_meaning_and_their_words(tmp_path: Path, doc: dict[str, Any], instances: list[Any]) -> None:
    """With $refs to unions, unions beside unevaluatedProperties or unevaluatedItems, unions
    nested in unions, in not and in if, and a recursive union: the same errors, at the same
    paths, in the same words, as the compiler's own iter_errors."""
    s = load(tmp_path, doc)
    compiler = jsonschema_rs.Draft202012Validator(doc)
    for instance in instances:
        expected = sorted((FieldError(listing.json_path(e.instance_path), e.message)
                           for e in compiler.iter_errors(instance)), key=by_path)
        assert s.errors(instance) == expected, instance


def test_a_long_message_is_shortened_keeping_its_end(tmp_path: Path) -> None:
    """An error that quotes a long value quotes its start and its end, so the message
    still says what is wrong; a short one is as the compiler words it."""
    s = load(tmp_path, {"type": "object", "properties": {"a": {"type": "object"}}})
    [error] = s.errors({"a": list(range(1000))})
    assert error.path == "$.a" and error.message.startswith("[0,1,2,") and len(error.message) < 600
    assert error.message.endswith('998,999] is not of type "object"'), error.message
    assert s.errors({"a": [1]}) == [FieldError("$.a", '[1] is not of type "object"')]

