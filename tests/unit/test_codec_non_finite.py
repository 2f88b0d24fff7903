"""The refusal of NaN and the infinities costs no second decode in the common case: a
payload with nulls and no non-finite float is encoded once and probed in C, never read
back or walked; every non-finite float is still refused, whatever holds it."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import os
import re
import struct
from collections import OrderedDict
from typing import Any

import orjson
import pytest

from runner.store import codec


def _record(i: int) -> dict[str, Any]:
    return {"id": i, "name": f"customer {i}", "email": None, "score": i / 7, "offset": -1 - i,
            "tags": ["a", None], "at": {"zip": None, "n": -i, "big": 1.7e308, "low": -1.7e308}}


@dataclasses.dataclass
class _Point:
    x: float


def test_a_payload_with_nulls_and_no_nan_is_neither_decoded_nor_walked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 15 KB payload with nulls was read back and compared (about 3x the encoding's
    own time) to find a NaN it did not hold."""
    calls: list[str] = []
    real_loads, real_walk = orjson.loads, codec._unstorable

    def loads(data: Any) -> Any:
        calls.append("loads")
        return real_loads(data)

    def walk(node: Any, path: str, str_keys: bool = False) -> str:
        calls.append("walk")
        return real_walk(node, path, str_keys)

    payload = {"items": [_record(i) for i in range(100)], "note": None, "t": (1, None, -2.5)}
    monkeypatch.setattr(codec.orjson, "loads", loads)
    monkeypatch.setattr(codec, "_unstorable", walk)
    out = codec.dumpb_checked(payload)
    assert len(out) > 15_000 and b"null" in out
    assert calls == []
    monkeypatch.undo()
    assert orjson.loads(out) == orjson.loads(orjson.dumps(payload))


_ODD_NAN = struct.unpack("<d", struct.pack("<Q", 0x7FF0_0000_0000_0001))[0]  # a NaN with other bits
_SHARED = float("nan")


@pytest.mark.parametrize("value, where", [
    ({"a": [1, None, float("nan")]}, "$.a[2]"),
    ({"a": None, "b": float("inf")}, "$.b"),
    ([None, (2, float("-inf"))], "$[1][1]"),
    ({"a": None, "b": -_ODD_NAN}, "$.b"),
    ({"a": [_SHARED, None, _SHARED]}, "$.a[0]"),  # one object twice
    (OrderedDict(a=None, b=float("nan")), "$.b"),  # a type the probe does not take
    ({"a": None, "p": _Point(float("inf"))}, "$.p.x"),  # was stored as null
])
def test_every_non_finite_float_is_still_refused(value: Any, where: str) -> None:
    with pytest.raises(codec.EncodeError):
        codec.dumpb_checked(value)
    found = codec.not_json(value)
    assert found is not None and where in found[1], found


class _NanMember(enum.Enum):
    A = float("nan")


class _NanInside(enum.Enum):
    A = {"k": float("inf")}  # noqa: RUF012  (an Enum member's value, not a class attribute)


class _AlwaysEqual(dict):  # type: ignore[type-arg]
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = None  # type: ignore[assignment]


@dataclasses.dataclass
class _Plain:
    x: int = 1


def _with_extra(value: Any) -> _Plain:
    p = _Plain()
    p.extra = value  # type: ignore[attr-defined]  # orjson writes it (the instance's __dict__)
    return p


@pytest.mark.parametrize("value, where", [
    ({"a": None, "e": _NanMember.A}, "$.e"),  # orjson writes an Enum's value
    ({"e": _NanInside.A}, "$.e.k"),
    ({"a": None, "p": _with_extra(float("nan"))}, "$.p.extra"),  # not a declared field
    (_AlwaysEqual(a=float("nan")), "$.a"),  # passed the decode-and-compare
])
def test_what_orjson_writes_of_other_types_is_checked_as_it_writes_it(value: Any, where: str) -> None:
    """The refusal missed NaN where orjson finds it but the walk did not look (an Enum's
    value, a dataclass's attribute set on the instance) or where the read-back compare was
    fooled (a dict subclass's own __eq__): each was stored as null."""
    with pytest.raises(codec.EncodeError):
        codec.dumpb_checked(value)
    assert codec.payload_problem(value) is not None and where in codec.payload_problem(value), \
        codec.payload_problem(value)
    with pytest.raises(codec.NotStorable, match=re.escape(where)):
        codec.dumpb_result(value)


def test_a_result_holding_a_dataclass_with_nan_is_refused_not_stored_as_null() -> None:
    """dumpb_result fell back to json with orjson's encoding of the dataclass, which wrote
    its NaN as null: {"m": {"x": null}} was stored and the job ended done."""
    with pytest.raises(codec.NotStorable, match=re.escape("$.m.x")):
        codec.dumpb_result({"m": _Point(float("nan"))})
    with pytest.raises(codec.NotStorable, match=re.escape("$.1.m.x")):
        codec.dumpb_result({1: {"m": _Point(float("inf"))}})  # a key only the fallback takes


def test_other_types_without_nan_encode_as_orjson_writes_them() -> None:
    values = [{"a": None, "e": _Plain(), "p": _with_extra(None)}, _AlwaysEqual(a=None, b=1.5),
              {"a": None, "d": datetime.datetime(2024, 1, 2, tzinfo=datetime.UTC)}]
    for value in values:
        assert codec.dumpb_checked(value) == orjson.dumps(value)
    assert codec.dumpb_result({1: _Plain(), "n": None}) == b'{"1":{"x":1},"n":null}'


@pytest.mark.parametrize(("value", "path"), [
    ({"files": ["ok.txt", json.loads('"caf\\ud83d"')]}, "$.files[1]"),  # a truncated emoji escape
    ({"files": [os.fsdecode(b"caf\xe9.txt")]}, "$.files[0]"),  # a file name that is not UTF-8
    ({"n": 1, "big": 10 ** 5000}, "$.big"),  # past Python's 4,300-digit conversion limit
    ({3: [{"k": "\udce9"}]}, "$.3[0].k"),  # (a number key: json's path)
])
def test_a_result_that_cannot_be_stored_names_the_offending_path(value: Any, path: str) -> None:
    """A lone surrogate in a string (json writes it as a \\udcxx escape, which orjson and
    every strict reader of the record refuse: the done job would read as unparseable) and
    an integer past the conversion limit are refused naming where they are, not "$"."""
    with pytest.raises(codec.NotStorable, match=re.escape(f" at {path} ")):
        codec.dumpb_result(value)
