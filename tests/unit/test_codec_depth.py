"""The nesting limit costs what a C scan costs: a wide value with many brackets is checked
by re-encoding, not by a walk in Python, and the limit is exact on both sides."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from runner.store import codec

LIMIT = codec.MAX_DEPTH


def nest(levels: int, leaf: Any = 1, kind: str = "list") -> Any:
    v = leaf
    for _ in range(levels):
        v = [v] if kind == "list" else {"a": v}
    return v


@pytest.mark.parametrize("kind", ["list", "dict"])
@pytest.mark.parametrize("leaf", [1, [], {}, "x"])
def test_the_limit_is_exact_when_encoding_and_decoding(kind: str, leaf: Any) -> None:
    extra = 1 if isinstance(leaf, list | dict) else 0
    at = nest(LIMIT - extra, leaf, kind)
    over = nest(LIMIT + 1 - extra, leaf, kind)
    raw = codec.dumpb_checked(at)
    assert raw == orjson.dumps(at)
    assert codec.loads(raw) == at
    with pytest.raises(codec.TooDeep) as err:
        codec.dumpb_checked(over)
    assert f"{LIMIT} levels" in str(err.value) and err.value.path.startswith("$")
    # What is read back keeps the headroom of runner's own records around a value.
    codec.loads(orjson.dumps(nest(codec.READ_DEPTH - extra, leaf, kind)))
    with pytest.raises(codec.TooDeep):
        codec.loads(orjson.dumps(nest(codec.READ_DEPTH + 1 - extra, leaf, kind)))
    # A body's envelope: its own limit, as exact.
    body = nest(LIMIT + codec.ENVELOPE - extra, leaf, kind)
    codec.loads_wire(orjson.dumps(body))
    with pytest.raises(codec.TooDeep):
        codec.loads_wire(orjson.dumps([body]))


def test_other_encoding_errors_pass_through_and_deep_results_name_the_path() -> None:
    with pytest.raises(TypeError) as err:
        codec.dumpb_checked({"a": {1, 2}})
    assert not isinstance(err.value, codec.TooDeep)
    with pytest.raises(codec.NotStorable, match=r"\$\.a.*120 levels"):
        codec.dumpb_result({"a": nest(codec.RESULT_DEPTH)})
    with pytest.raises(codec.NotStorable, match=r"120 levels"):
        codec.dumpb_result({1: nest(codec.RESULT_DEPTH)})  # the json path too
    assert codec.dumpb_result({1: 2}) == b'{"1":2}'
    at = nest(codec.RESULT_DEPTH)
    assert codec.dumpb_result(at) == orjson.dumps(at)


def test_a_wide_value_with_many_brackets_is_never_walked_in_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 300-item cart five levels deep has 600 brackets: the check once walked it in
    Python (10-40x orjson's own time); now the encoder's own limit decides, in C, and the
    Python walk (too_deep) runs only for a value past the limit, to name its path."""
    walked: list[int] = []
    real = codec.too_deep

    def counting(value: Any, limit: int = codec.MAX_DEPTH) -> str | None:
        walked.append(limit)
        return real(value, limit)

    monkeypatch.setattr(codec, "too_deep", counting)
    cart = {"items": [{"sku": i, "qty": 1, "opts": [{"o": [i]}]} for i in range(300)]}
    raw = orjson.dumps(cart)
    assert codec.loads(raw) == cart
    assert orjson.loads(codec.dumpb_checked(cart)) == cart
    assert walked == []
    with pytest.raises(codec.TooDeep):
        codec.dumpb_checked({"a": nest(codec.MAX_DEPTH)})
    assert walked, "past the limit the walk names the path"


def test_a_nan_key_is_refused_with_what_and_where() -> None:
    """A key JSON has no form for (NaN, an infinity) is named with its path and what to do
    instead, in a result (where number keys become strings) and in a payload (where keys
    must be strings); the result's error used to be blank."""
    with pytest.raises(codec.NotStorable) as exc:
        codec.dumpb_result({"a": [{float("nan"): 1}]})
    assert "the key nan at $.a[0]" in str(exc.value) and "use a string key" in str(exc.value)
    with pytest.raises(codec.NotStorable, match="the key inf at \\$ "):
        codec.dumpb_result({float("inf"): 1})
    assert codec.not_json({"p": {float("nan"): 1}}) == ("$", "the key nan at $.p is a float; keys here must be "
                                                        "strings (use str(key))")
