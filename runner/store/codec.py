"""The strict JSON codec used on the wire and in Redis (no pickle, ever)."""

from __future__ import annotations

import re
from typing import Any

import orjson

DecodeError = orjson.JSONDecodeError


def dumps(obj: Any) -> str:
    return orjson.dumps(obj).decode()


def dumpb(obj: Any) -> bytes:
    return orjson.dumps(obj)


def loads(data: str | bytes) -> Any:
    return orjson.loads(data)


_LONG_DIGITS = re.compile(rb"[0-9]{20,}")
INT_MIN, INT_MAX = -(2**63), 2**64 - 1


def loads_wire(data: bytes) -> Any:
    """Decode a request body strictly.

    orjson already refuses NaN, infinities, lone surrogates, invalid UTF-8 and nesting
    deeper than 1024; but it turns an integer too big for 64 bits into a float, losing
    digits silently. Such a body (rare: it needs a run of 20+ digits) is parsed again
    exactly and refused if an integer is out of range. Duplicate keys keep the last value;
    the payload is stored re-encoded, so every reader downstream sees that one value.
    """
    value = orjson.loads(data)
    if _LONG_DIGITS.search(data):
        import json  # the rare path: digits long enough to lose precision

        _check_ints(json.loads(data), "$")
    return value


def _check_ints(node: Any, path: str) -> None:
    if isinstance(node, bool):
        return
    if isinstance(node, int):
        if not INT_MIN <= node <= INT_MAX:
            raise ValueError(f"integer at {path} does not fit in 64 bits")
    elif isinstance(node, dict):
        for k, v in node.items():
            _check_ints(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _check_ints(v, f"{path}[{i}]")


def canonical(value: Any) -> Any:
    """The value with every integral float as an integer (7.0 -> 7): JSON does not tell
    them apart, and a schema's "integer" accepts both, so they are one request."""
    if isinstance(value, float):
        # Only where the integer is a JSON integer this codec writes (64 bits).
        return int(value) if value.is_integer() and abs(value) < 2**63 else value
    if isinstance(value, dict):
        return {k: canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [canonical(v) for v in value]
    return value


def canonical_hash(type_: str, version: int, payload: Any) -> str:
    """Stable hash of a request (function, version, payload with sorted keys and canonical
    numbers), to tell a duplicate from a conflict."""
    import hashlib  # a dict look-up per call; keeps hashlib out of every CLI start

    body = orjson.dumps(canonical(payload), option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(b"%s:%d:" % (type_.encode(), version) + body, digest_size=16).hexdigest()
