"""Hostile input to the engine: payload data never reaches str.format attribute lookup,
indexing, conversions or format specs through IDEMPOTENCY_KEY / RESOURCE_KEY templates,
and random records a worker reads end dead with a reason, never crash the worker."""

from __future__ import annotations

import random
import string
from typing import Any

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from runner.catalog import templates
from runner.catalog.templates import TemplateError
from runner.store.records import RECORD_FIELDS

from conftest import Project, raw_status, wait_for

INJECTIONS = [
    "{user.__class__}", "{user.__class__.__init__.__globals__}", "{0}", "{0.__class__}",
    "{x!r}", "{x!s}", "{x!a}", "{x:>99999}", "{x:{y}}", "{x[0]}", "{x[__class__]}",
    "{}", "{ x }", "{x.}", "{.x}", "{x..y}", "{__import__}", "{x:%}", "{{x}}", "{",
    "}", "{x", "x}", "{x}{", "{\u0661}",
]


@pytest.mark.parametrize("source", INJECTIONS)
def test_injection_templates_are_refused_or_inert(source: str) -> None:
    """Every template either fails to parse with a TemplateError, or (dotted names only)
    renders through plain dict lookups: an attribute name is just a missing key."""
    try:
        t = templates.parse(source)
    except TemplateError:
        return
    for f in t.fields:
        assert all(part.isidentifier() for part in f.split("."))
    with pytest.raises(TemplateError):
        t.render({"user": "bob", "x": "v"})  # a str has no key "__class__": no getattr


def test_dunder_names_are_refused_at_load() -> None:
    """Even as dictionary keys, dunder names are refused when the function loads."""
    with pytest.raises(TemplateError):
        templates.parse("{user.__class__}")
    t = templates.parse("{user.name}")
    assert t.render({"user": {"name": "bob"}}) == "bob"
    with pytest.raises(TemplateError):
        t.render({"user": "bob"})  # a str is not a mapping: no attribute lookup


@pytest.mark.parametrize("value", [
    "{0.__class__}", "{user.__class__.__mro__}", "%s%s%n", "$(rm -rf /)", "`id`", "a b",
    "🙂" * 10, "{x:>99999}", "\u200b\u2028",
])
def test_payload_values_are_copied_verbatim(value: str) -> None:
    """Braces, format specs, shell syntax, spaces and non-control Unicode in payload values are data."""
    assert templates.parse("user:{u}").render({"u": value}) == "user:" + value


@pytest.mark.parametrize("char", [chr(c) for c in (*range(0x20), 0x7F, 0x80, 0x85, 0x9B, 0x9F)])
def test_control_characters_never_render_into_a_key(char: str) -> None:
    """Every C0 control (the record's \\x1f and the limits' newline among them), DEL and
    the C1 controls are refused, naming the payload field and the character; a template
    whose own text holds one is refused when the function loads."""
    with pytest.raises(TemplateError, match=f"U\\+{ord(char):04X} at character 3") as refused:
        templates.parse("user:{a.b}").render({"a": {"b": "ab" + char + "cd"}})
    assert refused.value.field == "a.b"
    with pytest.raises(TemplateError, match="control character"):
        templates.parse("user:" + char + "{u}")


@pytest.mark.parametrize("value", [None, [1], {"a": 1}, ["{0}"]])
def test_non_scalar_values_are_refused(value: Any) -> None:
    with pytest.raises(TemplateError):
        templates.parse("{u}").render({"u": value})


def test_a_huge_value_is_refused() -> None:
    with pytest.raises(TemplateError, match="over"):
        templates.parse("{u}").render({"u": "x" * 100_000})


class _Trap(dict):  # type: ignore[type-arg]
    """A payload mapping whose attributes must never be read."""

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("__") and name not in ("__class__", "__contains__", "__getitem__", "__len__",
                                                  "__iter__", "__eq__", "__hash__"):
            raise AssertionError(f"attribute {name} was read from payload data")
        return super().__getattribute__(name)


@settings(max_examples=300, deadline=None)
@given(source=st.text(alphabet=string.printable + "_.{}!:[]0", max_size=30),
       payload=st.dictionaries(st.text(max_size=8), st.one_of(st.text(max_size=8), st.integers(),
                                                              st.booleans(), st.none()), max_size=4))
def test_fuzzed_templates_only_ever_raise_template_error(source: str, payload: dict[str, Any]) -> None:
    """Random template sources over random payloads: a str, or a TemplateError."""
    try:
        t = templates.parse(source)
    except TemplateError:
        return
    try:
        out = t.render(_Trap(payload))
    except TemplateError:
        return
    assert isinstance(out, str)


FIELDS = ["type", "version", "payload", "idem_key", "resource_key", "checkpoint"]
PLAUSIBLE = [b"record", b"1", b"{}", b'{"n": 1}', b"0", b"", b"noop"]


def _random_records(seed: int, n: int) -> list[dict[str, bytes]]:
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        rec = {}
        for f in FIELDS:
            roll = rnd.random()
            if roll < 0.5:
                rec[f] = rnd.choice(PLAUSIBLE)
            elif roll < 0.85:
                rec[f] = rnd.randbytes(rnd.randrange(13))
        out.append(rec)
    return out


@pytest.mark.parametrize("seed", [1, 2])
def test_random_records_never_crash_a_worker(project: Project, seed: int) -> None:
    """Twenty random records (random bytes in any field, fields missing) between good
    jobs: the good jobs all run, the worker stays up, and every random record ends done
    or dead. Bookkeeping fields (attempt, max_attempts, ready_ms, created_ms) are left
    out here: their wrong types are an engine bug pinned in
    tests/crash/test_malformed_records.py. An unknown type goes dead at once here
    (unknown_grace = 0) rather than waiting for a newer worker."""
    project.write_config(vt=1, worker="unknown_grace = 0")
    records = _random_records(seed, 20)
    raw = redis.Redis.from_url(project.server.url)
    k = project.keys("fast")
    c = project.client
    good = [c.enqueue("record", {"n": 0}).id]
    planted: list[bytes] = []
    for i, rec in enumerate(records):
        job_id = b"r%d-\xfe" % i
        # The record string (max_attempts 1, created_ms 0: left out, see above), and a
        # state hash holding the checkpoint, if any.
        fields = {"max_attempts": b"1", "created_ms": b"0", **rec}
        record = b"\x1f".join([b"1", *(fields.get(f, b"") for f in RECORD_FIELDS), fields.get("payload", b"")])
        raw.set(k.job_prefix.encode() + job_id, record)
        state = {"deferrals": 0, **({"checkpoint": rec["checkpoint"]} if "checkpoint" in rec else {})}
        raw.hset(k.job_prefix.encode() + job_id + b":s", mapping=state)
        raw.lpush(k.ready, job_id)
        planted.append(job_id)
        good.append(c.enqueue("record", {"n": i}).id)
    w = project.spawn_worker("fast")
    for g in good:
        assert c.wait(g, timeout_s=20).status == "done"
    wait_for(lambda: all(raw_status(raw, k, j) in (b"done", b"dead") for j in planted),
             timeout=20, what="every random record to settle")
    for j in planted:
        if raw_status(raw, k, j) == b"dead":
            assert raw.hget(k.job_prefix.encode() + j + b":s", "reason"), j
    assert w.poll() is None
    assert raw.llen(k.ready) == 0 and raw.zcard(k.leases) == 0
