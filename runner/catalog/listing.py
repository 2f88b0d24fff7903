"""The errors of an invalid payload, listed at a bounded cost.

Whether a payload validates takes microseconds whatever it holds; listing its errors does
not. The compiler builds every error before it yields one, holding the GIL, and the cost
grows faster than their number (520,000 wrong values in a 1 MB payload: 25 s). So every
error is listed only for a payload of at most LIST_BYTES encoded, and the payloads of one
request (a batch, a group) share that much (``one_request``); past it, the validator's
first error and a note at the payload's path that more may exist, naming the schema file
to check it against. The validator that lists errors evaluates ``anyOf`` and ``oneOf`` in
keywords.py, as the compiler's own error for them carries every error of every branch, so
a first error costs little whatever the schema. A message that quotes a long value keeps
its start and its end (MESSAGE_CHARS). A caller on an event loop asks only whether a
payload validates (``Versions.validate(..., listing=False)``, which raises Unlisted) and
lists the errors of one that does not elsewhere.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import orjson

from runner.catalog import keywords
from runner.errors import FieldError

# Every error is listed for at most this much payload, encoded, per payload or per request;
# past it, the first error and a note. Chosen on bench/validation.py --full (2 cores under
# load): 4 KiB of wrong values, about 2,000 errors, listed in 20 to 70 ms whatever the
# shape; 8 KiB took up to 250 ms, and the cost grows faster than the count.
LIST_BYTES = 4 * 1024
# A longer error message (one that quotes a long value) keeps its first and last halves.
MESSAGE_CHARS = 400


class Unlisted(Exception):
    """A payload does not validate, and its errors were not listed (``listing=False``)."""


class _Request(threading.local):
    # Within one_request: how many bytes of payload may still have every error listed.
    left: int | None = None


_request = _Request()


@contextlib.contextmanager
def one_request() -> Iterator[None]:
    """The payloads validated within are one request's (a batch, a group): they share one
    pattern budget (keywords.one_budget) and LIST_BYTES of payload whose errors are all
    listed, so a request of many invalid payloads costs what one does."""
    if _request.left is not None:  # inside another: that one holds
        yield
        return
    _request.left = LIST_BYTES
    try:
        with keywords.one_budget():
            yield
    finally:
        _request.left = None


def json_path(parts: Any) -> str:
    out = "$"
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def errors(check: Any, explain: Any, payload: Any, *, backtracks: bool, file: str) -> list[FieldError]:
    """Every error of ``payload`` (none when it validates), or its first and a note: ``check``
    says whether it validates, ``explain`` what is wrong (see schemas.Compiled); ``file``
    is the schema's, as the project has it (``schemas/<type>/v<N>.json``)."""
    if backtracks:
        keywords.start_budget()
    if check.is_valid(payload):
        cut = keywords.ran_out() if backtracks else None
        return [] if cut is None else [FieldError("$", cut)]
    size = _size(payload)
    left = LIST_BYTES if _request.left is None else _request.left
    note = None
    if size <= left:
        if _request.left is not None:
            _request.left -= size
        found = explain.iter_errors(payload)
    else:
        found = _first(explain, payload)
        note = _note(size, file, shared=size <= LIST_BYTES)
    # A set: additionalProperties checks the values its sibling patternProperties
    # matched too, which keywords.py then reports again.
    out: set[FieldError] = set()
    over: set[str] = set()
    for e in found:
        for parts, message in keywords.expand(e):
            if keywords.over_budget(message):  # said once: every later match ran out too
                if message in over:
                    continue
                over.add(message)
            out.add(FieldError(json_path(parts), _shortened(message)))
    cut = keywords.ran_out() if backtracks else None
    if cut is not None and cut not in over:  # cut short where an error does not show
        out.add(FieldError("$", cut))
    if not out:  # never taken for valid for want of words (the two validators agree)
        out.add(FieldError("$", f"does not validate against {file}"))
    listed = sorted(out, key=lambda e: (e.path, e.message))
    if note is None or cut is not None or over:  # cut short: its error says what to send instead
        return listed
    return [*listed, FieldError("$", note, note=True)]


def _size(payload: Any) -> int:
    try:
        return len(orjson.dumps(payload))
    except TypeError:  # an integer past 64 bits: about this long
        return len(repr(payload))


def _first(validator: Any, payload: Any) -> list[Any]:
    """The validator's first error, as iter_errors would give it, or none."""
    import jsonschema_rs

    try:
        validator.validate(payload)
    except jsonschema_rs.ValidationError as exc:
        return [exc]
    return []


def _note(size: int, file: str, shared: bool) -> str:
    why = (f"the payloads before it in this request used the {LIST_BYTES // 1024} KiB of payload whose errors are "
           "all listed" if shared else
           f"every error is listed for at most {LIST_BYTES // 1024} KiB of payload, and this one is {size:,} bytes")
    how = "send it alone or in smaller parts" if shared else "send it in smaller parts"
    return (f"only the first error is listed: {why}; more may exist. To see them all, check the payload against "
            f"{file} with any JSON Schema validator, or {how}")


def _shortened(message: str) -> str:
    if len(message) <= MESSAGE_CHARS:
        return message
    half = MESSAGE_CHARS // 2
    return f"{message[:half]} ... {message[-half:]}"
