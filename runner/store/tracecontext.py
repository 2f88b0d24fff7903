"""The W3C trace context a job carries from its producer to the worker that runs it.

It travels in the job record's ``meta`` (the JSON object of a producer's annotations) as
``{"traceparent": "00-<trace id>-<span id>-<flags>"}``; the claim returns meta with the
job, so a worker that traces parses it there and one that does not never looks.

A group's then-job has many parents: its meta also carries ``"links"``, the traceparents
of its members' runs (the first 127, written by the step that completes the group:
lua/includes/groups.lua, group_fire), for its run to link to.
"""

from __future__ import annotations

from runner.store import codec

FIELD = "traceparent"


def meta_for(traceparent: str | None) -> str:
    """The meta to enqueue with: '' (none) without a trace context."""
    return codec.dumps({FIELD: traceparent}) if traceparent else ""


LINKS = "links"


def links(meta: str) -> list[str]:
    """The traceparents a then-job's run links to ([] none or unreadable)."""
    if not meta or f'"{LINKS}"' not in meta:  # most jobs: no parse
        return []
    try:
        got = codec.loads(meta)
    except codec.DecodeError:
        return []
    found = got.get(LINKS) if isinstance(got, dict) else None
    return [tp for tp in found if isinstance(tp, str)] if isinstance(found, list) else []


def parse(meta: str) -> str:
    """The traceparent in a job's meta ('' none or unreadable)."""
    try:
        got = codec.loads(meta)
    except codec.DecodeError:
        return ""
    tp = got.get(FIELD) if isinstance(got, dict) else None
    return tp if isinstance(tp, str) else ""
