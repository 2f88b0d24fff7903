"""The strict JSON codec used on the wire and in Redis (no pickle, ever).

One nesting limit, MAX_DEPTH (120 levels), holds for every value a user hands in, at
every entry: a payload from any producer (the client, HTTP, the CLI, ctx.enqueue, a
requeue with an edit), a handler's result, a step's value, a signal's body, a checkpoint,
an event's data. Runner wraps those values in records of its own (a group's then-job
holds its members' results 4 levels in, an ON_SUCCESS body 1, a view 1), so what it reads
back is held to READ_DEPTH, MAX_DEPTH and HEADROOM levels more: a value within the limit
always reads back and renders, and one past READ_DEPTH (written by another producer)
reads as unparseable. The encoder (orjson) stops at 255 levels and the parser at 1,024.
"""

from __future__ import annotations

import dataclasses
import enum
import marshal
import math
import re
import threading
from typing import Any

import orjson

DecodeError = orjson.JSONDecodeError
EncodeError = orjson.JSONEncodeError

# Levels of arrays and objects in one value (``[]`` is 1, ``[[]]`` 2) a user may hand in,
# whatever the entry. Far over what a real payload holds.
MAX_DEPTH = 120
# Levels runner may add around a user's value in its own records (a group's then-job
# payload adds 4, an ON_SUCCESS body 1, a job view 1): what is read back from Redis is
# held to READ_DEPTH, well under the encoder's 255, so a view's own levels always encode.
HEADROOM = 8
READ_DEPTH = MAX_DEPTH + HEADROOM
# A result is held to the one limit, as every other value is (the name stays for callers).
RESULT_DEPTH = MAX_DEPTH
# A request body may wrap its payloads in a few levels of its own (a group's
# {"members": [{"payload": ...}]}): each payload is then held to MAX_DEPTH on its own.
ENVELOPE = 4


class TooDeep(DecodeError):
    """A value nested deeper than MAX_DEPTH. A DecodeError, so a stored record beyond the
    limit (written by another producer) reads as unparseable wherever it is read."""

    def __init__(self, path: str, limit: int = MAX_DEPTH) -> None:
        where = path if len(path) <= 60 else path[:60] + "..."
        self.limit = limit
        self.detail = (f"the nesting depth is over the limit of {limit} levels of arrays and objects "
                       f"(at {where}); flatten the value")
        super().__init__(self.detail, "", 0)
        self.path = path

    def __str__(self) -> str:  # without the parser's position, which names none here
        return self.detail


class NotStorable(ValueError):
    """A value JSON cannot hold, with the path of the offending part."""


def too_deep(value: Any, limit: int = MAX_DEPTH) -> str | None:
    """The path of the first array or object past ``limit`` levels in ``value``, or None."""
    stack: list[tuple[Any, int, str]] = [(value, 1, "$")]
    while stack:
        node, depth, path = stack.pop()
        if isinstance(node, dict):
            if depth > limit:
                return path
            stack.extend((v, depth + 1, f"{path}.{k}") for k, v in node.items()
                         if isinstance(v, dict | list | tuple))
        elif isinstance(node, list | tuple):
            if depth > limit:
                return path
            stack.extend((v, depth + 1, f"{path}[{i}]") for i, v in enumerate(node)
                         if isinstance(v, dict | list | tuple))
    return None


# orjson's encoder refuses past exactly 254 levels (a scalar in 254 lists encodes, in 255
# it does not). So a value is within ``limit`` levels iff it still encodes inside
# 254 - limit lists: the check runs in C, and the Python walk (too_deep) runs only to
# name the path of a value already known to be too deep.
_ENCODER_DEPTH = 254
_chains = threading.local()


