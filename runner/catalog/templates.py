"""IDEMPOTENCY_KEY / RESOURCE_KEY templates: ``"{user_id}:{template}"`` over a payload.

Only plain field names (dotted for nested objects, no dunder names) are allowed: no
attribute access (values are looked up as dict keys only), no indexing, no conversions
or format specs, so payload data can never reach str.format's attribute lookup. Values
must be strings, numbers or booleans; numbers render canonically (7.0 as 7).

A key never holds a control character (C0, DEL or C1): a rendered key, and an explicit
idempotency key (``control_character``), lands in a job record between separators (\\x1f
between its fields, a newline between its limit lines), so one such byte in a payload
value would let a producer write record fields or limit lines of its own choosing
(another account's rate-limit bucket, another user's lock).
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
MAX_KEY_BYTES = 512
# Every control character: the record's separators (\x1f, \n) among them, and the rest
# because a key is one line of text in every view, log and terminal that shows it.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class TemplateError(ValueError):
    """A key that cannot be rendered; ``field``: the payload field at fault, when one is."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def control_character(text: str) -> str | None:
    """The first control character in ``text``, said for an error ("U+000A at character
    5"), or None when it holds none."""
    m = _CONTROL.search(text)
    return None if m is None else f"U+{ord(m.group()):04X} at character {m.start() + 1}"


@dataclass(frozen=True, slots=True)
class Template:
    source: str
    parts: tuple[tuple[str, str | None], ...]  # (literal, field or None)

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(f for _, f in self.parts if f is not None)

    def render(self, payload: Mapping[str, Any]) -> str:
        out: list[str] = []
        for literal, field in self.parts:
            out.append(literal)
            if field is None:
                continue
            value: Any = payload
            for name in field.split("."):
                if not isinstance(value, Mapping) or name not in value:
                    raise TemplateError(f"the payload has no field {field!r} for {self.source!r}")
                value = value[name]
            if isinstance(value, bool):
                out.append("true" if value else "false")
            elif isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
                out.append(str(int(value)))  # 7.0 is the JSON number 7: one key, one resource
            elif isinstance(value, str):
                bad = control_character(value)
                if bad is not None:
                    raise TemplateError(
                        f"field {field!r} renders the key {self.source!r} and holds a control character "
                        f"({bad}), which a key cannot carry: remove it from the value", field=field)
                out.append(value)
            elif isinstance(value, int | float):
                out.append(str(value))
            else:
                raise TemplateError(
                    f"field {field!r} of {self.source!r} must be a string, number or boolean"
                )
        key = "".join(out)
        if len(key.encode()) > MAX_KEY_BYTES:
            raise TemplateError(f"the key rendered from {self.source!r} is over {MAX_KEY_BYTES} bytes")
        return key


def parse(source: str) -> Template:
    if not isinstance(source, str) or not source:
        raise TemplateError("a key template must be a non-empty string")
    parts: list[tuple[str, str | None]] = []
    try:
        parsed = list(string.Formatter().parse(source))
    except ValueError as exc:
        raise TemplateError(f"bad template {source!r}: {exc}") from None
    bad = control_character(source)
    if bad is not None:
        raise TemplateError(f"template {source!r} holds a control character ({bad}), which a key cannot carry")
    for literal, field, spec, conv in parsed:
        if field is None:
            parts.append((literal, None))
            continue
        if conv or spec:
            raise TemplateError(f"template {source!r}: conversions and format specs are not allowed")
        if not _FIELD.match(field) or any(part.startswith("__") for part in field.split(".")):
            raise TemplateError(
                f"template {source!r}: {{{field}}} must be a field name (dotted for nested fields)"
            )
        parts.append((literal, field))
    if not any(f for _, f in parts):
        raise TemplateError(f"template {source!r} names no payload field")
    return Template(source=source, parts=tuple(parts))


def schema_has(schema: Mapping[str, Any], field: str) -> bool:
    """Whether a dotted field is declared in a schema's (nested) properties."""
    node: Any = schema
    for name in field.split("."):
        props = node.get("properties") if isinstance(node, Mapping) else None
        if not isinstance(props, Mapping) or name not in props:
            return False
        node = props[name]
    return True
