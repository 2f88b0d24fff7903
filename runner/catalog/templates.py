"""IDEMPOTENCY_KEY / RESOURCE_KEY templates: ``"{user_id}:{template}"`` over a payload.

Only plain field names (dotted for nested objects, no dunder names) are allowed: no
attribute access (values are looked up as dict keys only), no indexing, no conversions
or format specs, so payload data can never reach str.format's attribute lookup. Values
must be strings, numbers or booleans; numbers render canonically (7.0 as 7).
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
MAX_KEY_BYTES = 512


class TemplateError(ValueError):
    pass


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
            elif isinstance(value, str | int | float):
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