def _wrapped(value: Any, limit: int) -> bytes:
    """orjson.dumps of ``value`` inside 254 - ``limit`` lists (JSONEncodeError past it).
    The chain of lists is built once per thread and reused: building 126 lists per call
    would cost more than the encoding of a small value."""
    outer = _ENCODER_DEPTH - limit
    chains: dict[int, tuple[list[Any], list[Any]]] | None = getattr(_chains, "by_limit", None)
    if chains is None:
        chains = _chains.by_limit = {}
    chain = chains.get(outer)
    if chain is None:
        inner: list[Any] = [None]
        top = inner
        for _ in range(outer - 1):
            top = [top]
        chain = chains[outer] = (top, inner)
    top, inner = chain
    inner[0] = value
    try:
        return orjson.dumps(top)
    finally:
        inner[0] = None


def _may_be_deep(data: str | bytes, limit: int = MAX_DEPTH) -> bool:
    # A value cannot nest deeper than it has brackets: two C scans spare nearly every
    # value the re-encoding (brackets inside strings only make this err on the safe side).
    if isinstance(data, str):
        return data.count("[") + data.count("{") > limit
    return data.count(b"[") + data.count(b"{") > limit


def check_depth(value: Any, data: str | bytes, limit: int = MAX_DEPTH, named: int | None = None) -> None:
    """Raise TooDeep when ``value`` (whose JSON text is ``data``) is past ``limit`` levels;
    ``named``: the limit the error states, when the check allows for an envelope around
    the value the user nests (a body's)."""
    if _may_be_deep(data, limit):
        try:
            _wrapped(value, limit)
        except orjson.JSONEncodeError:
            path = too_deep(value, limit)
            if path is not None:
                raise TooDeep(path, limit if named is None else named) from None


def dumpb_checked(obj: Any, limit: int = MAX_DEPTH) -> bytes:
    """orjson.dumps(obj), refused with TooDeep past ``limit`` levels: one encoding in all,
    inside the lists that make the encoder's own limit this one, sliced off after.
    Any other JSONEncodeError (a set, an integer out of 64 bits, NaN or an infinity) is
    raised as is (not_json names the path). The one encoder of what a caller hands in: a
    payload, ctx.enqueue's, an event's data, a signal's body, a step's value, a checkpoint."""
    outer = _ENCODER_DEPTH - limit
    try:
        raw = _wrapped(obj, limit)
    except orjson.JSONEncodeError:
        path = too_deep(obj, limit)
        if path is not None:
            raise TooDeep(path, limit) from None
        raise
    out = raw[outer:-outer]
    if b"null" in out and _has_non_finite(obj, out):
        # orjson writes NaN and infinities as null: a value the caller never sent.
        raise orjson.JSONEncodeError("NaN and infinities have no JSON form")
    return out


def _has_non_finite(obj: Any, out: bytes) -> bool:
    """Whether ``obj`` (encoded as ``out``, which holds a null) holds NaN or an infinity.
    Only then may a null stand for a float. A value of the built-in types is probed in C
    by marshal, with no second decode (reading ``out`` back and comparing cost 3x the
    encoding itself: 136 us for a 15 KB payload the encoder writes in 40), and walked
    only when the probe finds what may be such a float. One of other types (a dataclass,
    an Enum, a datetime, a subclass), which marshal refuses before any code of its own
    runs, is walked as orjson encodes it (_unstorable). Reading it back and comparing
    was not sound: a subclass's own __eq__ decided, and an Enum's value or a dataclass's
    attribute set on the instance compared as nothing."""
    return _non_finite(obj) and _unstorable(obj, "$") != ""


_BUILT_IN = (dict, list, tuple)


def _non_finite(node: Any) -> bool:
    """Whether orjson's encoding of ``node`` writes a NaN or an infinity (as null): a
    container of the built-in types only is probed in C by marshal, whatever it holds
    (one that holds another type is refused by marshal at once, and read part by part);
    any other value is read as orjson encodes it (see _unstorable)."""
    t = type(node)
    if t in _BUILT_IN:
        try:
            return _may_hold_non_finite(marshal.dumps(node, 4))
        except ValueError:  # "unmarshallable object": it holds a type other than the built-in ones
            pass
    elif isinstance(node, float):
        return not math.isfinite(node)
    elif t is str or t is int or t is bool or node is None:
        return False
    if isinstance(node, enum.Enum):
        return _non_finite(node.value)
    if isinstance(node, dict):
        return any(_non_finite(v) for v in dict.values(node))
    if isinstance(node, list):
        return any(_non_finite(v) for v in list.__iter__(node))
    if isinstance(node, tuple):
        return any(_non_finite(v) for v in tuple.__iter__(node))
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        return any(_non_finite(v) for _, v in _dataclass_items(node))
    return False


