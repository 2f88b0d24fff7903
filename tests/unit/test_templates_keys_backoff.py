"""Key templates refuse injection; the key layout shares one hash tag per queue; backoff bounds."""

from __future__ import annotations

import random

import pytest

from runner.catalog import templates
from runner.config import Backoff
from runner.store import keys
from runner.worker import backoff


def test_template_renders_plain_and_nested_fields() -> None:
    t = templates.parse("{user_id}:{meta.kind}")
    assert t.render({"user_id": 7, "meta": {"kind": "a"}}) == "7:a"
    assert templates.parse("{flag}").render({"flag": True}) == "true"


@pytest.mark.parametrize("bad", [
    "{user.__class__}", "{0}", "{x!r}", "{x:>99999}", "{x[0]}", "{}", "no fields", "{a.__dict__}",
])
def test_template_refuses_injection(bad: str) -> None:
    with pytest.raises(templates.TemplateError):
        templates.parse(bad)


def test_template_value_must_be_scalar_and_present() -> None:
    t = templates.parse("{x}")
    with pytest.raises(templates.TemplateError, match="must be a string"):
        t.render({"x": {"y": 1}})
    with pytest.raises(templates.TemplateError, match="no field"):
        t.render({})
    with pytest.raises(templates.TemplateError, match="over"):
        t.render({"x": "a" * 1000})


def test_schema_has_nested() -> None:
    s = {"properties": {"a": {"properties": {"b": {}}}}}
    assert templates.schema_has(s, "a.b") and not templates.schema_has(s, "a.c")


def test_every_queue_key_shares_the_hash_tag() -> None:
    k = keys.for_queue("app", "fast")
    all_keys = [k.ready, k.leases, k.claims, k.done_meta, k.done(3), k.res_prefix, k.census, k.scheduled,
                k.dead, k.notify, k.stats, k.job("x"), k.state("x"),
                k.idem("noop", "{evil}"), k.limit("r:user:1"), k.limit("r:user:1") + ":w",
                k.limwait, k.throughput(5)]
    for key in all_keys:
        assert key.startswith("app:{fast}:")


def test_keys_built_inside_scripts_are_their_prefix_and_a_suffix() -> None:
    """claim, reclaim and promote build job, idempotency, limit and throughput keys from
    the prefixes they get in KEYS; the helpers build the very same strings."""
    k = keys.for_queue("app", "fast")
    assert k.job("x") == k.job_prefix + "x"
    assert k.idem("noop", "user:7") == k.idem_prefix + "noop:user:7" == "app:{fast}:idem:noop:user:7"
    assert k.idem("noop", "k") != k.idem("other", "k")  # one function's keys never meet another's
    assert k.limit("r:res") == k.lim_prefix + "r:res" == "app:{fast}:lim:r:res"
    assert k.throughput(29_000_000) == k.tput_prefix + "29000000" == "app:{fast}:tput:29000000"


@pytest.mark.parametrize("jitter", ["full", "equal", "none"])
def test_backoff_is_capped_and_grows(jitter: str) -> None:
    p = Backoff(base_s=1.0, cap_s=30.0, jitter=jitter)
    rnd = random.Random(1)
    for attempt in range(1, 40):
        d = backoff.delay_s(p, attempt, rnd)
        ceiling = min(30.0, 2 ** (attempt - 1))
        assert 0 <= d <= ceiling
        if jitter == "none":
            assert d == ceiling
        if jitter == "equal":
            assert d >= ceiling / 2
