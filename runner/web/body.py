"""Bodies in and out: a request's media type, size limit and strict JSON (checked in that
order), query parameters, and JSON responses.

The size limit is checked from Content-Length before a byte is read, and enforced while
reading a body sent without one (chunked), so an oversized body is never held whole.
"""

from __future__ import annotations

import math
import re
from typing import Any

import falcon
import falcon.asgi

from runner.store import codec
from runner.web.problems import Problem

NO_BODY = object()


def is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _too_large(limit: int) -> Problem:
    return Problem(413, "payload-too-large", f"the body is over api.max_body_bytes ({limit} bytes)",
                   title="Payload too large", max_body_bytes=limit)


def _has_body(req: falcon.Request) -> bool:
    if req.content_length:
        return True
    return "chunked" in (req.get_header("Transfer-Encoding") or "").lower()


async def read_raw(req: falcon.asgi.Request, limit: int) -> bytes:
    encoding = (req.get_header("Content-Encoding") or "").strip().lower()
    if encoding not in ("", "identity"):
        # Never decoded here: a compressed body read as JSON would be a puzzling 400, and
        # one that happened to parse would be enqueued under a header that said otherwise.
        raise Problem(415, "unsupported-media-type",
                      f"the body has Content-Encoding {encoding!r}, which this API does not decode; send it "
                      "uncompressed (no Content-Encoding header)", title="Unsupported media type")
    length = req.content_length  # falcon answers 400 itself for a malformed header
    if length is not None and length > limit:
        raise _too_large(limit)
    if not length and "chunked" not in (req.get_header("Transfer-Encoding") or "").lower():
        return b""
    # The server ends the stream at Content-Length, or de-chunks a body sent without one
    # and ends it at the last chunk: never read past the limit either way.
    raw = await req.stream.read(limit + 1)
    if len(raw) > limit:
        raise _too_large(limit)
    return raw


async def read_json(req: falcon.asgi.Request, limit: int, *, optional: bool = False) -> Any:
    """The decoded JSON body; with ``optional``, NO_BODY when the request has none."""
    if optional and not _has_body(req):
        return NO_BODY
    if not is_json(req.content_type):
        raise Problem(415, "unsupported-media-type",
                      f"send the body as application/json (got {req.content_type or 'no Content-Type'})",
                      title="Unsupported media type")
    raw = await read_raw(req, limit)
    if not raw.strip():
        if optional:
            return NO_BODY
        raise Problem(400, "invalid-json", "the body is empty; send a JSON payload", title="Invalid JSON")
    try:
        return codec.loads_wire(raw)
    except codec.TooDeep as exc:
        raise Problem(400, "too-deep", str(exc), title="Nested too deep", max_depth=codec.MAX_DEPTH) from None
    except (codec.DecodeError, ValueError) as exc:
        raise Problem(400, "invalid-json", f"the body is not valid JSON: {exc}", title="Invalid JSON") from None


def send(resp: falcon.Response, obj: Any, status: int = 200) -> None:
    resp.status = falcon.code_to_http_status(status)
    resp.content_type = falcon.MEDIA_JSON
    resp.data = codec.dumpb_view(obj)


# A number in a query string, as the API document writes it: ASCII digits, a seconds
# value with at most one dot and an exponent. int() and float() take more ("1_0" is 10,
# " 5" is 5, a fullwidth or Arabic-Indic digit is a digit): ?delay=1_0 delayed by 10 s.
_INTEGER = re.compile(r"-?[0-9]+")
_NATURAL = re.compile(r"[0-9]+")
_SECONDS = re.compile(r"(?:[0-9]+|[0-9]*\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _bad_param(name: str, expected: str) -> Problem:
    return Problem(400, "invalid-parameter", f"query parameter {name!r} must be {expected}",
                   title="Invalid parameter", parameter=name)


def only_params(req: falcon.Request, *allowed: str, repeatable: tuple[str, ...] = ()) -> None:
    """Refuse unknown query parameters: a misspelt ``?dealy=60`` must not enqueue at once;
    and one given twice, unless ``repeatable`` names it (``/events?job=a&job=b``)."""
    if not req.query_string:  # most requests: no parameters to parse
        return
    params = req.params
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        expected = ", ".join(allowed) if allowed else "none"
        raise Problem(400, "unknown-parameter", f"unknown query parameter(s) {', '.join(map(repr, unknown))} "
                      f"(expected: {expected})", title="Unknown parameter", parameter=unknown[0])
    # ``?delay=abc&delay=`` would be read as one of its values and the other ignored: a
    # delay meant would be none. Each parameter holds one value, given once.
    for name in allowed:
        if name not in repeatable and isinstance(params.get(name), list):
            raise Problem(400, "invalid-parameter", f"query parameter {name!r} is given "
                          f"{len(params[name])} times; give it once", title="Invalid parameter", parameter=name)


def int_param(req: falcon.Request, name: str, lo: int, hi: int, default: int | None = None) -> int | None:
    raw = req.get_param(name)  # "?limit=" (empty) names no number: refused below, as the API document says
    if raw is None:
        return default
    try:
        if not (_NATURAL if lo >= 0 else _INTEGER).fullmatch(raw):
            raise ValueError(raw)
        value = int(raw)
    except ValueError:
        raise _bad_param(name, f"an integer from {lo} to {hi}") from None
    if not lo <= value <= hi:
        raise _bad_param(name, f"an integer from {lo} to {hi}")
    return value


def seconds_param(req: falcon.Request, name: str, hi: float) -> float | None:
    raw = req.get_param(name)  # "?delay=" (empty) names no number: refused below
    if raw is None:
        return None
    try:
        if not _SECONDS.fullmatch(raw):
            raise ValueError(raw)
        value = float(raw)
    except ValueError:
        raise _bad_param(name, f"a number of seconds from 0 to {hi:g}") from None
    if not math.isfinite(value) or not 0 <= value <= hi:
        raise _bad_param(name, f"a number of seconds from 0 to {hi:g}")
    return value