def _dataclass_items(node: Any) -> list[tuple[str, Any]]:
    """A dataclass instance's attributes as orjson writes them: its __dict__ (an attribute
    set on the instance too) or, with __slots__, its fields; none whose name begins with
    "_"."""
    attrs = getattr(node, "__dict__", None)
    items = (list(attrs.items()) if isinstance(attrs, dict)
             else [(f.name, getattr(node, f.name, None)) for f in dataclasses.fields(node)])
    return [(k, v) for k, v in items if isinstance(k, str) and not k.startswith("_")]


# marshal (version 4) writes a float as TYPE_BINARY_FLOAT, "g" (0xe7 with FLAG_REF, when
# the object is shared), then its IEEE 754 bytes little-endian. NaN and the infinities,
# and they only, have every exponent bit set: the last byte is 0x7f or 0xff, the one
# before it 0xf0 or more. Text never holds 0xff (UTF-8 has none) and seldom 0x7f, so one
# memchr for each spares nearly every payload the scan; negative integers hold 0xff, and
# then the scan (a literal first byte: a C search, about 14 instructions a byte) decides.
_NON_FINITE = (re.compile(rb"g[\x00-\xff]{6}[\xf0-\xff][\x7f\xff]"),
               re.compile(rb"\xe7[\x00-\xff]{6}[\xf0-\xff][\x7f\xff]"))


def _may_hold_non_finite(probe: bytes) -> bool:
    if b"\xff" not in probe and b"\x7f" not in probe:
        return False
    return any(p.search(probe) is not None for p in _NON_FINITE)


def payload_problem(value: Any) -> str | None:
    """Why ``value`` cannot be a job's payload, naming the path (nested past MAX_DEPTH,
    NaN or an infinity, an integer past 64 bits, a part JSON cannot hold), or None: for a
    payload checked before any enqueue (a SCHEDULE payload, when its file is loaded)."""
    try:
        dumpb_checked(value)
    except TooDeep as exc:
        return str(exc)
    except EncodeError:
        found = not_json(value)
        return found[1] if found is not None else "the value is not JSON"
    return None


def dumps(obj: Any) -> str:
    return orjson.dumps(obj).decode()


def dumpb(obj: Any) -> bytes:
    return orjson.dumps(obj)


