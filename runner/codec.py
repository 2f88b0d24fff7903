"""The strict JSON codec used on the wire and in Redis (no pickle, ever)."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

DecodeError = orjson.JSONDecodeError


def dumps(obj: Any) -> str:
    return orjson.dumps(obj).decode()


def dumpb(obj: Any) -> bytes:
    return orjson.dumps(obj)


def loads(data: str | bytes) -> Any:
    return orjson.loads(data)


def canonical_hash(version: int, payload: Any) -> str:
    """Stable hash of a payload (sorted keys), to tell a duplicate from a conflict."""
    body = orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(b"%d:" % version + body, digest_size=16).hexdigest()