def _parse(data: str | bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if exc.msg.startswith("depth limit exceeded"):  # orjson's own, at 1,024 levels
            raise TooDeep(f"char {exc.pos}") from None
        raise


def loads(data: str | bytes) -> Any:
    """Decode JSON; a value past READ_DEPTH is refused as undecodable (TooDeep)."""
    if len(data) < 20:
        # Most payloads a job reads (a claim, a meta): fewer characters than the deepest
        # value a reader refuses has brackets, and than an integer past 64 bits has digits.
        # (orjson at once, one call less per job; _parse raises what a bad text raises.)
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            return _parse(data)
    value = _parse(data)
    check_depth(value, data, READ_DEPTH)
    if _may_hold_long_ints(data):
        import json  # the rare path: a stored result whose integers past 64 bits keep their digits

        try:
            return json.loads(data)
        except (ValueError, RecursionError):
            return value
    return value


# Every byte to "0" (a digit), "-" or " ": a run of digits is then found by a C search.
_DIGITS = bytes(48 if chr(b).isdigit() and b < 128 else (45 if b == 45 else 32) for b in range(256))


def has_long_ints(data: str | bytes) -> bool:
    """Whether the JSON text ``data`` may hold an integer past 64 bits (cheap; see below)."""
    return _may_hold_long_ints(data)


def _may_hold_long_ints(data: str | bytes) -> bool:
    """Whether ``data`` holds an integer orjson reads as a float (over 2^64 - 1: 20 digits
    and more; below -2^63: a minus and 19 digits). Two C passes; a run of digits inside a
    string only costs an exact parse."""
    raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
    if len(raw) < 20:
        return False
    shape = raw.translate(_DIGITS)
    return b"00000000000000000000" in shape or b"-0000000000000000000" in shape


def dumpb_view(obj: Any) -> bytes:
    """A response's JSON, always. What cannot be encoded as it stands (written by another
    producer, or before a limit held) is shown in a form that can: an integer past 64 bits
    with every digit, a part nested too deep as a note in its place, a string with bytes
    that were not UTF-8 (read back from Redis surrogate-escaped) with U+FFFD for each, any
    other value as its text. Never an error."""
    try:
        return orjson.dumps(obj)
    except orjson.JSONEncodeError:
        shown = _shown(obj, 0)
    try:
        return orjson.dumps(shown, default=str, option=orjson.OPT_NON_STR_KEYS)
    except orjson.JSONEncodeError:  # an integer past 64 bits (a stored result): every digit
        import json

        return json.dumps(shown, default=str, ensure_ascii=False, separators=(",", ":")).encode()


def dumps_view(obj: Any) -> str:
    """dumpb_view as text, for the CLI's output."""
    return dumpb_view(obj).decode()


_SURROGATE = re.compile("[\ud800-\udfff]")


def shown_text(text: str) -> str:
    """``text`` with U+FFFD for each lone surrogate (a byte that was not UTF-8, read back
    from Redis surrogate-escaped), which no JSON encoder or terminal takes."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)
    return text


# What a terminal or a log reader may act on, or be misled by, in a producer's text: C0
# controls, DEL, the C1 controls (U+009B is an 8-bit CSI), the line and paragraph
# separators, and the bidi controls that reorder what a line shows (U+202E).
_PAST_C0 = "\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_UNSAFE_ALL = re.compile(f"[\x00-\x1f{_PAST_C0}]")
_UNSAFE_BUT_LINES = re.compile(f"[\x00-\x08\x0b-\x1f{_PAST_C0}]")  # (tab and newline kept)
_UNSAFE_PAST_C0 = re.compile(f"[{_PAST_C0}]")


def _written_out(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def escaped(text: str, keep_lines: bool = False) -> str:
    """``text`` with each character a terminal may act on written out (``\\x1b``,
    ``\\u202e``), newlines and tabs too unless ``keep_lines``: one field of a producer's
    data for a terminal or a text log line."""
    return (_UNSAFE_BUT_LINES if keep_lines else _UNSAFE_ALL).sub(_written_out, text)


def escaped_json(text: str) -> str:
    """JSON text with each such character past C0 (which JSON escapes itself) as a
    ``\\uXXXX`` escape: they occur only inside strings, where it is the same character."""
    if text.isascii() and "\x7f" not in text:  # (most lines: two scans in C, no match to look for)
        return text
    return _UNSAFE_PAST_C0.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _shown(node: Any, depth: int) -> Any:
    if isinstance(node, str):
        return shown_text(node)
    if isinstance(node, dict | list | tuple):
        if depth >= READ_DEPTH:
            return f"(nested deeper than {READ_DEPTH} levels: not shown)"
        if isinstance(node, dict):
            return {shown_text(k) if isinstance(k, str) else k: _shown(v, depth + 1) for k, v in node.items()}
        return [_shown(v, depth + 1) for v in node]
    return node


INT_MIN, INT_MAX = -(2**63), 2**64 - 1


def loads_wire(data: bytes) -> Any:
    """Decode a request body strictly.

    orjson already refuses NaN, infinities, lone surrogates, invalid UTF-8 and nesting
    deeper than 1024, and this refuses nesting past MAX_DEPTH and a body's ENVELOPE
    (TooDeep; the client holds each payload to MAX_DEPTH itself); but orjson turns
    an integer out of 64 bits into a float, losing digits silently. Such a body (rare: it
    needs a run of 19+ digits) is parsed again exactly and refused if an integer is out of
    range. Duplicate keys keep the last value; the payload is stored re-encoded, so every
    reader downstream sees that one value.
    """
    value = _parse(data)
    check_depth(value, data, MAX_DEPTH + ENVELOPE, named=MAX_DEPTH)
    if _may_hold_long_ints(data):
        import json  # the rare path: digits long enough to lose precision

        _check_ints(json.loads(data), "$")  # within MAX_DEPTH: no deep recursion here
    return value


def check_payload_ints(data: bytes) -> None:
    """ValueError, naming the path, when the JSON text ``data`` holds an integer a payload
    cannot carry (past 64 bits): a stored result may keep one, but a result passed on as
    another job's payload (ON_SUCCESS) may not."""
    if _may_hold_long_ints(data):
        import json

        _check_ints(json.loads(data), "$")


def not_json(value: Any) -> tuple[str, str] | None:
    """(path, why, the path named in it) for the first part of ``value`` a payload cannot
    carry: an integer past 64 bits, a value JSON cannot hold (a set, NaN, a key of another
    type), a string with lone surrogates; None when it encodes. For an error that names
    where to look, on the path where orjson refused (its own error names none)."""
    try:
        _check_ints(value, "$")
    except ValueError as exc:
        return getattr(exc, "path", "$"), str(exc)
    why = _unstorable(value, "$", str_keys=True)
    if why:
        return "$", why
    try:
        orjson.dumps(value)
    except orjson.JSONEncodeError as exc:
        why = _unstorable(value, "$", str_keys=True, texts=True)
        return "$", why or f"the value at $ is not JSON: {exc}"
    return None


class _OutOfRange(ValueError):
    def __init__(self, path: str) -> None:
        super().__init__(f"integer at {path} does not fit in 64 bits (from -2^63 to 2^64-1); send it as a string")
        self.path = path


def _check_ints(node: Any, path: str) -> None:
    if isinstance(node, bool):
        return
    if isinstance(node, int):
        if not INT_MIN <= node <= INT_MAX:
            raise _OutOfRange(path)
    elif isinstance(node, dict):
        for k, v in node.items():
            _check_ints(v, f"{path}.{k}")
    elif isinstance(node, list | tuple):
        for i, v in enumerate(node):
            _check_ints(v, f"{path}[{i}]")


def dumpb_result(obj: Any) -> bytes:
    """A handler's return value as JSON, as Python's ``json`` would store it: keys that
    are numbers, booleans or None become strings, integers past 64 bits keep their
    digits. NotStorable, with the offending path, for what JSON cannot hold (an object of
    another type, NaN and infinities: orjson writes those as null, and ctx.stream refuses
    them too) and for nesting past RESULT_DEPTH."""
    try:
        out = dumpb_checked(obj, RESULT_DEPTH)
    except TooDeep as exc:
        raise NotStorable(f"the value at {exc.path} is nested deeper than the limit of {RESULT_DEPTH} levels "
                          "that holds for every value runner takes (a payload, a result, a step's value); "
                          "flatten it") from None
    except orjson.JSONEncodeError:
        return _json_like(obj)
    if b"null" in out:  # (only then may a NaN hide in it: the walk costs nothing otherwise)
        why = _unstorable(obj, "$")
        if why:
            raise NotStorable(why)
    return out


def _json_like(obj: Any) -> bytes:
    import json

    def other(o: Any) -> Any:  # what orjson encodes and json does not (datetime, UUID, dataclass)
        try:  # (checked: orjson alone writes a dataclass's NaN as null)
            return orjson.loads(dumpb_checked(o))
        except orjson.JSONEncodeError:
            raise TypeError from None

    try:
        return json.dumps(obj, default=other, allow_nan=False, separators=(",", ":"),
                          ensure_ascii=False).encode()
    except (TypeError, ValueError) as exc:
        # (Never blank: should the walk find nothing, json's own words say what it refused.)
        raise NotStorable(_unstorable(obj, "$", texts=True) or f"the value at $ is not JSON ({exc})") from None


# An integer past this many bits may be past Python's conversion limit for a decimal
# string (sys.get_int_max_str_digits, 4,300 digits: about 14,284 bits); only such a one is
# converted to find out.
_LONG_INT_BITS = 14_000


def _bad_text(node: str | int, path: str) -> str:
    """Why JSON text cannot hold this string or integer ("" for nothing): a lone surrogate
    (json writes it as a \\udcxx escape, which orjson and every strict reader of the
    stored record refuse, so the record would read as unparseable), or an integer past
    Python's conversion limit."""
    if isinstance(node, str):
        if node.isascii():
            return ""
        try:
            node.encode("utf-8")
        except UnicodeEncodeError as exc:
            return (f"the string at {path} holds a lone surrogate ({node[exc.start]!r}, at character {exc.start}), "
                    "which no JSON reader of the record takes (a file name os.fsdecode read from bytes that are "
                    "not UTF-8, or a cut escape): store it as text, e.g. .encode('utf-8', 'replace').decode()")
        return ""
    if isinstance(node, int) and node.bit_length() > _LONG_INT_BITS:
        try:
            str(node)
        except ValueError:
            return (f"the integer at {path} has more digits than Python converts to text (sys.get_int_max_str_digits); "
                    "store it as a string")
    return ""


def _unstorable(node: Any, path: str, str_keys: bool = False, texts: bool = False) -> str:
    """What in ``node`` JSON cannot hold, with its path ("" for nothing). ``str_keys``: a
    key must be a string (a payload's, a checkpoint's; a result's may be a number, written
    as json writes it). The walk reads what orjson writes: a dict's or a list's own items
    (whatever a subclass overrides), an Enum's value, a dataclass's public attributes.
    ``texts``: strings and integers are looked at too (_bad_text: only where an encoder
    refused, never on the way of a value that encoded)."""
    if isinstance(node, enum.Enum):
        return _unstorable(node.value, path, str_keys, texts)
    if isinstance(node, dict):
        for k, v in dict.items(node):
            if isinstance(k, str):
                pass
            elif str_keys:
                return f"the key {k!r} at {path} is a {type(k).__name__}; keys here must be strings (use str(key))"
            elif not isinstance(k, int | float | bool) and k is not None:
                return f"the key {k!r} at {path} is a {type(k).__name__}; keys must be strings or numbers"
            elif isinstance(k, float) and not math.isfinite(k):
                return (f"the key {k!r} at {path} is a number JSON cannot hold (NaN and infinities have no JSON "
                        "form); use a string key in its place")
            if texts and isinstance(k, str) and (bad := _bad_text(k, f"{path} (a key)")):
                return bad
            found = _unstorable(v, f"{path}.{k}", str_keys, texts)
            if found:
                return found
        return ""
    if isinstance(node, list | tuple):
        for i, v in enumerate(list.__iter__(node) if isinstance(node, list) else tuple.__iter__(node)):
            found = _unstorable(v, f"{path}[{i}]", str_keys, texts)
            if found:
                return found
        return ""
    if isinstance(node, float) and not math.isfinite(node):
        return f"the value at {path} is {node!r}, which JSON cannot hold (use None or a string in its place)"
    if dataclasses.is_dataclass(node) and not isinstance(node, type):  # as orjson writes it
        for name, v in _dataclass_items(node):
            found = _unstorable(v, f"{path}.{name}", str_keys, texts)
            if found:
                return found
        return ""
    if isinstance(node, int | str | bool | float) or node is None:
        return _bad_text(node, path) if texts and isinstance(node, str | int) and not isinstance(node, bool) else ""
    try:
        orjson.dumps(node)
    except orjson.JSONEncodeError:
        return f"the value at {path} ({type(node).__name__}) is not JSON"
    return ""


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
